// The ABI header seen from C++: layouts, flags helpers and constants.
#include <catch2/catch.hpp>
#include <cstddef>
#include <cstring>
#include <type_traits>

#include "perfq/perfq_abi.h"
#include "perfq/perfq_ioctl.h"

namespace perfq {
namespace {

// The header's own static assertions hold in C++ by including it; these pin
// what the rest of the project relies on.
static_assert(std::is_trivially_copyable_v<perfq_record>);
static_assert(std::is_standard_layout_v<perfq_region_header>);
static_assert(alignof(perfq_record) == 8);
static_assert(sizeof(perfq_sync_page) <= 2 * PERFQ_PAGE_SIZE);
static_assert(sizeof(perfq_region_header) <= PERFQ_PAGE_SIZE);
static_assert(offsetof(perfq_dev_ctrl, head_mirror) - offsetof(perfq_dev_ctrl, tail) >=
              PERFQ_CACHELINE);
static_assert(offsetof(perfq_spsc_header, head) - offsetof(perfq_spsc_header, tail) >=
              PERFQ_CACHELINE);

TEST_CASE("abi: magic words spell their names", "[abi]") {
  char m[9] = {};
  uint64_t v = PERFQ_REGION_MAGIC;
  std::memcpy(m, &v, 8);
  CHECK(std::string(m) == "PERFQRGN");
  v = PERFQ_SPSC_MAGIC;
  std::memcpy(m, &v, 8);
  CHECK(std::string(m) == "EPFQRING");
}

TEST_CASE("abi: record flags pack kind and clock domain", "[abi]") {
  for (unsigned kind = PERFQ_KIND_BEGIN; kind <= PERFQ_KIND_MAX; ++kind) {
    for (unsigned dom = 0; dom <= PERFQ_CLOCK_MAX; ++dom) {
      uint16_t f = PERFQ_FLAGS(kind, dom);
      CHECK((f & PERFQ_FLAGS_KIND_MASK) == kind);
      CHECK(((f & PERFQ_FLAGS_DOMAIN_MASK) >> PERFQ_FLAGS_DOMAIN_SHIFT) == dom);
      CHECK(PERFQ_FLAGS_KIND(f) == kind);
      CHECK(PERFQ_FLAGS_DOMAIN(f) == dom);
      CHECK((f & PERFQ_FLAGS_RESERVED_MASK) == 0);
    }
  }
}

}  // namespace
}  // namespace perfq
