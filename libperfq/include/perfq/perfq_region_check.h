/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR MIT */
/*
 * The rules a perfq region header must meet, written once for every reader
 * of one: the host library (libperfq's validate_region_header()) and the
 * kernel driver (perfq.ko), which both refuse a device whose header breaks
 * any of them.  C, no library calls, no allocation: it builds in the kernel,
 * in freestanding firmware and in C++.
 *
 * perfq_check_region_header() returns the first rule broken (fault 0: none)
 * with what the caller needs to say so: which section or byte (index,
 * index2) and the values involved (a, b).  Each caller words its message.
 */
#ifndef PERFQ_REGION_CHECK_H
#define PERFQ_REGION_CHECK_H

#include "perfq_abi.h"

enum perfq_header_fault {
	PERFQ_HDR_OK = 0,
	PERFQ_HDR_SHORT,	    /* a: bytes mapped, b: the header's size */
	PERFQ_HDR_MAGIC,	    /* a: magic */
	PERFQ_HDR_ABI_VERSION,	    /* a: abi_version */
	PERFQ_HDR_HEADER_SIZE,	    /* a: header_size */
	PERFQ_HDR_FEATURES,	    /* a: features, b: the unknown bits */
	PERFQ_HDR_REGION_SIZE,	    /* a: region_size, b: bytes mapped */
	PERFQ_HDR_RECORD_SIZE,	    /* a: record_size */
	PERFQ_HDR_RING_CAPACITY,    /* a: ring_capacity */
	PERFQ_HDR_DICT_CAPACITY,    /* a: dict_capacity, b: region_size */
	PERFQ_HDR_DEVICE_CLOCK_HZ,  /* a: device_clock_hz */
	PERFQ_HDR_TIMER_HZ,	    /* a: timer_hz */
	PERFQ_HDR_NAME_UNTERMINATED, /* device_name has no NUL */
	PERFQ_HDR_NAME_EMPTY,
	PERFQ_HDR_NAME_BYTE,	    /* index: offset, a: the non-printable byte */
	PERFQ_HDR_NAME_TAIL,	    /* index: offset, a: a nonzero byte after the NUL */
	PERFQ_HDR_SECTION_ALIGN,    /* index: section, a: offset, b: size */
	PERFQ_HDR_SECTION_BOUNDS,   /* index: section, a: offset, b: size */
	PERFQ_HDR_SECTION_SMALL,    /* index: section, a: size, b: the minimum */
	PERFQ_HDR_HEADER_OFFSET,    /* a: the header section's offset */
	PERFQ_HDR_SECTION_OVERLAP,  /* index, index2: the two sections */
	PERFQ_HDR_RESERVED,	    /* index: which, a: its value */
};

struct perfq_header_check {
	enum perfq_header_fault fault;
	int index;
	int index2;
	perfq_u64 a;
	perfq_u64 b;
};

/* What a fault is about, as messages print it. */
static inline const char *perfq_header_fault_name(enum perfq_header_fault f)
{
	switch (f) {
	case PERFQ_HDR_OK: return "no fault";
	case PERFQ_HDR_SHORT: return "mapping shorter than the header";
	case PERFQ_HDR_MAGIC: return "magic (not a perfq region, or not initialized yet)";
	case PERFQ_HDR_ABI_VERSION: return "abi_version";
	case PERFQ_HDR_HEADER_SIZE: return "header_size";
	case PERFQ_HDR_FEATURES: return "unknown feature bits";
	case PERFQ_HDR_REGION_SIZE: return "region_size (a page multiple within what is mapped)";
	case PERFQ_HDR_RECORD_SIZE: return "record_size";
	case PERFQ_HDR_RING_CAPACITY: return "ring_capacity (a power of two in range)";
	case PERFQ_HDR_DICT_CAPACITY: return "dict_capacity (larger than the region)";
	case PERFQ_HDR_DEVICE_CLOCK_HZ: return "device_clock_hz out of range";
	case PERFQ_HDR_TIMER_HZ: return "timer_hz out of range";
	case PERFQ_HDR_NAME_UNTERMINATED: return "device_name not NUL-terminated";
	case PERFQ_HDR_NAME_EMPTY: return "device_name empty";
	case PERFQ_HDR_NAME_BYTE: return "device_name has a non-printable byte";
	case PERFQ_HDR_NAME_TAIL: return "device_name has a nonzero byte after its NUL";
	case PERFQ_HDR_SECTION_ALIGN: return "section not page aligned";
	case PERFQ_HDR_SECTION_BOUNDS: return "section outside the region";
	case PERFQ_HDR_SECTION_SMALL: return "section too small for what it holds";
	case PERFQ_HDR_HEADER_OFFSET: return "header section not at offset 0";
	case PERFQ_HDR_SECTION_OVERLAP: return "sections overlap";
	case PERFQ_HDR_RESERVED: return "reserved word nonzero";
	}
	return "unknown fault";
}

