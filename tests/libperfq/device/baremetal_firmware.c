// SPDX-License-Identifier: MIT
/*
 * A bare-metal device firmware on the perfq device SDK, for the freestanding
 * check (freestanding_check.sh): no C library, no OS.  The board supplies
 * its two clocks; the BAR's address comes from the boot code.  One worker
 * loop records, the collector and the timer server are polled from the
 * same main loop, as a single-core microcontroller would run them.
 */
#include "perfq/perfq_device.h"

uint64_t board_device_now(void *ctx);
uint64_t board_timer_read(void *ctx);
void firmware_main(void *bar, uint64_t bar_size);

static const struct perfq_dev_port port = { board_device_now, board_timer_read, 0 };
static const struct perfq_dev_event events[] = {
	{ PERFQ_EVENT_LOST, PERFQ_KIND_LOST, "perfq_lost" },
	{ 1, PERFQ_KIND_INSTANT, "irq" },
};
static struct perfq_record slots[256];
static struct perfq_dev_queue queue;
static struct perfq_dev_queue *queues[1] = { &queue };
static struct perfq_dev_delivery delivery[1];
static struct perfq_dev_collector collector;
static struct perfq_dev_timer timer;
#ifndef PERFQ_DEVICE_NO_MODE_B
static struct perfq_dev_mode_b mode_b;
#endif

void firmware_main(void *bar, uint64_t bar_size)
{
	const struct perfq_dev_geometry g = {
		.ring_capacity = 1024, .dict_capacity = 8, .app_size = 0,
		.device_clock_hz = 100000000u, .timer_hz = 25000000u,
		.features = PERFQ_FEAT_TIMER_REQRESP | PERFQ_FEAT_DEVICE_NOW,
		.device_name = "bare-metal firmware",
	};
	struct perfq_region_header h;
	uint64_t n;

	if (perfq_dev_region_init(bar, bar_size, &g, &h) ||
	    perfq_dev_dictionary_write(bar, &h, events, 2))
		return;
	perfq_dev_region_publish(bar);
	perfq_dev_queue_init(&queue, 0, slots, 256);
	perfq_dev_collector_init(&collector, bar, &h, queues, delivery, 1, &port);
#ifndef PERFQ_DEVICE_NO_MODE_B
	perfq_dev_mode_b_init(&mode_b, bar, &h);
	perfq_dev_collector_set_converter(&collector, &(struct perfq_dev_converter){
		perfq_dev_mode_b_poll, perfq_dev_mode_b_convert, &mode_b });
#endif
	perfq_dev_timer_init(&timer, bar, &h, &port);
	perfq_dev_set_state(bar, &h, PERFQ_DEVICE_RUNNING);
	for (n = 0; !perfq_dev_collector_fault(&collector); n++) {
		perfq_dev_record(&queue, &port, 1, PERFQ_KIND_INSTANT, n);
		perfq_dev_collect(&collector);
		while (perfq_dev_timer_poll(&timer) == PERFQ_DEV_TIMER_SERVED)
			;
	}
}
