/* SPDX-License-Identifier: MIT */
/*
 * perfq_device.c - the perfq device SDK (see perfq_device.h).  Freestanding
 * C11: memcpy/memset are the only library calls (the compiler's), and mode B's
 * clock-sync math (perfq_device_sync.c's part, below) the only floating point.
 */
#include "perfq_device.h"

#include "perfq_region_check.h"

#define PERFQ_DEV_PAGE ((uint64_t)PERFQ_PAGE_SIZE)

static uint64_t round_up_page(uint64_t v)
{
	return (v + PERFQ_DEV_PAGE - 1) / PERFQ_DEV_PAGE * PERFQ_DEV_PAGE;
}

static bool is_pow2(uint64_t v)
{
	return v != 0 && (v & (v - 1)) == 0;
}

static size_t name_len(const char *s, size_t max)
{
	size_t n = 0;

	while (n < max && s[n])
		n++;
	return n;
}

static bool printable(const char *s, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e)
			return false;
	return true;
}

/* ------------------------------------------------------------------ */
/* The region                                                          */

int perfq_dev_layout(const struct perfq_dev_geometry *g, struct perfq_region_header *out)
{
	struct perfq_region_header h;
	uint64_t off = 0;
	size_t n;
	int id;

	if (!g || !out || !g->device_name)
		return PERFQ_DEV_EINVAL;
	if (!is_pow2(g->ring_capacity) || g->ring_capacity < PERFQ_RING_CAPACITY_MIN ||
	    g->ring_capacity > PERFQ_RING_CAPACITY_MAX)
		return PERFQ_DEV_EINVAL;
	n = name_len(g->device_name, PERFQ_DEVICE_NAME_LEN);
	if (n == 0 || n >= PERFQ_DEVICE_NAME_LEN || !printable(g->device_name, n))
		return PERFQ_DEV_EINVAL;
	if (g->device_clock_hz == 0 || g->device_clock_hz > PERFQ_CLOCK_HZ_MAX ||
	    g->timer_hz == 0 || g->timer_hz > PERFQ_CLOCK_HZ_MAX)
		return PERFQ_DEV_EINVAL;
	if (g->features & ~PERFQ_FEAT_ALL)
		return PERFQ_DEV_EINVAL;

	__builtin_memset(&h, 0, sizeof(h));
	h.magic = PERFQ_REGION_MAGIC;
	h.abi_version = PERFQ_ABI_VERSION;
	h.header_size = sizeof(struct perfq_region_header);
	h.features = g->features;
	h.ring_capacity = g->ring_capacity;
	h.record_size = PERFQ_RECORD_SIZE;
	h.dict_capacity = g->dict_capacity;
	h.device_clock_hz = g->device_clock_hz;
	h.timer_hz = g->timer_hz;
	__builtin_memcpy(h.device_name, g->device_name, n);
	for (id = 0; id < PERFQ_SECTION_COUNT; id++) {
		uint64_t size = id == PERFQ_SECTION_APP ? g->app_size : perfq_min_section_size(&h, id);

		if (id != PERFQ_SECTION_APP && size == 0)
			size = 1;
		size = round_up_page(size);
		h.sections[id].offset = off;
		h.sections[id].size = size;
		off += size;
	}
	h.region_size = off > round_up_page(g->min_region_size) ? off
								 : round_up_page(g->min_region_size);
	*out = h;
	return PERFQ_DEV_OK;
}

int perfq_dev_region_init(void *base, uint64_t len, const struct perfq_dev_geometry *g,
			  struct perfq_region_header *out)
{
	struct perfq_region_header h;
	struct perfq_dict_header *dict;
	int rc = perfq_dev_layout(g, &h);

	if (rc)
		return rc;
	if (!base || h.region_size > len)
		return PERFQ_DEV_ENOSPC;
	if (perfq_check_region_header(&h, len).fault != PERFQ_HDR_OK)
		return PERFQ_DEV_EINVAL;
	__builtin_memset(base, 0, (size_t)h.region_size);
	h.magic = 0;
	__builtin_memcpy(base, &h, sizeof(h));
	dict = (struct perfq_dict_header *)perfq_dev_section(base, &h, PERFQ_SECTION_DICT);
	dict->entry_size = sizeof(struct perfq_dict_entry);
	h.magic = PERFQ_REGION_MAGIC;
	if (out)
		*out = h;
	return PERFQ_DEV_OK;
}

