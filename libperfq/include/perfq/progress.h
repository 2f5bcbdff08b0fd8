// How far a read of a trace has got, for a progress bar: `perfqctl report`
// and `export` pass a callback; it is called after every chunk, from the
// reading thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "perfq/trace.h"

namespace perfq {

struct TraceProgressInfo {
  uint64_t records = 0;      // records read so far (this pass)
  uint64_t bytes_done = 0;   // of the file, through the last whole chunk
  uint64_t bytes_total = 0;  // the file's size when the read began
  int pass = 1;              // report --resync reads twice
  int passes = 1;
};
using TraceProgress = std::function<void(const TraceProgressInfo&)>;

// A visitor that passes everything on to `inner` and calls `progress`
// after each chunk of records.
std::unique_ptr<TraceVisitor> make_progress_visitor(const TraceReader& reader, uint64_t bytes_total,
                                                    int pass, int passes, TraceProgress progress,
                                                    TraceVisitor& inner);

}  // namespace perfq
