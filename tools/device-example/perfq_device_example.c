// SPDX-License-Identifier: MIT
/*
 * perfq-device-example: a perfq device built on perfq_device.h alone and
 * the platform's threads, as firmware on a device's CPU would be.  Builds
 * for any instruction set (make device-example ARCH=riscv64|aarch64|native)
 * and runs, under qemu-user, as the device of a recording by the host's
 * perfq-daemon through a region file under /dev/shm.
 *
 *   timer register R  the CPU's own counter (rdtime, cntvct_el0, rdtsc)
 *   device clock D    CLOCK_MONOTONIC_RAW plus an offset of 10^6 s
 *
 * Sync mode A or B, as the host asks (in B the collector converts each
 * record to host time before it crosses, with the SDK's model).
 * Workers record `tick` events at --rate each; with --jobs, two job workers
 * serve perfq-demo-app's job queue.  Until SIGINT/SIGTERM; then one JSON
 * line of accounting: emitted = delivered + dropped, per stream too.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "perfq/perfq_device.h"

#define MAX_WORKERS 64
#define QUEUE_RECORDS 16384u
#define JOB_WORKERS 2u
#define D_OFFSET_NS 1000000000000000ull
#define TRUTH_BRACKET_NS 1000u

enum { EV_TICK = 3, EV_JOB_START = 1, EV_JOB_END = 2 };

static const struct perfq_dev_event dictionary[] = {
	{ PERFQ_EVENT_LOST, PERFQ_KIND_LOST, "perfq_lost" },
	{ EV_JOB_START, PERFQ_KIND_BEGIN, "job_start" },
	{ EV_JOB_END, PERFQ_KIND_END, "job_end" },
	{ EV_TICK, PERFQ_KIND_INSTANT, "tick" },
};

/* ---- The port layer: this platform's clocks ---------------------------- */

static uint64_t clock_ns(clockid_t id)
{
	struct timespec ts;

	clock_gettime(id, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t counter(void)
{
	uint64_t v;
#if defined(__riscv)
	__asm__ volatile("rdtime %0" : "=r"(v));
#elif defined(__aarch64__)
	__asm__ volatile("isb; mrs %0, cntvct_el0" : "=r"(v)::"memory");
#elif defined(__x86_64__)
	uint32_t lo, hi;

	__asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
	v = (uint64_t)hi << 32 | lo;
#else
	v = clock_ns(CLOCK_MONOTONIC_RAW);
#endif
	return v;
}

static uint64_t port_device_now(void *ctx)
{
	(void)ctx;
	return clock_ns(CLOCK_MONOTONIC_RAW) + D_OFFSET_NS;
}

static uint64_t port_timer_read(void *ctx)
{
	(void)ctx;
	return counter();
}

static const struct perfq_dev_port port = { port_device_now, port_timer_read, NULL };

/* The counter's nominal rate: the architecture's register where it has one
 * (cntfrq_el0), else measured against CLOCK_MONOTONIC over 200 ms, to 4
 * significant digits (the host fits the real rate; this is its prior). */
static uint64_t counter_hz(void)
{
	uint64_t c0, c1, t0, t1, hz, scale = 1;
	struct timespec nap = { 0, 200000000 };
#if defined(__aarch64__)
	__asm__ volatile("mrs %0, cntfrq_el0" : "=r"(hz));
	if (hz)
		return hz;
#endif
	t0 = clock_ns(CLOCK_MONOTONIC);
	c0 = counter();
	nanosleep(&nap, NULL);
	c1 = counter();
	t1 = clock_ns(CLOCK_MONOTONIC);
	hz = (uint64_t)((double)(c1 - c0) * 1e9 / (double)(t1 - t0));
	while (hz / scale >= 10000)
		scale *= 10;
	return (hz + scale / 2) / scale * scale;
}

/* ---- Options ------------------------------------------------------------ */

struct options {
	const char *region;
	int create;
	unsigned workers;
	double rate;
	int jobs;
	int truth;
	double duration;
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: perfq-device-example --region PATH [--create] [--workers N] [--rate R]\n"
		"                            [--jobs] [--truth] [--duration S]\n"
		"A perfq device on perfq_device.h alone: N workers record `tick` events at R per\n"
		"second each into their device queues, a collector moves them into the region\n"
		"(a file under /dev/shm), a timer server answers the host's register reads.\n"
		"  --region PATH  the region file; --create creates or resizes it (else it\n"
		"                 must exist, as a BAR's backing file does)\n"
		"  --workers N    worker threads (default 2, at most %d)\n"
		"  --rate R       records per second per worker (default 1000)\n"
		"  --jobs         also serve perfq-demo-app's job queue (two job workers)\n"
		"  --truth        each tick's arg is the true host CLOCK_MONOTONIC at the record,\n"
		"                 within +-500 ns (0: not known that well)\n"
		"  --duration S   stop S seconds after the host's first sync round\n"
		"Workers start at the host's first sync round.  Until SIGINT or SIGTERM; then\n"
		"one JSON line: emitted, dropped, delivered, in total and per stream.\n",
		MAX_WORKERS);
}

static int parse(int argc, char **argv, struct options *o)
{
	int i;

	for (i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			usage(stdout);
			exit(0);
		} else if (!strcmp(a, "--create")) {
			o->create = 1;
		} else if (!strcmp(a, "--jobs")) {
			o->jobs = 1;
		} else if (!strcmp(a, "--truth")) {
			o->truth = 1;
		} else if (v && !strcmp(a, "--region")) {
			o->region = argv[++i];
		} else if (v && !strcmp(a, "--workers")) {
			o->workers = (unsigned)strtoul(argv[++i], NULL, 10);
		} else if (v && !strcmp(a, "--rate")) {
			o->rate = strtod(argv[++i], NULL);
		} else if (v && !strcmp(a, "--duration")) {
			o->duration = strtod(argv[++i], NULL);
		} else {
			fprintf(stderr, "perfq-device-example: unknown or incomplete option '%s'\n", a);
			return -1;
		}
	}
	if (!o->region) {
		fprintf(stderr, "perfq-device-example: --region PATH is required\n");
		return -1;
	}
	if (o->workers > MAX_WORKERS || o->rate < 0 || o->duration < 0) {
		fprintf(stderr, "perfq-device-example: --workers 0..%d, --rate and --duration >= 0\n",
			MAX_WORKERS);
		return -1;
	}
	return 0;
}

