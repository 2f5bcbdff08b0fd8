/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR MIT */
/*
 * perfq_abi.h - the one binary interface shared by the perfq kernel module,
 * the device side (firmware or perfq-devsim) and the host side (libperfq,
 * perfq-daemon, instrumented applications).
 *
 * THE SHARED REGION
 *
 * A perfq device exposes one memory region (a PCI BAR, or a file under
 * /dev/shm for the software device).  The device creates it: it fills the
 * header page, every other section, and writes the header's magic word last
 * (release), so a host that sees the magic sees a complete header.  After
 * that the header is read-only for everybody.  All fields are little-endian
 * and naturally aligned; only explicitly sized types are used.
 *
 *   offset (default layout)        section             writer -> reader
 *   0x00000 +------------------+
 *           | header           |  HEADER             device (at init) -> host
 *   0x01000 +------------------+
 *           | device control   |  DEV_CTRL           tail:        device -> device
 *           |  tail            |                     head_mirror: host (posted) -> device
 *           |  head_mirror     |
 *   0x02000 +------------------+
 *           | host control     |  HOST_CTRL          tail_mirror: device (posted) -> host
 *           |  tail_mirror     |                     head:        host -> host
 *           |  head            |
 *   0x03000 +------------------+
 *           | timer register   |  TIMER              register and its request/response
 *   0x04000 +------------------+
 *           | time sync        |  SYNC               model: host -> device (mode A)
 *           |  model (seqlock) |                     device samples: device -> host
 *           |  device samples  |                     mailbox: host -> device (mode B)
 *           |  mailbox         |
 *   0x06000 +------------------+
 *           | event dictionary |  DICT               device (at init) -> host
 *           +------------------+
 *           | application area |  APP                defined by the workload (job queue)
 *           +------------------+
 *           | record ring      |  RING               records: device -> host
 *           |  capacity x 32 B |
 *           +------------------+  region_size
 *
 * Only the section table in the header is authoritative: a reader never
 * assumes the default offsets above.  Every section starts on a page
 * boundary, lies inside the region and overlaps no other section.
 *
 * THE RECORD RING AND ITS MIRRORED CONTROL WORDS
 *
 * The ring is single-producer (the device collector) single-consumer (the
 * host drain thread).  Positions are free-running u64 counters; slot =
 * position & (capacity - 1), capacity a power of two.  They never wrap in
 * practice, so tail - head is the fill level, and any fill above capacity,
 * or a tail behind the head, is corruption.
 *
 * Across PCIe a read is a round trip and a write is posted, so each control
 * word has two copies and each side polls only the copy local to it:
 *
 *   device collector:  reads head_mirror (DEV_CTRL, local),
 *                      writes records, then release-stores the new tail to
 *                      DEV_CTRL.tail and HOST_CTRL.tail_mirror.
 *   host drain thread: acquire-loads HOST_CTRL.tail_mirror (local),
 *                      reads records, then release-stores the new head to
 *                      HOST_CTRL.head and DEV_CTRL.head_mirror.
 *
 * The host never trusts the region: it validates the header once, keeps a
 * private copy of the geometry, and checks every tail it reads.
 */
#ifndef PERFQ_ABI_H
#define PERFQ_ABI_H

#ifdef __KERNEL__
#include <linux/types.h>
typedef __u8 perfq_u8;
typedef __u16 perfq_u16;
typedef __u32 perfq_u32;
typedef __u64 perfq_u64;
typedef __s64 perfq_s64;
#else
#include <stdint.h>
typedef uint8_t perfq_u8;
typedef uint16_t perfq_u16;
typedef uint32_t perfq_u32;
typedef uint64_t perfq_u64;
typedef int64_t perfq_s64;
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ */
/* Versioning                                                          */

/* "PERFQRGN" read as a little-endian u64. */
#define PERFQ_REGION_MAGIC 0x4e47525146524550ULL
#define PERFQ_ABI_VERSION 1u

#define PERFQ_PAGE_SIZE 4096u
#define PERFQ_CACHELINE 64u
#define PERFQ_RECORD_SIZE 32u
#define PERFQ_DEVICE_NAME_LEN 64u
#define PERFQ_EVENT_NAME_LEN 48u