int perfq_dev_dictionary_write(void *base, const struct perfq_region_header *h,
			       const struct perfq_dev_event *events, uint32_t count)
{
	struct perfq_dict_header *dict =
		(struct perfq_dict_header *)perfq_dev_section(base, h, PERFQ_SECTION_DICT);
	struct perfq_dict_entry *entries = (struct perfq_dict_entry *)(dict + 1);
	uint32_t i;

	if (count > h->dict_capacity)
		return PERFQ_DEV_ENOSPC;
	for (i = 0; i < count; i++) {
		const struct perfq_dev_event *e = &events[i];
		struct perfq_dict_entry entry;
		size_t n;

		if (!e->name)
			return PERFQ_DEV_EINVAL;
		n = name_len(e->name, PERFQ_EVENT_NAME_LEN);
		if (n == 0 || n >= PERFQ_EVENT_NAME_LEN || !printable(e->name, n) ||
		    e->kind == PERFQ_KIND_INVALID || e->kind > PERFQ_KIND_MAX)
			return PERFQ_DEV_EINVAL;
		__builtin_memset(&entry, 0, sizeof(entry));
		entry.event = e->event;
		entry.kind = e->kind;
		__builtin_memcpy(entry.name, e->name, n);
		entries[i] = entry;
	}
	dict->entry_size = sizeof(struct perfq_dict_entry);
	/* Pairs with the host's acquire load of count. */
	PERFQ_DEV_WMB();
	PERFQ_DEV_STORE_RELEASE(&dict->count, count);
	return PERFQ_DEV_OK;
}

void perfq_dev_region_publish(void *base)
{
	struct perfq_region_header *h = (struct perfq_region_header *)base;

	/* Pairs with the host's acquire load of the magic: every byte of the
	 * header, the dictionary and the application area is visible first. */
	PERFQ_DEV_WMB();
	PERFQ_DEV_STORE_RELEASE(&h->magic, (perfq_u64)PERFQ_REGION_MAGIC);
}

void perfq_dev_set_state(void *base, const struct perfq_region_header *h,
			 enum perfq_device_state state)
{
	struct perfq_host_ctrl *hc =
		(struct perfq_host_ctrl *)perfq_dev_section(base, h, PERFQ_SECTION_HOST_CTRL);

	PERFQ_DEV_WMB();
	PERFQ_DEV_STORE_RELEASE(&hc->device_state, (perfq_u32)state);
}

/* ------------------------------------------------------------------ */
/* Device queues                                                       */

int perfq_dev_queue_init(struct perfq_dev_queue *q, uint16_t stream, struct perfq_record *slots,
			 uint64_t capacity)
{
	if (!q || !slots || !is_pow2(capacity) || capacity < 2)
		return PERFQ_DEV_EINVAL;
	__builtin_memset(q, 0, sizeof(*q));
	q->slots = slots;
	q->mask = capacity - 1;
	q->stream = stream;
	return PERFQ_DEV_OK;
}

uint64_t perfq_dev_queue_pending(const struct perfq_dev_queue *q)
{
	return PERFQ_DEV_LOAD_ACQUIRE(&q->tail) - PERFQ_DEV_LOAD_RELAXED(&q->head);
}

/* ------------------------------------------------------------------ */
/* The collector                                                       */

int perfq_dev_collector_init(struct perfq_dev_collector *c, void *base,
			     const struct perfq_region_header *h, struct perfq_dev_queue **queues,
			     struct perfq_dev_delivery *delivery, uint32_t nqueues,
			     const struct perfq_dev_port *port)
{
	uint32_t i;

	if (!c || !base || !h || (nqueues && (!queues || !delivery)) || !port)
		return PERFQ_DEV_EINVAL;
	__builtin_memset(c, 0, sizeof(*c));
	c->ring = (struct perfq_record *)perfq_dev_section(base, h, PERFQ_SECTION_RING);
	c->mask = h->ring_capacity - 1;
	c->dev_ctrl = (struct perfq_dev_ctrl *)perfq_dev_section(base, h, PERFQ_SECTION_DEV_CTRL);
	c->host_ctrl = (struct perfq_host_ctrl *)perfq_dev_section(base, h, PERFQ_SECTION_HOST_CTRL);
	c->queues = queues;
	c->delivery = delivery;
	c->nqueues = nqueues;
	c->batch = 256;
	c->port = port;
	c->device_now = (h->features & PERFQ_FEAT_DEVICE_NOW) != 0;
	c->tail = PERFQ_DEV_LOAD_RELAXED(&c->dev_ctrl->tail);
	c->head_cache = PERFQ_DEV_LOAD_ACQUIRE(&c->dev_ctrl->head_mirror);
	for (i = 0; i < nqueues; i++)
		__builtin_memset(&delivery[i], 0, sizeof(delivery[i]));
	return PERFQ_DEV_OK;
}