/* ---- The device --------------------------------------------------------- */

struct device {
	struct options o;
	void *base;
	struct perfq_region_header h;
	struct perfq_dev_jobq jobq;
	unsigned nqueues;
	struct perfq_dev_queue queues[MAX_WORKERS + JOB_WORKERS];
	struct perfq_dev_queue *qp[MAX_WORKERS + JOB_WORKERS];
	struct perfq_dev_delivery delivery[MAX_WORKERS + JOB_WORKERS];
	struct perfq_dev_collector collector;
	struct perfq_dev_mode_b mode_b;
	struct perfq_dev_timer timer;
	atomic_int go, stop_workers, stop_collector, stop_timer;
	atomic_ullong jobs_done, timer_rounds;
};

/* The one device of this program (its threads reach it from here). */
static struct device device;

static void nap_ns(uint64_t ns)
{
	struct timespec ts = { (time_t)(ns / 1000000000u), (long)(ns % 1000000000u) };

	nanosleep(&ts, NULL);
}

static void futex(void *word, int op, uint32_t val, uint64_t timeout_ns)
{
	struct timespec ts = { (time_t)(timeout_ns / 1000000000u),
			       (long)(timeout_ns % 1000000000u) };

	syscall(SYS_futex, word, op, val, timeout_ns ? &ts : NULL, NULL, 0);
}

/* D, and in *truth the host's CLOCK_MONOTONIC at the same instant: the
 * middle of a bracket of two reads around D's, retried until the bracket
 * is at most TRUTH_BRACKET_NS (a thread preempted in between would make
 * the truth wrong by the preemption); 0 when no try was that tight. */
static uint64_t truth_read(uint64_t *truth)
{
	uint64_t t0, t1, d;
	int tries;

	for (tries = 0; tries < 32; tries++) {
		t0 = clock_ns(CLOCK_MONOTONIC);
		d = port_device_now(NULL);
		t1 = clock_ns(CLOCK_MONOTONIC);
		if (t1 - t0 <= TRUTH_BRACKET_NS) {
			*truth = t0 + (t1 - t0) / 2;
			return d;
		}
	}
	*truth = 0;
	return d;
}

static void *worker(void *arg)
{
	struct perfq_dev_queue *q = arg;
	const double period = 1e9 / device.o.rate;
	uint64_t start, n = 0;

	while (!atomic_load(&device.go) && !atomic_load(&device.stop_workers))
		nap_ns(1000000);
	start = clock_ns(CLOCK_MONOTONIC);
	while (!atomic_load_explicit(&device.stop_workers, memory_order_relaxed)) {
		const uint64_t due = (uint64_t)((double)(clock_ns(CLOCK_MONOTONIC) - start) / period) + 1;

		for (; n < due; n++) {
			uint64_t d, arg = n;

			if (device.o.truth)
				d = truth_read(&arg);
			else
				d = port_device_now(NULL);
			perfq_dev_record_at(q, EV_TICK, PERFQ_KIND_INSTANT, d, arg);
		}
		nap_ns(period > 1e6 ? (uint64_t)period : 1000000);
	}
	return NULL;
}

