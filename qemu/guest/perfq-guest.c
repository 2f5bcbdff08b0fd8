/* SPDX-License-Identifier: MIT */
/*
 * perfq-guest: the small static helper the QEMU scenarios run inside the
 * guest to poke /dev/perfqN directly.
 *
 *   perfq-guest info DEV                    print PERFQ_IOC_INFO as key=value lines
 *   perfq-guest clock DEV N ROUND [REPS]    clock-sample ioctl; bracket widths (ns)
 *   perfq-guest badinput DEV                every bad ioctl/mmap must fail cleanly
 *   perfq-guest fuzz DEV ITERATIONS SEED    random ioctls and mmaps
 *   perfq-guest wait-state DEV STATE SECS   wait for host_ctrl.device_state == STATE
 *   perfq-guest hold DEV SECS               map the region, touch it until SIGBUS
 *   perfq-guest sync-until-gone DEV SECS    clock-sample rounds on a silent device
 *                                           until one ends with ENODEV (removal)
 *   perfq-guest exit CODE                   isa-debug-exit (port 0xf4)
 *
 * Output: one line per check, "ok: ..." or "FAIL: ..."; the exit status is
 * 0 when every check passed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/io.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "perfq/perfq_abi.h"
#include "perfq/perfq_ioctl.h"

static int failures;

static void check(int cond, const char *what, long got, int err)
{
	if (cond) {
		printf("ok: %s\n", what);
	} else {
		printf("FAIL: %s (returned %ld, errno %d %s)\n", what, got, err, strerror(err));
		failures++;
	}
}

/* Expect a call to fail with one errno. */
#define EXPECT_ERR(call, want, what)                                   \
	do {                                                           \
		errno = 0;                                             \
		long r_ = (long)(call);                                \
		int e_ = errno;                                        \
		check(r_ == -1 && e_ == (want), what, r_, e_);         \
	} while (0)

static int open_dev(const char *dev)
{
	int fd = open(dev, O_RDWR | O_CLOEXEC);

	if (fd < 0) {
		fprintf(stderr, "perfq-guest: open %s: %s\n", dev, strerror(errno));
		exit(2);
	}
	return fd;
}

static int get_info(int fd, struct perfq_ioc_info *info)
{
	memset(info, 0, sizeof(*info));
	info->size = sizeof(*info);
	return ioctl(fd, PERFQ_IOC_INFO, info);
}

static int cmd_info(const char *dev)
{
	struct perfq_ioc_info info;
	int fd = open_dev(dev);
	int i;

	if (get_info(fd, &info)) {
		fprintf(stderr, "perfq-guest: PERFQ_IOC_INFO: %s\n", strerror(errno));
		return 1;
	}
	printf("version=%u\nabi_version=%u\nregion_size=%llu\nring_capacity=%llu\n"
	       "features=%#llx\nbar_size=%llu\nrecords_seen=%llu\nlink_speed_mtps=%u\n"
	       "link_width=%u\nflags=%#x\ndevice_name=%s\npci_address=%s\n",
	       info.version, info.abi_version, (unsigned long long)info.region_size,
	       (unsigned long long)info.ring_capacity, (unsigned long long)info.features,
	       (unsigned long long)info.bar_size, (unsigned long long)info.records_seen,
	       info.link_speed_mtps, info.link_width, info.flags, (const char *)info.device_name,
	       (const char *)info.pci_address);
	for (i = 0; i < PERFQ_SECTION_COUNT; i++)
		printf("section%d=%llu+%llu\n", i, (unsigned long long)info.sections[i].offset,
		       (unsigned long long)info.sections[i].size);
	close(fd);
	return 0;
}

static double ms_since(const struct timespec *t0)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)(t.tv_sec - t0->tv_sec) * 1e3 + (double)(t.tv_nsec - t0->tv_nsec) / 1e6;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/*
 * Why a timer read timed out, from the timer page: the last request the
 * device answered against the last one asked, and the window.
 */