void perfq_dev_collector_set_converter(struct perfq_dev_collector *c,
				       const struct perfq_dev_converter *conv)
{
	if (conv)
		c->converter = *conv;
	else
		__builtin_memset(&c->converter, 0, sizeof(c->converter));
}

static void collector_fault(struct perfq_dev_collector *c, enum perfq_dev_fault f, uint64_t seen)
{
	if (c->fault)
		return;
	c->fault = f;
	c->fault_seen = seen;
	c->fault_tail = c->tail;
	c->fault_prev = c->head_cache;
}

/* Free slots in the shared ring; re-reads the host's head (the mirror
 * the host posts to device memory) when the cached one says full. */
static uint64_t ring_room(struct perfq_dev_collector *c)
{
	uint64_t h;

	if (c->fault)
		return 0;
	if (c->tail - c->head_cache <= c->mask)
		return c->mask + 1 - (c->tail - c->head_cache);
	/* Pairs with the host's release of the head: it has read every slot
	 * below it. */
	h = PERFQ_DEV_LOAD_ACQUIRE(&c->dev_ctrl->head_mirror);
	if (h > c->tail) {
		collector_fault(c, PERFQ_DEV_FAULT_HEAD_AHEAD, h);
		return 0;
	}
	if (h < c->head_cache) {
		collector_fault(c, PERFQ_DEV_FAULT_HEAD_BACKWARDS, h);
		return 0;
	}
	if (c->tail - h > c->mask + 1) {
		collector_fault(c, PERFQ_DEV_FAULT_HEAD_TOO_FAR, h);
		return 0;
	}
	c->head_cache = h;
	return c->mask + 1 - (c->tail - h);
}

static void ring_put(struct perfq_dev_collector *c, struct perfq_record r)
{
	if (c->converter.convert)
		(void)c->converter.convert(c->converter.ctx, &r);
	c->ring[c->tail & c->mask] = r;
	c->tail++;
}

static void publish_tail(struct perfq_dev_collector *c)
{
	/* D after every record it publishes was stamped: posted before the
	 * tail, whose release orders it for the host's acquire. */
	if (c->device_now)
		PERFQ_DEV_STORE_RELAXED(&c->host_ctrl->device_now, c->port->device_now(c->port->ctx));
	PERFQ_DEV_WMB();
	/* Pairs with the host's acquire of tail_mirror: slots first. */
	PERFQ_DEV_STORE_RELEASE(&c->dev_ctrl->tail, c->tail);
	PERFQ_DEV_STORE_RELEASE(&c->host_ctrl->tail_mirror, c->tail);
}

/* One queue's share of a pass: its LOST record, then its records. */
static size_t collect_queue(struct perfq_dev_collector *c, struct perfq_dev_queue *q,
			    struct perfq_dev_delivery *d, uint64_t *room)
{
	const uint64_t dropped = perfq_dev_queue_dropped(q);
	uint64_t head = q->head, tail, n, k;
	size_t moved = 0;

