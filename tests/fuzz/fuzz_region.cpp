// libFuzzer: a hostile device region, as perfq-daemon maps it from a device
// (driver mmap or a shm file).  The header's validation, then the drain of
// whatever the ring holds (control words, records, LOST records) and the
// validation of every record, as the daemon drains a device.
#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/region.h"
#include "host/drain.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < sizeof(perfq_region_header) || size > (64u << 20)) return 0;
  // Page-aligned, writable memory of exactly the input's length: the
  // daemon's view of a BAR or a shm file.
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return 0;
  std::memcpy(base, data, size);
  if (auto region = perfq::Region::attach(base, size); region.is_ok()) {
    perfq::DeviceDrain drain(region.value());
    std::vector<perfq_record> out;
    for (int i = 0; i < 4; ++i) {
      out.clear();
      auto n = drain.poll(out, 1024);
      if (!n.is_ok()) break;
      for (const auto& rec : out) drain.account(rec);
    }
    (void)drain.finished();
  }
  ::munmap(base, size);
  return 0;
}