/* The section names, by enum perfq_section_id, as messages print them. */
static inline const char *perfq_section_name(int id)
{
	static const char *const names[PERFQ_SECTION_COUNT] = {
		"header", "dev_ctrl", "host_ctrl", "timer", "sync", "dict", "app", "ring",
	};
	return id >= 0 && id < PERFQ_SECTION_COUNT ? names[id] : "unknown";
}

/* The bytes section `id` must hold at least. */
static inline perfq_u64 perfq_min_section_size(const struct perfq_region_header *h, int id)
{
	switch (id) {
	case PERFQ_SECTION_HEADER:
		return sizeof(struct perfq_region_header);
	case PERFQ_SECTION_DEV_CTRL:
		return sizeof(struct perfq_dev_ctrl);
	case PERFQ_SECTION_HOST_CTRL:
		return sizeof(struct perfq_host_ctrl);
	case PERFQ_SECTION_TIMER:
		return sizeof(struct perfq_timer_page);
	case PERFQ_SECTION_SYNC:
		return sizeof(struct perfq_sync_page);
	case PERFQ_SECTION_DICT:
		return sizeof(struct perfq_dict_header) +
		       (perfq_u64)h->dict_capacity * sizeof(struct perfq_dict_entry);
	case PERFQ_SECTION_RING:
		return h->ring_capacity * PERFQ_RECORD_SIZE;
	default:
		return 0;
	}
}

static inline struct perfq_header_check perfq_header_fault_at(enum perfq_header_fault f, int index,
							       int index2, perfq_u64 a, perfq_u64 b)
{
	struct perfq_header_check c;

	c.fault = f;
	c.index = index;
	c.index2 = index2;
	c.a = a;
	c.b = b;
	return c;
}

/*
 * Checks the header `h` of a region of which `mapped_len` bytes are mapped
 * (h is a copy the caller took: a device may rewrite the original while it
 * is checked).
 */
