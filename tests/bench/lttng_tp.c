// Instantiates the LTTng-UST tracepoint provider (probes) of lttng_tp.h.
#define TRACEPOINT_CREATE_PROBES
#define TRACEPOINT_DEFINE
#include "lttng_tp.h"