/* Feature flags (header.features).  A reader refuses bits it does not know. */
#define PERFQ_FEAT_TIMER_REQRESP (1ULL << 0) /* timer read is a request/response exchange */
#define PERFQ_FEAT_SYNC_MODE_B (1ULL << 1)   /* device can convert times itself (mode B) */
#define PERFQ_FEAT_JOB_QUEUE (1ULL << 2)     /* application area holds the job queue */
#define PERFQ_FEAT_DEVICE_NOW (1ULL << 3)    /* the collector posts host_ctrl.device_now */
/*
 * The region is system memory (a BAR backed by host RAM, as QEMU's ivshmem
 * with a file behind it): the host may map it write-back.  Without this bit
 * the region is device memory: the host maps the ring (and dictionary)
 * write-combining at most and every other page uncached.  The timer page is
 * uncached either way.
 */
#define PERFQ_FEAT_SYSTEM_MEMORY (1ULL << 4)
#define PERFQ_FEAT_ALL \
	(PERFQ_FEAT_TIMER_REQRESP | PERFQ_FEAT_SYNC_MODE_B | PERFQ_FEAT_JOB_QUEUE | \
	 PERFQ_FEAT_DEVICE_NOW | PERFQ_FEAT_SYSTEM_MEMORY)

/* Bounds a reader enforces on the geometry. */
#define PERFQ_RING_CAPACITY_MIN 2ULL
#define PERFQ_RING_CAPACITY_MAX (1ULL << 32)
#define PERFQ_CLOCK_HZ_MAX 100000000000ULL /* 100 GHz */

/* ------------------------------------------------------------------ */
/* Records                                                             */

enum perfq_kind {
	PERFQ_KIND_INVALID = 0, /* a zeroed slot is never a valid record */
	PERFQ_KIND_BEGIN = 1,
	PERFQ_KIND_END = 2,
	PERFQ_KIND_INSTANT = 3,
	PERFQ_KIND_COUNTER = 4,
	PERFQ_KIND_LOST = 5, /* arg = number of records dropped on this stream */
	PERFQ_KIND_MAX = PERFQ_KIND_LOST,
};

enum perfq_clock_domain {
	PERFQ_CLOCK_HOST = 0,        /* host CLOCK_MONOTONIC, ns */
	PERFQ_CLOCK_DEVICE = 1,      /* device system clock D */
	PERFQ_CLOCK_DEVICE_TIMER = 2, /* device timer register R */
	PERFQ_CLOCK_HOST_BY_DEVICE = 3, /* host time computed on the device (mode B) */
	PERFQ_CLOCK_MAX = PERFQ_CLOCK_HOST_BY_DEVICE,
};

/* flags = kind | domain << 4; bits 8..15 are reserved and must be zero. */
#define PERFQ_FLAGS_KIND_MASK 0x000fu
#define PERFQ_FLAGS_DOMAIN_SHIFT 4
#define PERFQ_FLAGS_DOMAIN_MASK 0x00f0u
#define PERFQ_FLAGS_RESERVED_MASK 0xff00u
#define PERFQ_FLAGS(kind, domain) \
	((perfq_u16)((kind) | ((domain) << PERFQ_FLAGS_DOMAIN_SHIFT)))
/* The two halves of flags: the one decoding every reader uses. */
#define PERFQ_FLAGS_KIND(flags) ((unsigned)((flags) & PERFQ_FLAGS_KIND_MASK))
#define PERFQ_FLAGS_DOMAIN(flags) \
	((unsigned)(((flags) & PERFQ_FLAGS_DOMAIN_MASK) >> PERFQ_FLAGS_DOMAIN_SHIFT))

struct perfq_record {
	perfq_u64 index; /* per-stream sequence number: a gap is a loss */
	perfq_u32 event; /* id in the event dictionary of the source */
	perfq_u16 stream; /* worker/queue the record came from */
	perfq_u16 flags; /* PERFQ_FLAGS(kind, clock domain) */
	perfq_u64 time; /* in the clock domain named by flags */
	perfq_u64 arg; /* correlation id, byte count, counter value... */
};

