// The online converter of device times: the one conversion policy of a
// recording (perfq-daemon's drain, and through it perfqctl record's).
//
// A device time converts once a sync round after it is in the model
// (interpolation, never extrapolation past the newest round), with the fit
// of its own segment, and carries the bound that model claims there
// (TraceRecord::claim_ns).  Records the model cannot convert yet wait here,
// in order per stream; one that waited max_wait_ns converts with whatever
// model there is (TraceConversion::kForced, with that model's claim where
// a round after it is in the model, and without a bound where none is).
// Mode B's times (PERFQ_CLOCK_HOST_BY_DEVICE) wait for a host round after
// them, and keep the device's bound only if no step came between.  See
// docs/sync.md, "When a device time converts" and "Around a clock step".
//
// One thread (the drain's); the model comes from the sync thread as an
// immutable snapshot (ConversionModel::after_round()).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "perfq/trace.h"
#include "sync/sync.h"

namespace perfq {

// What the converter converts with: a device's model as of its newest round
// taken into it.  The sync thread makes one per round (after_round()), the converter
// reads it; a copy of the whole history each round would cost more with
// every round of a recording, so it reaches back a horizon.
struct ConversionModel {
  ClockModel current;
  PiecewiseModel history;       // the recent past (PiecewiseModel::recent())
  uint64_t covered_device = 0;  // device time of the newest round in it
  int64_t covered_host = 0;     // its host time
  uint64_t rounds = 0;          // rounds taken into the model so far (RoundGate::taken())
  double tight_ns = 0;          // RoundGate::tight_ns() then
  bool contradicted = false;    // a later round contradicts it (ClockSync::contradicted())

  // The model after a round (`v`, `obs`: its verdict and observation, as
  // ClockSync and its RoundGate gave them), given the one before (null:
  // none yet): a round taken into the model makes a new one (covering up to
  // it, its history from `horizon_s` seconds of device time before it); one
  // that contradicts the model leaves it, marked so (mode B's device stops
  // converting meanwhile, and the converter marks what it converted); any
  // other changes nothing.
  static std::shared_ptr<const ConversionModel> after_round(
      std::shared_ptr<const ConversionModel> prev, const ClockSync& sync, const RoundGate& gate,
      ClockSync::Verdict v, const SyncObservation& obs, double horizon_s);
};

// Which of a mode B device's published lines (perfq_sync_page::lines) the
// records of one read may have been converted with: ids lo..hi, from what
// the device had published before the ring's tail that showed them was
// read to what it had published after they were read (hi 0: not known,
// the device publishes none).
struct LineIds {
  uint64_t lo = 0;
  uint64_t hi = 0;
};

class OnlineConverter {
 public:
  struct Options {
    uint16_t source = 0;  // TraceRecord::source of what it converts
    uint64_t device_clock_hz = 1'000'000'000;
    size_t max_waiting = 1u << 20;        // records waiting at most; feed() drops beyond
    int64_t max_wait_ns = 2'000'000'000;  // a record waits at most this long
    // A model that has not changed for this long converts everything it
    // can, forced (a device whose rounds stopped being taken).
    int64_t stale_model_ns = 1'000'000'000;
    // A device-clock step back smaller than this is jitter of its clock
    // reads, not a step.
    double back_step_ns = 2000;
    // Called when a stream's device clock goes back (its epoch opens).
    std::function<void(uint16_t stream, int64_t ticks)> on_back_step;
  };

  explicit OnlineConverter(Options o);

  // One poll's records, read before `read_ns`, with the model there is
  // (null: none yet).  Converted records are appended to `out`; the rest
  // wait (behind a waiting record of its stream, a record waits).  Returns
  // how many could not wait (max_waiting) and were dropped.
  // `lines`: the mode B lines its records may have been converted with
  // (DeviceDrain::last_lines()); without them, mode B's times carry no
  // bound.
  uint64_t feed(std::span<const perfq_record> batch, const ConversionModel* m, int64_t now,
                int64_t read_ns, std::vector<TraceRecord>& out, LineIds lines = {});

  // A line a mode B device published (DeviceDrain::new_lines()): what the
  // host bounds the times converted with it by.  One that is not a line a
  // clock of device_clock_hz could have (a rate off by more than a factor
  // of two, a fraction outside [0, 1], not finite) is kept as unusable:
  // what it may have converted has no bound.
  void add_device_line(const perfq_sync_line_pub& l);

  // Converts, among what waits, what `m` now converts (with a new model, or
  // forced once a record waited max_wait_ns): a prefix of the waiting
  // records in time order, so a model every 10 ms while a million wait does
  // not go through all of them.  Stops after appending `max_out` records
  // (returns false: call again), true when it is done.
  bool release(const std::shared_ptr<const ConversionModel>& m, int64_t now,
               std::vector<TraceRecord>& out, size_t max_out = SIZE_MAX);

