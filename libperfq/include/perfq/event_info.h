// One event a source can record, as its dictionary names it: a device's
// (published in its region), a host application's (sent over its socket)
// and a trace's (each source's dictionary in the metadata) alike.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace perfq {

// The arg name that declares a byte count (perfq_event_arg() with
// PERFQ_ARG_BYTES, either name of perfq_event2(), a device's
// PERFQ_DEV_ARG_BYTES): the report gives such an event's throughput.
// (constexpr, not inline: a constant of each program, not a symbol of the
// library's ABI.)
constexpr std::string_view kArgBytes = "bytes";

struct EventInfo {
  uint32_t event = 0;
  uint16_t kind = 0;  // enum perfq_kind
  std::string name;
  // Empty: the record's arg is one 64-bit number, unnamed ("arg").  One
  // name: that number's (perfq_event_arg()).  Two names: it packs two
  // 32-bit numbers (perfq_event2(), PERFQ_ARG2), [0] the upper half and [1]
  // the lower, and the exports show them under these names.
  std::vector<std::string> args = {};
  bool operator==(const EventInfo&) const = default;

  // Where the arg holds a byte count: in none of it, all of it, or its
  // upper or lower 32 bits (the arg, or half of it, named kArgBytes).
  enum class Bytes : uint8_t { kNone, kWhole, kHigh, kLow };
  Bytes bytes() const {
    if (args.size() == 1 && args[0] == kArgBytes) return Bytes::kWhole;
    if (args.size() == 2 && args[0] == kArgBytes) return Bytes::kHigh;
    if (args.size() == 2 && args[1] == kArgBytes) return Bytes::kLow;
    return Bytes::kNone;
  }
  // The byte count a record's arg carries under bytes() (0 for kNone).
  static uint64_t bytes_of(Bytes where, uint64_t arg) {
    switch (where) {
      case Bytes::kWhole:
        return arg;
      case Bytes::kHigh:
        return arg >> 32;
      case Bytes::kLow:
        return arg & 0xffffffffu;
      case Bytes::kNone:
        break;
    }
    return 0;
  }
};

}  // namespace perfq
