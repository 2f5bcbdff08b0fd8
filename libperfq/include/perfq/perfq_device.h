/* SPDX-License-Identifier: MIT */
/*
 * perfq_device.h - the perfq device SDK: everything the device side of a
 * perfq recording does, in C11 that firmware can build.
 *
 * Freestanding: it needs only <stdint.h>, <stddef.h>, <stdbool.h> and the
 * compiler's __atomic builtins (GCC and Clang); no allocation (the caller
 * hands it every byte of memory), no OS call, no floating point on the
 * record path.  The one source file beside this header, perfq_device.c,
 * uses memcpy and memset (builtins the compiler may emit as calls) and,
 * for the clock-sync math of mode B only, double arithmetic and sqrt
 * (__builtin_sqrt: an instruction on hard-float targets).  Build with
 * -DPERFQ_DEVICE_NO_MODE_B to leave mode B, and all floating point, out.
 *
 * WHAT A DEVICE DOES (see docs/device-integration.md)
 *
 *   worker threads  --perfq_dev_record()-->  their device queues
 *   collector       --perfq_dev_collect()--> the region's shared queue (ring)
 *   timer server    --perfq_dev_timer_poll()--> answers the host's timer
 *                   reads and publishes the device's (R, D, R) samples
 *
 * and, once at start, lays out the region: perfq_dev_region_init(),
 * perfq_dev_dictionary_write(), (the application area), then
 * perfq_dev_region_publish(), which writes the magic word last.
 *
 * THE PORT LAYER
 *
 * struct perfq_dev_port supplies the device's clocks: device_now() the
 * device system clock D (what records are stamped with) and timer_read()
 * the timer register R (the one the host reads across the bus: a
 * free-running counter).  Memory ordering between device threads and
 * towards the host uses the __atomic builtins below; where the region is
 * device memory written with posted writes that need an explicit barrier
 * (a write-combining buffer to flush, a bus without ordering), define
 * PERFQ_DEV_WMB() to it before including this header: it runs before every
 * store that publishes data to the host (a tail, a sample batch's seq).
 * Define PERFQ_DEV_NOW() (an expression reading D) to make
 * perfq_dev_record() read the clock inline instead of through the port.
 *
 * THREADING CONTRACT
 *
 *   - perfq_dev_record() / perfq_dev_record_at(): only the worker that owns
 *     the queue; never blocks, never fails other than "full: dropped";
 *   - perfq_dev_collect(), perfq_dev_collector_*(): only the one collector
 *     thread (it is every queue's only consumer and the ring's producer);
 *   - perfq_dev_timer_poll(): only the one timer server thread;
 *   - perfq_dev_queue_emitted()/_dropped(): any thread, any time (counters);
 *   - perfq_dev_jobq_take()/perfq_dev_jobq_complete(): one worker per channel;
 *   - everything else: at set-up, before the threads start.
 * No call sleeps or waits: where a thread has nothing to do, the call says
 * so and the caller decides how to idle (a WFI, a futex, a timer).
 *
 * The device never trusts the host either: a head the host posts that
 * makes no sense stops the collector (perfq_dev_collector_fault()) rather
 * than overwrite records the host has not read.
 */
#ifndef PERFQ_DEVICE_H
#define PERFQ_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "perfq_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ */
/* Ordering                                                            */

#ifndef PERFQ_DEV_WMB
#define PERFQ_DEV_WMB() ((void)0)
#endif

#define PERFQ_DEV_LOAD_ACQUIRE(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define PERFQ_DEV_LOAD_RELAXED(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define PERFQ_DEV_STORE_RELEASE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define PERFQ_DEV_STORE_RELAXED(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)

/* ------------------------------------------------------------------ */
/* Errors                                                              */

enum perfq_dev_err {
	PERFQ_DEV_OK = 0,
	PERFQ_DEV_EINVAL = 1,	  /* an argument is out of range (see the function) */
	PERFQ_DEV_ENOSPC = 2,	  /* the memory given is too small */
	PERFQ_DEV_ECORRUPT = 3,	  /* what was read is inconsistent */
	PERFQ_DEV_EAGAIN = 4,	  /* nothing consistent yet: try again later */
};

/* ------------------------------------------------------------------ */
/* The port layer                                                      */