  // At the end: converts everything waiting that a round covers as it
  // would have, the rest forced with `m`; without a model, mode B's times
  // as the device gave them (no bound).  Returns the device times left
  // (no model at all): they cannot be converted.
  size_t finish(const ConversionModel* m, std::vector<TraceRecord>& out);

  size_t waiting() const { return waiting_; }
  // Whether `m` covers every waiting record (a round after each of them).
  bool covers_waiting(const ConversionModel& m) const;
  // A host time before which nothing waiting will land (the merge's bound),
  // less `grace_ns`: INT64_MAX when nothing waits, INT64_MIN when unknown.
  int64_t waiting_bound(const ConversionModel* m, int64_t grace_ns) const;

 private:
  // What a read knew when it was made: the host time after it (its records
  // also began to wait then), the model's current segment, whether a round
  // contradicted the model, and mode B's lines.  One per feed() whose
  // records wait, not one per record (a record waits in 40 bytes).
  struct Read {
    int64_t read_ns = INT64_MAX;  // INT64_MAX: not known
    uint32_t segment = 0;
    bool contradicted = false;
    LineIds lines;  // mode B: the lines its records may have been converted with
  };
  struct Held {
    perfq_record rec;
    uint32_t read = 0;   // its Read's id (read_of())
    uint32_t epoch = 0;  // epoch_of() when it was read
  };
  static_assert(sizeof(Held) == 40, "a waiting record: the record and two words");
  // A device stream's clock, as its records show it, and what of it waits.
  struct StreamClock {
    uint16_t id = 0;
    uint64_t last = 0;  // newest device time of the stream
    uint32_t epoch = 0;
    bool seen = false;
    int64_t last_host = INT64_MIN;  // host time of its newest converted record
    std::deque<Held> waiting;       // in arrival order: later records wait behind
  };

  // A mode B device's line (perfq_sync_line_pub), decoded.
  struct DeviceLine {
    perfq_sync_line line{};
    bool usable = false;
  };

  static Read read_state(const ConversionModel* m, int64_t read_ns, LineIds lines);
  const Read& read_of(const Held& h) const {
    return reads_[static_cast<uint32_t>(h.read - static_cast<uint32_t>(reads_base_))];
  }
  // Drops the Reads no waiting record refers to any more.
  void prune_reads();
  uint32_t epoch_of(const perfq_record& r, StreamClock& sc, const ConversionModel* m);
  bool convert(const perfq_record& r, const StreamClock& sc, uint32_t epoch,
               const ConversionModel* m, bool force, const Read& rs, TraceRecord* out) const;
  bool confirm_device_time(const perfq_record& r, const StreamClock& sc, uint32_t epoch,
                           const ConversionModel* m, bool force, const Read& rs,
                           TraceRecord* out) const;
  // The bound of mode B's time r given the lines it may have been
  // converted with; false: wait (a line puts it past the newest round).
  bool device_claim(const perfq_record& r, const StreamClock& sc, uint32_t epoch,
                    const ConversionModel& m, bool force, const Read& rs, double* claim) const;
  void emit(const TraceRecord& tr, StreamClock& sc, std::vector<TraceRecord>& out);

  // convert() with one segment (most records: a device whose clock never
  // stepped), and what it computes once per model and knot rather than
  // once per record: the current model as a line, and the knot of the
  // time's own model (claim_by_then()).  Valid while its model is: each of
  // feed(), release() and finish() starts it afresh.
  struct ByCurrent {
    const ConversionModel* m = nullptr;
    perfq_sync_line current{};
    double rate_k = 0;                 // 3 sigma of the current rate, per ns of distance
    const ClockModel* then = nullptr;  // the knot of [then_from, then_until]
    uint64_t then_from = 1, then_until = 0;
    perfq_sync_line then_line{};
    bool then_bounds = false;
    double then_base = 0;  // how far apart the models are at its reference, plus its uncertainty
  };
  bool convert_by_current(const perfq_record& r, const ConversionModel& m, bool force,
                          bool unseen_step, TraceRecord* out) const;
  double claim_by_then(const perfq_record& r, const ConversionModel& m) const;
  ByCurrent& by_current(const ConversionModel& m) const;

  Options o_;
  int64_t back_step_ticks_;
  std::map<uint16_t, StreamClock> streams_;
  size_t waiting_ = 0;
  // Per epoch, the lowest segment id its records may use (epoch 0: 0).
  std::vector<uint32_t> epoch_floor_{0};
  std::deque<Read> reads_;                // the reads of what waits, oldest first
  uint64_t reads_base_ = 0;               // the id of reads_.front()
  std::map<uint64_t, DeviceLine> lines_;  // mode B's lines by id (the newest kMaxLines)
  std::shared_ptr<const ConversionModel> held_model_;  // the model of the last release
  int64_t held_since_ = 0;                             // when it came
  mutable ByCurrent by_current_;
};

}  // namespace perfq
