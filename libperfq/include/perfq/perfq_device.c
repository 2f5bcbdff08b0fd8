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
		const uint16_t kind = (uint16_t)(e->kind & ~PERFQ_DEV_ARG_BYTES);
		const bool bytes = (e->kind & PERFQ_DEV_ARG_BYTES) != 0;
		struct perfq_dict_entry entry;
		size_t n;

		if (!e->name)
			return PERFQ_DEV_EINVAL;
		n = name_len(e->name, PERFQ_EVENT_NAME_LEN);
		if (n == 0 || n >= PERFQ_EVENT_NAME_LEN || !printable(e->name, n) ||
		    kind == PERFQ_KIND_INVALID || kind > PERFQ_KIND_MAX ||
		    (bytes && kind == PERFQ_KIND_COUNTER))
			return PERFQ_DEV_EINVAL;
		__builtin_memset(&entry, 0, sizeof(entry));
		entry.event = e->event;
		entry.kind = kind;
		entry.flags = bytes ? PERFQ_DICT_ARG_BYTES : 0;
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

void perfq_dev_line_publish(struct perfq_sync_page *p, const struct perfq_sync_line_pub *l)
{
	struct perfq_sync_line_pub *dst = &p->lines[l->id % PERFQ_SYNC_LINES];
	const uint64_t done = seq_begin(&dst->seq);

	PUT(&dst->id, l->id);
	PUT(&dst->device_ref, l->device_ref);
	PUT(&dst->host_ref_ns, l->host_ref_ns);
	PUT(&dst->host_frac, l->host_frac);
	PUT(&dst->ns_per_tick, l->ns_per_tick);
	seq_end(&dst->seq, done);
	/* Pairs with the host's acquire: the slot first.  Before any record
	 * converted with it is published (the collector's tail). */
	PERFQ_DEV_STORE_RELEASE(&p->lines_newest, l->id);
}

int perfq_dev_line_read(const struct perfq_sync_page *p, uint64_t id,
			struct perfq_sync_line_pub *out, uint32_t max_tries)
{
	const struct perfq_sync_line_pub *src = &p->lines[id % PERFQ_SYNC_LINES];
	uint32_t i;

