/* Compiled by the tests as strict C11 and as C++20: the ABI header must stand
 * alone in both, with every layout assertion in it holding. */
#include "perfq/perfq_abi.h"

struct perfq_record perfq_abi_probe_record;
struct perfq_region_header perfq_abi_probe_header;

int perfq_abi_probe(void);
int perfq_abi_probe(void)
{
	return (int)sizeof(struct perfq_sync_page) + PERFQ_FLAGS(PERFQ_KIND_LOST, PERFQ_CLOCK_DEVICE);
}