/* ------------------------------------------------------------------ */
/* The region header (section HEADER, page 0)                          */

enum perfq_section_id {
	PERFQ_SECTION_HEADER = 0,
	PERFQ_SECTION_DEV_CTRL = 1,
	PERFQ_SECTION_HOST_CTRL = 2,
	PERFQ_SECTION_TIMER = 3,
	PERFQ_SECTION_SYNC = 4,
	PERFQ_SECTION_DICT = 5,
	PERFQ_SECTION_APP = 6,
	PERFQ_SECTION_RING = 7,
	PERFQ_SECTION_COUNT = 8,
};

struct perfq_section {
	perfq_u64 offset; /* from the start of the region, page aligned */
	perfq_u64 size; /* bytes, a multiple of the page size */
};

struct perfq_region_header {
	perfq_u64 magic; /* PERFQ_REGION_MAGIC, written last by the device */
	perfq_u32 abi_version; /* PERFQ_ABI_VERSION */
	perfq_u32 header_size; /* sizeof(struct perfq_region_header) */
	perfq_u64 features; /* PERFQ_FEAT_* */
	perfq_u64 region_size; /* bytes, a multiple of the page size */
	perfq_u64 ring_capacity; /* records, a power of two */
	perfq_u32 record_size; /* PERFQ_RECORD_SIZE */
	perfq_u32 dict_capacity; /* entries the DICT section can hold */
	perfq_u64 device_clock_hz; /* nominal rate of the device system clock D */
	perfq_u64 timer_hz; /* nominal rate of the timer register R */
	perfq_u8 device_name[PERFQ_DEVICE_NAME_LEN]; /* NUL-terminated, printable */
	struct perfq_section sections[PERFQ_SECTION_COUNT];
	perfq_u64 reserved[16]; /* zero */
};

/* ------------------------------------------------------------------ */
/* Control pages (sections DEV_CTRL and HOST_CTRL)                     */

/* Lives on the device: the device polls it, the host only writes to it. */
struct perfq_dev_ctrl {
	perfq_u64 tail; /* device-owned producer position */
	perfq_u8 pad0[PERFQ_CACHELINE - 8];
	perfq_u64 head_mirror; /* host's head, posted by the host */
	perfq_u8 pad1[PERFQ_CACHELINE - 8];
	perfq_u64 reserved[8];
};

enum perfq_device_state {
	PERFQ_DEVICE_INIT = 0,
	PERFQ_DEVICE_RUNNING = 1,
	PERFQ_DEVICE_STOPPED = 2, /* the collector has exited; tail is final */
};

/* Lives in host memory: the host polls it, the device only writes to it. */
struct perfq_host_ctrl {
	perfq_u64 tail_mirror; /* device's tail, posted by the device */
	perfq_u8 pad0[PERFQ_CACHELINE - 8];
	perfq_u64 head; /* host-owned consumer position */
	perfq_u8 pad1[PERFQ_CACHELINE - 8];
	perfq_u32 device_state; /* enum perfq_device_state, posted by the device */
	perfq_u32 reserved0;
	perfq_u64 heartbeat; /* bumped by the device collector on every pass */
	/* With PERFQ_FEAT_DEVICE_NOW: the device clock D, read by the collector
	 * before each tail it posts, so that no record the host reads is stamped
	 * later.  Informational: the host converts a device time only once a
	 * sync round after it is in (a forward clock step smaller than the time
	 * a record takes to reach the host cannot be seen here), and does not
	 * read it. */
	perfq_u64 device_now;
	perfq_u64 reserved[5];
};

/* ------------------------------------------------------------------ */
/* Timer register page (section TIMER)                                 */