static void *job_worker(void *arg)
{
	struct perfq_dev_queue *q = arg;
	const uint32_t index = q->stream - device.o.workers;
	unsigned idle = 0;

	while (!atomic_load_explicit(&device.stop_workers, memory_order_relaxed)) {
		int worked = 0;
		uint32_t ch;

		for (ch = index; ch < device.jobq.channels; ch += JOB_WORKERS) {
			struct perfq_job job;
			struct perfq_job_completion c = { 0 };
			uint64_t t0;

			if (!perfq_dev_jobq_can_complete(&device.jobq, ch) ||
			    !perfq_dev_jobq_take(&device.jobq, ch, &job))
				continue;
			c.corr_id = job.corr_id;
			c.start_time = port_device_now(NULL);
			perfq_dev_record_at(q, EV_JOB_START, PERFQ_KIND_BEGIN, c.start_time,
					    job.corr_id);
			t0 = clock_ns(CLOCK_MONOTONIC);
			while (clock_ns(CLOCK_MONOTONIC) - t0 < job.duration_ns % 1000000000u)
				;
			c.end_time = port_device_now(NULL);
			perfq_dev_record_at(q, EV_JOB_END, PERFQ_KIND_END, c.end_time, job.corr_id);
			perfq_dev_jobq_complete(&device.jobq, ch, &c);
			atomic_fetch_add(&device.jobs_done, 1);
			worked = 1;
		}
		idle = worked ? 0 : idle + 1;
		if (idle > 64)
			nap_ns(idle > 1000 ? 1000000 : 50000);
	}
	return NULL;
}

static void *collector(void *arg)
{
	struct device *dev = arg;
	uint64_t sleep_ns = 1000, deadline;

	while (!atomic_load(&dev->stop_collector) && !perfq_dev_collector_fault(&dev->collector)) {
		const size_t moved = perfq_dev_collect(&dev->collector);

		/* A full batch: on at once.  A trickle: in batches of 1 ms, not
		 * chasing the workers through the cache lines they write. */
		if (moved >= dev->collector.batch) {
			sleep_ns = 1000;
			continue;
		}
		if (moved)
			sleep_ns = 1000000;
		nap_ns(sleep_ns);
		sleep_ns = sleep_ns < 1000000 ? sleep_ns * 2 : 1000000;
	}
	/* Deliver what is queued, as long as the host makes room (5 s). */
	deadline = clock_ns(CLOCK_MONOTONIC) + 5000000000ull;
	while (!perfq_dev_collector_drained(&dev->collector) &&
	       !perfq_dev_collector_fault(&dev->collector) && clock_ns(CLOCK_MONOTONIC) < deadline)
		if (!perfq_dev_collect(&dev->collector))
			nap_ns(1000000);
	perfq_dev_collector_finish(&dev->collector, dev->base, &dev->h);
	return NULL;
}

static void *timer_server(void *arg)
{
	struct device *dev = arg;
	struct perfq_timer_page *page = dev->timer.page;
	uint64_t quiet_since = clock_ns(CLOCK_MONOTONIC);
	unsigned n = 0;

	/* A round measures how long a register read takes: run first. */
	setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), -15);
	while (!atomic_load_explicit(&dev->stop_timer, memory_order_relaxed)) {
		switch (perfq_dev_timer_poll(&dev->timer)) {
		case PERFQ_DEV_TIMER_CLOSED: {
			/* Awake from a little before the round the host
			 * announced until a little after; else asleep, 2 ms at
			 * most. */
			const uint64_t idle_us = perfq_dev_timer_idle_us(&dev->timer, PERFQ_DEV_TIMER_LEAD_US,
									   PERFQ_DEV_TIMER_GRACE_US);

			quiet_since = clock_ns(CLOCK_MONOTONIC); /* no round: nobody is quiet */
			if (idle_us == 0)
				break;
			futex(&page->window, FUTEX_WAIT, 0, idle_us < 2000 ? idle_us * 1000 : 2000000);
			break;
		}
		case PERFQ_DEV_TIMER_SERVED:
			atomic_store(&dev->go, 1);
			quiet_since = clock_ns(CLOCK_MONOTONIC);
			break;
		case PERFQ_DEV_TIMER_PUBLISHED:
			atomic_fetch_add(&dev->timer_rounds, 1);
			futex(&dev->timer.sync->device_samples.round, FUTEX_WAKE, INT32_MAX, 0);
			break;
		case PERFQ_DEV_TIMER_WAITING:
			atomic_store(&dev->go, 1);
			/* A host gone quiet (it died mid-round): poll slowly. */
			if ((++n & 255) == 0 && clock_ns(CLOCK_MONOTONIC) - quiet_since > 20000000) {
				perfq_dev_timer_asleep(&dev->timer);
				futex(&page->window, FUTEX_WAIT, dev->timer.round, 2000000);
			}
			break;
		}
	}
	return NULL;
}

