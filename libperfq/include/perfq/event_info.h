// One event a source can record, as its dictionary names it: a device's
// (published in its region), a host application's (sent over its socket)
// and a trace's (each source's dictionary in the metadata) alike.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace perfq {

struct EventInfo {
  uint32_t event = 0;
  uint16_t kind = 0;  // enum perfq_kind
  std::string name;
  // Empty: the record's arg is one 64-bit number.  Two names: it packs two
  // 32-bit numbers (perfq_event2(), PERFQ_ARG2), [0] the upper half and [1]
  // the lower, and the exports show them under these names.
  std::vector<std::string> args = {};
  bool operator==(const EventInfo&) const = default;
};

}  // namespace perfq