/*
 * On hardware, `value` is the timer register R itself: a load from it is a
 * PCIe non-posted read that returns R at the moment the device serves it.
 * With PERFQ_FEAT_TIMER_REQRESP (the software device) the same exchange is
 * made explicit: the reader stores a new tag into req_tag (release); the
 * device samples R, stores it into resp_value and then the tag into
 * resp_tag (release); the reader spins, with a timeout, until resp_tag
 * equals its tag, then reads resp_value.  One reader at a time.
 *
 * `window` is nonzero while a sync round is open; the device's serving
 * thread sleeps while it is zero (a futex on this word where host and
 * device share a kernel, slow polling where they do not).
 *
 * `next_window_us` (host -> device, 0: not known) is when the host expects
 * to open the next round's window, in microseconds after the device saw
 * the last one close; a device may poll the window at full speed from a
 * little before then instead of sleeping.  While it does, it sets `serving`
 * (device -> host) to 1, and the host opens the window without waking it
 * or giving it the CPU; it clears `serving` (a full barrier, then it looks
 * at `window` again) before it sleeps.  Both words are hints: a device
 * that never sets `serving` is woken every round, and a host that never
 * announces a round finds the device asleep.
 */
struct perfq_timer_page {
	perfq_u64 value; /* R, for hardware with a directly readable register */
	perfq_u8 pad0[PERFQ_CACHELINE - 8];
	perfq_u64 req_tag; /* reader -> device */
	perfq_u8 pad1[PERFQ_CACHELINE - 8];
	perfq_u64 resp_tag; /* device -> reader */
	perfq_u64 resp_value; /* R sampled when the request was served */
	perfq_u8 pad2[PERFQ_CACHELINE - 16];
	perfq_u32 window; /* futex word: nonzero while a sync round is open */
	perfq_u32 serving; /* device -> host: 1 while it polls `window` awake */
	perfq_u32 next_window_us; /* host -> device: the next window, after the last closed */
	perfq_u32 reserved0;
	perfq_u64 reserved[6];
};

/* ------------------------------------------------------------------ */
/* Time sync page (section SYNC)                                       */

#define PERFQ_SYNC_MAX_SAMPLES 64u

/*
 * One bracketed read: `before` and `after` are read from one clock, `value`
 * from another in between.  Host samples: (H1, R2, H2).  Device samples:
 * (R1 before, D, R1 after).
 */
struct perfq_clock_sample {
	perfq_u64 before;
	perfq_u64 value;
	perfq_u64 after;
	perfq_u64 reserved;
};

/*
 * The time sync buffer: the current clock model, written by the host under
 * a sequence word (seqlock: odd while being written).  A reader copies the
 * model, then re-reads seq; equal and even means the copy is consistent.
 *   host_ns = host_ref_ns + (device_time - device_ref) * (1 + rate_ppb / 1e9)
 * expressed for integer arithmetic as mult/shift.
 */
struct perfq_sync_model {
	perfq_u64 seq;
	perfq_u64 device_ref; /* device time D at the reference point */
	perfq_s64 host_ref_ns; /* host time at the reference point (signed: any offset) */
	perfq_s64 rate_ppb; /* drift of host vs device, parts per billion */
	perfq_u64 uncertainty_ns;
	perfq_u64 valid_from_device; /* first device time this model applies to */
	perfq_u32 segment; /* increments when a clock step starts a new segment */
	perfq_u32 flags; /* PERFQ_SYNC_MODEL_VALID */
	perfq_u64 reserved[9];
};
#define PERFQ_SYNC_MODEL_VALID 1u

/* A batch of samples under a sequence word: the writer bumps seq to odd,
 * writes count and samples, then bumps seq to even. */
struct perfq_sample_batch {
	perfq_u64 seq;
	perfq_u32 count; /* <= PERFQ_SYNC_MAX_SAMPLES */
	perfq_u32 round; /* sync round the samples belong to */
	perfq_u64 reserved[6];
	struct perfq_clock_sample samples[PERFQ_SYNC_MAX_SAMPLES];
};

enum perfq_sync_mode {
	PERFQ_SYNC_MODE_A = 0, /* host computes and writes the model */
	PERFQ_SYNC_MODE_B = 1, /* host sends samples, device computes */
};

