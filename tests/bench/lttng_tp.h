// The LTTng-UST tracepoint provider of the LTTng baseline (lttng_bench.cpp):
// one event with the same payload as a perfq record (event id, stream,
// argument; the tracer adds its own timestamp).
#undef TRACEPOINT_PROVIDER
#define TRACEPOINT_PROVIDER perfq_bench

#undef TRACEPOINT_INCLUDE
#define TRACEPOINT_INCLUDE "./lttng_tp.h"

#if !defined(PERFQ_LTTNG_TP_H) || defined(TRACEPOINT_HEADER_MULTI_READ)
#define PERFQ_LTTNG_TP_H

#include <lttng/tracepoint.h>

TRACEPOINT_EVENT(perfq_bench, instant, TP_ARGS(uint32_t, event, uint16_t, stream, uint64_t, arg),
                 TP_FIELDS(ctf_integer(uint32_t, event, event) ctf_integer(uint16_t, stream, stream)
                               ctf_integer(uint64_t, arg, arg)))

#endif  // PERFQ_LTTNG_TP_H

#include <lttng/tracepoint-event.h>