struct perfq_dev_port {
	uint64_t (*device_now)(void *ctx); /* D, the device system clock */
	uint64_t (*timer_read)(void *ctx); /* R, the timer register the host reads */
	void *ctx;
};

/* ------------------------------------------------------------------ */
/* The region                                                          */

struct perfq_dev_geometry {
	uint64_t ring_capacity;	  /* records, a power of two (PERFQ_RING_CAPACITY_MIN..MAX) */
	uint32_t dict_capacity;	  /* event dictionary entries */
	uint64_t app_size;	  /* application area bytes (rounded up to pages; 0: none) */
	uint64_t device_clock_hz; /* nominal rate of D */
	uint64_t timer_hz;	  /* nominal rate of R */
	uint64_t features;	  /* PERFQ_FEAT_* */
	const char *device_name;  /* 1..63 printable ASCII characters */
	uint64_t min_region_size; /* pad the region to at least this (a BAR's size) */
};

/* The header of a region of this geometry, magic included, with the
 * default section layout (perfq_abi.h).  PERFQ_DEV_EINVAL for a geometry a
 * host would refuse. */
int perfq_dev_layout(const struct perfq_dev_geometry *g, struct perfq_region_header *out);

/* Lays the region out in [base, base + len): zeroes it, writes the header
 * without its magic and the empty dictionary.  *out (may be NULL) gets the
 * header.  PERFQ_DEV_ENOSPC when the region does not fit in len. */
int perfq_dev_region_init(void *base, uint64_t len, const struct perfq_dev_geometry *g,
			  struct perfq_region_header *out);

/* OR into perfq_dev_event.kind: the event's arg is a byte count, and the
 * report gives its throughput and its share of the PCIe link:
 *   { EV_DMA_H2D, PERFQ_KIND_BEGIN | PERFQ_DEV_ARG_BYTES, "dma_h2d" }
 * (a range's bytes are its begin's arg).  Not for PERFQ_KIND_COUNTER. */
#define PERFQ_DEV_ARG_BYTES 0x100u

struct perfq_dev_event {
	uint32_t event;	  /* id records carry; PERFQ_EVENT_LOST (0) is perfq's own */
	uint16_t kind;	  /* enum perfq_kind, | PERFQ_DEV_ARG_BYTES */
	const char *name; /* 1..47 printable ASCII characters */
};

/* Writes the event dictionary (entries, then the count with release).
 * PERFQ_DEV_EINVAL for a bad name or kind, ENOSPC beyond dict_capacity. */
int perfq_dev_dictionary_write(void *base, const struct perfq_region_header *h,
			       const struct perfq_dev_event *events, uint32_t count);

/* Writes the magic word, last: a host that sees it sees everything above. */
void perfq_dev_region_publish(void *base);

/* The device state word the host reads (posted write). */
void perfq_dev_set_state(void *base, const struct perfq_region_header *h,
			 enum perfq_device_state state);

/* A section of the region (h: the header the device laid out). */
static inline void *perfq_dev_section(void *base, const struct perfq_region_header *h, int id)
{
	return (uint8_t *)base + h->sections[id].offset;
}

/* ------------------------------------------------------------------ */
/* Device queues: one per worker                                       */

struct perfq_dev_queue {
	/* The worker's cache line. */
	struct perfq_record *slots;
	uint64_t mask;
	uint64_t tail;	     /* worker -> collector (release) */
	uint64_t head_cache; /* the worker's copy of head */
	uint64_t dropped;    /* records refused because the queue was full (release) */
	uint64_t last_drop_time; /* D of the newest drop (stored before dropped) */
	uint16_t stream;
	uint8_t pad0[PERFQ_CACHELINE - 6 * 8 - 2];
	/* The collector's cache line. */
	uint64_t head; /* collector -> worker (release) */
	uint8_t pad1[PERFQ_CACHELINE - 8];
};

/* slots: capacity records (a power of two >= 2) that belong to this queue
 * from now on.  PERFQ_DEV_EINVAL for a bad capacity. */
int perfq_dev_queue_init(struct perfq_dev_queue *q, uint16_t stream, struct perfq_record *slots,
			 uint64_t capacity);