static void print_timer_cause(int fd, const struct perfq_ioc_info *info)
{
	const struct perfq_section *sec = &info->sections[PERFQ_SECTION_TIMER];
	const volatile struct perfq_timer_page *t;
	unsigned long long req, resp;
	void *p;

	p = mmap(NULL, sec->size, PROT_READ, MAP_SHARED, fd, (off_t)sec->offset);
	if (p == MAP_FAILED) {
		fprintf(stderr, "perfq-guest: cause unknown: mapping the timer page: %s\n",
			strerror(errno));
		return;
	}
	t = p;
	req = t->req_tag;
	resp = t->resp_tag;
	if (resp == req)
		fprintf(stderr, "perfq-guest: cause: the device answered request %llu after the reader gave up: it was late, not absent (window %u)\n",
			req, t->window);
	else
		fprintf(stderr, "perfq-guest: cause: the device did not answer request %llu (it last answered %llu; window %u): it was not running\n",
			req, resp, t->window);
	munmap(p, sec->size);
}

/*
 * reps rounds of n clock samples, from sync round `round` on.  A round that
 * times out after PERFQ_IOC_ROUND_MIN_SAMPLES samples is kept short, as
 * perfq-daemon keeps it (and counted); one with fewer fails, with its cause.
 */
static int cmd_clock(const char *dev, unsigned n, unsigned round, unsigned reps)
{
	static struct perfq_ioc_clock_samples req;
	static uint64_t widths[PERFQ_SYNC_MAX_SAMPLES * 64];
	unsigned total = 0, r, i, bad = 0, shorts = 0;
	unsigned enough = n < PERFQ_IOC_ROUND_MIN_SAMPLES ? n : PERFQ_IOC_ROUND_MIN_SAMPLES;
	struct perfq_ioc_info info;
	int fd = open_dev(dev);

	if (get_info(fd, &info)) {
		fprintf(stderr, "perfq-guest: PERFQ_IOC_INFO: %s\n", strerror(errno));
		return 1;
	}
	if (reps == 0 || reps > 64)
		reps = 1;
	for (r = 0; r < reps; r++) {
		struct timespec t0;

		memset(&req, 0, sizeof(req));
		req.size = sizeof(req);
		req.n = n;
		req.round = round + r;
		req.timeout_ns = PERFQ_IOC_TIMEOUT_MAX_NS;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		if (ioctl(fd, PERFQ_IOC_CLOCK_SAMPLES, &req)) {
			int e = errno;

			fprintf(stderr,
				"perfq-guest: PERFQ_IOC_CLOCK_SAMPLES round %u (%u of %u): %s after %.1f ms (count %u)\n",
				req.round, r + 1, reps, strerror(e), ms_since(&t0), req.count);
			if (e == ETIMEDOUT)
				print_timer_cause(fd, &info);
			if (e != ETIMEDOUT || req.count < enough)
				return 1;
			shorts++;
		} else if (req.count != n) {
			bad++;
		}
		if (req.version != PERFQ_IOC_VERSION)
			bad++;
		for (i = 0; i < req.count; i++) {
			const struct perfq_clock_sample *s = &req.samples[i];

			if (s->after < s->before || s->before == 0 || s->value == 0)
				bad++;
			widths[total++] = s->after - s->before;
		}
	}
	qsort(widths, total, sizeof(widths[0]), cmp_u64);
	printf("clock: samples=%u bad=%u short_rounds=%u bracket_ns min=%llu p50=%llu p90=%llu max=%llu\n",
	       total, bad, shorts, (unsigned long long)widths[0],
	       (unsigned long long)widths[total / 2], (unsigned long long)widths[total * 9 / 10],
	       (unsigned long long)widths[total - 1]);
	close(fd);
	return bad ? 1 : 0;
}

static volatile sig_atomic_t got_sigbus;
static sigjmp_buf sigbus_jmp;

static void on_sigbus(int sig)
{
	(void)sig;
	got_sigbus = 1;
	siglongjmp(sigbus_jmp, 1);
}

/* Sets the page at ro_page to content (zero-padded) and leaves it read-only. */
static void fill_ro_page(void *ro_page, long page, const void *content, size_t len)
{
	mprotect(ro_page, page, PROT_READ | PROT_WRITE);
	memset(ro_page, 0, page);
	memcpy(ro_page, content, len);
	mprotect(ro_page, page, PROT_READ);
}

