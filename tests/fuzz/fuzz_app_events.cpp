// libFuzzer: what an instrumented application sends the daemon at hello
// (the application protocol's JSON: its event list), parsed as perfq-daemon
// parses it, and a record from an application's ring validated as one.
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "app/app_proto.h"
#include "host/drain.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size >= sizeof(perfq_record)) {
    perfq_record r;
    std::memcpy(&r, data, sizeof r);
    (void)perfq::validate_record(r, perfq::RecordOrigin::kHostApp);
    (void)perfq::validate_record(r, perfq::RecordOrigin::kDevice);
  }
  const auto j = nlohmann::json::parse(std::string_view(reinterpret_cast<const char*>(data), size),
                                       nullptr, false);
  if (j.is_discarded()) return 0;
  std::vector<perfq::EventInfo> events;
  if (j.is_array()) (void)perfq::parse_events(j, 255, &events);
  if (j.is_object() && j.contains("events")) (void)perfq::parse_events(j["events"], 255, &events);
  for (const auto& e : events) (void)perfq::event_to_json(e);
  return 0;
}
