// The merge stage of the daemon: a k-way merge of record streams by host
// time behind a watermark.
//
// Each producer thread (a device drain, the host collector) owns one Input.
// With every batch (or alone, when it has nothing) it reports a bound: "none
// of my future records will be older than this host time".  The watermark is
// the smallest bound of the inputs still open; records older than it are
// released in time order.  Two rules keep memory bounded:
//   - an input not heard from (no push, no advance) for `stream_timeout`
//     (its thread is stuck) no longer holds the watermark back;
//   - the watermark never lags the present by more than `max_delay`.
// A record that arrives below what was already released is "late": it is
// still released (next), and counted.
//
// Threading: push()/advance()/close() from the input's producer thread (one
// per input); take_ready()/take_all() from the writer thread.  Internally
// one mutex guards the pending records.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "perfq/trace.h"

namespace perfqd {

struct MergeOptions {
  int64_t max_delay_ns = 2'000'000'000;       // watermark never lags more
  int64_t stream_timeout_ns = 500'000'000;    // a silent input stops holding it
  size_t wake_writer_at = 1 << 16;            // pending records that wake the writer
};

struct MergeStats {
  uint64_t pushed = 0;
  uint64_t released = 0;
  uint64_t late = 0;       // released after a newer record had been
  uint64_t pending = 0;    // waiting for the watermark
  int64_t watermark = 0;   // host ns
};

class Merger {
 public:
  class Input;

  explicit Merger(MergeOptions opts = {});
  ~Merger();
  Merger(const Merger&) = delete;
  Merger& operator=(const Merger&) = delete;

  // A new input whose first bound is `bound` (host ns).
  Input* add_input(std::string name, int64_t bound);

  // Producer side (the input's thread).  `records` need not be sorted.
  void push(Input* in, std::vector<perfq::TraceRecord>& records, int64_t bound);
  void advance(Input* in, int64_t bound);
  void close(Input* in);  // no more records from this input

  // Writer side: wait up to `max_wait_ns` for enough work (or a close), then
  // append to `out`, in time order, every record below the watermark at
  // host time `now`.  Returns how many.
  size_t take_ready(std::vector<perfq::TraceRecord>& out, int64_t now, int64_t max_wait_ns);
  // Everything still pending, in time order (at stop, after every input closed).
  size_t take_all(std::vector<perfq::TraceRecord>& out);

  MergeStats stats() const;

 private:
  int64_t watermark_locked(int64_t now) const;
  size_t release_locked(std::vector<perfq::TraceRecord>& out, int64_t limit);

  MergeOptions opts_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::vector<std::unique_ptr<Input>> inputs_;
  std::vector<perfq::TraceRecord> sorted_;    // pending, in time order
  std::vector<perfq::TraceRecord> incoming_;  // pending, unsorted
  int64_t released_upto_ = INT64_MIN;
  MergeStats stats_;
};

class Merger::Input {
 public:
  const std::string& name() const { return name_; }

 private:
  friend class Merger;
  Input(std::string name, int64_t bound, int64_t now)
      : name_(std::move(name)), bound_(bound), heard_at_(now) {}
  std::string name_;
  int64_t bound_;
  int64_t heard_at_;  // host ns of the last push or advance
  bool closed_ = false;
};

}  // namespace perfqd