/* Unknown ioctl numbers and types, wrong encoded sizes and directions. */
static void badinput_ioctl_numbers(int fd, struct perfq_ioc_info *info)
{
	EXPECT_ERR(ioctl(fd, _IOWR(PERFQ_IOC_TYPE, 0x7f, struct perfq_ioc_info), info), ENOTTY,
		   "unknown ioctl number is ENOTTY");
	EXPECT_ERR(ioctl(fd, _IOWR('x', 0, struct perfq_ioc_info), info), ENOTTY,
		   "foreign ioctl type is ENOTTY");
	EXPECT_ERR(ioctl(fd, _IOC(_IOC_READ | _IOC_WRITE, PERFQ_IOC_TYPE, 0, 100), info), EINVAL,
		   "INFO with a wrong encoded size is EINVAL");
	EXPECT_ERR(ioctl(fd, _IOR(PERFQ_IOC_TYPE, 0, struct perfq_ioc_info), info), EINVAL,
		   "INFO with a wrong direction is EINVAL");
}

/* PERFQ_IOC_INFO with a wrong size word and with pointers it cannot use. */
static void badinput_info(int fd, void *ro_page, long page)
{
	struct perfq_ioc_info info;
	void *p;

	memset(&info, 0, sizeof(info));
	info.size = sizeof(info) - 8;
	EXPECT_ERR(ioctl(fd, PERFQ_IOC_INFO, &info), EINVAL, "INFO with a wrong size word is EINVAL");
	EXPECT_ERR(ioctl(fd, PERFQ_IOC_INFO, NULL), EFAULT, "INFO with NULL is EFAULT");
	EXPECT_ERR(ioctl(fd, PERFQ_IOC_INFO, (void *)16), EFAULT, "INFO with a wild pointer is EFAULT");
	EXPECT_ERR(ioctl(fd, PERFQ_IOC_INFO, (void *)0xffff888000000000ULL), EFAULT,
		   "INFO with a kernel pointer is EFAULT");
	memset(&info, 0, sizeof(info));
	info.size = sizeof(info);
	fill_ro_page(ro_page, page, &info, sizeof(info));
	EXPECT_ERR(ioctl(fd, PERFQ_IOC_INFO, ro_page), EFAULT, "INFO into read-only memory is EFAULT");
	/* the struct straddling the end of a mapping */
	p = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	munmap((char *)p + page, page);
	*(uint32_t *)((char *)p + page - 16) = sizeof(info);
	EXPECT_ERR(ioctl(fd, PERFQ_IOC_INFO, (char *)p + page - 16), EFAULT,
		   "INFO straddling unmapped memory is EFAULT");
}

/* PERFQ_IOC_CLOCK_SAMPLES with each field out of range, then one good call. */
static void badinput_clock(int fd, void *ro_page, long page)
{
	static struct perfq_ioc_clock_samples req;
	struct perfq_ioc_clock_samples head;
	int r;

	memset(&req, 0, sizeof(req));
	req.size = sizeof(req);
	req.n = 0;
	EXPECT_ERR(ioctl(fd, PERFQ_IOC_CLOCK_SAMPLES, &req), EINVAL, "CLOCK_SAMPLES n=0 is EINVAL");
	req.n = PERFQ_SYNC_MAX_SAMPLES + 1;
	EXPECT_ERR(ioctl(fd, PERFQ_IOC_CLOCK_SAMPLES, &req), EINVAL, "CLOCK_SAMPLES n=65 is EINVAL");
	req.n = 0xffffffffu;
	EXPECT_ERR(ioctl(fd, PERFQ_IOC_CLOCK_SAMPLES, &req), EINVAL, "CLOCK_SAMPLES huge n is EINVAL");
	req.n = 4;
	req.flags = 1;
	EXPECT_ERR(ioctl(fd, PERFQ_IOC_CLOCK_SAMPLES, &req), EINVAL, "CLOCK_SAMPLES flags is EINVAL");
	req.flags = 0;
	req.reserved[2] = 1;
	EXPECT_ERR(ioctl(fd, PERFQ_IOC_CLOCK_SAMPLES, &req), EINVAL,
		   "CLOCK_SAMPLES nonzero reserved is EINVAL");
	req.reserved[2] = 0;
	req.timeout_ns = ~0ULL;
	EXPECT_ERR(ioctl(fd, PERFQ_IOC_CLOCK_SAMPLES, &req), EINVAL,
		   "CLOCK_SAMPLES huge timeout is EINVAL");
	req.timeout_ns = 0;
	req.size = 64;
	EXPECT_ERR(ioctl(fd, PERFQ_IOC_CLOCK_SAMPLES, &req), EINVAL,
		   "CLOCK_SAMPLES wrong size word is EINVAL");
	req.size = sizeof(req);
	EXPECT_ERR(ioctl(fd, _IOC(_IOC_READ | _IOC_WRITE, PERFQ_IOC_TYPE, 1, 64), &req), EINVAL,
		   "CLOCK_SAMPLES wrong encoded size is EINVAL");
	EXPECT_ERR(ioctl(fd, PERFQ_IOC_CLOCK_SAMPLES, NULL), EFAULT, "CLOCK_SAMPLES NULL is EFAULT");
	memset(&head, 0, sizeof(head));
	head.size = sizeof(head);
	head.n = 1;
	head.round = 1;
	fill_ro_page(ro_page, page, &head, sizeof(head));
	EXPECT_ERR(ioctl(fd, PERFQ_IOC_CLOCK_SAMPLES, ro_page), EFAULT,
		   "CLOCK_SAMPLES answering into read-only memory is EFAULT");
	req.n = 4;
	req.round = 2;
	errno = 0;
	r = ioctl(fd, PERFQ_IOC_CLOCK_SAMPLES, &req);
	check(r == 0 && req.count == 4, "CLOCK_SAMPLES n=4 works", r, errno);
}

