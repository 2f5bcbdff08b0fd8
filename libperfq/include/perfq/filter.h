// Part of a trace: `perfqctl report`, `report --html` and `export` take
// --from/--to (a time window), --source, --stream and --event, and see only
// the records (and loss reports) inside.  Sync samples and clock models
// always pass: they describe the clocks, not the part.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "perfq/status.h"
#include "perfq/trace.h"

namespace perfq {

// A time given on the command line: seconds from the trace's start ("1.5")
// or an absolute host time in ns ("45244733351578ns").
struct TraceTimePoint {
  bool absolute = false;
  double seconds = 0;  // from the start, when !absolute
  int64_t ns = 0;      // when absolute
};
Result<TraceTimePoint> parse_trace_time(std::string_view text);

struct TraceFilter {
  std::optional<TraceTimePoint> from, to;  // [from, to], host time
  std::vector<std::string> sources;        // ids or names; empty: all
  std::vector<uint16_t> streams;           // empty: all
  std::vector<std::string> events;         // event names; empty: all
  bool empty() const {
    return !from && !to && sources.empty() && streams.empty() && events.empty();
  }
};

// A visitor that passes what `filter` keeps on to `inner`.  The trace's
// start (for relative times) is the recording's start_ns where the
// metadata states it, else its first record.  With a time window the
// metadata's start_ns/stop_ns it passes on are the window's (clamped to the
// recording's), so that durations and rates are the window's.
std::unique_ptr<TraceVisitor> make_filter_visitor(const TraceFilter& filter, TraceVisitor& inner);

}  // namespace perfq