	if (dropped > d->lost_reported) {
		/* Stamped with the newest drop's time (read after the count). */
		struct perfq_record lost;

		lost.index = perfq_dev_queue_emitted(q);
		lost.event = PERFQ_EVENT_LOST;
		lost.stream = q->stream;
		lost.flags = PERFQ_FLAGS(PERFQ_KIND_LOST, PERFQ_CLOCK_DEVICE);
		lost.time = PERFQ_DEV_LOAD_RELAXED(&q->last_drop_time);
		lost.arg = dropped - d->lost_reported;
		ring_put(c, lost);
		d->lost_reported = dropped;
		moved++;
		if (--*room == 0)
			return moved;
	}
	/* Pairs with the worker's release of tail. */
	tail = PERFQ_DEV_LOAD_ACQUIRE(&q->tail);
	n = tail - head;
	if (n > q->mask + 1) /* cannot happen: the worker is ours */
		n = 0;
	if (n > *room)
		n = *room;
	if (n > c->batch)
		n = c->batch;
	for (k = 0; k < n; k++)
		ring_put(c, q->slots[(head + k) & q->mask]);
	if (n) {
		/* Pairs with the worker's acquire of head: slots read first. */
		PERFQ_DEV_STORE_RELEASE(&q->head, head + n);
		d->delivered += n;
		*room -= n;
	}
	return moved + (size_t)n;
}

size_t perfq_dev_collect(struct perfq_dev_collector *c)
{
	size_t moved = 0;
	uint32_t i;

	if (c->converter.poll)
		c->converter.poll(c->converter.ctx);
	for (i = 0; i < c->nqueues; i++) {
		uint64_t room = ring_room(c);

		if (room == 0)
			break; /* keep the oldest data: stop reading the queues */
		moved += collect_queue(c, c->queues[i], &c->delivery[i], &room);
	}
	if (moved)
		publish_tail(c);
	/* Posted write: tells the host the collector is alive. */
	PERFQ_DEV_STORE_RELAXED(&c->host_ctrl->heartbeat, ++c->heartbeat);
	return moved;
}

bool perfq_dev_collector_drained(const struct perfq_dev_collector *c)
{
	uint32_t i;

	for (i = 0; i < c->nqueues; i++) {
		const struct perfq_dev_queue *q = c->queues[i];

		if (perfq_dev_queue_dropped(q) > c->delivery[i].lost_reported)
			return false;
		if (perfq_dev_queue_pending(q) != 0)
			return false;
	}
	return true;
}

void perfq_dev_collector_finish(struct perfq_dev_collector *c, void *base,
				const struct perfq_region_header *h)
{
	uint32_t i;

	for (i = 0; i < c->nqueues; i++)
		c->delivery[i].undelivered = perfq_dev_queue_pending(c->queues[i]);
	perfq_dev_set_state(base, h, PERFQ_DEVICE_STOPPED);
}

/* ------------------------------------------------------------------ */
/* Seqlocks (see sync/sync_buffer.h for the protocol)                  */

/* Begin a write: returns the even value to store when done.  Only we
 * write seq; a scribbled value is tolerated (the next odd after it). */
static uint64_t seq_begin(uint64_t *seq)
{
	const uint64_t odd = (PERFQ_DEV_LOAD_RELAXED(seq) + 1) | 1;

	PERFQ_DEV_STORE_RELAXED(seq, odd);
	return odd + 1;
}

static void seq_end(uint64_t *seq, uint64_t even)
{
	/* Pairs with the reader's acquire of seq: every field first. */
	PERFQ_DEV_WMB();
	PERFQ_DEV_STORE_RELEASE(seq, even);
}

#define PUT(p, v) PERFQ_DEV_STORE_RELEASE((p), (v))
#define GET(p) PERFQ_DEV_LOAD_ACQUIRE(p)

void perfq_dev_batch_write(struct perfq_sample_batch *dst, uint32_t round,
			   const struct perfq_clock_sample *samples, uint32_t count)
{
	const uint32_t n = count < PERFQ_SYNC_MAX_SAMPLES ? count : PERFQ_SYNC_MAX_SAMPLES;
	const uint64_t done = seq_begin(&dst->seq);
	uint32_t i;

	PUT(&dst->count, n);
	PUT(&dst->round, round);
	for (i = 0; i < n; i++) {
		PUT(&dst->samples[i].before, samples[i].before);
		PUT(&dst->samples[i].value, samples[i].value);
		PUT(&dst->samples[i].after, samples[i].after);
		PUT(&dst->samples[i].reserved, (perfq_u64)0);
	}
	seq_end(&dst->seq, done);
}

