// One event a source can record, as its dictionary names it: a device's
// (published in its region), a host application's (sent over its socket)
// and a trace's (each source's dictionary in the metadata) alike.
#pragma once

#include <cstdint>
#include <string>

namespace perfq {

struct EventInfo {
  uint32_t event = 0;
  uint16_t kind = 0;  // enum perfq_kind
  std::string name;
  bool operator==(const EventInfo&) const = default;
};

}  // namespace perfq