/* mmap requests the driver must refuse: out of range, misaligned, writable read-only parts. */
static void badinput_mmap(int fd, const struct perfq_ioc_info *info, long page)
{
	const struct perfq_section *sec = info->sections;
	uint64_t region = info->region_size;

	EXPECT_ERR(mmap(NULL, page, PROT_READ, MAP_SHARED, fd, (off_t)region), EINVAL,
		   "mmap at the region end is EINVAL");
	EXPECT_ERR(mmap(NULL, page, PROT_READ, MAP_SHARED, fd, (off_t)1 << 44), EINVAL,
		   "mmap far beyond the region is EINVAL");
	EXPECT_ERR(mmap(NULL, 2 * page, PROT_READ, MAP_SHARED, fd, (off_t)(region - page)), EINVAL,
		   "mmap running past the region end is EINVAL");
	EXPECT_ERR(mmap(NULL, region + page, PROT_READ, MAP_SHARED, fd, 0), EINVAL,
		   "mmap longer than the region is EINVAL");
	EXPECT_ERR(mmap(NULL, page, PROT_READ, MAP_SHARED, fd, 123), EINVAL,
		   "mmap at an unaligned offset is EINVAL");
	EXPECT_ERR(mmap(NULL, 0, PROT_READ, MAP_SHARED, fd, 0), EINVAL, "mmap of length 0 is EINVAL");
	EXPECT_ERR(mmap(NULL, page, PROT_READ, MAP_PRIVATE, fd, 0), EINVAL,
		   "MAP_PRIVATE is EINVAL");
	EXPECT_ERR(mmap(NULL, page, PROT_READ | PROT_EXEC, MAP_SHARED, fd, 0), EINVAL,
		   "PROT_EXEC is EINVAL");
	EXPECT_ERR(mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
			(off_t)sec[PERFQ_SECTION_HEADER].offset),
		   EACCES, "writable header is EACCES");
	EXPECT_ERR(mmap(NULL, sec[PERFQ_SECTION_RING].size, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
			(off_t)sec[PERFQ_SECTION_RING].offset),
		   EACCES, "writable ring is EACCES");
	EXPECT_ERR(mmap(NULL, region, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), EACCES,
		   "writable whole region is EACCES");
	EXPECT_ERR(mmap(NULL, sec[PERFQ_SECTION_HOST_CTRL].size + sec[PERFQ_SECTION_DICT].size,
			PROT_READ | PROT_WRITE, MAP_SHARED, fd,
			(off_t)sec[PERFQ_SECTION_DICT].offset - (off_t)sec[PERFQ_SECTION_HOST_CTRL].size),
		   EACCES, "writable range reaching into the dictionary is EACCES");
}

