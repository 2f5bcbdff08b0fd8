#include "app/app_proto.h"

#include "perfq/perfq_abi.h"

#include <sys/socket.h>
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
      if (!a.is_array() || a.size() != 2 || !a[0].is_string() || !a[1].is_string())
        return Status(Errc::kInvalidArgument, "event args must be two names");
      for (const auto& n : a) {
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

}  // namespace perfq