/* Record with an explicit device time.  The record's index (a per-stream
 * sequence number) is consumed whether it is queued or dropped, so a gap
 * reveals a loss; a full queue drops and counts.  True when queued. */
static inline bool perfq_dev_record_at(struct perfq_dev_queue *q, uint32_t event,
				       enum perfq_kind kind, uint64_t time, uint64_t arg)
{
	/* Every record so far was queued (tail) or dropped: its index. */
	const uint64_t tail = q->tail;
	const uint64_t index = tail + q->dropped;
	struct perfq_record *slot;

	if (tail - q->head_cache > q->mask) {
		/* Pairs with the collector's release of head. */
		q->head_cache = PERFQ_DEV_LOAD_ACQUIRE(&q->head);
		if (tail - q->head_cache > q->mask) {
			/* The drop's time first: who sees the count sees it. */
			PERFQ_DEV_STORE_RELAXED(&q->last_drop_time, time);
			PERFQ_DEV_STORE_RELEASE(&q->dropped, q->dropped + 1);
			return false;
		}
	}
	slot = &q->slots[tail & q->mask];
	slot->index = index;
	slot->event = event;
	slot->stream = q->stream;
	slot->flags = PERFQ_FLAGS(kind, PERFQ_CLOCK_DEVICE);
	slot->time = time;
	slot->arg = arg;
	/* Pairs with the collector's acquire of tail: the slot first. */
	PERFQ_DEV_STORE_RELEASE(&q->tail, tail + 1);
	return true;
}

/* Record stamped with D now (PERFQ_DEV_NOW() if defined, else the port). */
static inline bool perfq_dev_record(struct perfq_dev_queue *q, const struct perfq_dev_port *port,
				    uint32_t event, enum perfq_kind kind, uint64_t arg)
{
#ifdef PERFQ_DEV_NOW
	(void)port;
	return perfq_dev_record_at(q, event, kind, PERFQ_DEV_NOW(), arg);
#else
	return perfq_dev_record_at(q, event, kind, port->device_now(port->ctx), arg);
#endif
}

/* Exact accounting, from any thread: emitted = queued + dropped (exact once
 * the worker has stopped; while it records, a value it has passed). */
static inline uint64_t perfq_dev_queue_emitted(const struct perfq_dev_queue *q)
{
	return PERFQ_DEV_LOAD_ACQUIRE(&q->tail) + PERFQ_DEV_LOAD_ACQUIRE(&q->dropped);
}
static inline uint64_t perfq_dev_queue_dropped(const struct perfq_dev_queue *q)
{
	return PERFQ_DEV_LOAD_ACQUIRE(&q->dropped);
}
/* Records queued and not yet collected (an estimate while the worker runs). */
uint64_t perfq_dev_queue_pending(const struct perfq_dev_queue *q);

/* ------------------------------------------------------------------ */
/* The collector                                                       */

/* Per-queue accounting the collector keeps. */
struct perfq_dev_delivery {
	uint64_t delivered;	/* records copied into the shared ring */
	uint64_t lost_reported; /* sum of the counts of the LOST records sent */
	uint64_t undelivered;	/* left in the queue at finish (count them dropped) */
};

enum perfq_dev_fault {
	PERFQ_DEV_FAULT_NONE = 0,
	PERFQ_DEV_FAULT_HEAD_AHEAD = 1,	   /* head > tail */
	PERFQ_DEV_FAULT_HEAD_BACKWARDS = 2, /* head < a head seen before */
	PERFQ_DEV_FAULT_HEAD_TOO_FAR = 3,   /* tail - head > capacity */
};

/* Converts a record's time as it crosses the bus (mode B); NULL: none. */
struct perfq_dev_converter {
	void (*poll)(void *ctx);			 /* once per collector pass */
	bool (*convert)(void *ctx, struct perfq_record *r); /* false: left in D */
	void *ctx;
};

