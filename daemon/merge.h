// The merge stage of the daemon: a k-way merge of record streams by host
// time, and the watermark that says how far they are complete.
//
// Each producer thread (a device drain, the host collector) owns one Input.
// With every batch (or alone, when it has nothing) it reports a bound: "none
// of my future records will be older than this host time".  The watermark is
// the smallest bound of the inputs still open.  The writer takes every
// pending record, in time order, as soon as it comes (within its wake, 50
// ms), with the watermark: the trace file (version 2) gets each take's
// records as one ordered stretch and then the watermark, and its reader
// merges the stretches behind the watermarks (docs/trace-format.md).  So the
// daemon holds a record only until the writer's next take, not until every
// input has passed its time: what a kill -9 loses, and the daemon's memory,
// no longer grow with the slowest input's delay.  Two rules keep the
// watermark moving (a reader's hold bounded):
//   - an input not heard from (no push, no advance) for `stream_timeout`
//     (its thread is stuck) no longer holds the watermark back;
//   - the watermark never lags the present by more than `max_delay`.
// An input with nothing to pass until further notice (the host collector
// while no application is connected) is suspended: it does not hold the
// watermark back until it is resumed, with a new bound, before any record
// it could later pass exists.
// A record pushed below a watermark already taken is "late": it is still
// taken (next), comes out of order in the file, and is counted.
//
// How: each input keeps its pending records as sorted runs of bounded size
// (a batch is sorted by its producer, outside the lock, and appended to the
// input's last run when it follows it in time, as a device's batches
// usually do); a take merges the heads of all runs with a heap.  Drained
// runs' buffers are reused rather than returned to the allocator.
//
// Threading: push()/advance()/close() from the input's producer thread (one
// per input); take()/take_all() from the writer thread.  Internally one
// mutex guards the pending records.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "device/device_clock.h"
#include "perfq/trace.h"

namespace perfqd {

// The daemon's clock: host CLOCK_MONOTONIC in the merge's signed ns.
inline int64_t now_ns() { return static_cast<int64_t>(perfq::monotonic_ns()); }

struct MergeOptions {
  int64_t max_delay_ns = 2'000'000'000;     // watermark never lags more
  int64_t stream_timeout_ns = 500'000'000;  // a silent input stops holding it
  size_t wake_writer_at = 1 << 16;  // records pushed since the last take that wake the writer
  // The writer's wait while nothing at all is pending (an idle recording:
  // every wakeup costs CPU), instead of take()'s max_wait_ns; the first
  // push ends it, and its records wait max_wait_ns.
  int64_t idle_wait_ns = 250'000'000;
};

struct MergeStats {
  uint64_t pushed = 0;
  uint64_t released = 0;  // taken by the writer
  uint64_t late = 0;      // pushed below a watermark already taken
  uint64_t pending = 0;   // waiting for the writer's next take
  int64_t watermark = 0;  // host ns, as of the stats() call
  std::string held_by;    // the input whose bound is the watermark ("" if none)
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
  // Any thread.  resume() sets the bound to at least `bound` and counts as
  // being heard from.
  void suspend(Input* in);
  void resume(Input* in, int64_t bound);

  // Writer side: wait up to `max_wait_ns` for enough work (or a close), then
  // append to `out`, in time order, every pending record.  Returns how many.
  // At most max_records at a time, the oldest: a writer behind a large
  // backlog takes it in pieces (the next call does not wait) instead of
  // copying it whole.  `*complete` (if given) is how far the records taken
  // so far are complete: every record still pending, or pushed from now on,
  // is at least that old (late ones aside); it never decreases.
  size_t take(std::vector<perfq::TraceRecord>& out, int64_t max_wait_ns,
              size_t max_records = SIZE_MAX, int64_t* complete = nullptr);
  // Everything still pending, in time order (at stop, after every input closed).
  size_t take_all(std::vector<perfq::TraceRecord>& out);
  // The writer's take_ready() in progress (or the next) returns at once.
  void wake_writer();

