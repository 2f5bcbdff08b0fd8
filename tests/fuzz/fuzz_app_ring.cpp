// libFuzzer: what a daemon hands an instrumented application for one of its
// threads (the application trusts no daemon either): the reply to "thread"
// and the memfd that came with it, through attach_app_ring(), the check the
// application's library makes before it maps and writes the ring.  Input:
//   the reply's JSON line, '\n', one byte of seals (bit 0: F_SEAL_SHRINK,
//   bit 1: F_SEAL_GROW), then the memfd's bytes (its size is theirs).
// An accepted ring must take capacity records and refuse the next one,
// every store inside the mapping (a store past it would crash the fuzzer).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "app/app_proto.h"
#include "core/mapping.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nl = in.find('\n');
  if (nl == std::string_view::npos || nl + 1 >= in.size()) return 0;
  const auto reply = nlohmann::json::parse(in.substr(0, nl), nullptr, false);
  if (reply.is_discarded()) return 0;
  const uint8_t seals = data[nl + 1];
  const std::string_view bytes = in.substr(nl + 2);
  perfq::UniqueFd fd(::memfd_create("fuzz-app-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return 0;
  if (!bytes.empty() &&
      ::write(fd.get(), bytes.data(), bytes.size()) != static_cast<ssize_t>(bytes.size()))
    return 0;
  int add = 0;
  if (seals & 1) add |= F_SEAL_SHRINK;
  if (seals & 2) add |= F_SEAL_GROW;
  if (add != 0 && ::fcntl(fd.get(), F_ADD_SEALS, add) != 0) return 0;
  auto ring = perfq::attach_app_ring(fd.get(), reply);
  if (!ring) return 0;
  perfq_record r{};
  uint64_t taken = 0;
  const uint64_t cap = reply["ring_records"].get<uint64_t>();
  for (uint64_t i = 0; i <= cap && i < (1u << 16); ++i) {
    r.index = i;
    if (ring->producer.try_push(r)) ++taken;
  }
  // The ring's positions are the memfd's bytes: a ring that claims to be
  // fuller takes fewer, never more than its capacity.
  if (taken > cap) std::abort();
  return 0;
}