struct perfq_dev_collector {
	struct perfq_record *ring;
	uint64_t mask;
	struct perfq_dev_ctrl *dev_ctrl;
	struct perfq_host_ctrl *host_ctrl;
	struct perfq_dev_queue **queues;
	struct perfq_dev_delivery *delivery;
	uint32_t nqueues;
	uint32_t batch; /* records per copy from one queue (default 256) */
	const struct perfq_dev_port *port;
	struct perfq_dev_converter converter;
	bool device_now; /* PERFQ_FEAT_DEVICE_NOW */
	uint64_t tail;
	uint64_t head_cache;
	uint64_t heartbeat;
	enum perfq_dev_fault fault;
	uint64_t fault_seen; /* the head read */
	uint64_t fault_tail; /* our tail then */
	uint64_t fault_prev; /* the last valid head */
};

/* queues[i] and delivery[i] (zeroed here) for nqueues queues: memory the
 * caller keeps for the collector's life.  PERFQ_DEV_EINVAL for bad
 * arguments. */
int perfq_dev_collector_init(struct perfq_dev_collector *c, void *base,
			     const struct perfq_region_header *h, struct perfq_dev_queue **queues,
			     struct perfq_dev_delivery *delivery, uint32_t nqueues,
			     const struct perfq_dev_port *port);
/* Mode B (or any conversion) as records cross: set before the first pass. */
void perfq_dev_collector_set_converter(struct perfq_dev_collector *c,
				       const struct perfq_dev_converter *conv);

/* One pass: for each queue, a LOST record for the drops not yet reported,
 * then up to `batch` records; the tail to both copies; the heartbeat.
 * When the ring is full it stops reading the queues (the oldest data is
 * kept; the workers drop and the LOST records say how many).  Returns the
 * records moved (0: idle).  Once a fault is seen it moves nothing. */
size_t perfq_dev_collect(struct perfq_dev_collector *c);

/* Everything queued has been delivered and every drop reported. */
bool perfq_dev_collector_drained(const struct perfq_dev_collector *c);

/* At the end (the workers stopped, the last passes made): counts what is
 * left in the queues as undelivered and marks the device STOPPED. */
void perfq_dev_collector_finish(struct perfq_dev_collector *c, void *base,
				const struct perfq_region_header *h);

static inline enum perfq_dev_fault perfq_dev_collector_fault(const struct perfq_dev_collector *c)
{
	return c->fault;
}

/* ------------------------------------------------------------------ */
/* The time sync buffer: seqlocked model and sample batches            */

/* Writer side of a sample batch (count <= PERFQ_SYNC_MAX_SAMPLES). */
void perfq_dev_batch_write(struct perfq_sample_batch *dst, uint32_t round,
			   const struct perfq_clock_sample *samples, uint32_t count);
/* A consistent copy: out[PERFQ_SYNC_MAX_SAMPLES].  EAGAIN when no copy was
 * consistent within max_tries, ECORRUPT for a count above the maximum. */
int perfq_dev_batch_read(const struct perfq_sample_batch *src, struct perfq_clock_sample *out,
			 uint32_t *count, uint32_t *round, uint64_t *seq, uint32_t max_tries);
/* The same for the model (the host writes it in mode A). */
void perfq_dev_model_write(struct perfq_sync_model *dst, const struct perfq_sync_model *m);
int perfq_dev_model_read(const struct perfq_sync_model *src, struct perfq_sync_model *out,
			 uint32_t max_tries);
/* Mode B's lines (perfq_sync_page.lines): publish l (l->id the next
 * number, seq ignored) in its slot, then name it in lines_newest; and a
 * consistent copy of the slot of line `id` (EAGAIN when none was within
 * max_tries; the caller compares out->id with the id it asked for: the
 * slot may hold a later line, or none yet). */
void perfq_dev_line_publish(struct perfq_sync_page *p, const struct perfq_sync_line_pub *l);
int perfq_dev_line_read(const struct perfq_sync_page *p, uint64_t id,
			struct perfq_sync_line_pub *out, uint32_t max_tries);

/* host = host_ref_ns + (d - device_ref) * (1e9 + rate_ppb) / 1e9, exactly,
 * rounded to nearest (half away from zero), modular in u64: what a device
 * in mode A computes with the host's model.  Integer only. */
uint64_t perfq_sync_apply(const struct perfq_sync_model *m, uint64_t device_time);

/* ------------------------------------------------------------------ */
/* The timer server                                                    */