int perfq_dev_batch_read(const struct perfq_sample_batch *src, struct perfq_clock_sample *out,
			 uint32_t *count, uint32_t *round, uint64_t *seq, uint32_t max_tries)
{
	uint32_t i, k;

	for (i = 0; i < max_tries; i++) {
		const uint64_t s1 = GET(&src->seq);
		uint32_t c, r, n;

		if (s1 & 1)
			continue;
		c = GET(&src->count);
		r = GET(&src->round);
		/* A count read mid-write may be garbage: judge it once the
		 * copy is consistent, but never index beyond the array. */
		n = c < PERFQ_SYNC_MAX_SAMPLES ? c : PERFQ_SYNC_MAX_SAMPLES;
		for (k = 0; k < n; k++) {
			out[k].before = GET(&src->samples[k].before);
			out[k].value = GET(&src->samples[k].value);
			out[k].after = GET(&src->samples[k].after);
			out[k].reserved = 0;
		}
		if (PERFQ_DEV_LOAD_RELAXED(&src->seq) != s1)
			continue;
		if (c > PERFQ_SYNC_MAX_SAMPLES)
			return PERFQ_DEV_ECORRUPT;
		*count = n;
		*round = r;
		if (seq)
			*seq = s1;
		return PERFQ_DEV_OK;
	}
	return PERFQ_DEV_EAGAIN;
}

void perfq_dev_model_write(struct perfq_sync_model *dst, const struct perfq_sync_model *m)
{
	const uint64_t done = seq_begin(&dst->seq);

	PUT(&dst->device_ref, m->device_ref);
	PUT(&dst->host_ref_ns, m->host_ref_ns);
	PUT(&dst->rate_ppb, m->rate_ppb);
	PUT(&dst->uncertainty_ns, m->uncertainty_ns);
	PUT(&dst->valid_from_device, m->valid_from_device);
	PUT(&dst->segment, m->segment);
	PUT(&dst->flags, m->flags);
	seq_end(&dst->seq, done);
}

int perfq_dev_model_read(const struct perfq_sync_model *src, struct perfq_sync_model *out,
			 uint32_t max_tries)
{
	uint32_t i;

	for (i = 0; i < max_tries; i++) {
		const uint64_t s1 = GET(&src->seq);
		struct perfq_sync_model m;

		if (s1 & 1)
			continue;
		__builtin_memset(&m, 0, sizeof(m));
		m.device_ref = GET(&src->device_ref);
		m.host_ref_ns = GET(&src->host_ref_ns);
		m.rate_ppb = GET(&src->rate_ppb);
		m.uncertainty_ns = GET(&src->uncertainty_ns);
		m.valid_from_device = GET(&src->valid_from_device);
		m.segment = GET(&src->segment);
		m.flags = GET(&src->flags);
		if (PERFQ_DEV_LOAD_RELAXED(&src->seq) != s1)
			continue;
		m.seq = s1;
		*out = m;
		return PERFQ_DEV_OK;
	}
	return PERFQ_DEV_EAGAIN;
}

#undef PUT
#undef GET

uint64_t perfq_sync_apply(const struct perfq_sync_model *m, uint64_t device_time)
{
	/* dx * k / 1e9 with k = 1e9 + rate_ppb, exact without 128-bit
	 * integers: k = kh * 1e9 + kl and |dx| = xh * 1e9 + xl, so
	 * |dx| * k / 1e9 = |dx| * kh + xh * kl + xl * kl / 1e9, where only the
	 * last term has a fraction (xl, kl < 1e9: the product fits).  Every
	 * product is taken modulo 2^64, as the result is. */
	const uint64_t e9 = 1000000000u;
	const int64_t dx = (int64_t)(device_time - m->device_ref);
	const int64_t k = (int64_t)1000000000 + m->rate_ppb;
	const bool neg = (dx < 0) != (k < 0);
	const uint64_t ax = dx < 0 ? (uint64_t)0 - (uint64_t)dx : (uint64_t)dx;
	const uint64_t ak = k < 0 ? (uint64_t)0 - (uint64_t)k : (uint64_t)k;
	const uint64_t kh = ak / e9, kl = ak % e9, xh = ax / e9, xl = ax % e9;
	uint64_t q = ax * kh + xh * kl + (xl * kl + e9 / 2) / e9;

	if (neg)
		q = (uint64_t)0 - q;
	return (uint64_t)m->host_ref_ns + q;
}

/* ------------------------------------------------------------------ */
/* The timer server                                                    */