/* The mappings the driver must grant, and what it refuses to change on them. */
static void badinput_good_mappings(int fd, const struct perfq_ioc_info *info, long page)
{
	const struct perfq_section *sec = info->sections;
	uint64_t region = info->region_size;
	void *p;

	p = mmap(NULL, region, PROT_READ, MAP_SHARED, fd, 0);
	check(p != MAP_FAILED, "read-only mapping of the whole region works", (long)p, errno);
	if (p != MAP_FAILED) {
		check(*(volatile uint64_t *)p == PERFQ_REGION_MAGIC, "the mapped header has the magic",
		      0, 0);
		EXPECT_ERR(mprotect(p, page, PROT_READ | PROT_WRITE), EACCES,
			   "mprotect of a read-only mapping to writable is EACCES");
		EXPECT_ERR(mprotect(p, page, PROT_READ | PROT_EXEC), EACCES,
			   "mprotect to executable is EACCES");
		EXPECT_ERR(mremap(p, region, region + page, 0), EFAULT,
			   "mremap growing the mapping fails");
		munmap(p, region);
	}
	p = mmap(NULL, sec[PERFQ_SECTION_HOST_CTRL].size, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
		 (off_t)sec[PERFQ_SECTION_HOST_CTRL].offset);
	check(p != MAP_FAILED, "read-write mapping of host_ctrl works", (long)p, errno);
	if (p != MAP_FAILED) {
		volatile struct perfq_host_ctrl *hc = p;

		check(hc->device_state <= PERFQ_DEVICE_STOPPED, "host_ctrl reads sanely", 0, 0);
		munmap(p, sec[PERFQ_SECTION_HOST_CTRL].size);
	}
	p = mmap(NULL, sec[PERFQ_SECTION_APP].size, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
		 (off_t)sec[PERFQ_SECTION_APP].offset);
	check(p != MAP_FAILED, "read-write mapping of the app area works", (long)p, errno);
	if (p != MAP_FAILED)
		munmap(p, sec[PERFQ_SECTION_APP].size);
}

static int cmd_badinput(const char *dev)
{
	struct perfq_ioc_info info, scratch;
	long page = sysconf(_SC_PAGESIZE);
	void *ro_page;
	int fd = open_dev(dev);

	check(get_info(fd, &info) == 0 && info.version == PERFQ_IOC_VERSION, "INFO with a good argument",
	      0, errno);
	scratch = info;
	badinput_ioctl_numbers(fd, &scratch);
	ro_page = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	badinput_info(fd, ro_page, page);
	badinput_clock(fd, ro_page, page);
	badinput_mmap(fd, &info, page);
	badinput_good_mappings(fd, &info, page);
	close(fd);
	return failures ? 1 : 0;
}

static uint64_t rnd_state;