enum perfq_dev_timer_event {
	PERFQ_DEV_TIMER_CLOSED = 0,    /* no round open: the caller may sleep (on window) */
	PERFQ_DEV_TIMER_WAITING = 1,   /* a round is open, no request now: poll again soon */
	PERFQ_DEV_TIMER_SERVED = 2,    /* answered one read */
	PERFQ_DEV_TIMER_PUBLISHED = 3, /* a round closed: its device samples are published */
};

struct perfq_dev_timer {
	struct perfq_timer_page *page;
	struct perfq_sync_page *sync;
	const struct perfq_dev_port *port;
	uint64_t last_tag;
	uint32_t round;	       /* the open round (0: none) */
	uint32_t sample_every; /* a device sample after every n-th answer (default 3) */
	uint32_t answered;
	uint32_t count;
	uint64_t served;  /* reads answered */
	uint64_t windows; /* rounds seen */
	struct perfq_clock_sample samples[PERFQ_SYNC_MAX_SAMPLES];
	uint64_t timer_hz;
	uint64_t closed_r; /* R when the last window was seen closing */
	bool closed_seen;  /* closed_r is set and the host's announcement not yet used up */
	bool serving;	   /* what the page's `serving` says */
};

void perfq_dev_timer_init(struct perfq_dev_timer *t, void *base,
			  const struct perfq_region_header *h, const struct perfq_dev_port *port);
/* One step of the exchange of PERFQ_FEAT_TIMER_REQRESP: answers a pending
 * read with R (resp_value, then resp_tag), takes a device sample (R, D, R)
 * after every sample_every-th answer, and when the host closes the round
 * publishes them as the round's device_samples batch (at least one). */
enum perfq_dev_timer_event perfq_dev_timer_poll(struct perfq_dev_timer *t);
/* After CLOSED: the host's announcement of its next window
 * (next_window_us, counted from the close this device saw), as the time
 * the caller may sleep before it polls the window again, in microseconds.
 *   - 0: the window is due within lead_us, or late by at most grace_us:
 *     poll it without sleeping; `serving` is set, so the host opens it
 *     without waking this device or giving it the CPU;
 *   - otherwise the time until lead_us before the window is due, or
 *     UINT64_MAX when nothing is announced (or the announced time passed
 *     grace_us ago): sleep as usual (at most that long); `serving` is
 *     cleared first, so the host wakes this device.
 * A host value beyond an hour counts as none. */
uint64_t perfq_dev_timer_idle_us(struct perfq_dev_timer *t, uint32_t lead_us, uint32_t grace_us);
/* The lead and grace a software timer server uses (devsim's and the
 * example's): awake 0.2 ms before an announced round, until 1 ms after.
 * A device whose wakeup is slower asks for a longer lead. */
#define PERFQ_DEV_TIMER_LEAD_US 200u
#define PERFQ_DEV_TIMER_GRACE_US 1000u
/* Before any other sleep of the serving thread (a round open with no
 * reads for long): clears `serving`, so the host wakes it. */
void perfq_dev_timer_asleep(struct perfq_dev_timer *t);
/* One device sample: {before = R, value = D, after = R}. */
struct perfq_clock_sample perfq_dev_sample(const struct perfq_dev_port *port);

/* ------------------------------------------------------------------ */
/* The job queue (application area, PERFQ_FEAT_JOB_QUEUE)              */

struct perfq_dev_jobq {
	uint8_t *app;
	uint32_t channels;
	uint64_t capacity;
	uint64_t offset;
	uint64_t stride;
};

/* Lays the job queue out in the application area: up to max_channels
 * channels with the largest power-of-two rings (16..65536) that fit;
 * the magic last.  PERFQ_DEV_ENOSPC when not even one channel fits. */
int perfq_dev_jobq_format(struct perfq_dev_jobq *q, void *app, uint64_t app_size,
			  uint32_t max_channels);
/* The two rings of a channel. */
struct perfq_spsc_header *perfq_dev_jobq_submit_ring(const struct perfq_dev_jobq *q, uint32_t ch);
struct perfq_spsc_header *perfq_dev_jobq_complete_ring(const struct perfq_dev_jobq *q, uint32_t ch);
/* Device job worker: the next job of channel ch (false: none), and its
 * completion (false: the completion ring is full; then take no job). */