void perfq_dev_timer_init(struct perfq_dev_timer *t, void *base,
			  const struct perfq_region_header *h, const struct perfq_dev_port *port)
{
	__builtin_memset(t, 0, sizeof(*t));
	t->page = (struct perfq_timer_page *)perfq_dev_section(base, h, PERFQ_SECTION_TIMER);
	t->sync = (struct perfq_sync_page *)perfq_dev_section(base, h, PERFQ_SECTION_SYNC);
	t->port = port;
	t->sample_every = 3;
	t->last_tag = PERFQ_DEV_LOAD_ACQUIRE(&t->page->resp_tag);
}

struct perfq_clock_sample perfq_dev_sample(const struct perfq_dev_port *port)
{
	struct perfq_clock_sample s;

	s.before = port->timer_read(port->ctx);
	s.value = port->device_now(port->ctx);
	s.after = port->timer_read(port->ctx);
	s.reserved = 0;
	return s;
}

static void timer_publish(struct perfq_dev_timer *t)
{
	/* A round always gets at least one device sample. */
	if (t->count == 0)
		t->samples[t->count++] = perfq_dev_sample(t->port);
	perfq_dev_batch_write(&t->sync->device_samples, t->round, t->samples, t->count);
	t->count = 0;
	t->answered = 0;
}

enum perfq_dev_timer_event perfq_dev_timer_poll(struct perfq_dev_timer *t)
{
	const uint32_t w = PERFQ_DEV_LOAD_ACQUIRE(&t->page->window);
	uint64_t req;

	if (t->round != 0 && w != t->round) { /* closed, or already the next round */
		timer_publish(t);
		t->round = w;
		if (w)
			t->windows++;
		return PERFQ_DEV_TIMER_PUBLISHED;
	}
	if (t->round == 0) {
		if (w == 0)
			return PERFQ_DEV_TIMER_CLOSED;
		t->round = w;
		t->windows++;
	}
	/* Pairs with the reader's release of req_tag. */
	req = PERFQ_DEV_LOAD_ACQUIRE(&t->page->req_tag);
	if (req == t->last_tag)
		return PERFQ_DEV_TIMER_WAITING;
	PERFQ_DEV_STORE_RELAXED(&t->page->resp_value, t->port->timer_read(t->port->ctx));
	PERFQ_DEV_WMB();
	/* Pairs with the reader's acquire of resp_tag: resp_value first. */
	PERFQ_DEV_STORE_RELEASE(&t->page->resp_tag, req);
	t->last_tag = req;
	t->served++;
	/* Our own sample, right after the answer: interleaved with the host's
	 * (not after every answer: the host's next read would wait for it). */
	if (++t->answered % (t->sample_every ? t->sample_every : 1) == 0 &&
	    t->count < PERFQ_SYNC_MAX_SAMPLES)
		t->samples[t->count++] = perfq_dev_sample(t->port);
	return PERFQ_DEV_TIMER_SERVED;
}

/* ------------------------------------------------------------------ */
/* The job queue                                                       */

#define JOB_SIZE 32u

static uint64_t jobq_ring_bytes(uint64_t cap)
{
	return sizeof(struct perfq_spsc_header) + cap * JOB_SIZE;
}

static struct perfq_jobq_channel *jobq_channel(const struct perfq_dev_jobq *q, uint32_t ch)
{
	return (struct perfq_jobq_channel *)(q->app + q->offset + (uint64_t)ch * q->stride);
}

struct perfq_spsc_header *perfq_dev_jobq_submit_ring(const struct perfq_dev_jobq *q, uint32_t ch)
{
	return (struct perfq_spsc_header *)(jobq_channel(q, ch) + 1);
}

struct perfq_spsc_header *perfq_dev_jobq_complete_ring(const struct perfq_dev_jobq *q, uint32_t ch)
{
	return (struct perfq_spsc_header *)((uint8_t *)perfq_dev_jobq_submit_ring(q, ch) +
					    jobq_ring_bytes(q->capacity));
}

static void spsc_init(struct perfq_spsc_header *r, uint64_t cap)
{
	__builtin_memset(r, 0, sizeof(*r));
	r->version = PERFQ_ABI_VERSION;
	r->element_size = JOB_SIZE;
	r->capacity = cap;
	PERFQ_DEV_STORE_RELEASE(&r->magic, (perfq_u64)PERFQ_SPSC_MAGIC);
}

