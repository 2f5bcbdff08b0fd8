/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR MIT */
/*
 * perfq_ioctl.h - the kernel UAPI of perfq.ko: what /dev/perfqN answers to
 * (mmap of the shared region, PERFQ_IOC_INFO, PERFQ_IOC_CLOCK_SAMPLES).
 * Built on perfq_abi.h (the region layout); include this one to talk to
 * the driver.  Strict C11 and C++, and the kernel's own C.
 */
#ifndef PERFQ_IOCTL_H
#define PERFQ_IOCTL_H

#include "perfq_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ================================================================== */
/* BEGIN driver interface: /dev/perfqN ioctls and mmap (perfq.ko)     */
/* ================================================================== */

/*
 * The perfq driver binds a device whose BAR holds the shared region and
 * exposes it as /dev/perfqN.
 *
 * mmap(2): the file offset is a byte offset into the region (page aligned);
 * offset + length must lie inside region_size.  Sections the host writes
 * (DEV_CTRL, HOST_CTRL, TIMER, SYNC, APP) may be mapped read-write; the
 * others (HEADER, DICT, RING) only read-only, and a range that touches one
 * of them must be mapped without PROT_WRITE.  MAP_SHARED only, never
 * PROT_EXEC.  Anything else is -EINVAL (-EACCES for a forbidden write).
 * When the device goes away the driver revokes every mapping: a later
 * access raises SIGBUS, and every ioctl returns -ENODEV.
 *
 * ioctls: each argument starts with `size`, set by the caller to the size
 * of the struct it was compiled with; the driver answers -EINVAL when it
 * or the size encoded in the command differs from its own, and stores its
 * interface version in `version`.  Unknown commands get -ENOTTY.
 */
#if defined(__KERNEL__)
#include <linux/ioctl.h>
#elif defined(__linux__)
#include <linux/ioctl.h>
#endif

#define PERFQ_IOC_TYPE 0xCF
#define PERFQ_IOC_VERSION 1u
#define PERFQ_PCI_ADDR_LEN 32u
#define PERFQ_IOC_TIMEOUT_DEFAULT_NS 2000000ULL /* per register read */
#define PERFQ_IOC_TIMEOUT_MAX_NS 10000000ULL    /* interrupts are off meanwhile */
/*
 * A round that ends with -ETIMEDOUT after at least this many samples (or n,
 * if fewer were asked) is kept by its reader with the samples it has: a
 * round needs only its best few, so a device away for a while costs the
 * round its tail, not the round.  perfq-daemon and perfq-guest both do so.
 */
#define PERFQ_IOC_ROUND_MIN_SAMPLES 4u

/* perfq_ioc_info.flags */
#define PERFQ_INFO_LINK_OF_PORT (1u << 0) /* link fields are the nearest upstream PCIe port's */

struct perfq_ioc_info {
	perfq_u32 size; /* in: sizeof(struct perfq_ioc_info) */
	perfq_u32 version; /* out: PERFQ_IOC_VERSION */
	perfq_u32 abi_version; /* out: the region header's */
	perfq_u32 flags; /* out: PERFQ_INFO_* */
	perfq_u64 region_size; /* out: the validated geometry */
	perfq_u64 ring_capacity;
	perfq_u64 features;
	perfq_u64 device_clock_hz;
	perfq_u64 timer_hz;
	perfq_u64 bar_size; /* out: bytes of the BAR that holds the region */
	perfq_u64 records_seen; /* out: the tail the device last posted */
	perfq_u32 link_speed_mtps; /* out: PCIe link speed in MT/s, 0 = unknown */
	perfq_u32 link_width; /* out: lanes, 0 = unknown */
	perfq_u32 max_samples; /* out: PERFQ_SYNC_MAX_SAMPLES */
	perfq_u32 reserved0;
	perfq_u8 device_name[PERFQ_DEVICE_NAME_LEN]; /* out: NUL-terminated */
	perfq_u8 pci_address[PERFQ_PCI_ADDR_LEN]; /* out: "0000:01:00.0", NUL-terminated */
	struct perfq_section sections[PERFQ_SECTION_COUNT]; /* out */
	perfq_u64 reserved[8];
};