bool perfq_dev_jobq_take(const struct perfq_dev_jobq *q, uint32_t ch, struct perfq_job *out);
bool perfq_dev_jobq_can_complete(const struct perfq_dev_jobq *q, uint32_t ch);
bool perfq_dev_jobq_complete(const struct perfq_dev_jobq *q, uint32_t ch,
			     const struct perfq_job_completion *c);


#ifndef PERFQ_DEVICE_NO_MODE_B
/* ------------------------------------------------------------------ */
/* Clock sync: the one implementation of the model, its fit and gate   */
/*                                                                     */
/* The host's daemon (libperfq's ClockSync, RoundGate, make_observation */
/* are its C++ face) and a device in mode B run this same code on the   */
/* same rounds, so the device converts with the model the host fits.    */
/* Double arithmetic; sqrt is __builtin_sqrt (build with                */
/* -fno-math-errno where the FPU has it).  See docs/sync.md.            */

#define PERFQ_SYNC_WINDOW_MAX 128u /* observations in the online fit */
#define PERFQ_SYNC_GATE_ROUNDS 64u
#define PERFQ_SYNC_MIN_MODEL_ROUNDS 5u

struct perfq_sync_rates {
	uint64_t device_hz; /* D's nominal rate */
	uint64_t timer_hz;  /* R's nominal rate */
};

/* One round reduced to a point: D and H at the same instant. */
struct perfq_sync_obs {
	uint64_t device_time;
	uint64_t host_ns;
	double uncertainty_ns; /* |error| <= this if every bracket is honest */
	double host_delay_ns;  /* tightest host bracket */
	double device_delay_ns;
	uint32_t round;
	uint16_t host_used;
	uint16_t device_used;
};

struct perfq_sync_selection {
	double margin_ns;     /* 50 */
	double margin_frac;   /* 0.1 */
	double outlier_k;     /* 5 */
	bool average_scatter; /* true */
	double rate_error;    /* 1e-3 */
};

/* host = host_ref + host_frac + (d - device_ref) * ns_per_tick */
struct perfq_sync_line {
	uint64_t device_ref;
	uint64_t host_ref;
	double host_frac;      /* [0, 1) */
	double ns_per_tick;
	double uncertainty_ns; /* ~3 sigma at device_ref */
	double rate_sigma_ppb;
	uint64_t valid_from_device;
	uint32_t segment;
	bool valid;
};

struct perfq_sync_config {
	uint32_t window; /* 128, at most PERFQ_SYNC_WINDOW_MAX */
	double reject_k, reject_floor_ns, sigma_floor_ns, prior_drift_ppm;
	double step_min_ns, step_k, witness_k, max_uncertainty_ns;
};

struct perfq_sync_gate_config {
	double floor_ns;	   /* 2000 */
	double factor;		   /* 4 */
	double contended_delay_ns; /* 20000 */
};

enum perfq_sync_verdict {
	PERFQ_SYNC_ACCEPTED = 0,
	PERFQ_SYNC_REJECTED = 1,
	PERFQ_SYNC_OUTLIER = 2,
	PERFQ_SYNC_STEP_PENDING = 3,
	PERFQ_SYNC_NEW_SEGMENT = 4,
	PERFQ_SYNC_INVALID = 5,
};

enum perfq_sync_observe_err {
	PERFQ_SYNC_OBS_OK = 0,
	PERFQ_SYNC_OBS_RATES = 1,     /* a rate is 0 or above PERFQ_CLOCK_HZ_MAX */
	PERFQ_SYNC_OBS_NO_HOST = 2,   /* no usable host sample */
	PERFQ_SYNC_OBS_NO_DEVICE = 3, /* no usable device sample */
	PERFQ_SYNC_OBS_PAIRING = 4,   /* the two sides are not of one round */
};

/* Scratch for one sample of perfq_sync_observe() (no allocation). */
struct perfq_sync_cand {
	double delay_ns, at_ns, implied, a, b, w, tmp;
	uint8_t ok;
};

void perfq_sync_default_selection(struct perfq_sync_selection *s);
void perfq_sync_default_config(struct perfq_sync_config *c);
void perfq_sync_default_gate_config(struct perfq_sync_gate_config *g);

