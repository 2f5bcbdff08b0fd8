// attach_app_ring(): what an application accepts from a daemon for one of
// its threads.  A daemon's ring is taken; one the daemon could cut short
// under the application (no shrink seal), one too small for its capacity,
// and a reply that does not match the ring are refused with the reason,
// before the application maps or writes anything of it.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

#include "app/app_proto.h"
#include "core/mapping.h"
#include "core/spsc_ring.h"

using namespace perfq;
using nlohmann::json;

namespace {

// A ring of `cap` records laid out as perfq-daemon lays it out, in a memfd
// of `bytes` bytes (0: just large enough) with `seals`.
UniqueFd make_ring(uint64_t cap, uint16_t stream, int seals, size_t bytes = 0) {
  UniqueFd fd(::memfd_create("app-ring-test", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  REQUIRE(fd.valid());
  const size_t need = PERFQ_APP_RING_OFFSET_SLOTS + cap * sizeof(perfq_record);
  REQUIRE(::ftruncate(fd.get(), static_cast<off_t>(bytes ? bytes : need)) == 0);
  if (!bytes || bytes >= need) {
    auto m = Mapping::map_shared(fd.get(), bytes ? bytes : need, "test ring");
    REQUIRE(m.is_ok());
    auto* base = static_cast<uint8_t*>(m->get());
    REQUIRE(SpscRingMemory<perfq_record>::init(base + PERFQ_APP_RING_OFFSET_SPSC,
                                               m->size() - PERFQ_APP_RING_OFFSET_SPSC, cap)
                .is_ok());
    auto* hdr = reinterpret_cast<perfq_app_ring_header*>(base);
    hdr->version = PERFQ_ABI_VERSION;
    hdr->stream = stream;
    hdr->magic = PERFQ_APP_RING_MAGIC;
  }
  if (seals) REQUIRE(::fcntl(fd.get(), F_ADD_SEALS, seals) == 0);
  return fd;
}

json reply(uint64_t stream, uint64_t cap) {
  return {{"ok", true}, {"stream", stream}, {"ring_records", cap}};
}

}  // namespace

TEST_CASE("app ring: a daemon's ring is taken, records go into it up to its capacity",
          "[app_ring]") {
  UniqueFd fd = make_ring(64, 7, F_SEAL_SHRINK | F_SEAL_GROW);
  auto r = attach_app_ring(fd.get(), reply(7, 64));
  INFO(r.status().message());
  REQUIRE(r.is_ok());
  CHECK(r->stream == 7);
  perfq_record rec{};
  int taken = 0;
  for (int i = 0; i < 65; ++i) taken += r->producer.try_push(rec) ? 1 : 0;
  CHECK(taken == 64);
}

TEST_CASE("app ring: what a daemon could break is refused with the reason", "[app_ring]") {
  auto refused = [](int fd, const json& j, const std::string& why) {
    auto r = attach_app_ring(fd, j);
    REQUIRE_FALSE(r.is_ok());
    CHECK(r.status().code() == Errc::kCorrupt);
    INFO(r.status().message());
    CHECK(r.status().message().find(why) != std::string::npos);
  };
  {
    UniqueFd fd = make_ring(64, 7, 0);  // could be cut short under us: SIGBUS
    refused(fd.get(), reply(7, 64), "not sealed against shrinking");
  }
  {
    UniqueFd fd = make_ring(64, 7, F_SEAL_SHRINK, PERFQ_APP_RING_OFFSET_SLOTS + 10 * 32);
    refused(fd.get(), reply(7, 64), "cannot hold 64 records");
  }
  UniqueFd fd = make_ring(64, 7, F_SEAL_SHRINK);
  refused(fd.get(), reply(8, 64), "does not match the reply");
  refused(fd.get(), reply(7, 48), "not a power of two");
  refused(fd.get(), reply(70000, 64), "no stream id");
  refused(fd.get(), json{{"ok", true}, {"stream", uint64_t{7}}, {"ring_records", "64"}},
          "no ring_records");
  refused(-1, reply(7, 64), "no memfd");
}