static uint64_t rnd(void)
{
	/* splitmix64 */
	uint64_t z = (rnd_state += 0x9e3779b97f4a7c15ULL);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static int errno_allowed(int e)
{
	return e == EINVAL || e == ENOTTY || e == EFAULT || e == EACCES || e == ETIMEDOUT ||
	       e == EPERM || e == ENOMEM || e == EOVERFLOW;
}

/*
 * One random ioctl, r choosing its shape: our type most of the time, random
 * nr/size/dir, random contents and pointer.  Returns ioctl's result, *err its errno.
 */
static long fuzz_ioctl(int fd, uint64_t r, int *err)
{
	static uint8_t buf[8192] __attribute__((aligned(64)));
	unsigned type = (r >> 8) % 4 ? PERFQ_IOC_TYPE : (unsigned)(r >> 16) & 0xff;
	unsigned nr = (r >> 24) % 4 ? (unsigned)(r >> 26) % 3 : (unsigned)(r >> 26) & 0xff;
	unsigned size = (r >> 34) % 2 ? ((r >> 35) % 2 ? sizeof(struct perfq_ioc_info)
						   : sizeof(struct perfq_ioc_clock_samples))
				      : (unsigned)(r >> 36) & 0x3fff;
	unsigned dir = (r >> 50) % 4 ? (_IOC_READ | _IOC_WRITE) : (unsigned)(r >> 52) & 3;
	unsigned long cmd = _IOC(dir, type, nr, size);
	void *arg;
	size_t k;
	long ret;

	for (k = 0; k < sizeof(buf); k += 8)
		*(uint64_t *)(buf + k) = rnd() & ((r >> 54) % 2 ? ~0ULL : 0x4f);
	*(uint32_t *)buf = (r >> 55) % 2 ? (uint32_t)size : (uint32_t)rnd();
	switch ((r >> 57) % 8) {
	case 0: arg = NULL; break;
	case 1: arg = (void *)(uintptr_t)(rnd() & 0xffff); break;
	case 2: arg = (void *)(uintptr_t)(0xffff800000000000ULL | rnd()); break;
	case 3: arg = buf + sizeof(buf) - (rnd() % 64); break;
	default: arg = buf; break;
	}
	/* keep the clock ioctl short: a small n and timeout when valid */
	if (arg == buf && nr == 1) {
		((struct perfq_ioc_clock_samples *)buf)->timeout_ns = rnd() % 200000;
		((struct perfq_ioc_clock_samples *)buf)->round = 0;
	}
	errno = 0;
	ret = ioctl(fd, cmd, arg);
	*err = errno;
	return ret;
}

/*
 * One mmap with random offset, length, protection and flags, r choosing
 * them; a mapping that works is touched once and unmapped, and counted in
 * *mapped.  Returns 0 or -1, *err the errno.
 */
static long fuzz_mmap(int fd, uint64_t region_size, long page, uint64_t r, unsigned long *mapped,
		      int *err)
{
	uint64_t off = (r >> 8) % 4 ? ((rnd() % (region_size / page + 4)) * page)
				    : rnd() % (1ULL << 40);
	uint64_t len = (r >> 12) % 4 ? ((rnd() % 8) * page) : rnd() % (region_size * 2);
	int prot = (int)((r >> 16) & 7);
	int flags = (r >> 20) % 4 ? MAP_SHARED : MAP_PRIVATE;
	void *p;

	errno = 0;
	p = mmap(NULL, len, prot, flags, fd, (off_t)off);
	*err = errno;
	if (p == MAP_FAILED)
		return -1;
	(*mapped)++;
	if ((prot & PROT_READ) && len)
		(void)*(volatile uint8_t *)p;
	munmap(p, len);
	return 0;
}

static int cmd_fuzz(const char *dev, unsigned long iters, unsigned long seed)
{
	struct perfq_ioc_info info;
	unsigned long i, ok = 0, refused = 0, mapped = 0;
	long page = sysconf(_SC_PAGESIZE);
	int fd = open_dev(dev);

	rnd_state = seed;
	if (get_info(fd, &info)) {
		fprintf(stderr, "perfq-guest: INFO: %s\n", strerror(errno));
		return 1;
	}
	for (i = 0; i < iters; i++) {
		uint64_t r = rnd();
		long ret;
		int e;

		if (r % 3 != 0)
			ret = fuzz_ioctl(fd, r, &e);
		else
			ret = fuzz_mmap(fd, info.region_size, page, r, &mapped, &e);
		if (ret == 0) {
			ok++;
		} else if (errno_allowed(e)) {
			refused++;
		} else {
			printf("FAIL: fuzz call %lu failed with unexpected errno %d %s\n", i, e, strerror(e));
			failures++;
		}
	}
	printf("fuzz: %lu calls, %lu succeeded (%lu mappings), %lu refused cleanly, %d unexpected\n",
	       iters, ok, mapped, refused, failures);
	close(fd);
	return failures ? 1 : 0;
}

static int cmd_wait_state(const char *dev, unsigned state, double secs)
{
	struct perfq_ioc_info info;
	int fd = open_dev(dev);
	struct timespec t0, t;
	volatile struct perfq_host_ctrl *hc;
	void *p;

	if (get_info(fd, &info))
		return 1;
	p = mmap(NULL, info.sections[PERFQ_SECTION_HOST_CTRL].size, PROT_READ, MAP_SHARED, fd,
		 (off_t)info.sections[PERFQ_SECTION_HOST_CTRL].offset);
	if (p == MAP_FAILED)
		return 1;
	hc = p;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		if (__atomic_load_n(&hc->device_state, __ATOMIC_ACQUIRE) == state) {
			printf("ok: device_state is %u\n", state);
			return 0;
		}
		clock_gettime(CLOCK_MONOTONIC, &t);
		if ((double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) / 1e9 > secs) {
			printf("FAIL: device_state stayed %u, not %u, for %.1f s\n", hc->device_state,
			       state, secs);
			return 1;
		}
		usleep(2000);
	}
}