/* One round's host samples (H1, R2, H2) and device samples (R1, D, R1)
 * -> one observation.  scratch: nh + nd candidates.  *gap_ns (may be NULL)
 * gets the pairing distance for an error message. */
int perfq_sync_observe(const struct perfq_clock_sample *host, uint32_t nh,
		       const struct perfq_clock_sample *device, uint32_t nd,
		       const struct perfq_sync_rates *rates, const struct perfq_sync_selection *sel,
		       uint32_t round, struct perfq_sync_cand *scratch, struct perfq_sync_obs *out,
		       double *gap_ns);
/* The selection for the next round given the model (a clock measured far
 * off its nominal rate widens rate_error to 1.5 x its drift). */
struct perfq_sync_selection perfq_sync_selection_for(const struct perfq_sync_selection *base,
						     const struct perfq_sync_line *m,
						     const struct perfq_sync_rates *rates);

/* The line's functions (see libperfq's ClockModel). */
uint64_t perfq_sync_line_to_host(const struct perfq_sync_line *m, uint64_t d);
double perfq_sync_line_distance_ns(const struct perfq_sync_line *m, uint64_t d);
double perfq_sync_line_claim(const struct perfq_sync_line *m, uint64_t d);
double perfq_sync_line_claim_newer(const struct perfq_sync_line *m, uint64_t d,
				   const struct perfq_sync_line *newer);
bool perfq_sync_line_settled_over(const struct perfq_sync_line *m, double dx_ns);
bool perfq_sync_line_vouches(const struct perfq_sync_line *m, uint64_t d, double tight_ns);
double perfq_sync_line_drift_ppb(const struct perfq_sync_line *m,
				 const struct perfq_sync_rates *rates);
void perfq_sync_line_to_abi(const struct perfq_sync_line *m, struct perfq_sync_model *out);

/* The robust weighted fit (points relative to an origin). */
struct perfq_sync_pt {
	double x, y, w, u;
	double r, tmp; /* scratch */
	uint8_t in, next;
};
/* misfit: how far the line is, at the very least, from the clocks near its
 * reference (x = 0): the largest excess of a residual over its own
 * observation's uncertainty, among the PERFQ_SYNC_MISFIT_POINTS inliers
 * nearest to it.  Clocks whose relation is not a line (a host clock that
 * NTP slews, a device oscillator that wanders) leave residuals their
 * brackets do not explain; averaging them as noise would claim a bound the
 * line does not keep, so the knot's uncertainty adds it. */
#define PERFQ_SYNC_MISFIT_POINTS 8u
struct perfq_sync_fit {
	double a, c, xbar, var_ybar, var_c, bias_c2, sigma;
	uint32_t inliers;
	double misfit;
};
void perfq_sync_robust_fit(struct perfq_sync_pt *p, uint32_t n, double prior_var,
			   const struct perfq_sync_config *cfg, struct perfq_sync_fit *out);
struct perfq_sync_pt perfq_sync_make_pt(const struct perfq_sync_obs *o, uint64_t d_o, uint64_t h_o,
					double s0, const struct perfq_sync_config *cfg);
void perfq_sync_knot_from(const struct perfq_sync_fit *f, const struct perfq_sync_obs *o, double s0,
			  uint32_t segment, uint64_t valid_from, bool prior_measured,
			  struct perfq_sync_line *out);
/* max(floor, factor x the lower quartile of u[0..n)), reordering u. */
double perfq_sync_gate_of(double *u, uint32_t n, const struct perfq_sync_gate_config *cfg);
bool perfq_sync_usable(const struct perfq_sync_obs *o, const struct perfq_sync_config *cfg);
/* Quickselect: the k-th smallest of p[0], p[stride], ... (reorders them). */
double perfq_sync_select(double *p, uint32_t n, uint32_t stride, uint32_t k);

/* The history of models, for a host that converts past times (NULL
 * members: not kept, as on a device). */
struct perfq_sync_history {
	void (*open_segment)(void *ctx, uint32_t id, uint64_t valid_from);
	void (*close_segment)(void *ctx, uint64_t valid_until); /* the current one */
	void (*drop_segment)(void *ctx);			 /* the current one, replaced */
	void (*knot)(void *ctx, const struct perfq_sync_line *m);
	void (*observed)(void *ctx, uint64_t host_ns);
	void *ctx;
};

