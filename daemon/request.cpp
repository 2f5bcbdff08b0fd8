#include "request.h"

#include "app/json_lines.h"
#include "kernel_events.h"

namespace perfqd {

using namespace perfq;
using nlohmann::json;

std::optional<json> parse_request_line(const std::string& line, std::string* error) {
  if (line.find_first_not_of(" \t\r") == std::string::npos) {
    *error = "empty request: expected one JSON object per line";
    return std::nullopt;
  }
  json req = json::parse(line, nullptr, false);
  if (req.is_discarded() || !req.is_object()) {
    *error = "malformed request: expected one JSON object per line";
    return std::nullopt;
  }
  if (!req.contains("cmd") || !req["cmd"].is_string()) {
    *error = "request has no \"cmd\" string";
    return std::nullopt;
  }
  return req;
}

std::string parse_kernel_request(const json& req, KernelEventOptions& k) {
  if (req.contains("kernel_events")) {
    if (!req["kernel_events"].is_string())
      return std::string("kernel_events must be a string such as \"sched,syscalls\"");
    if (Status s = parse_kernel_event_list(req["kernel_events"].get<std::string>(), &k); !s)
      return s.message();
  }
  if (req.contains("pids")) {
    if (!req["pids"].is_array()) return "pids must be an array of process ids";
    for (const auto& p : req["pids"]) {
      if (!p.is_number_unsigned() || p.get<uint64_t>() == 0 || p.get<uint64_t>() > 0x3fffffff)
        return std::string("pids: " + p.dump() + " is not a process id");
      k.pids.push_back(static_cast<uint32_t>(p.get<uint64_t>()));
    }
  }
  if (req.contains("uprobes")) {
    if (!req["uprobes"].is_array()) return "uprobes must be an array of PATH:SYMBOL";
    for (const auto& u : req["uprobes"]) {
      if (!u.is_string()) return std::string("uprobes: " + u.dump() + " is not PATH:SYMBOL");
      if (Status s = check_uprobe_spec(u.get<std::string>()); !s) return s.message();
      k.uprobes.push_back(u.get<std::string>());
    }
  }
  if (!k.pids.empty() && !k.any())
    return std::string(
        "pids only tell which processes --kernel-events and --uprobe trace; "
        "give one of them too");
  return {};
}

std::string check_field(const json& req, const char* key, const char* want) {
  if (!req.contains(key)) return {};
  const json& v = req[key];
  const std::string w = want;
  const bool ok = w == "string"             ? v.is_string()
                  : w == "number"           ? v.is_number()
                  : w == "unsigned integer" ? v.is_number_unsigned()
                  : w == "boolean"          ? v.is_boolean()
                                            : false;
  if (ok) return {};
  return std::string(key) + " must be a " + want + ", not " + v.type_name() + " " +
         perfq::json_line(v);
}

std::string parse_start(const json& req, const DaemonConfig& c, RecordingOptions& o) {
  if (!req.contains("output") || !req["output"].is_string())
    return std::string("\"output\" (the trace file's absolute path) is required");
  o.output = req["output"].get<std::string>();
  if (o.output.find('\0') != std::string::npos)
    return std::string("output must not contain a NUL byte (a path ends at the first one)");
  if (o.output.empty() || o.output[0] != '/')
    return std::string("output '" + o.output + "' must be an absolute path");
  if (req.contains("force") && !req["force"].is_boolean())
    return std::string("\"force\" (replace an existing output) must be true or false");
  o.force = req.value("force", false);
  if (req.contains("devices")) {
    if (!req["devices"].is_array())
      return "devices must be an array of strings (shm:PATH or /dev/perfqN), not " +
             std::string(req["devices"].type_name());
    for (const auto& d : req["devices"]) {
      if (!d.is_string())
        return "devices: " + d.dump() + " is a " + d.type_name() +
               ", not a string (shm:PATH or /dev/perfqN)";
      o.devices.push_back(d.get<std::string>());
    }
  } else {
    o.devices = c.devices;
  }
  for (const auto& [key, want] : {std::pair{"sync_interval_ms", "unsigned integer"},
                                  {"sync_mode", "string"},
                                  {"duration_s", "number"}})
    if (std::string e = check_field(req, key, want); !e.empty()) return e;
  const uint64_t interval = req.value("sync_interval_ms", uint64_t{c.sync_interval_ms});
  if (interval < 1 || interval > 60000) return "sync_interval_ms must be within 1..60000";
  o.sync_interval_ms = static_cast<unsigned>(interval);
  const std::string mode = req.value("sync_mode", c.sync_mode);
  if (mode != "a" && mode != "b") return std::string("sync_mode must be \"a\" or \"b\"");
  o.sync_mode = mode == "b" ? PERFQ_SYNC_MODE_B : PERFQ_SYNC_MODE_A;
  o.duration_s = req.value("duration_s", 0.0);
  if (!(o.duration_s >= 0 && o.duration_s <= kMaxDurationS))
    return "duration_s must be within 0.." + std::to_string(static_cast<long>(kMaxDurationS)) +
           " seconds (0: until stopped)";
  return parse_kernel_request(req, o.kernel);
}

}  // namespace perfqd