static int cmd_hold(const char *dev, double secs)
{
	struct perfq_ioc_info info;
	int fd = open_dev(dev);
	struct timespec t0, t;
	volatile uint64_t *hdr;
	void *p;

	if (get_info(fd, &info))
		return 1;
	p = mmap(NULL, info.region_size, PROT_READ, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return 1;
	hdr = p;
	signal(SIGBUS, on_sigbus);
	printf("hold: mapped %llu bytes\n", (unsigned long long)info.region_size);
	fflush(stdout);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	if (sigsetjmp(sigbus_jmp, 1) == 0) {
		for (;;) {
			if (*hdr != PERFQ_REGION_MAGIC) {
				printf("FAIL: hold: the mapping read %#llx instead of the magic\n",
				       (unsigned long long)*hdr);
				return 1;
			}
			clock_gettime(CLOCK_MONOTONIC, &t);
			if ((double)(t.tv_sec - t0.tv_sec) > secs) {
				printf("hold: no SIGBUS within %.0f s\n", secs);
				return 3;
			}
			usleep(1000);
		}
	}
	printf("ok: SIGBUS on access after removal\n");
	errno = 0;
	EXPECT_ERR(get_info(fd, &info), ENODEV, "INFO after removal is ENODEV");
	EXPECT_ERR(mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0), ENODEV,
		   "mmap after removal is ENODEV");
	close(fd);
	return failures ? 1 : 0;
}

/*
 * Rounds of PERFQ_IOC_CLOCK_SAMPLES against a device that does not answer,
 * back to back, until one ends with ENODEV: the device was removed while
 * the ioctl waited.  Exit 0 then, 1 on any other error or after secs.
 */
static int cmd_sync_until_gone(const char *dev, double secs)
{
	static struct perfq_ioc_clock_samples req;
	struct timespec start, t0;
	unsigned round = 1000, timeouts = 0;
	int fd = open_dev(dev);

	clock_gettime(CLOCK_MONOTONIC, &start);
	printf("sync: waiting in PERFQ_IOC_CLOCK_SAMPLES for the silent device\n");
	while (ms_since(&start) < secs * 1e3) {
		memset(&req, 0, sizeof(req));
		req.size = sizeof(req);
		req.n = PERFQ_SYNC_MAX_SAMPLES;
		req.round = round++;
		req.timeout_ns = PERFQ_IOC_TIMEOUT_MAX_NS;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		if (ioctl(fd, PERFQ_IOC_CLOCK_SAMPLES, &req) == 0) {
			printf("sync: round %u answered (%u samples): the device is not silent\n",
			       req.round, req.count);
			continue;
		}
		if (errno == ETIMEDOUT) {
			timeouts++;
			continue;
		}
		if (errno == ENODEV) {
			printf("ok: the ioctl waiting %.1f ms for the silent device ended with ENODEV (after %u timed-out rounds)\n",
			       ms_since(&t0), timeouts);
			close(fd);
			return 0;
		}
		printf("FAIL: PERFQ_IOC_CLOCK_SAMPLES round %u: %s after %.1f ms\n", req.round,
		       strerror(errno), ms_since(&t0));
		return 1;
	}
	printf("FAIL: no ENODEV within %.0f s (%u timed-out rounds)\n", secs, timeouts);
	return 1;
}

static int cmd_exit(int code)
{
	if (ioperm(0xf4, 1, 1)) {
		perror("perfq-guest: ioperm");
		return 1;
	}
	outb((unsigned char)code, 0xf4);
	return 1; /* not reached with isa-debug-exit present */
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc >= 3 && !strcmp(argv[1], "info"))
		return cmd_info(argv[2]);
	if (argc >= 5 && !strcmp(argv[1], "clock"))
		return cmd_clock(argv[2], (unsigned)atoi(argv[3]), (unsigned)atoi(argv[4]),
				 argc >= 6 ? (unsigned)atoi(argv[5]) : 1);
	if (argc >= 3 && !strcmp(argv[1], "badinput"))
		return cmd_badinput(argv[2]);
	if (argc >= 5 && !strcmp(argv[1], "fuzz"))
		return cmd_fuzz(argv[2], strtoul(argv[3], NULL, 0), strtoul(argv[4], NULL, 0));
	if (argc >= 5 && !strcmp(argv[1], "wait-state"))
		return cmd_wait_state(argv[2], (unsigned)atoi(argv[3]), atof(argv[4]));
	if (argc >= 4 && !strcmp(argv[1], "hold"))
		return cmd_hold(argv[2], atof(argv[3]));
	if (argc >= 4 && !strcmp(argv[1], "sync-until-gone"))
		return cmd_sync_until_gone(argv[2], atof(argv[3]));
	if (argc >= 3 && !strcmp(argv[1], "exit"))
		return cmd_exit(atoi(argv[2]));
	fprintf(stderr, "usage: perfq-guest info|clock|badinput|fuzz|wait-state|hold|sync-until-gone|exit ...\n");
	return 2;
}