/* The online tracker: the robust fit over a sliding window, steps and
 * rate breaks.  Plain memory: one per device (about 20 KB). */
struct perfq_sync_online {
	struct perfq_sync_rates rates;
	struct perfq_sync_config cfg;
	struct perfq_sync_history hist;
	struct perfq_sync_line current;
	struct perfq_sync_obs window[PERFQ_SYNC_WINDOW_MAX];
	uint8_t inlier[PERFQ_SYNC_WINDOW_MAX];
	struct perfq_sync_pt pts[PERFQ_SYNC_WINDOW_MAX];
	uint32_t n;
	bool have_pending, have_pending2;
	struct perfq_sync_obs pending, pending2;
	uint32_t rate_breaks;
	double sigma, fit_xbar, fit_var_ybar, fit_var_c, fit_bias_c2;
	bool seg_prior_measured;
	double prior_slope, prior_var, seg_slope0, seg_var0;
	uint32_t seg_id, next_segment, seg_knots;
	uint64_t seg_valid_from;
};

void perfq_sync_online_init(struct perfq_sync_online *s, const struct perfq_sync_rates *rates,
			    const struct perfq_sync_config *cfg, const struct perfq_sync_history *hist);
enum perfq_sync_verdict perfq_sync_online_add(struct perfq_sync_online *s,
					      const struct perfq_sync_obs *obs);
/* A round too loose to fit may still witness a step. */
enum perfq_sync_verdict perfq_sync_online_witness(struct perfq_sync_online *s,
						  const struct perfq_sync_obs *obs);

/* Which rounds the online model takes (the same on host and device). */
struct perfq_sync_gate {
	struct perfq_sync_gate_config cfg;
	uint64_t taken;
	double tight; /* the loosest claim converted without waiting; inf at first */
	double recent[PERFQ_SYNC_GATE_ROUNDS];
	double scratch[PERFQ_SYNC_GATE_ROUNDS];
	uint32_t count, pos;
};
void perfq_sync_gate_init(struct perfq_sync_gate *g, const struct perfq_sync_gate_config *cfg);
enum perfq_sync_verdict perfq_sync_gate_feed(struct perfq_sync_gate *g, struct perfq_sync_online *s,
					     const struct perfq_sync_obs *obs);
static inline bool perfq_sync_taken(enum perfq_sync_verdict v)
{
	return v == PERFQ_SYNC_ACCEPTED || v == PERFQ_SYNC_NEW_SEGMENT;
}
/* Rewrites a PERFQ_CLOCK_DEVICE record into PERFQ_CLOCK_HOST_BY_DEVICE
 * where the model vouches for its time (the host's rule for converting
 * without waiting for a later round); false: left in D for the host. */
bool perfq_sync_convert_record(const struct perfq_sync_online *s, const struct perfq_sync_gate *g,
			       struct perfq_record *r);

/* ---- Mode B on the device: a converter for the collector ---------- */
struct perfq_dev_mode_b {
	struct perfq_sync_page *sync;
	struct perfq_sync_selection sel;
	struct perfq_sync_online online;
	struct perfq_sync_gate gate;
	uint64_t mailbox_seq; /* the last mailbox copy looked at */
	uint32_t round;	      /* the last round taken */
	bool converting;      /* the host asked for mode B and a model exists */
	struct perfq_sync_line_pub line; /* the line published last (id 0: none) */
	struct perfq_clock_sample host[PERFQ_SYNC_MAX_SAMPLES];
	struct perfq_clock_sample dev[PERFQ_SYNC_MAX_SAMPLES];
	struct perfq_sync_cand cand[2 * PERFQ_SYNC_MAX_SAMPLES];
};
void perfq_dev_mode_b_init(struct perfq_dev_mode_b *m, void *base,
			   const struct perfq_region_header *h);
/* perfq_dev_converter's two calls (ctx: the perfq_dev_mode_b). */
void perfq_dev_mode_b_poll(void *ctx);
bool perfq_dev_mode_b_convert(void *ctx, struct perfq_record *r);
#endif /* PERFQ_DEVICE_NO_MODE_B */

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PERFQ_DEVICE_H */