/*
 * n bracketed reads of the timer register R, taken by the kernel with
 * preemption and interrupts off around each one (as PTP_SYS_OFFSET_EXTENDED):
 * samples[i] = {ktime_get_ns() before, R, ktime_get_ns() after}, in host
 * CLOCK_MONOTONIC.  With PERFQ_FEAT_TIMER_REQRESP a read is the
 * request/response exchange of perfq_timer_page, bounded by timeout_ns
 * (interrupts stay off for one read at most; a read that times out is
 * retried a few times with interrupts on).  Returns 0 with count == n, or
 * -ETIMEDOUT with count = the samples taken before the device went quiet;
 * -EINTR when a signal arrives while it waits for the device, -ENODEV when
 * the device is removed meanwhile (the round is cut short, never waited out).
 * A nonzero `round` opens the device's sync window for that round first
 * (and waits, interrupts on, for the device to answer) and closes it after.
 */
struct perfq_ioc_clock_samples {
	perfq_u32 size; /* in: sizeof(struct perfq_ioc_clock_samples) */
	perfq_u32 version; /* out: PERFQ_IOC_VERSION */
	perfq_u32 n; /* in: 1..PERFQ_SYNC_MAX_SAMPLES */
	perfq_u32 round; /* in: sync round whose window to open, 0 = leave it */
	perfq_u64 timeout_ns; /* in: per read, 0 = default, at most PERFQ_IOC_TIMEOUT_MAX_NS */
	perfq_u32 count; /* out: samples taken */
	perfq_u32 flags; /* in: zero */
	perfq_u64 reserved[4]; /* in: zero */
	struct perfq_clock_sample samples[PERFQ_SYNC_MAX_SAMPLES]; /* out */
};

#define PERFQ_IOC_INFO _IOWR(PERFQ_IOC_TYPE, 0x00, struct perfq_ioc_info)
#define PERFQ_IOC_CLOCK_SAMPLES _IOWR(PERFQ_IOC_TYPE, 0x01, struct perfq_ioc_clock_samples)

PERFQ_CHECK_SIZE(perfq_ioc_info, 376);
PERFQ_CHECK_OFFSET(perfq_ioc_info, size, 0);
PERFQ_CHECK_OFFSET(perfq_ioc_info, version, 4);
PERFQ_CHECK_OFFSET(perfq_ioc_info, abi_version, 8);
PERFQ_CHECK_OFFSET(perfq_ioc_info, flags, 12);
PERFQ_CHECK_OFFSET(perfq_ioc_info, region_size, 16);
PERFQ_CHECK_OFFSET(perfq_ioc_info, ring_capacity, 24);
PERFQ_CHECK_OFFSET(perfq_ioc_info, features, 32);
PERFQ_CHECK_OFFSET(perfq_ioc_info, device_clock_hz, 40);
PERFQ_CHECK_OFFSET(perfq_ioc_info, timer_hz, 48);
PERFQ_CHECK_OFFSET(perfq_ioc_info, bar_size, 56);
PERFQ_CHECK_OFFSET(perfq_ioc_info, records_seen, 64);
PERFQ_CHECK_OFFSET(perfq_ioc_info, link_speed_mtps, 72);
PERFQ_CHECK_OFFSET(perfq_ioc_info, link_width, 76);
PERFQ_CHECK_OFFSET(perfq_ioc_info, max_samples, 80);
PERFQ_CHECK_OFFSET(perfq_ioc_info, device_name, 88);
PERFQ_CHECK_OFFSET(perfq_ioc_info, pci_address, 152);
PERFQ_CHECK_OFFSET(perfq_ioc_info, sections, 184);
PERFQ_CHECK_OFFSET(perfq_ioc_info, reserved, 312);
PERFQ_CHECK_SIZE(perfq_ioc_clock_samples, 64 + PERFQ_SYNC_MAX_SAMPLES * 32);
PERFQ_CHECK_OFFSET(perfq_ioc_clock_samples, size, 0);
PERFQ_CHECK_OFFSET(perfq_ioc_clock_samples, version, 4);
PERFQ_CHECK_OFFSET(perfq_ioc_clock_samples, n, 8);
PERFQ_CHECK_OFFSET(perfq_ioc_clock_samples, round, 12);
PERFQ_CHECK_OFFSET(perfq_ioc_clock_samples, timeout_ns, 16);
PERFQ_CHECK_OFFSET(perfq_ioc_clock_samples, count, 24);
PERFQ_CHECK_OFFSET(perfq_ioc_clock_samples, flags, 28);
PERFQ_CHECK_OFFSET(perfq_ioc_clock_samples, reserved, 32);
PERFQ_CHECK_OFFSET(perfq_ioc_clock_samples, samples, 64);

/* ================================================================== */
/* END driver interface                                               */
/* ================================================================== */

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PERFQ_IOCTL_H */