/*
 * Mode B: a line the device converts its times with (device -> host), so
 * that the host can bound what the device converted with its own model
 * (the device's differs: it fits the rounds it took, and takes the newest
 * when late).  host = host_ref_ns + host_frac + (d - device_ref) *
 * ns_per_tick, the two doubles stored as their IEEE-754 bits.  Written
 * under `seq` (odd while written) in slot id % PERFQ_SYNC_LINES, before
 * `lines_newest` names it and before any record converted with it is
 * published: a record the host reads after seeing lines_newest = n was
 * converted with line n or a later one, and one it read before it loaded
 * lines_newest = m with line m or an earlier one.  A device that publishes
 * no lines (lines_newest 0) has its converted times kept without a bound.
 */
#define PERFQ_SYNC_LINES 8u
struct perfq_sync_line_pub {
	perfq_u64 seq;
	perfq_u64 id; /* 1, 2, ...: lines_newest when it was published */
	perfq_u64 device_ref;
	perfq_u64 host_ref_ns;
	perfq_u64 host_frac; /* double bits: ns in [0, 1) past host_ref_ns */
	perfq_u64 ns_per_tick; /* double bits: host ns per device tick */
	perfq_u64 reserved[2];
};

struct perfq_sync_page {
	struct perfq_sync_model model; /* host -> device: the time sync buffer */
	perfq_u32 mode; /* enum perfq_sync_mode, host -> device */
	perfq_u32 reserved0;
	perfq_u64 reserved[7];
	struct perfq_sample_batch device_samples; /* device -> host: (R1, D, R1) */
	struct perfq_sample_batch mailbox; /* host -> device, mode B: (H1, R2, H2) */
	/* device -> host, mode B: the lines the device converts with */
	perfq_u64 lines_newest; /* id of the newest line published (0: none) */
	perfq_u64 reserved1[7];
	struct perfq_sync_line_pub lines[PERFQ_SYNC_LINES];
};

/* ------------------------------------------------------------------ */
/* Event dictionary (section DICT)                                     */

/* Event id 0 is reserved in every dictionary for loss reports (kind LOST). */
#define PERFQ_EVENT_LOST 0u

/* perfq_dict_entry.flags: the record's arg is a byte count (the host names
 * it "bytes" and the report gives the event's throughput).  Bits not
 * defined here are zero, and a host ignores them. */
#define PERFQ_DICT_ARG_BYTES 0x0001u

struct perfq_dict_entry {
	perfq_u32 event; /* event id used in records */
	perfq_u16 kind; /* enum perfq_kind the event is recorded with */
	perfq_u16 flags; /* PERFQ_DICT_* (zero before they existed) */
	perfq_u64 reserved1;
	perfq_u8 name[PERFQ_EVENT_NAME_LEN]; /* NUL-terminated */
};

struct perfq_dict_header {
	perfq_u32 count; /* valid entries that follow */
	perfq_u32 entry_size; /* sizeof(struct perfq_dict_entry) */
	perfq_u64 reserved[7];
	/* struct perfq_dict_entry entries[count]; */
};

/* ------------------------------------------------------------------ */
/* A standalone SPSC ring in one mapping (host application rings in a  */
/* memfd, device-local queues):                                        */
/*   [perfq_spsc_header][capacity x element]                           */

#define PERFQ_SPSC_MAGIC 0x474e495251465045ULL /* "EPFQRING" */

struct perfq_spsc_header {
	perfq_u64 magic;
	perfq_u32 version; /* PERFQ_ABI_VERSION */
	perfq_u32 element_size;
	perfq_u64 capacity; /* elements, a power of two */
	perfq_u64 reserved0[4];
	/* Producer-owned, optional (0: not kept).  A producer that publishes in
	 * chunks (the host application rings) stores here, with release, its
	 * position after every element it writes; `tail` trails it by less
	 * than a chunk.  Elements below `written` are complete: a consumer may
	 * read up to it when the tail has stood still (a quiet producer), or
	 * for good (the producer gone).  On its own cache line: the consumer
	 * reads it only then. */
	perfq_u64 written;
	perfq_u64 tail; /* producer-owned */
	perfq_u64 lost; /* producer-owned: pushes refused because the ring was full */
	perfq_u8 pad0[PERFQ_CACHELINE - 16];
	perfq_u64 head; /* consumer-owned */
	perfq_u8 pad1[PERFQ_CACHELINE - 8];
};