  MergeStats stats() const;
  // Records pending, without the lock (as of the last push or take): for a
  // producer that stops reading while the writer is this far behind.
  size_t pending_approx() const { return pending_.load(std::memory_order_relaxed); }

 private:
  struct Run {
    std::vector<perfq::TraceRecord> recs;  // sorted by time_ns
    size_t pos = 0;                        // recs[pos..] are pending
    uint64_t seq = 0;                      // creation order: ties go to the older run
  };
  static constexpr size_t kRunRecords = 16384;  // a run's capacity (768 KiB)
  static constexpr size_t kSpareRuns = 4;       // drained buffers kept for reuse

  bool holds_back_locked(const Input& in, int64_t now) const;
  int64_t watermark_locked(int64_t now) const;
  // The oldest `max` pending records, in time order; returns how many.
  size_t release_locked(std::vector<perfq::TraceRecord>& out, size_t max);
  std::vector<perfq::TraceRecord> take_spare_locked();
  static void sort_batch(Input* in, std::vector<perfq::TraceRecord>& records);

  MergeOptions opts_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::vector<std::unique_ptr<Input>> inputs_;
  std::vector<std::vector<perfq::TraceRecord>> spare_;  // empty, with capacity
  uint64_t next_seq_ = 0;
  // Changed under mu_ only; read without it by pending_approx().
  std::atomic<size_t> pending_{0};
  size_t pushed_since_take_ = 0;
  bool capped_ = false;           // the last take stopped at its max_records
  bool kicked_ = false;           // wake_writer() since the last take
  bool idle_waiting_ = false;     // the writer waits with nothing pending
  int64_t complete_ = INT64_MIN;  // the last take's watermark: records below it are late
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
  bool suspended_ = false;
  std::vector<Merger::Run> runs_;  // pending, oldest first; each sorted
  // The producer's, for sorting its batches outside the lock.
  std::vector<perfq::TraceRecord> sort_scratch_;
  std::vector<size_t> sort_bounds_;
  std::vector<perfq::TraceRecord> merge_scratch_;  // under the merger's lock
};

// What a producer that reads several in-order streams from one queue can
// promise the merge when it is behind (its read came back full): each
// stream's records come in time order, so what is still queued is no older
// than the least of the streams' newest times read, less the queue's
// latency between streams (`grace_ns`: its collector moves every stream in
// each pass).  That holds for a read that spans a whole pass of the
// collector, so that it sees every stream with records (a drain's batch of
// 16 Ki records spans many); a stream it missed may bring records below the
// bound, which the merge releases late and counts.
// One per producer thread; note() every record read, then bound(), then
// clear() before the next read.  Past kMaxStreams streams in one read there
// is no bound (INT64_MIN): a search per record must stay short whatever
// stream ids a device writes.
class StreamFrontier {
 public:
  static constexpr size_t kMaxStreams = 64;

  void clear() {
    newest_.clear();
    overflow_ = false;
  }
  void note(uint16_t stream, int64_t t) {
    if (overflow_) return;
    if (!newest_.empty() && newest_.back().first == stream) {  // runs of one stream
      newest_.back().second = std::max(newest_.back().second, t);
      return;
    }
    for (auto& [s, newest] : newest_)
      if (s == stream) {
        newest = std::max(newest, t);
        return;
      }
    if (newest_.size() == kMaxStreams) {
      overflow_ = true;
      return;
    }
    newest_.emplace_back(stream, t);
  }
  // min(least newest, now) - grace_ns; INT64_MIN with nothing noted or
  // too many streams.
  int64_t bound(int64_t now, int64_t grace_ns) const {
    if (newest_.empty() || overflow_) return INT64_MIN;
    int64_t least = now;
    for (const auto& [s, t] : newest_) least = std::min(least, t);
    return least - grace_ns;
  }

 private:
  std::vector<std::pair<uint16_t, int64_t>> newest_;
  bool overflow_ = false;
};

}  // namespace perfqd