static inline struct perfq_header_check
perfq_check_region_header(const struct perfq_region_header *h, perfq_u64 mapped_len)
{
	const unsigned int page = PERFQ_PAGE_SIZE;
	unsigned int i, j, nul;

	if (mapped_len < sizeof(*h))
		return perfq_header_fault_at(PERFQ_HDR_SHORT, 0, 0, mapped_len, sizeof(*h));
	if (h->magic != PERFQ_REGION_MAGIC)
		return perfq_header_fault_at(PERFQ_HDR_MAGIC, 0, 0, h->magic, 0);
	if (h->abi_version != PERFQ_ABI_VERSION)
		return perfq_header_fault_at(PERFQ_HDR_ABI_VERSION, 0, 0, h->abi_version, 0);
	if (h->header_size != sizeof(*h))
		return perfq_header_fault_at(PERFQ_HDR_HEADER_SIZE, 0, 0, h->header_size, 0);
	if (h->features & ~PERFQ_FEAT_ALL)
		return perfq_header_fault_at(PERFQ_HDR_FEATURES, 0, 0, h->features,
					     h->features & ~PERFQ_FEAT_ALL);
	if (h->region_size % page || h->region_size < page || h->region_size > mapped_len)
		return perfq_header_fault_at(PERFQ_HDR_REGION_SIZE, 0, 0, h->region_size, mapped_len);
	if (h->record_size != PERFQ_RECORD_SIZE)
		return perfq_header_fault_at(PERFQ_HDR_RECORD_SIZE, 0, 0, h->record_size, 0);
	if (!h->ring_capacity || (h->ring_capacity & (h->ring_capacity - 1)) ||
	    h->ring_capacity < PERFQ_RING_CAPACITY_MIN || h->ring_capacity > PERFQ_RING_CAPACITY_MAX)
		return perfq_header_fault_at(PERFQ_HDR_RING_CAPACITY, 0, 0, h->ring_capacity, 0);
	if ((perfq_u64)h->dict_capacity * sizeof(struct perfq_dict_entry) > h->region_size)
		return perfq_header_fault_at(PERFQ_HDR_DICT_CAPACITY, 0, 0, h->dict_capacity,
					     h->region_size);
	if (!h->device_clock_hz || h->device_clock_hz > PERFQ_CLOCK_HZ_MAX)
		return perfq_header_fault_at(PERFQ_HDR_DEVICE_CLOCK_HZ, 0, 0, h->device_clock_hz, 0);
	if (!h->timer_hz || h->timer_hz > PERFQ_CLOCK_HZ_MAX)
		return perfq_header_fault_at(PERFQ_HDR_TIMER_HZ, 0, 0, h->timer_hz, 0);

	for (nul = 0; nul < PERFQ_DEVICE_NAME_LEN && h->device_name[nul]; nul++)
		;
	if (nul == PERFQ_DEVICE_NAME_LEN)
		return perfq_header_fault_at(PERFQ_HDR_NAME_UNTERMINATED, 0, 0, 0, 0);
	if (nul == 0)
		return perfq_header_fault_at(PERFQ_HDR_NAME_EMPTY, 0, 0, 0, 0);
	for (i = 0; i < nul; i++)
		if (h->device_name[i] < 0x20 || h->device_name[i] > 0x7e)
			return perfq_header_fault_at(PERFQ_HDR_NAME_BYTE, (int)i, 0,
						     h->device_name[i], 0);
	for (i = nul; i < PERFQ_DEVICE_NAME_LEN; i++)
		if (h->device_name[i])
			return perfq_header_fault_at(PERFQ_HDR_NAME_TAIL, (int)i, 0,
						     h->device_name[i], 0);

	for (i = 0; i < PERFQ_SECTION_COUNT; i++) {
		const struct perfq_section *s = &h->sections[i];

		if (s->offset % page || s->size % page)
			return perfq_header_fault_at(PERFQ_HDR_SECTION_ALIGN, (int)i, 0, s->offset,
						     s->size);
		if (s->offset > h->region_size || s->size > h->region_size - s->offset)
			return perfq_header_fault_at(PERFQ_HDR_SECTION_BOUNDS, (int)i, 0, s->offset,
						     s->size);
		if (s->size < perfq_min_section_size(h, (int)i))
			return perfq_header_fault_at(PERFQ_HDR_SECTION_SMALL, (int)i, 0, s->size,
						     perfq_min_section_size(h, (int)i));
	}
	if (h->sections[PERFQ_SECTION_HEADER].offset != 0)
		return perfq_header_fault_at(PERFQ_HDR_HEADER_OFFSET, 0, 0,
					     h->sections[PERFQ_SECTION_HEADER].offset, 0);
	for (i = 0; i < PERFQ_SECTION_COUNT; i++) {
		for (j = i + 1; j < PERFQ_SECTION_COUNT; j++) {
			const struct perfq_section *x = &h->sections[i];
			const struct perfq_section *y = &h->sections[j];

			if (x->size && y->size && x->offset < y->offset + y->size &&
			    y->offset < x->offset + x->size)
				return perfq_header_fault_at(PERFQ_HDR_SECTION_OVERLAP, (int)i,
							     (int)j, 0, 0);
		}
	}
	for (i = 0; i < sizeof(h->reserved) / sizeof(h->reserved[0]); i++)
		if (h->reserved[i])
			return perfq_header_fault_at(PERFQ_HDR_RESERVED, (int)i, 0, h->reserved[i], 0);
	return perfq_header_fault_at(PERFQ_HDR_OK, 0, 0, 0, 0);
}

#endif /* PERFQ_REGION_CHECK_H */