/* ------------------------------------------------------------------ */
/* The job queue (application area, PERFQ_FEAT_JOB_QUEUE)             */

/*
 * The software device's emulated accelerator workload.  The application
 * area holds a perfq_jobq_header and `channels` channels.  A host thread
 * claims a channel (compare-and-swap of `owner` from 0 to a nonzero token)
 * and owns its two SPSC rings: it produces jobs into `submit` and consumes
 * completions from `complete`; one device job worker consumes `submit` and
 * produces `complete`.  Each ring is a perfq_spsc_header followed by
 * `ring_capacity` 32-byte elements.
 *
 *   [perfq_jobq_header]
 *   channel 0: [perfq_jobq_channel][submit ring][complete ring]
 *   channel 1: ...                 (each channel channel_stride bytes)
 */
#define PERFQ_JOBQ_MAGIC 0x424f4a5146524550ULL /* "PERFQJOB" */

struct perfq_jobq_header {
	perfq_u64 magic; /* PERFQ_JOBQ_MAGIC, written last */
	perfq_u32 version; /* PERFQ_ABI_VERSION */
	perfq_u32 channels;
	perfq_u64 ring_capacity; /* elements per ring, a power of two */
	perfq_u64 channel_offset; /* first channel, from the start of the app area */
	perfq_u64 channel_stride; /* bytes between channels */
	perfq_u64 reserved[3];
};

struct perfq_jobq_channel {
	perfq_u64 owner; /* 0 = free; claimed by a host thread with CAS */
	perfq_u64 submitted; /* host-owned statistic */
	perfq_u64 reserved[6];
};

struct perfq_job {
	perfq_u64 corr_id; /* correlation id, carried by every record of the job */
	perfq_u64 duration_ns; /* how long the device works on it */
	perfq_u64 submit_time; /* host time of the submit, informational */
	perfq_u64 reserved;
};

struct perfq_job_completion {
	perfq_u64 corr_id;
	perfq_u64 start_time; /* device time D the job started */
	perfq_u64 end_time; /* device time D the job ended */
	perfq_u32 status; /* 0 = done */
	perfq_u32 reserved;
};

/* ------------------------------------------------------------------ */
/* Layout checks, in C and C++                                         */

#if defined(__cplusplus)
#define PERFQ_STATIC_ASSERT(expr, msg) static_assert(expr, msg)
#elif defined(__KERNEL__)
#define PERFQ_STATIC_ASSERT(expr, msg) _Static_assert(expr, msg)
#else
#define PERFQ_STATIC_ASSERT(expr, msg) _Static_assert(expr, msg)
#endif

