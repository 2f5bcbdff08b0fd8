#include "app/app_proto.h"

#include "perfq/perfq_abi.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <cerrno>
#include <cstring>

namespace perfq {

std::string clean_name(const std::string& s, size_t max) {
  std::string out;
  for (char ch : s) {
    if (out.size() >= max) break;
    out.push_back(ch >= 0x20 && ch < 0x7f ? ch : '?');
  }
  return out;
}

nlohmann::json event_to_json(const EventInfo& e) {
  nlohmann::json j = {{"id", e.event}, {"name", e.name}, {"kind", e.kind}};
  if (!e.args.empty()) j["args"] = e.args;
  return j;
}

Status parse_events(const nlohmann::json& arr, size_t max_id, std::vector<EventInfo>* out) {
  if (!arr.is_array()) return Status(Errc::kInvalidArgument, "events must be an array");
  if (arr.size() > max_id) return Status(Errc::kInvalidArgument, "too many events");
  for (const auto& e : arr) {
    if (!e.is_object() || !e.contains("id") || !e["id"].is_number_unsigned() ||
        !e.contains("name") || !e["name"].is_string() || !e.contains("kind") ||
        !e["kind"].is_number_unsigned())
      return Status(Errc::kInvalidArgument, "event needs id, name and kind");
    const uint64_t id = e["id"].get<uint64_t>();
    const uint64_t kind = e["kind"].get<uint64_t>();
    const std::string name = e["name"].get<std::string>();
    if (id == 0 || id > max_id)
      return Status(Errc::kInvalidArgument, "event id " + std::to_string(id) + " out of range");
    if (kind < PERFQ_KIND_BEGIN || kind > PERFQ_KIND_COUNTER)
      return Status(Errc::kInvalidArgument, "event kind " + std::to_string(kind) + " invalid");
    if (name.empty() || name.size() >= PERFQ_EVENT_NAME_LEN)
      return Status(Errc::kInvalidArgument, "event name must be 1 to 47 bytes");
    std::vector<std::string> args;
    if (e.contains("args")) {
      const auto& a = e["args"];
      if (!a.is_array() || a.empty() || a.size() > 2)
        return Status(Errc::kInvalidArgument, "event args must be one or two names");
      if (kind == PERFQ_KIND_COUNTER)
        return Status(Errc::kInvalidArgument, "a counter's arg is its value: it takes no names");
      for (const auto& n : a) {
        if (!n.is_string())
          return Status(Errc::kInvalidArgument, "event arg names must be strings");
        const std::string s = n.get<std::string>();
        if (s.empty() || s.size() > kArgNameMax)
          return Status(Errc::kInvalidArgument,
                        "event arg names must be 1 to " + std::to_string(kArgNameMax) + " bytes");
        args.push_back(clean_name(s, kArgNameMax));
      }
    }
    out->push_back({static_cast<uint32_t>(id), static_cast<uint16_t>(kind), clean_name(name, 47),
                    std::move(args)});
  }
  return Status::ok();
}

Result<AppRing> attach_app_ring(int fd, const nlohmann::json& reply) {
  auto bad = [](const std::string& what) { return Status(Errc::kCorrupt, "app ring: " + what); };
  if (!reply.is_object()) return bad("the reply is not an object");
  const nlohmann::json& js = reply.contains("stream") ? reply["stream"] : nlohmann::json();
  const nlohmann::json& jc =
      reply.contains("ring_records") ? reply["ring_records"] : nlohmann::json();
  if (!js.is_number_unsigned() || js.get<uint64_t>() > 0xffff) return bad("no stream id");
  if (!jc.is_number_unsigned()) return bad("no ring_records");
  const uint64_t stream = js.get<uint64_t>();
  const uint64_t cap = jc.get<uint64_t>();
  if (cap == 0 || (cap & (cap - 1)) != 0 || cap > PERFQ_RING_CAPACITY_MAX)
    return bad("ring_records " + std::to_string(cap) + " is not a power of two up to " +
               std::to_string(PERFQ_RING_CAPACITY_MAX));
  if (fd < 0) return bad("no memfd came with the reply");
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0)
    return bad("the memfd is not sealed against shrinking");
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Status::from_errno("app ring: fstat");
  const auto file = static_cast<uint64_t>(st.st_size);
  if (file < PERFQ_APP_RING_OFFSET_SLOTS + cap * sizeof(perfq_record))
    return bad("a memfd of " + std::to_string(file) + " bytes cannot hold " + std::to_string(cap) +
               " records");
  auto m = Mapping::map_shared(fd, static_cast<size_t>(file), "app ring");
  if (!m) return m.status();
  auto* base = static_cast<uint8_t*>(m->get());
  auto* hdr = reinterpret_cast<perfq_app_ring_header*>(base);
  // Pairs with the daemon's store_release of the magic: the header is complete.
  if (load_acquire(&hdr->magic) != PERFQ_APP_RING_MAGIC || hdr->version != PERFQ_ABI_VERSION ||
      hdr->stream != stream)
    return bad("the ring's header does not match the reply");
  auto ring = SpscRingMemory<perfq_record>::attach(base + PERFQ_APP_RING_OFFSET_SPSC,
                                                   m->size() - PERFQ_APP_RING_OFFSET_SPSC);
  if (!ring) return bad(ring.status().message());
  if (ring->capacity() != cap) return bad("the ring's capacity does not match the reply");
  AppRing r;
  r.hdr = hdr;
  r.spsc = ring->header();
  r.producer = ring->chunked_producer(app_ring_chunk(cap));
  r.stream = static_cast<uint16_t>(stream);
  r.mapping = std::move(*m);
  return r;
}

}  // namespace perfq
