/* Compiled by the tests as strict C11 and as C++20: the ABI header and the
 * header rules (the driver's and libperfq's) must stand alone in both, with
 * every layout assertion in them holding. */
#include "perfq/perfq_abi.h"
#include "perfq/perfq_ioctl.h"
#include "perfq/perfq_region_check.h"

struct perfq_record perfq_abi_probe_record;
struct perfq_region_header perfq_abi_probe_header;

int perfq_abi_probe(void);
int perfq_abi_probe(void)
{
	return (int)sizeof(struct perfq_sync_page) + PERFQ_FLAGS(PERFQ_KIND_LOST, PERFQ_CLOCK_DEVICE) +
	       (int)perfq_check_region_header(&perfq_abi_probe_header, 0).fault +
	       (int)*perfq_header_fault_name(PERFQ_HDR_MAGIC) + (int)*perfq_section_name(0);
}