#define PERFQ_CHECK_SIZE(type, size) \
	PERFQ_STATIC_ASSERT(sizeof(struct type) == (size), #type " size")
#define PERFQ_CHECK_OFFSET(type, field, off)                       \
	PERFQ_STATIC_ASSERT(__builtin_offsetof(struct type, field) == (off), \
			    #type "." #field " offset")

PERFQ_CHECK_SIZE(perfq_record, 32);
PERFQ_CHECK_OFFSET(perfq_record, index, 0);
PERFQ_CHECK_OFFSET(perfq_record, event, 8);
PERFQ_CHECK_OFFSET(perfq_record, stream, 12);
PERFQ_CHECK_OFFSET(perfq_record, flags, 14);
PERFQ_CHECK_OFFSET(perfq_record, time, 16);
PERFQ_CHECK_OFFSET(perfq_record, arg, 24);

PERFQ_CHECK_SIZE(perfq_section, 16);
PERFQ_CHECK_SIZE(perfq_region_header, 384);
PERFQ_CHECK_OFFSET(perfq_region_header, magic, 0);
PERFQ_CHECK_OFFSET(perfq_region_header, abi_version, 8);
PERFQ_CHECK_OFFSET(perfq_region_header, header_size, 12);
PERFQ_CHECK_OFFSET(perfq_region_header, features, 16);
PERFQ_CHECK_OFFSET(perfq_region_header, region_size, 24);
PERFQ_CHECK_OFFSET(perfq_region_header, ring_capacity, 32);
PERFQ_CHECK_OFFSET(perfq_region_header, record_size, 40);
PERFQ_CHECK_OFFSET(perfq_region_header, dict_capacity, 44);
PERFQ_CHECK_OFFSET(perfq_region_header, device_clock_hz, 48);
PERFQ_CHECK_OFFSET(perfq_region_header, timer_hz, 56);
PERFQ_CHECK_OFFSET(perfq_region_header, device_name, 64);
PERFQ_CHECK_OFFSET(perfq_region_header, sections, 128);
PERFQ_CHECK_OFFSET(perfq_region_header, reserved, 256);

PERFQ_CHECK_SIZE(perfq_dev_ctrl, 192);
PERFQ_CHECK_OFFSET(perfq_dev_ctrl, tail, 0);
PERFQ_CHECK_OFFSET(perfq_dev_ctrl, head_mirror, 64);
PERFQ_CHECK_SIZE(perfq_host_ctrl, 192);
PERFQ_CHECK_OFFSET(perfq_host_ctrl, tail_mirror, 0);
PERFQ_CHECK_OFFSET(perfq_host_ctrl, head, 64);
PERFQ_CHECK_OFFSET(perfq_host_ctrl, device_state, 128);
PERFQ_CHECK_OFFSET(perfq_host_ctrl, heartbeat, 136);
PERFQ_CHECK_OFFSET(perfq_host_ctrl, device_now, 144);

PERFQ_CHECK_SIZE(perfq_timer_page, 256);
PERFQ_CHECK_OFFSET(perfq_timer_page, value, 0);
PERFQ_CHECK_OFFSET(perfq_timer_page, req_tag, 64);
PERFQ_CHECK_OFFSET(perfq_timer_page, resp_tag, 128);
PERFQ_CHECK_OFFSET(perfq_timer_page, resp_value, 136);
PERFQ_CHECK_OFFSET(perfq_timer_page, window, 192);
PERFQ_CHECK_OFFSET(perfq_timer_page, serving, 196);
PERFQ_CHECK_OFFSET(perfq_timer_page, next_window_us, 200);

PERFQ_CHECK_SIZE(perfq_clock_sample, 32);
PERFQ_CHECK_SIZE(perfq_sync_model, 128);
PERFQ_CHECK_OFFSET(perfq_sync_model, seq, 0);
PERFQ_CHECK_OFFSET(perfq_sync_model, device_ref, 8);
PERFQ_CHECK_OFFSET(perfq_sync_model, host_ref_ns, 16);
PERFQ_CHECK_OFFSET(perfq_sync_model, rate_ppb, 24);
PERFQ_CHECK_OFFSET(perfq_sync_model, uncertainty_ns, 32);
PERFQ_CHECK_OFFSET(perfq_sync_model, valid_from_device, 40);
PERFQ_CHECK_OFFSET(perfq_sync_model, segment, 48);
PERFQ_CHECK_SIZE(perfq_sample_batch, 64 + PERFQ_SYNC_MAX_SAMPLES * 32);
PERFQ_CHECK_OFFSET(perfq_sample_batch, samples, 64);
PERFQ_CHECK_SIZE(perfq_sync_line_pub, 64);
PERFQ_CHECK_SIZE(perfq_sync_page,
		 192 + 2 * (64 + PERFQ_SYNC_MAX_SAMPLES * 32) + 64 + PERFQ_SYNC_LINES * 64);
PERFQ_CHECK_OFFSET(perfq_sync_page, lines_newest, 192 + 2 * (64 + PERFQ_SYNC_MAX_SAMPLES * 32));
PERFQ_CHECK_OFFSET(perfq_sync_page, mode, 128);
PERFQ_CHECK_OFFSET(perfq_sync_page, device_samples, 192);

PERFQ_CHECK_SIZE(perfq_dict_entry, 64);
PERFQ_CHECK_OFFSET(perfq_dict_entry, name, 16);
PERFQ_CHECK_SIZE(perfq_dict_header, 64);

PERFQ_CHECK_SIZE(perfq_spsc_header, 192);
PERFQ_CHECK_OFFSET(perfq_spsc_header, written, 56);
PERFQ_CHECK_OFFSET(perfq_spsc_header, tail, 64);
PERFQ_CHECK_OFFSET(perfq_spsc_header, lost, 72);
PERFQ_CHECK_OFFSET(perfq_spsc_header, head, 128);

PERFQ_CHECK_SIZE(perfq_jobq_header, 64);
PERFQ_CHECK_SIZE(perfq_jobq_channel, 64);
PERFQ_CHECK_SIZE(perfq_job, 32);
PERFQ_CHECK_SIZE(perfq_job_completion, 32);

/* The driver's ioctls and mmap rules: perfq_ioctl.h (the kernel UAPI). */

/* ================================================================== */
/* Host application rings                                             */
/* ================================================================== */

/*
 * An instrumented host application (libperfq's client, perfq.h) gets one
 * ring per thread from the daemon (HostApps, host_apps.h): a memfd the
 * daemon creates, sizes, seals against shrinking and growing, lays out and
 * passes over the control socket with SCM_RIGHTS.  Both map it shared.
 *
 *   offset 0    [perfq_app_ring_header]   64 B   daemon lays out; see fields
 *   offset 64   [perfq_spsc_header]      192 B   written, tail, lost: application
 *                                                head: daemon
 *   offset 256  [capacity x perfq_record]        application -> daemon
 *
 * The application's thread is the ring's only producer, the daemon's host
 * collector thread its only consumer.  Records carry index = the ring
 * position they were written at (per-thread sequence from 0), stream = the
 * stream id in this header, flags = PERFQ_FLAGS(kind, PERFQ_CLOCK_HOST),
 * time = CLOCK_MONOTONIC ns.  A push into a full ring is refused and counted
 * in the spsc header's `lost`; such records never get an index.
 *
 * Chunks: the application publishes its tail once per chunk of
 * PERFQ_APP_RING_CHUNK records (fewer in a ring smaller than 8 chunks:
 * capacity / 8), so the daemon never reads the cache lines it is writing,
 * and keeps `written` current after every record.  The daemon reads up to
 * `written` when a ring's tail has not moved since its last pass (within
 * its 2-10 ms poll), when the thread or the application has ended, and at a
 * stop: a partly filled chunk is never stranded.
 *
 * The daemon trusts nothing in this memory: it keeps its own copy of the
 * geometry and the stream id and validates every tail (and `written`) and
 * record it reads.
 */
#define PERFQ_APP_RING_CHUNK 64u
#define PERFQ_APP_RING_MAGIC 0x474e525041514650ULL /* "PFQAPRNG" */
#define PERFQ_APP_RING_OFFSET_SPSC 64u
#define PERFQ_APP_RING_OFFSET_SLOTS (64u + 192u)

struct perfq_app_ring_header {
	perfq_u64 magic; /* PERFQ_APP_RING_MAGIC, daemon, written last (release) */
	perfq_u32 version; /* PERFQ_ABI_VERSION, daemon */
	perfq_u16 stream; /* daemon: stream id records must carry */
	perfq_u16 reserved0;
	perfq_u64 recording; /* daemon -> app (relaxed): nonzero while recording */
	perfq_u64 finished; /* app -> daemon: 1 (release, after the last tail) at thread exit */
	perfq_u64 reserved[4];
};

PERFQ_CHECK_SIZE(perfq_app_ring_header, PERFQ_APP_RING_OFFSET_SPSC);
PERFQ_CHECK_OFFSET(perfq_app_ring_header, stream, 12);
PERFQ_CHECK_OFFSET(perfq_app_ring_header, recording, 16);
PERFQ_CHECK_OFFSET(perfq_app_ring_header, finished, 24);
PERFQ_STATIC_ASSERT(PERFQ_APP_RING_OFFSET_SLOTS ==
			    PERFQ_APP_RING_OFFSET_SPSC + sizeof(struct perfq_spsc_header),
		    "app ring slots follow the spsc header");

/* ================================================================== */
/* END host application rings                                         */
/* ================================================================== */

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PERFQ_ABI_H */
