// libFuzzer: what a control client sends perfq-daemon (perfqctl, or anyone
// who can connect to the socket), read as the daemon reads it: the input's
// lines, each through parse_request_line(), then the fields of its command
// (start: parse_start() with its kernel events; devices: its "all").  No
// exception may escape, and whatever is accepted must be what the checks
// promise (an absolute output path without a NUL, a known sync mode, a
// duration in range).
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const perfqd::DaemonConfig config;
  size_t pos = 0;
  while (pos <= in.size()) {
    size_t nl = in.find('\n', pos);
    if (nl == std::string_view::npos) nl = in.size();
    const std::string line(in.substr(pos, nl - pos));
    pos = nl + 1;
    std::string why;
    auto req = perfqd::parse_request_line(line, &why);
    if (!req) {
      if (why.empty()) std::abort();  // every refusal says why
      continue;
    }
    const std::string cmd = (*req)["cmd"].get<std::string>();
    if (cmd == "start") {
      perfqd::RecordingOptions o;
      if (perfqd::parse_start(*req, config, o).empty()) {
        if (o.output.empty() || o.output[0] != '/' || o.output.find('\0') != std::string::npos)
          std::abort();
        if (o.sync_mode != PERFQ_SYNC_MODE_A && o.sync_mode != PERFQ_SYNC_MODE_B) std::abort();
        if (!(o.duration_s >= 0 && o.duration_s <= perfqd::kMaxDurationS)) std::abort();
        if (o.sync_interval_ms < 1 || o.sync_interval_ms > 60000) std::abort();
      }
    } else if (cmd == "devices") {
      (void)perfqd::check_field(*req, "all", "boolean");
    }
  }
  return 0;
}