	for (i = 0; i < max_tries; i++) {
		const uint64_t s1 = GET(&src->seq);
		struct perfq_sync_line_pub l;

		if (s1 & 1)
			continue;
		__builtin_memset(&l, 0, sizeof(l));
		l.id = GET(&src->id);
		l.device_ref = GET(&src->device_ref);
		l.host_ref_ns = GET(&src->host_ref_ns);
		l.host_frac = GET(&src->host_frac);
		l.ns_per_tick = GET(&src->ns_per_tick);
		if (PERFQ_DEV_LOAD_RELAXED(&src->seq) != s1)
			continue;
		l.seq = s1;
		*out = l;
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
	/* k in u64: 1e9 + rate_ppb may exceed the s64 range. */
	const uint64_t uk = (uint64_t)1000000000 + (uint64_t)m->rate_ppb;
	const bool k_neg = m->rate_ppb < -1000000000;
	const bool neg = (dx < 0) != k_neg;
	const uint64_t ax = dx < 0 ? (uint64_t)0 - (uint64_t)dx : (uint64_t)dx;
	const uint64_t ak = k_neg ? (uint64_t)0 - uk : uk;
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
	t->timer_hz = h->timer_hz;
	perfq_dev_timer_asleep(t); /* a previous server's word says nothing of this one */
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
		t->closed_r = t->port->timer_read(t->port->ctx);
		t->closed_seen = w == 0;
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

/* us (at most 2^32) in ticks of hz (at most PERFQ_CLOCK_HZ_MAX), and
 * ticks back in us, without overflow. */
static uint64_t ticks_of_us(uint64_t us, uint64_t hz)
{
	return us / 1000000 * hz + us % 1000000 * hz / 1000000;
}

static uint64_t us_of_ticks(uint64_t ticks, uint64_t hz)
{
	return ticks / hz * 1000000 + ticks % hz * 1000000 / hz;
}

void perfq_dev_timer_asleep(struct perfq_dev_timer *t)
{
	/* Then the caller's sleep looks at window (a futex wait compares it):
	 * a host that still saw serving set stored its window before this,
	 * and the sleep does not begin. */
	__atomic_store_n(&t->page->serving, 0u, __ATOMIC_SEQ_CST);
	t->serving = false;
}

#define NEXT_WINDOW_MAX_US 3600000000u /* an hour */

uint64_t perfq_dev_timer_idle_us(struct perfq_dev_timer *t, uint32_t lead_us, uint32_t grace_us)
{
	const uint32_t next_us = PERFQ_DEV_LOAD_RELAXED(&t->page->next_window_us);
	uint64_t due, lead, elapsed, idle_us = UINT64_MAX;

	if (!t->closed_seen || next_us == 0 || next_us > NEXT_WINDOW_MAX_US || t->timer_hz == 0 ||
	    t->timer_hz > PERFQ_CLOCK_HZ_MAX)
		goto none;
	due = ticks_of_us(next_us, t->timer_hz);
	lead = ticks_of_us(lead_us, t->timer_hz);
	elapsed = t->port->timer_read(t->port->ctx) - t->closed_r;
	if (elapsed < due && due - elapsed > lead) {
		idle_us = us_of_ticks(due - elapsed - lead, t->timer_hz) + 1;
	} else if (elapsed <= due || elapsed - due <= ticks_of_us(grace_us, t->timer_hz)) {
		if (!t->serving) {
			__atomic_store_n(&t->page->serving, 1u, __ATOMIC_RELEASE);
			t->serving = true;
		}
		return 0;
	} else {
		t->closed_seen = false; /* the host did not come: used up */
	}
none:
	if (t->serving)
		perfq_dev_timer_asleep(t);
	return idle_us;
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

#ifndef PERFQ_DEVICE_NO_MODE_B
/* ------------------------------------------------------------------ */
/* Clock sync (see perfq_device.h and docs/sync.md)                    */

#define INF_D (__builtin_inf())
#define E9 1e9

static double fabs_d(double x)
{
	return x < 0 ? -x : x;
}

static double max_d(double a, double b)
{
	return a > b ? a : b;
}

static double max3(double a, double b, double c)
{
	return max_d(max_d(a, b), c);
}

static bool finite_d(double x)
{
	return x - x == 0;
}

static double sqrt_d(double x)
{
	return __builtin_sqrt(x);
}

/* 2^52: a double this large has no fraction (and an int64_t cannot hold
 * every one beyond 2^63). */
#define WHOLE_D 4503599627370496.0

/* Nearest integer, halves away from zero.  Beyond 2^52 (or not a number)
 * x is its own: hostile samples give fits far outside any clock. */
static double round_d(double x)
{
	if (!(fabs_d(x) < WHOLE_D))
		return x;
	return x < 0 ? -(double)(int64_t)(-x + 0.5) : (double)(int64_t)(x + 0.5);
}

static double floor_d(double x)
{
	double t;

	if (!(fabs_d(x) < WHOLE_D))
		return x;
	t = (double)(int64_t)x;
	return t > x ? t - 1 : t;
}

static int64_t time_diff(uint64_t a, uint64_t b)
{
	return (int64_t)(a - b);
}

/* Modular add of a rounded signed delta; deltas beyond s64 are clamped. */
static uint64_t add_ns(uint64_t base, double delta)
{
	int64_t v;

	if (!finite_d(delta))
		v = 0;
	else if (delta >= 9.2e18)
		v = INT64_MAX;
	else if (delta <= -9.2e18)
		v = INT64_MIN;
	else
		v = (int64_t)round_d(delta);
	return base + (uint64_t)v;
}

/* Saturating add, for range bounds. */
static uint64_t sat_add(uint64_t base, double delta)
{
	const double r = (double)base + delta;

	if (!finite_d(r))
		return base;
	if (r <= 0)
		return 0;
	if (r >= 1.8446744073709551615e19)
		return UINT64_MAX;
	return (uint64_t)r;
}

double perfq_sync_select(double *p, uint32_t n, uint32_t stride, uint32_t k)
{
	uint32_t lo = 0, hi = n - 1;

#define AT(i) p[(size_t)(i) * stride]
	while (lo < hi) {
		const double pivot = AT(lo + (hi - lo) / 2);
		uint32_t i = lo, j = hi;

		while (i <= j) {
			while (AT(i) < pivot)
				i++;
			while (AT(j) > pivot)
				j--;
			if (i <= j) {
				const double t = AT(i);

				AT(i) = AT(j);
				AT(j) = t;
				i++;
				if (j == 0)
					break;
				j--;
			}
		}
		if (k <= j)
			hi = j;
		else if (k >= i)
			lo = i;
		else
			break;
	}
	return AT(k);
#undef AT
}

/* The median of p[0], p[stride], ... (the mean of the two middle values
 * for an even count; 0 when empty), reordering them. */
static double median_strided(double *p, uint32_t n, uint32_t stride)
{
	double hi, lo;
	uint32_t i;

	if (n == 0)
		return 0;
	hi = perfq_sync_select(p, n, stride, n / 2);
	if (n % 2)
		return hi;
	lo = p[0];
	for (i = 1; i < n / 2; i++)
		lo = max_d(lo, p[(size_t)i * stride]);
	return (lo + hi) / 2;
}

void perfq_sync_default_selection(struct perfq_sync_selection *s)
{
	s->margin_ns = 50;
	s->margin_frac = 0.1;
	s->outlier_k = 5;
	s->average_scatter = true;
	s->rate_error = 1e-3;
}

void perfq_sync_default_config(struct perfq_sync_config *c)
{
	c->window = 128;
	c->reject_k = 4;
	c->reject_floor_ns = 20;
	c->sigma_floor_ns = 2;
	c->prior_drift_ppm = 1000;
	c->step_min_ns = 2000;
	c->step_k = 8;
	c->witness_k = 10;
	c->max_uncertainty_ns = 1e6;
}

void perfq_sync_default_gate_config(struct perfq_sync_gate_config *g)
{
	g->floor_ns = 2000;
	g->factor = 4;
	g->contended_delay_ns = 20000;
}

/* ---- Observation -------------------------------------------------- */

#define MAX_BRACKET_TICKS ((int64_t)1 << 62)
#define MAX_PAIRING_GAP_NS 10e9
#define ROUND_DRIFT_ALLOWANCE 2e-3

struct picked {
	double a, b, max_half_ns, min_delay_ns;
	uint32_t used;
};

static void sort_by_delay(struct perfq_sync_cand *c, uint32_t n)
{
	uint32_t i, j;

	for (i = 1; i < n; i++) {
		struct perfq_sync_cand x = c[i];

		for (j = i; j > 0 && c[j - 1].delay_ns > x.delay_ns; j--)
			c[j] = c[j - 1];
		c[j] = x;
	}
}

/* Shifted-value vote among the tight candidates (c sorted by delay):
 * clears ok for a sample too far from the tight ones' median. */
static double vote(struct perfq_sync_cand *c, uint32_t n, const struct perfq_sync_selection *sel,
		   uint32_t *ntight_out)
{
	const double min_delay = c[0].delay_ns;
	const double margin = max_d(sel->margin_ns, sel->margin_frac * min_delay);
	uint32_t ntight = 0, i;
	double med, med_at, spread;

	for (i = 0; i < n; i++)
		c[i].ok = 1;
	while (ntight < n && (ntight < 3 || c[ntight].delay_ns <= 2 * min_delay + margin))
		ntight++;
	if (ntight_out)
		*ntight_out = ntight;
	if (ntight < 3)
		return 0;
	for (i = 0; i < ntight; i++)
		c[i].tmp = c[i].implied;
	med = median_strided(&c[0].tmp, ntight, sizeof(*c) / sizeof(double));
	for (i = 0; i < ntight; i++)
		c[i].tmp = c[i].at_ns;
	med_at = median_strided(&c[0].tmp, ntight, sizeof(*c) / sizeof(double));
	for (i = 0; i < ntight; i++)
		c[i].tmp = fabs_d(c[i].implied - med);
	spread = 1.4826 * median_strided(&c[0].tmp, ntight, sizeof(*c) / sizeof(double));
	for (i = 0; i < n; i++) {
		const double tol = max_d(sel->outlier_k * spread,
					 c[i].delay_ns / 2 + min_delay / 2 + margin) +
				   ROUND_DRIFT_ALLOWANCE * fabs_d(c[i].at_ns - med_at);

		if (fabs_d(c[i].implied - med) > tol)
			c[i].ok = 0;
	}
	return spread;
}

/* The host side: selection by delay. */
static struct picked pick(struct perfq_sync_cand *c, uint32_t n,
			  const struct perfq_sync_selection *sel)
{
	struct picked p = { 0, 0, 0, 0, 0 };
	double best = -1, spread;
	uint32_t i;

	sort_by_delay(c, n);
	spread = vote(c, n, sel, NULL);
	for (i = 0; i < n; i++) {
		double m2;

		if (!c[i].ok)
			continue;
		if (best < 0)
			best = c[i].delay_ns;
		m2 = max3(sel->margin_ns, sel->margin_frac * best, sel->average_scatter ? spread : 0);
		if (c[i].delay_ns > best + m2)
			break;
		p.a += c[i].a;
		p.b += c[i].b;
		p.max_half_ns = max_d(p.max_half_ns, c[i].delay_ns / 2);
		p.used++;
	}
	if (p.used == 0) { /* everything voted out: the tightest */
		p.a = c[0].a;
		p.b = c[0].b;
		p.max_half_ns = c[0].delay_ns / 2;
		p.used = 1;
	} else {
		p.a /= p.used;
		p.b /= p.used;
	}
	p.min_delay_ns = best < 0 ? c[0].delay_ns : best;
	return p;
}

/* The device side: a weighted mean over the samples that survive the
 * vote, weights 1 / (width^2/12 + value scatter + (distance x rate
 * error)^2); max_half_ns over those that carry the mean. */
static struct picked weigh(struct perfq_sync_cand *c, uint32_t n,
			   const struct perfq_sync_selection *sel, double at_host_ns)
{
	struct picked p = { 0, 0, 0, 0, 0 };
	uint32_t ntight = 0, i, ref = 0;
	double spread, excess2 = 0, W = 0, wmax = 0, da = 0, db = 0;

	sort_by_delay(c, n);
	spread = vote(c, n, sel, &ntight);
	if (sel->average_scatter && ntight >= 3) {
		double own = 0;

		for (i = 0; i < ntight; i++)
			own += c[i].delay_ns * c[i].delay_ns / 12;
		excess2 = max_d(0, spread * spread - own / ntight);
	}
	for (i = 0; i < n; i++) {
		double gap, var;

		c[i].w = 0;
		if (!c[i].ok)
			continue;
		gap = (c[i].at_ns - at_host_ns) * sel->rate_error;
		var = c[i].delay_ns * c[i].delay_ns / 12 + excess2 + gap * gap;
		c[i].w = 1 / (var + 1e-6);
		W += c[i].w;
		wmax = max_d(wmax, c[i].w);
	}
	if (W == 0) {
		p.a = c[0].a;
		p.b = c[0].b;
		p.max_half_ns = c[0].delay_ns / 2;
		p.min_delay_ns = c[0].delay_ns;
		p.used = 1;
		return p;
	}
	while (c[ref].w != wmax)
		ref++;
	for (i = 0; i < n; i++) {
		if (c[i].w == 0)
			continue;
		da += c[i].w * (c[i].a - c[ref].a);
		db += c[i].w * (c[i].b - c[ref].b);
		if (c[i].w >= wmax / 16) {
			p.used++;
			p.max_half_ns = max_d(p.max_half_ns, c[i].delay_ns / 2);
		}
	}
	p.a = c[ref].a + da / W;
	p.b = c[ref].b + db / W;
	p.min_delay_ns = c[ref].delay_ns;
	for (i = 0; i < n; i++)
		if (c[i].ok) {
			p.min_delay_ns = c[i].delay_ns;
			break;
		}
	return p;
}

static const struct perfq_clock_sample *first_usable(const struct perfq_clock_sample *s,
						     uint32_t n)
{
	uint32_t i;

	for (i = 0; i < n; i++)
		if (time_diff(s[i].after, s[i].before) >= 0 &&
		    time_diff(s[i].after, s[i].before) <= MAX_BRACKET_TICKS)
			return &s[i];
	return NULL;
}

int perfq_sync_observe(const struct perfq_clock_sample *host, uint32_t nh,
		       const struct perfq_clock_sample *device, uint32_t nd,
		       const struct perfq_sync_rates *rates, const struct perfq_sync_selection *sel,
		       uint32_t round, struct perfq_sync_cand *scratch, struct perfq_sync_obs *out,
		       double *gap_out)
{
	const struct perfq_clock_sample *h0, *d0;
	struct perfq_sync_cand *hc = scratch, *dc;
	uint32_t nhc = 0, ndc = 0, i;
	struct picked hp, dp;
	double tns, dns, gap_ns, hstar, dround, hround;
	uint64_t base_h, base_r, base_d;

	if (rates->device_hz == 0 || rates->device_hz > PERFQ_CLOCK_HZ_MAX ||
	    rates->timer_hz == 0 || rates->timer_hz > PERFQ_CLOCK_HZ_MAX)
		return PERFQ_SYNC_OBS_RATES;
	tns = E9 / (double)rates->timer_hz;
	dns = E9 / (double)rates->device_hz;
	h0 = first_usable(host, nh);
	if (!h0)
		return PERFQ_SYNC_OBS_NO_HOST;
	base_h = h0->before;
	base_r = h0->value;
	for (i = 0; i < nh; i++) {
		const int64_t delay = time_diff(host[i].after, host[i].before);
		double hmid, r2;

		if (delay < 0 || delay > MAX_BRACKET_TICKS)
			continue;
		hmid = (double)time_diff(host[i].before, base_h) + (double)delay / 2;
		r2 = (double)time_diff(host[i].value, base_r);
		hc[nhc].delay_ns = (double)delay;
		hc[nhc].at_ns = hmid;
		hc[nhc].implied = hmid - r2 * tns;
		hc[nhc].a = hmid;
		hc[nhc].b = r2;
		nhc++;
	}
	d0 = first_usable(device, nd);
	if (!d0)
		return PERFQ_SYNC_OBS_NO_DEVICE;
	base_d = d0->value;
	dc = scratch + nhc;
	for (i = 0; i < nd; i++) {
		const int64_t delay = time_diff(device[i].after, device[i].before);
		double r1, d;

		if (delay < 0 || delay > MAX_BRACKET_TICKS)
			continue;
		r1 = (double)time_diff(device[i].before, base_r) + (double)delay / 2;
		d = (double)time_diff(device[i].value, base_d);
		dc[ndc].delay_ns = (double)delay * tns;
		dc[ndc].at_ns = r1 * tns;
		dc[ndc].implied = d * dns - r1 * tns;
		dc[ndc].a = d;
		dc[ndc].b = r1;
		ndc++;
	}
	hp = pick(hc, nhc, sel);
	dp = weigh(dc, ndc, sel, hp.b * tns);
	gap_ns = (dp.b - hp.b) * tns;
	if (gap_out)
		*gap_out = gap_ns;
	if (fabs_d(gap_ns) > MAX_PAIRING_GAP_NS)
		return PERFQ_SYNC_OBS_PAIRING;
	hstar = hp.a + gap_ns;
	dround = round_d(dp.a);
	hstar += (dround - dp.a) * dns;
	hround = round_d(hstar);
	out->device_time = add_ns(base_d, dround); /* (clamped: hostile samples) */
	out->host_ns = add_ns(base_h, hround);
	out->uncertainty_ns = hp.max_half_ns + dp.max_half_ns + fabs_d(gap_ns) * sel->rate_error;
	out->host_delay_ns = hp.min_delay_ns;
	out->device_delay_ns = dp.min_delay_ns;
	out->round = round;
	out->host_used = (uint16_t)(hp.used < 65535 ? hp.used : 65535);
	out->device_used = (uint16_t)(dp.used < 65535 ? dp.used : 65535);
	return PERFQ_SYNC_OBS_OK;
}

struct perfq_sync_selection perfq_sync_selection_for(const struct perfq_sync_selection *base,
						     const struct perfq_sync_line *m,
						     const struct perfq_sync_rates *rates)
{
	struct perfq_sync_selection s = *base;

	if (m->valid)
		s.rate_error = max_d(base->rate_error,
				     1.5 * fabs_d(perfq_sync_line_drift_ppb(m, rates)) * 1e-9);
	return s;
}

/* ---- The line ----------------------------------------------------- */

uint64_t perfq_sync_line_to_host(const struct perfq_sync_line *m, uint64_t d)
{
	const double dx = (double)time_diff(d, m->device_ref);

	return add_ns(m->host_ref, m->host_frac + dx * m->ns_per_tick);
}

double perfq_sync_line_distance_ns(const struct perfq_sync_line *m, uint64_t d)
{
	return fabs_d((double)time_diff(d, m->device_ref) * m->ns_per_tick);
}

double perfq_sync_line_claim(const struct perfq_sync_line *m, uint64_t d)
{
	const double dx = perfq_sync_line_distance_ns(m, d);

	return dx > 0 ? m->uncertainty_ns + 3 * m->rate_sigma_ppb * 1e-9 * dx : m->uncertainty_ns;
}

double perfq_sync_line_claim_newer(const struct perfq_sync_line *m, uint64_t d,
				   const struct perfq_sync_line *newer)
{
	const double gap_ppb = fabs_d((m->ns_per_tick / newer->ns_per_tick - 1) * E9);
	const double rate_ppb = max_d(3 * m->rate_sigma_ppb, gap_ppb + 3 * newer->rate_sigma_ppb);
	const double dx = perfq_sync_line_distance_ns(m, d);

	return dx > 0 ? m->uncertainty_ns + rate_ppb * 1e-9 * dx : m->uncertainty_ns;
}

bool perfq_sync_line_settled_over(const struct perfq_sync_line *m, double dx_ns)
{
	return 3 * m->rate_sigma_ppb * 1e-9 * dx_ns <= 0.25 * m->uncertainty_ns;
}

bool perfq_sync_line_vouches(const struct perfq_sync_line *m, uint64_t d, double tight_ns)
{
	const double dx = perfq_sync_line_distance_ns(m, d);

	return perfq_sync_line_settled_over(m, dx) &&
	       m->uncertainty_ns + 3 * m->rate_sigma_ppb * 1e-9 * dx <= tight_ns;
}

double perfq_sync_line_drift_ppb(const struct perfq_sync_line *m,
				 const struct perfq_sync_rates *rates)
{
	return (E9 / (double)rates->device_hz / m->ns_per_tick - 1) * E9;
}

void perfq_sync_line_to_abi(const struct perfq_sync_line *m, struct perfq_sync_model *out)
{
	const double ppb = round_d((m->ns_per_tick - 1) * E9);

	__builtin_memset(out, 0, sizeof(*out));
	out->device_ref = m->device_ref;
	out->host_ref_ns = (int64_t)(m->host_ref + (m->host_frac >= 0.5 ? 1 : 0));
	out->rate_ppb = ppb > 9.2e18	  ? INT64_MAX
			: ppb < -9.2e18 ? INT64_MIN
			: finite_d(ppb) ? (int64_t)ppb
					: 0;
	/* No number is no bound (the largest), never 0. */
	out->uncertainty_ns = !(m->uncertainty_ns < 1.8e19) ? (uint64_t)1.8e19
			      : m->uncertainty_ns <= 0	      ? 0
			      : (uint64_t)m->uncertainty_ns +
					((double)(uint64_t)m->uncertainty_ns < m->uncertainty_ns);
	out->valid_from_device = m->valid_from_device;
	out->segment = m->segment;
	out->flags = m->valid ? PERFQ_SYNC_MODEL_VALID : 0;
}

/* ---- The robust fit ----------------------------------------------- */

/* perfq_sync_fit.misfit: over the PERFQ_SYNC_MISFIT_POINTS inliers nearest
 * to x = 0, the largest |r| - u (uses the scratch field tmp). */
static double misfit_near(struct perfq_sync_pt *p, uint32_t n)
{
	double worst = 0;
	uint32_t k, i;

	for (i = 0; i < n; i++)
		p[i].tmp = 0; /* 1: taken */
	for (k = 0; k < PERFQ_SYNC_MISFIT_POINTS; k++) {
		uint32_t best = n;

		for (i = 0; i < n; i++)
			if (p[i].in && p[i].tmp == 0 &&
			    (best == n || fabs_d(p[i].x) < fabs_d(p[best].x)))
				best = i;
		if (best == n)
			break;
		p[best].tmp = 1;
		worst = max_d(worst, fabs_d(p[best].r) - p[best].u);
	}
	return worst;
}

void perfq_sync_robust_fit(struct perfq_sync_pt *p, uint32_t n, double prior_var,
			   const struct perfq_sync_config *cfg, struct perfq_sync_fit *f)
{
	const double lambda = prior_var > 0 ? 1 / prior_var : 1e30;
	const uint32_t stride = sizeof(*p) / sizeof(double);
	int iter;
	uint32_t i;

	__builtin_memset(f, 0, sizeof(*f));
	for (iter = 0; iter < 6; iter++) {
		double W = 0, sx = 0, sy = 0, xbar, ybar, sxx = 0, sxy = 0, chi2 = 0, med, mad,
		       scale2;
		uint32_t m = 0, kept = 0, t = 0;
		bool changed = false;

		for (i = 0; i < n; i++)
			if (p[i].in) {
				W += p[i].w;
				sx += p[i].w * p[i].x;
				sy += p[i].w * p[i].y;
				m++;
			}
		xbar = sx / W;
		ybar = sy / W;
		for (i = 0; i < n; i++)
			if (p[i].in) {
				const double dx = p[i].x - xbar;

				sxx += p[i].w * dx * dx;
				sxy += p[i].w * dx * (p[i].y - ybar);
			}
		f->c = sxy / (sxx + lambda);
		f->a = ybar - f->c * xbar;
		/* One observation measures no slope: only the prior vouches. */
		f->bias_c2 = sxx > 0 ? (f->c - sxy / sxx) * (f->c - sxy / sxx) : INF_D;
		f->xbar = xbar;
		for (i = 0; i < n; i++) {
			p[i].r = p[i].y - (f->a + f->c * p[i].x);
			if (p[i].in) {
				chi2 += p[i].w * p[i].r * p[i].r;
				p[t++].tmp = p[i].r;
			}
		}
		med = median_strided(&p[0].tmp, t, stride);
		for (i = 0; i < t; i++)
			p[i].tmp = fabs_d(p[i].tmp - med);
		mad = 1.4826 * median_strided(&p[0].tmp, t, stride);
		f->sigma = max_d(mad, cfg->sigma_floor_ns);
		scale2 = m > 2 ? max_d(1, chi2 / (m - 2)) : 1;
		f->var_ybar = scale2 / W;
		f->var_c = scale2 / (sxx + lambda);
		f->inliers = m;
		if (n < 3)
			break;
		for (i = 0; i < n; i++) {
			const double thr = max3(cfg->reject_k * f->sigma, 2.0 * p[i].u,
						cfg->reject_floor_ns);

			p[i].next = fabs_d(p[i].r) <= thr;
			kept += p[i].next;
		}
		if (kept < 2)
			break; /* keep the previous set rather than fit nothing */
		for (i = 0; i < n; i++) {
			changed |= p[i].next != p[i].in;
			p[i].in = p[i].next;
		}
		if (!changed)
			break;
	}
	f->misfit = misfit_near(p, n);
}

struct perfq_sync_pt perfq_sync_make_pt(const struct perfq_sync_obs *o, uint64_t d_o, uint64_t h_o,
					double s0, const struct perfq_sync_config *cfg)
{
	struct perfq_sync_pt pt;
	const double u = o->uncertainty_ns, fl = cfg->sigma_floor_ns;

	__builtin_memset(&pt, 0, sizeof(pt));
	pt.x = (double)time_diff(o->device_time, d_o);
	pt.y = (double)time_diff(o->host_ns, h_o) - s0 * pt.x;
	pt.w = 1 / (u * u / 3 + fl * fl);
	pt.u = u;
	pt.in = 1;
	return pt;
}

void perfq_sync_knot_from(const struct perfq_sync_fit *f, const struct perfq_sync_obs *o, double s0,
			  uint32_t segment, uint64_t valid_from, bool prior_measured,
			  struct perfq_sync_line *m)
{
	const double fl = floor_d(f->a);
	const double bias2 = prior_measured ? 0 : f->bias_c2;
	const double off2 = f->xbar != 0 ? bias2 * f->xbar * f->xbar : 0;
	const double var0 = f->var_ybar + f->xbar * f->xbar * f->var_c; /* var_at(0) */

	__builtin_memset(m, 0, sizeof(*m));
	m->device_ref = o->device_time;
	m->host_ref = add_ns(o->host_ns, fl);
	m->host_frac = f->a - fl;
	m->ns_per_tick = s0 + f->c;
	m->uncertainty_ns = 3 * sqrt_d(var0 + off2) + f->misfit;
	m->rate_sigma_ppb = sqrt_d(f->var_c + bias2) * E9;
	m->valid_from_device = valid_from;
	m->segment = segment;
	/* A slope the ABI cannot carry (rate_ppb in (-1e9, 1e18 - 1e9): a
	 * device clock faster than 1e18 ticks or slower than one tick a host
	 * second), or no number at all, is no clock: hostile or garbage
	 * samples.  Such a line is not a model (the fuzzer's input gave one
	 * of 6e-14 ns a tick, whose ABI form no reader accepts). */
	m->valid = finite_d(m->ns_per_tick) && m->ns_per_tick > 1.000001e-9 &&
		   m->ns_per_tick < 0.999999e9 && finite_d(m->uncertainty_ns);
}

double perfq_sync_gate_of(double *u, uint32_t n, const struct perfq_sync_gate_config *cfg)
{
	if (n == 0)
		return INF_D;
	return max_d(cfg->floor_ns, cfg->factor * perfq_sync_select(u, n, 1, n / 4));
}

bool perfq_sync_usable(const struct perfq_sync_obs *o, const struct perfq_sync_config *cfg)
{
	return finite_d(o->uncertainty_ns) && o->uncertainty_ns >= 0 &&
	       o->uncertainty_ns <= cfg->max_uncertainty_ns;
}

/* ---- The online tracker ------------------------------------------- */

#define HOOK(s, name, ...)                                                 \
	do {                                                               \
		if ((s)->hist.name)                                        \
			(s)->hist.name((s)->hist.ctx, __VA_ARGS__);       \
	} while (0)

void perfq_sync_online_init(struct perfq_sync_online *s, const struct perfq_sync_rates *rates,
			    const struct perfq_sync_config *cfg, const struct perfq_sync_history *hist)
{
	double sd;

	__builtin_memset(s, 0, sizeof(*s));
	s->rates = *rates;
	s->cfg = *cfg;
	if (s->cfg.window < 2)
		s->cfg.window = 2;
	if (s->cfg.window > PERFQ_SYNC_WINDOW_MAX)
		s->cfg.window = PERFQ_SYNC_WINDOW_MAX;
	if (hist)
		s->hist = *hist;
	s->prior_slope = E9 / (double)rates->device_hz;
	sd = s->cfg.prior_drift_ppm * 1e-6 * s->prior_slope;
	s->prior_var = sd * sd;
	s->seg_slope0 = 1;
}

static void refit(struct perfq_sync_online *s)
{
	const struct perfq_sync_obs *o = &s->window[s->n - 1];
	struct perfq_sync_fit f;
	uint32_t i;

	/* From all points: one rejected earlier may fit now. */
	for (i = 0; i < s->n; i++)
		s->pts[i] = perfq_sync_make_pt(&s->window[i], o->device_time, o->host_ns,
					       s->seg_slope0, &s->cfg);
	perfq_sync_robust_fit(s->pts, s->n, s->seg_var0, &s->cfg, &f);
	for (i = 0; i < s->n; i++)
		s->inlier[i] = s->pts[i].in;
	s->fit_xbar = f.xbar;
	s->fit_var_ybar = f.var_ybar;
	s->fit_var_c = f.var_c;
	s->fit_bias_c2 = s->seg_prior_measured || !finite_d(f.bias_c2) ? 0 : f.bias_c2;
	s->sigma = f.sigma;
	perfq_sync_knot_from(&f, o, s->seg_slope0, s->seg_id,
			     s->seg_knots == 0 ? s->seg_valid_from : o->device_time,
			     s->seg_prior_measured, &s->current);
}

static void push_knot(struct perfq_sync_online *s)
{
	s->seg_knots++;
	HOOK(s, knot, &s->current);
}

static void window_push(struct perfq_sync_online *s, const struct perfq_sync_obs *o)
{
	uint32_t i;

	if (s->n == s->cfg.window) { /* drop the oldest */
		for (i = 1; i < s->n; i++) {
			s->window[i - 1] = s->window[i];
			s->inlier[i - 1] = s->inlier[i];
		}
		s->n--;
	}
	s->window[s->n] = *o;
	s->inlier[s->n] = 1;
	s->n++;
	HOOK(s, observed, o->host_ns);
}

static void open_segment(struct perfq_sync_online *s, uint32_t id, uint64_t valid_from)
{
	s->seg_id = id;
	s->seg_valid_from = valid_from;
	s->seg_knots = 0;
	HOOK(s, open_segment, id, valid_from);
	s->n = 0;
	s->have_pending = false;
	s->have_pending2 = false;
}

static void take(struct perfq_sync_online *s, const struct perfq_sync_obs *o)
{
	window_push(s, o);
	refit(s);
	push_knot(s);
}

static void start_segment(struct perfq_sync_online *s, const struct perfq_sync_obs *first,
			  const struct perfq_sync_obs *second)
{
	const struct perfq_sync_obs *head = first ? first : second;
	uint64_t valid_from = 0;

	if (s->n) {
		/* The step happened between the old segment's last observation
		 * and `head`: split that interval at its host midpoint. */
		const struct perfq_sync_obs *last = &s->window[s->n - 1];
		const double gap = (double)time_diff(head->host_ns, last->host_ns);
		const double old_slope = s->current.ns_per_tick;
		const double floor_sd = 0.1e-6 * (E9 / (double)s->rates.device_hz);

		HOOK(s, close_segment, sat_add(last->device_time, gap / 2 / old_slope));
		valid_from = sat_add(head->device_time, -gap / 2 / old_slope);
		/* The clock's rate does not change at a step: start from it. */
		s->seg_slope0 = old_slope;
		s->seg_var0 = max_d(s->fit_var_c + s->fit_bias_c2, floor_sd * floor_sd);
		s->seg_prior_measured = s->seg_prior_measured || s->n >= 2;
	} else {
		s->seg_slope0 = s->prior_slope;
		s->seg_var0 = s->prior_var;
		s->seg_prior_measured = false;
	}
	open_segment(s, s->next_segment++, valid_from);
	if (first)
		take(s, first);
	take(s, second);
}

static bool far_off(const struct perfq_sync_online *s, const struct perfq_sync_obs *obs,
		    double at_least_ns)
{
	const double x = (double)time_diff(obs->device_time, s->current.device_ref);
	const double resid =
		(double)time_diff(obs->host_ns, perfq_sync_line_to_host(&s->current, obs->device_time));
	const double dxb = x - s->fit_xbar;
	const double model_unc = 3 * sqrt_d(s->fit_var_ybar + dxb * dxb * s->fit_var_c);
	const double tol = max_d(max3(s->cfg.step_min_ns, s->cfg.step_k * s->sigma,
				      2 * obs->uncertainty_ns + model_unc),
				 at_least_ns);

	return fabs_d(resid) > tol;
}

static void start_rate_segment(struct perfq_sync_online *s, const struct perfq_sync_obs *a,
			       const struct perfq_sync_obs *b, const struct perfq_sync_obs *c,
			       double slope, double slope_var)
{
	struct perfq_sync_obs keep[4];
	uint32_t nkeep = 0, i;
	uint64_t valid_from = 0;
	const double floor_sd = 0.1e-6 * (E9 / (double)s->rates.device_hz);

	s->rate_breaks++;
	if (s->n <= 1 && s->next_segment > 0) {
		/* A segment that never measured a rate was wrong from its
		 * start: replace it, keeping its observation if on the line. */
		valid_from = s->seg_valid_from;
		if (s->n) {
			const struct perfq_sync_obs *o = &s->window[0];
			const double dx = (double)time_diff(o->device_time, a->device_time);
			const double e = (double)time_diff(o->host_ns, a->host_ns) - slope * dx;
			const double tol = max_d(s->cfg.step_min_ns / 2,
						 2 * (o->uncertainty_ns + a->uncertainty_ns)) +
					   3 * sqrt_d(slope_var) * fabs_d(dx);

			if (fabs_d(e) <= tol)
				keep[nkeep++] = *o;
		}
		if (s->hist.drop_segment)
			s->hist.drop_segment(s->hist.ctx);
	} else if (s->n) {
		/* Split between the old segment's last observation and a. */
		const struct perfq_sync_obs *last = &s->window[s->n - 1];
		const double gap = (double)time_diff(a->host_ns, last->host_ns);

		HOOK(s, close_segment, sat_add(last->device_time, gap / 2 / s->current.ns_per_tick));
		valid_from = sat_add(a->device_time, -gap / 2 / slope);
	}
	s->seg_slope0 = slope;
	s->seg_var0 = max_d(slope_var, floor_sd * floor_sd);
	s->seg_prior_measured = true; /* the line through three observations */
	keep[nkeep++] = *a;
	keep[nkeep++] = *b;
	keep[nkeep++] = *c;
	open_segment(s, s->next_segment++, valid_from);
	for (i = 0; i < nkeep; i++)
		take(s, &keep[i]);
}

static enum perfq_sync_verdict step_candidate(struct perfq_sync_online *s,
					      const struct perfq_sync_obs *obs)
{
	if (s->have_pending) {
		const struct perfq_sync_obs *p = &s->pending;
		const double dx = (double)time_diff(obs->device_time, p->device_time);
		const double e = (double)time_diff(obs->host_ns, p->host_ns) -
				 s->current.ns_per_tick * dx;
		const double confirm = max3(s->cfg.step_min_ns / 2, s->cfg.step_k * s->sigma,
					    2 * (obs->uncertainty_ns + p->uncertainty_ns)) +
				       3 * sqrt_d(s->fit_var_c) * fabs_d(dx);

		if (fabs_d(e) <= confirm) {
			const struct perfq_sync_obs first = *p, second = *obs;

			start_segment(s, &first, &second);
			return PERFQ_SYNC_NEW_SEGMENT;
		}
		if (s->have_pending2) {
			/* No one offset: one line?  The middle candidate against
			 * the line through the other two. */
			const struct perfq_sync_obs a = s->pending2, b = s->pending, c = *obs;
			const double dxc = (double)time_diff(c.device_time, a.device_time);
			const double dxb = (double)time_diff(b.device_time, a.device_time);

			if (dxc > 0 && dxb > 0 && dxb < dxc) {
				const double slope = (double)time_diff(c.host_ns, a.host_ns) / dxc;
				const double eb = (double)time_diff(b.host_ns, a.host_ns) - slope * dxb;
				const double tol = max3(s->cfg.step_min_ns / 2, s->cfg.step_k * s->sigma,
							2 * (a.uncertainty_ns + b.uncertainty_ns +
							     c.uncertainty_ns));

				if (slope > 0 && fabs_d(eb) <= tol) {
					const double sd = 2 * (a.uncertainty_ns + c.uncertainty_ns) / dxc;

					start_rate_segment(s, &a, &b, &c, slope, sd * sd);
					return PERFQ_SYNC_NEW_SEGMENT;
				}
			}
		}
		s->pending2 = s->pending;
		s->have_pending2 = true;
	}
	s->pending = *obs;
	s->have_pending = true;
	return PERFQ_SYNC_STEP_PENDING;
}

static enum perfq_sync_verdict unusable(const struct perfq_sync_obs *obs)
{
	return finite_d(obs->uncertainty_ns) && obs->uncertainty_ns >= 0 ? PERFQ_SYNC_OUTLIER
									  : PERFQ_SYNC_INVALID;
}

enum perfq_sync_verdict perfq_sync_online_add(struct perfq_sync_online *s,
					      const struct perfq_sync_obs *obs)
{
	if (!perfq_sync_usable(obs, &s->cfg))
		return unusable(obs);
	if (!s->current.valid) {
		start_segment(s, NULL, obs);
		return PERFQ_SYNC_ACCEPTED;
	}
	if (far_off(s, obs, 0))
		return step_candidate(s, obs);
	s->have_pending = false; /* a lone far-off observation was an outlier */
	s->have_pending2 = false;
	take(s, obs);
	return s->inlier[s->n - 1] ? PERFQ_SYNC_ACCEPTED : PERFQ_SYNC_REJECTED;
}

enum perfq_sync_verdict perfq_sync_online_witness(struct perfq_sync_online *s,
						  const struct perfq_sync_obs *obs)
{
	if (!perfq_sync_usable(obs, &s->cfg))
		return unusable(obs);
	/* Only a step much wider than the observation itself. */
	if (!s->current.valid || !far_off(s, obs, s->cfg.witness_k * obs->uncertainty_ns))
		return PERFQ_SYNC_OUTLIER;
	return step_candidate(s, obs);
}

/* ---- The gate ----------------------------------------------------- */

void perfq_sync_gate_init(struct perfq_sync_gate *g, const struct perfq_sync_gate_config *cfg)
{
	__builtin_memset(g, 0, sizeof(*g));
	g->cfg = *cfg;
	g->tight = INF_D;
}

enum perfq_sync_verdict perfq_sync_gate_feed(struct perfq_sync_gate *g, struct perfq_sync_online *s,
					     const struct perfq_sync_obs *obs)
{
	enum perfq_sync_verdict v;
	double gate, least;
	bool useless = false;
	uint32_t i;

	/* Against the usual uncertainty of this device's rounds before it. */
	__builtin_memcpy(g->scratch, g->recent, g->count * sizeof(double));
	gate = perfq_sync_gate_of(g->scratch, g->count, &g->cfg);
	if (g->count < PERFQ_SYNC_GATE_ROUNDS)
		g->recent[g->count++] = obs->uncertainty_ns;
	else
		g->recent[g->pos++ % PERFQ_SYNC_GATE_ROUNDS] = obs->uncertainty_ns;
	/* A contended round that agrees with the model stays out of it while
	 * the model predicts its time better than the round can tell. */
	if (obs->host_delay_ns > g->cfg.contended_delay_ns && s->current.valid) {
		const struct perfq_sync_line *m = &s->current;
		const double rate_3s =
			3 * m->rate_sigma_ppb * 1e-9 * perfq_sync_line_distance_ns(m, obs->device_time);
		const double model_unc = sqrt_d(m->uncertainty_ns * m->uncertainty_ns + rate_3s * rate_3s);
		const double resid = fabs_d(
			(double)time_diff(obs->host_ns, perfq_sync_line_to_host(m, obs->device_time)));

		useless = model_unc < obs->uncertainty_ns && resid <= obs->uncertainty_ns + model_unc;
	}
	v = !s->current.valid || (obs->uncertainty_ns <= gate && !useless)
		    ? perfq_sync_online_add(s, obs)
		    : perfq_sync_online_witness(s, obs);
	if (perfq_sync_taken(v))
		g->taken++;
	/* Until 64 rounds tell what this device's rounds give, the floor. */
	if (g->count < PERFQ_SYNC_GATE_ROUNDS) {
		g->tight = g->cfg.floor_ns;
	} else {
		least = g->recent[0];
		for (i = 1; i < g->count; i++)
			least = g->recent[i] < least ? g->recent[i] : least;
		g->tight = max_d(g->cfg.floor_ns, g->cfg.factor * least);
	}
	return v;
}

bool perfq_sync_convert_record(const struct perfq_sync_online *s, const struct perfq_sync_gate *g,
			       struct perfq_record *r)
{
	if (!s->current.valid || PERFQ_FLAGS_DOMAIN(r->flags) != PERFQ_CLOCK_DEVICE)
		return false;
	/* The host's rule for extrapolating past the newest round; nor while
	 * the newest round contradicts the model (a step or rate break
	 * waiting for confirmation). */
	if (g->taken < PERFQ_SYNC_MIN_MODEL_ROUNDS || s->have_pending ||
	    !perfq_sync_line_vouches(&s->current, r->time, g->tight))
		return false;
	r->time = perfq_sync_line_to_host(&s->current, r->time);
	r->flags = (perfq_u16)((r->flags & ~PERFQ_FLAGS_DOMAIN_MASK) |
			       (PERFQ_CLOCK_HOST_BY_DEVICE << PERFQ_FLAGS_DOMAIN_SHIFT));
	return true;
}

/* ---- Mode B on the device ----------------------------------------- */

void perfq_dev_mode_b_init(struct perfq_dev_mode_b *m, void *base,
			   const struct perfq_region_header *h)
{
	struct perfq_sync_rates rates;
	struct perfq_sync_config cfg;
	struct perfq_sync_gate_config gc;

	__builtin_memset(m, 0, sizeof(*m));
	m->sync = (struct perfq_sync_page *)perfq_dev_section(base, h, PERFQ_SECTION_SYNC);
	rates.device_hz = h->device_clock_hz;
	rates.timer_hz = h->timer_hz;
	perfq_sync_default_config(&cfg);
	perfq_sync_default_gate_config(&gc);
	perfq_sync_default_selection(&m->sel);
	perfq_sync_online_init(&m->online, &rates, &cfg, NULL);
	perfq_sync_gate_init(&m->gate, &gc);
	/* Line numbers go on from a collector that ran on this region before. */
	m->line.id = PERFQ_DEV_LOAD_ACQUIRE(&m->sync->lines_newest);
}

/* Publishes the model's line when it changed (a round taken, a step
 * confirmed): before the collector converts a record with it. */
PERFQ_STATIC_ASSERT(sizeof(double) == sizeof(perfq_u64), "a line's doubles as their bits");

static void publish_line(struct perfq_dev_mode_b *m)
{
	const struct perfq_sync_line *c = &m->online.current;
	struct perfq_sync_line_pub l;

	if (!c->valid)
		return;
	__builtin_memset(&l, 0, sizeof(l));
	l.device_ref = c->device_ref;
	l.host_ref_ns = c->host_ref;
	__builtin_memcpy(&l.host_frac, &c->host_frac, sizeof(l.host_frac));
	__builtin_memcpy(&l.ns_per_tick, &c->ns_per_tick, sizeof(l.ns_per_tick));
	if (m->line.id && l.device_ref == m->line.device_ref &&
	    l.host_ref_ns == m->line.host_ref_ns && l.host_frac == m->line.host_frac &&
	    l.ns_per_tick == m->line.ns_per_tick)
		return;
	l.id = m->line.id + 1;
	perfq_dev_line_publish(m->sync, &l);
	m->line = l;
}

void perfq_dev_mode_b_poll(void *ctx)
{
	struct perfq_dev_mode_b *m = ctx;
	uint32_t nh, nd, hround, dround;
	uint64_t seq;
	struct perfq_sync_selection sel;
	struct perfq_sync_obs obs;

	if (PERFQ_DEV_LOAD_ACQUIRE(&m->sync->mode) != PERFQ_SYNC_MODE_B) {
		m->converting = false;
		return;
	}
	/* Cheap when nothing changed: the mailbox's sequence word. */
	seq = PERFQ_DEV_LOAD_ACQUIRE(&m->sync->mailbox.seq);
	if (seq == m->mailbox_seq)
		return;
	if (perfq_dev_batch_read(&m->sync->mailbox, m->host, &nh, &hround, &seq, 64))
		return;
	if (hround == m->round || nh == 0) {
		m->mailbox_seq = seq;
		return;
	}
	/* Our own samples of the same round (the timer server's). */
	if (perfq_dev_batch_read(&m->sync->device_samples, m->dev, &nd, &dround, NULL, 64) ||
	    dround != hround)
		return; /* not published yet: look again next pass */
	m->mailbox_seq = seq;
	m->round = hround;
	sel = perfq_sync_selection_for(&m->sel, &m->online.current, &m->online.rates);
	if (perfq_sync_observe(m->host, nh, m->dev, nd, &m->online.rates, &sel, hround, m->cand,
			       &obs, NULL) == PERFQ_SYNC_OBS_OK)
		perfq_sync_gate_feed(&m->gate, &m->online, &obs);
	publish_line(m);
	m->converting = m->online.current.valid;
}

bool perfq_dev_mode_b_convert(void *ctx, struct perfq_record *r)
{
	struct perfq_dev_mode_b *m = ctx;

	return m->converting && perfq_sync_convert_record(&m->online, &m->gate, r);
}
#endif /* PERFQ_DEVICE_NO_MODE_B */
