// The control socket's requests, read as perfq-daemon reads them: one JSON
// object per line, then the fields of each command.  Nothing here acts: a
// request is parsed and checked (what is wrong, named with its field), and
// Daemon::handle() does what it asks.  No function here throws: a request's
// fields are checked for their JSON type before they are read.  (Split out
// of daemon.cpp and control.cpp so that tests/fuzz/fuzz_control.cpp can feed
// it any bytes without a daemon.)
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "config.h"
#include "recording.h"

namespace perfqd {

// One request line (without its '\n') as the control socket takes it: a JSON
// object with a "cmd" string.  nullopt with *error set (the reply's words)
// for an empty line, malformed JSON, or no "cmd" string.
std::optional<nlohmann::json> parse_request_line(const std::string& line, std::string* error);

// A request's field `key` of the JSON type `want` ("string", "number",
// "unsigned integer", "boolean"), if present: what is wrong with it, or "".
// Requests are read with this, never with json's get<>(), whose type
// errors name no field.
std::string check_field(const nlohmann::json& req, const char* key, const char* want);

// A start request's kernel events (kernel_events, pids, uprobes) into `k`;
// what is wrong with them, or "".
std::string parse_kernel_request(const nlohmann::json& req, KernelEventOptions& k);

// A start request into `o` (the config's settings where it says nothing);
// what is wrong with it, or "".
std::string parse_start(const nlohmann::json& req, const DaemonConfig& c, RecordingOptions& o);

}  // namespace perfqd