int perfq_dev_jobq_format(struct perfq_dev_jobq *q, void *app, uint64_t app_size,
			  uint32_t max_channels)
{
	const uint64_t offset = PERFQ_CACHELINE; /* after the header */
	struct perfq_jobq_header *h = (struct perfq_jobq_header *)app;
	uint32_t channels = max_channels, i;
	uint64_t cap = 0, c;

	if (!q || !app || app_size < 2 * PERFQ_DEV_PAGE || max_channels == 0)
		return PERFQ_DEV_ENOSPC;
	/* The largest power-of-two capacity (at least 16) with rings for as
	 * many channels as asked; fewer channels if even that does not fit. */
	for (; channels > 0; --channels) {
		const uint64_t per = (app_size - offset) / channels;

		for (c = (uint64_t)1 << 16; c >= 16; c >>= 1)
			if (sizeof(struct perfq_jobq_channel) + 2 * jobq_ring_bytes(c) <= per) {
				cap = c;
				break;
			}
		if (cap)
			break;
	}
	if (cap == 0)
		return PERFQ_DEV_ENOSPC;
	__builtin_memset(app, 0, (size_t)app_size);
	q->app = (uint8_t *)app;
	q->channels = channels;
	q->capacity = cap;
	q->offset = offset;
	q->stride = (sizeof(struct perfq_jobq_channel) + 2 * jobq_ring_bytes(cap) + 63) / 64 * 64;
	h->version = PERFQ_ABI_VERSION;
	h->channels = channels;
	h->ring_capacity = cap;
	h->channel_offset = offset;
	h->channel_stride = q->stride;
	for (i = 0; i < channels; i++) {
		spsc_init(perfq_dev_jobq_submit_ring(q, i), cap);
		spsc_init(perfq_dev_jobq_complete_ring(q, i), cap);
	}
	/* Pairs with the host's acquire of the magic. */
	PERFQ_DEV_WMB();
	PERFQ_DEV_STORE_RELEASE(&h->magic, (perfq_u64)PERFQ_JOBQ_MAGIC);
	return PERFQ_DEV_OK;
}

bool perfq_dev_jobq_take(const struct perfq_dev_jobq *q, uint32_t ch, struct perfq_job *out)
{
	struct perfq_spsc_header *r = perfq_dev_jobq_submit_ring(q, ch);
	const uint64_t head = PERFQ_DEV_LOAD_RELAXED(&r->head);
	/* Pairs with the host's release of tail.  The host is not trusted: a
	 * tail behind the head or beyond the capacity reads as empty. */
	const uint64_t tail = PERFQ_DEV_LOAD_ACQUIRE(&r->tail);
	const struct perfq_job *slots = (const struct perfq_job *)(r + 1);

	if (tail == head || tail - head > q->capacity)
		return false;
	*out = slots[head & (q->capacity - 1)];
	PERFQ_DEV_STORE_RELEASE(&r->head, head + 1);
	return true;
}

bool perfq_dev_jobq_can_complete(const struct perfq_dev_jobq *q, uint32_t ch)
{
	struct perfq_spsc_header *r = perfq_dev_jobq_complete_ring(q, ch);
	const uint64_t tail = PERFQ_DEV_LOAD_RELAXED(&r->tail);
	const uint64_t head = PERFQ_DEV_LOAD_ACQUIRE(&r->head);

	return head <= tail && tail - head < q->capacity;
}

bool perfq_dev_jobq_complete(const struct perfq_dev_jobq *q, uint32_t ch,
			     const struct perfq_job_completion *c)
{
	struct perfq_spsc_header *r = perfq_dev_jobq_complete_ring(q, ch);
	struct perfq_job_completion *slots = (struct perfq_job_completion *)(r + 1);
	const uint64_t tail = PERFQ_DEV_LOAD_RELAXED(&r->tail);

	if (!perfq_dev_jobq_can_complete(q, ch))
		return false;
	slots[tail & (q->capacity - 1)] = *c;
	PERFQ_DEV_WMB();
	/* Pairs with the host's acquire of tail: the slot first. */
	PERFQ_DEV_STORE_RELEASE(&r->tail, tail + 1);
	return true;
}