static int map_region(struct device *dev)
{
	const uint64_t want = dev->o.create ? 0 : 1;
	struct perfq_dev_geometry g = {
		.ring_capacity = 1u << 16, .dict_capacity = 64, .app_size = 256 * 1024,
		.device_clock_hz = 1000000000u, .timer_hz = counter_hz(),
		/* A file under /dev/shm is system memory; mode B: the device
		 * converts its records when the host asks for it. */
		.features = PERFQ_FEAT_TIMER_REQRESP | PERFQ_FEAT_DEVICE_NOW |
			    PERFQ_FEAT_SYNC_MODE_B | PERFQ_FEAT_SYSTEM_MEMORY |
			    (dev->o.jobs ? PERFQ_FEAT_JOB_QUEUE : 0),
		.device_name = "perfq-device-example",
	};
	struct perfq_region_header h;
	struct stat st;
	int fd, rc;

	if (perfq_dev_layout(&g, &h))
		return fprintf(stderr, "perfq-device-example: bad geometry\n"), -1;
	fd = open(dev->o.region, O_RDWR | (dev->o.create ? O_CREAT : 0), 0660);
	if (fd < 0 || fstat(fd, &st))
		return fprintf(stderr, "perfq-device-example: %s: %s\n", dev->o.region,
			       strerror(errno)), -1;
	if ((uint64_t)st.st_size > h.region_size)
		g.min_region_size = (uint64_t)st.st_size; /* never shrink a BAR file */
	else if (want || ftruncate(fd, (off_t)h.region_size))
		return fprintf(stderr, "perfq-device-example: %s: %llu bytes needed\n",
			       dev->o.region, (unsigned long long)h.region_size), -1;
	perfq_dev_layout(&g, &h);
	dev->base = mmap(NULL, h.region_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (dev->base == MAP_FAILED)
		return fprintf(stderr, "perfq-device-example: mmap: %s\n", strerror(errno)), -1;
	rc = perfq_dev_region_init(dev->base, h.region_size, &g, &dev->h);
	if (!rc)
		rc = perfq_dev_dictionary_write(dev->base, &dev->h, dictionary,
						sizeof(dictionary) / sizeof(dictionary[0]));
	if (!rc && dev->o.jobs)
		rc = perfq_dev_jobq_format(&dev->jobq,
					   perfq_dev_section(dev->base, &dev->h, PERFQ_SECTION_APP),
					   dev->h.sections[PERFQ_SECTION_APP].size, 8);
	if (rc)
		return fprintf(stderr, "perfq-device-example: region layout failed (%d)\n", rc), -1;
	perfq_dev_region_publish(dev->base);
	return 0;
}

static void print_accounting(struct device *dev, const char *why)
{
	unsigned long long emitted = 0, dropped = 0, delivered = 0;
	unsigned i;

	printf("{\"streams\":[");
	for (i = 0; i < dev->nqueues; i++) {
		const unsigned long long e = perfq_dev_queue_emitted(&dev->queues[i]);
		const unsigned long long d = perfq_dev_queue_dropped(&dev->queues[i]) +
					     dev->delivery[i].undelivered;

		printf("%s{\"stream\":%u,\"name\":\"%s%u\",\"emitted\":%llu,\"dropped\":%llu,"
		       "\"delivered\":%llu,\"lost_reported\":%llu}",
		       i ? "," : "", i, i < dev->o.workers ? "worker" : "jobworker",
		       i < dev->o.workers ? i : i - dev->o.workers, e, d,
		       (unsigned long long)dev->delivery[i].delivered,
		       (unsigned long long)dev->delivery[i].lost_reported);
		emitted += e;
		dropped += d;
		delivered += dev->delivery[i].delivered;
	}
	printf("],\"emitted\":%llu,\"dropped\":%llu,\"delivered\":%llu,\"jobs_completed\":%llu,"
	       "\"truth_bracket_ns\":%u,\"timer_hz\":%llu,\"timer_reads_served\":%llu,\"sync_rounds\":%llu,\"signal\":\"%s\"%s}\n",
	       emitted, dropped, delivered, (unsigned long long)atomic_load(&dev->jobs_done), TRUTH_BRACKET_NS,
	       (unsigned long long)dev->h.timer_hz, (unsigned long long)dev->timer.served,
	       (unsigned long long)atomic_load(&dev->timer_rounds), why,
	       perfq_dev_collector_fault(&dev->collector) ? ",\"fault\":\"the host wrote a bad head\"" : "");
	fflush(stdout);
}

/* Waits for SIGINT/SIGTERM, or --duration from the first sync round. */
static const char *wait_for_stop(struct device *dev, const sigset_t *sigs)
{
	uint64_t t_go = 0;

	for (;;) {
		struct timespec ts = { 0, 50000000 };
		const int sig = sigtimedwait(sigs, NULL, &ts);

		if (sig == SIGINT || sig == SIGTERM)
			return strsignal(sig);
		if (!t_go && atomic_load(&dev->go))
			t_go = clock_ns(CLOCK_MONOTONIC);
		if (t_go && dev->o.duration > 0 &&
		    (double)(clock_ns(CLOCK_MONOTONIC) - t_go) >= dev->o.duration * 1e9)
			return "none";
	}
}

int main(int argc, char **argv)
{
	pthread_t threads[MAX_WORKERS + JOB_WORKERS], col, tim;
	unsigned i, idle, rounds;
	const char *why;
	sigset_t sigs;

	device.o.workers = 2;
	device.o.rate = 1000;
	if (parse(argc, argv, &device.o))
		return usage(stderr), 2;
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	if (map_region(&device))
		return 1;
	device.nqueues = device.o.workers + (device.o.jobs ? JOB_WORKERS : 0);
	for (i = 0; i < device.nqueues; i++) {
		struct perfq_record *slots = calloc(QUEUE_RECORDS, sizeof(*slots));

		if (!slots || perfq_dev_queue_init(&device.queues[i], (uint16_t)i, slots, QUEUE_RECORDS))
			return fprintf(stderr, "perfq-device-example: out of memory\n"), 1;
		device.qp[i] = &device.queues[i];
	}
	perfq_dev_collector_init(&device.collector, device.base, &device.h, device.qp, device.delivery, device.nqueues,
				 &port);
	/* Mode B: the collector converts records to host time as they cross,
	 * with the model it fits from the host's samples in the mailbox. */
	perfq_dev_mode_b_init(&device.mode_b, device.base, &device.h);
	perfq_dev_collector_set_converter(&device.collector,
					  &(struct perfq_dev_converter){ perfq_dev_mode_b_poll,
									 perfq_dev_mode_b_convert,
									 &device.mode_b });
	perfq_dev_timer_init(&device.timer, device.base, &device.h, &port);
	pthread_create(&col, NULL, collector, &device);
	pthread_create(&tim, NULL, timer_server, &device);
	for (i = 0; i < device.nqueues; i++)
		pthread_create(&threads[i], NULL, i < device.o.workers ? worker : job_worker,
			       &device.queues[i]);
	perfq_dev_set_state(device.base, &device.h, PERFQ_DEVICE_RUNNING);
	fprintf(stderr, "perfq-device-example: running on %s (timer %llu Hz, %u workers%s)\n",
		device.o.region, (unsigned long long)device.h.timer_hz, device.o.workers,
		device.o.jobs ? ", job queue" : "");

	why = wait_for_stop(&device, &sigs);
	atomic_store(&device.stop_workers, 1);
	for (i = 0; i < device.nqueues; i++)
		pthread_join(threads[i], NULL);
	atomic_store(&device.stop_collector, 1);
	pthread_join(col, NULL);
	/* The host converts a time once a round after it is in: answer its
	 * reads until it stops asking (0.3 s without a round, 2 s at most). */
	rounds = (unsigned)atomic_load(&device.timer_rounds);
	for (i = 0, idle = 0; i < 40 && idle < 6; i++, idle++) {
		struct timespec ts = { 0, 50000000 };
		int sig = sigtimedwait(&sigs, NULL, &ts);

		if (sig == SIGINT || sig == SIGTERM)
			break;
		if ((unsigned)atomic_load(&device.timer_rounds) != rounds ||
		    PERFQ_DEV_LOAD_ACQUIRE(&device.timer.page->window)) {
			rounds = (unsigned)atomic_load(&device.timer_rounds);
			idle = 0;
		}
	}
	atomic_store(&device.stop_timer, 1);
	pthread_join(tim, NULL);
	print_accounting(&device, why);
	return perfq_dev_collector_fault(&device.collector) ? 1 : 0;
}
