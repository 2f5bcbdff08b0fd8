// Host-device clock synchronization: from bracketed clock samples to a
// piecewise clock model that converts device times to host time.
//
// Clocks (see ARCHITECTURE.md "Time synchronization"):
//   H  host time, CLOCK_MONOTONIC ns;
//   D  device system time, device_clock_hz ticks per second (nominal);
//   R  the device timer register, timer_hz ticks per second (nominal),
//      readable by both sides: the bridge between H and D.
// Every clock has an arbitrary u64 origin.  Absolute times are u64 and all
// arithmetic on them is modular: a difference of two times of one clock is
// read as a signed 64-bit value, so any offset between clocks works (H - D
// may be anything, including beyond the s64 range) as long as the times
// compared inside one recording are less than 2^63 ticks apart.
//
// The pipeline:
//   1. make_observation(): one sync round's host samples (H1, R2, H2) and
//      device samples (R1 before, D, R1 after) -> one observation (D, H at
//      the same instant, uncertainty), selecting samples by delay.
//   2. ClockSync: robust weighted fit of offset and drift over a sliding
//      window of observations, step detection (new segment), and the
//      history of models, so that to_host(d) uses the model valid at d.
//   3. fit_offline(): the whole-recording piecewise model from all
//      observations, with two-sided fits, for re-synchronization.
//   4. DeviceClockSync: mode B, the same math on the device.
// The time sync buffer (the seqlocked model and sample batches in the shared
// region) is in sync/sync_buffer.h.
//
// Threading: every class here is a plain value type; one thread uses an
// instance at a time (the caller synchronizes).  Nothing here blocks.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "perfq/perfq_abi.h"
#include "perfq/perfq_device.h"
#include "perfq/status.h"
#include "perfq/trace.h"

namespace perfq {

// ---- Nominal rates ------------------------------------------------------------

struct ClockRates {
  uint64_t device_hz = 1'000'000'000;  // D, from perfq_region_header.device_clock_hz
  uint64_t timer_hz = 1'000'000'000;   // R, from perfq_region_header.timer_hz

  // Both nonzero and <= PERFQ_CLOCK_HZ_MAX.
  Status validate() const;
  // Nominal ns per tick.
  long double device_ns_per_tick() const { return 1e9L / static_cast<long double>(device_hz); }
  long double timer_ns_per_tick() const { return 1e9L / static_cast<long double>(timer_hz); }
};

// Signed difference of two times of one clock (modular: any origin works).
inline int64_t time_diff(uint64_t a, uint64_t b) noexcept { return static_cast<int64_t>(a - b); }

// ---- 1. Sampling and selection ------------------------------------------------------

// One sync round reduced to a point: at the instant the device clock read
// `device_time`, the host clock read `host_ns`.
struct SyncObservation {
  uint64_t device_time = 0;    // D, device ticks
  uint64_t host_ns = 0;        // H at the same instant
  double uncertainty_ns = 0;   // bound: |error| <= this if every bracket is honest
  double host_delay_ns = 0;    // tightest host bracket H2 - H1
  double device_delay_ns = 0;  // tightest device bracket R1after - R1before, in ns
  uint32_t round = 0;
  uint16_t host_used = 0;    // host samples averaged into this observation
  uint16_t device_used = 0;  // device samples averaged into this observation
};

struct SelectionConfig {
  // Host side, chrony-style: average the samples whose delay is within
  // max(margin_ns, margin_frac * min_delay) of the tightest one.  0/0 keeps
  // only the tightest sample.  (The device side is a weighted mean, below.)
  double margin_ns = 50;
  double margin_frac = 0.1;
  // A sample among the tightest whose implied offset is more than
  // max(outlier_k * robust spread, its half-bracket + the best half-bracket
  // + margin) from the median is a shifted value, not a clock reading.
  double outlier_k = 5;
  // Widen the margin to the robust scatter of the tight samples' values
  // when that is larger (noisy clock reads: averaging beats selecting).
  bool average_scatter = true;
  // How far R's real rate may be from its nominal one, relative (1000 ppm).
  // A device sample dt away from the host's selection costs dt x rate_error
  // in its weight, and the distance between the two sides' means costs as
  // much in the observation's uncertainty.
  double rate_error = 1e-3;
};

// Host samples: {before = H1, value = R2, after = H2}.  Device samples:
// {before = R1 before, value = D, after = R1 after}.  The host side is
// selected by delay (the tightest brackets: a read's bracket midpoint is
// biased by however much of its delay came before or after the read, an
// error that does not average out over rounds); the device side is the mean
// of every sample weighted by 1 / (width^2/12 + value scatter + (distance
// from the host selection x rate_error)^2): where D lies inside its R
// bracket is a symmetric error, so averaging beats selecting there.  Samples whose bracket
// is inverted or absurdly wide (> 2^62 ticks) are skipped (the host never
// trusts the device); with no usable sample on a side the result is an
// error.  Combines, at one instant,
//   H - D = (H1 + H2)/2 - R2 - (D - R1),  R1 = (R1before + R1after)/2,
// with R converted to ns (and to device ticks) at its nominal rate.

Result<SyncObservation> make_observation(std::span<const perfq_clock_sample> host,
                                         std::span<const perfq_clock_sample> device,
                                         const ClockRates& rates, const SelectionConfig& sel = {},
                                         uint32_t round = 0);

// The selection for a device's next round given its model: a device clock
// measured far off its nominal rate (a mis-declared clock or timer rate, or
// a timer derived from a clock that is) makes the timer's nominal rate as
// doubtful, so the observation allows for 1.5 x the measured drift of rate
// error, not only base.rate_error (1000 ppm).  At -100 000 ppm with 3 us
// jitter, without this, rounds claimed +-1 us while 3 us off.  The host,
// mode B's device and the offline fit all take it, so that the same rounds
// give them the same model.
struct ClockModel;
SelectionConfig selection_for(const SelectionConfig& base, const ClockModel& m,
                              const ClockRates& rates);

// ---- 2. Clock model ------------------------------------------------------------

// One linear model: host = host_ref + host_frac + (d - device_ref) * ns_per_tick.
struct ClockModel {
  uint64_t device_ref = 0;
  uint64_t host_ref = 0;
  double host_frac = 0;         // sub-ns part of the host time at device_ref, [0, 1)
  long double ns_per_tick = 1;  // host ns per device tick (nominal * (1 + drift))
  double uncertainty_ns = 0;    // ~3 sigma at device_ref
  double rate_sigma_ppb = 0;    // 1 sigma of the rate estimate
  uint64_t valid_from_device = 0;
  uint32_t segment = 0;
  bool valid = false;

  uint64_t to_host(uint64_t device_time) const noexcept;
  // Host ns between device_ref and device time d.
  double host_distance_ns(uint64_t d) const noexcept;
  // What the model vouches for at d (the bound every converted time
  // carries): its uncertainty at its reference plus 3 sigma of its rate
  // over the distance.
  double claim_at(uint64_t d) const noexcept;
  // The claim at d where `newer`, a later model of the same device, knows
  // its rate better: a rate further from newer's than its own 3 sigma says
  // (a first model's, whose rate is the prior's: nominal +-1000 ppm, for a
  // clock 5000 ppm off) claims that difference, plus newer's 3 sigma, over
  // the distance.  What the online converter claims with an older segment's
  // model.
  double claim_at(uint64_t d, const ClockModel& newer) const noexcept;
  // Whether d may be converted by extrapolation, without waiting for a
  // round after it: the rate is known well enough that 3 sigma of it over
  // the distance adds at most a quarter of the model's own uncertainty.
  // The one rule for the daemon's converter and mode B's device.
  bool settled_at(uint64_t d) const noexcept { return settled_over(host_distance_ns(d)); }
  bool settled_over(double dx_ns) const noexcept;
  // Whether the model may convert d beyond its newest round now: settled
  // there and claiming at most tight_ns (RoundGate::tight_ns()).  The one
  // rule for both online converters, the daemon's and mode B's device's.
  bool vouches(uint64_t d, double tight_ns) const noexcept;
  // How fast the device clock runs against its nominal rate, measured in
  // host time, in ppb (+1000 ppm: D gains 1 ms per host second).  Note the
  // ABI's rate_ppb is the inverse view (host ns per device tick): outputs
  // go through clock_standing(), never through rate_ppb.
  double device_drift_ppb(const ClockRates& rates) const noexcept;

  // The ABI form.  rate_ppb is host ns per device tick minus 1, in ppb, so
  // the ABI formula host = host_ref_ns + (d - device_ref) * (1 + rate_ppb/1e9)
  // holds for any device rate (250 MHz: rate_ppb ~ 3e9).  host_ref_ns is the
  // u64 host time bit-cast to s64.  seq is left 0 (the buffer writer sets it).
  perfq_sync_model to_abi() const noexcept;
  // Refuses unknown flag bits and a rate that is not a positive number of ns
  // per tick (1e9 + rate_ppb in (0, 1e18]).  A model without the VALID flag
  // converts to valid = false.
  static Result<ClockModel> from_abi(const perfq_sync_model& m);
};

// How a model stands (perfq/trace.h's ClockStanding, the one sign convention).
ClockStanding clock_standing(const ClockModel& m, const ClockRates& rates) noexcept;

// host = host_ref_ns + (d - device_ref) * (1e9 + rate_ppb) / 1e9, exact in
// 128-bit integers, rounded to nearest; modular in u64.  What a device in
// mode A (or any reader of the time sync buffer) computes.
uint64_t apply_abi_model(const perfq_sync_model& m, uint64_t device_time) noexcept;

struct SyncConfig {
  uint32_t window = 128;          // observations in the online fit (12.8 s at 100 ms)
  uint32_t offline_window = 128;  // centered window of the offline fit
  double reject_k = 4;            // reject residuals beyond k x robust sigma (MAD)
  double reject_floor_ns = 20;    // ... but never below this (quantization)
  double sigma_floor_ns = 2;      // minimum per-observation sigma
  double prior_drift_ppm = 1000;  // prior 1-sigma of the drift around nominal
  // Step detection: an observation further than
  //   max(step_min_ns, step_k x robust sigma, 3 x (its uncertainty + model's))
  // from the prediction is a step candidate; a second one consistent with it
  // starts a new segment; a normal observation in between discards it.
  // Three candidates in a row that lie on one line but not at the model's
  // rate start a segment at that line's rate (a rate break).
  double step_min_ns = 2000;
  double step_k = 8;
  // A loose observation (kept out of the fit) witnesses a step only when it
  // is further off than this many times its own uncertainty.
  double witness_k = 10;
  // Observations less certain than this are useless (a preempted round):
  // verdict kOutlier, never fitted, never a step witness.
  double max_uncertainty_ns = 1e6;
  uint32_t max_history = 1u << 18;  // models kept for conversion of past times
};

// A piecewise model: segments (split at clock steps), each a sequence of
// linear models (knots) ordered by device time.
class PiecewiseModel {
 public:
  struct Segment {
    uint32_t id = 0;
    uint64_t valid_from = 0;  // device time range this segment claims
    uint64_t valid_until = UINT64_MAX;
    // Host times of the first and last observation fitted into it (0 when
    // not known: the offline fit leaves them): it was in effect between the
    // previous segment's last_host and the next one's first_host.
    uint64_t first_host = 0;
    uint64_t last_host = 0;
    std::vector<ClockModel> knots;
  };

  // interpolate: blend the two knots around d (offline); otherwise use the
  // last knot at or before d (online: the model that was current at d).
  explicit PiecewiseModel(bool interpolate = false) : interpolate_(interpolate) {}

  bool empty() const { return segments_.empty(); }
  const std::vector<Segment>& segments() const { return segments_; }
  std::vector<Segment>& mutable_segments() { return segments_; }

  // The segment for d: the newest whose range contains d, else the nearest.
  // -1 when empty.  Device times inside an interval where a backward step
  // made the clock repeat itself are ambiguous: the newest segment wins
  // (use the explicit-segment overload when the caller knows better).
  int segment_for(uint64_t device_time) const;
  // The same among the segments whose id is in [min_id, max_id] (-1 when
  // none is): a caller that knows which steps lie before a time (a
  // stream whose times went back) tells a repeated time apart.
  int segment_for(uint64_t device_time, uint32_t min_id, uint32_t max_id) const;
  // Host time of d in the segment, among those whose range holds d, that
  // puts it nearest `host_hint` (a time the caller knows to be close: the
  // online conversion, for an offline re-conversion), else as to_host(d).
  uint64_t to_host_near(uint64_t device_time, uint64_t host_hint) const;
  // Host time of d (0 when empty).
  uint64_t to_host(uint64_t device_time) const;
  uint64_t to_host(uint64_t device_time, uint32_t segment) const;
  // The model used for d (valid = false when empty): the knot at or before
  // it (its first knot before the first), in its segment or in `segment`.
  ClockModel model_at(uint64_t device_time) const;
  ClockModel model_at(uint64_t device_time, uint32_t segment) const;
  // The knot model_at(device_time, segment) uses, in place (null when the
  // model is empty), and the device times [*from, *until] it is the one
  // for: a caller converting many times in order looks it up once a knot.
  const ClockModel* knot_for(uint64_t device_time, uint32_t segment, uint64_t* from,
                             uint64_t* until) const;
  // Every knot as an ABI model, for the trace file.
  std::vector<perfq_sync_model> to_abi() const;
  // The same model for device times from `from_device` on: each segment
  // keeps the knot in use at from_device and those after it (at least its
  // last).  Converts every d >= from_device exactly as this one does; an
  // older d gets its segment's oldest kept knot.  For a copy per sync round
  // that costs what the recent past holds, not the whole recording.
  PiecewiseModel recent(uint64_t from_device) const;

 private:
  static const ClockModel& knot_at(const Segment& s, uint64_t d);  // s.knots not empty
  uint64_t convert(const Segment& s, uint64_t d) const;
  bool interpolate_;
  std::vector<Segment> segments_;
};

// The online tracker (the sync thread's state).
class ClockSync {
 public:
  enum class Verdict : uint8_t {
    kAccepted,     // used in the fit
    kRejected,     // inside the model's reach but rejected by the robust fit
    kOutlier,      // far off and too uncertain to witness a step
    kStepPending,  // far off: a step candidate waiting for confirmation
    kNewSegment,   // confirmed a step: this and the pending one start a segment
    kInvalid,      // not a usable observation
  };

  explicit ClockSync(const ClockRates& rates, const SyncConfig& cfg = {});
  ClockSync(const ClockSync& o);
  ClockSync& operator=(const ClockSync& o);
  ClockSync(ClockSync&& o) noexcept;
  ClockSync& operator=(ClockSync&& o) noexcept;

  Verdict add(const SyncObservation& obs);
  // An observation too loose to fit (a gate left it out) may still witness
  // a step: one a few tens of microseconds wide tells a millisecond step
  // apart.  Far off the prediction (and by more than witness_k times its
  // own uncertainty), it is a step candidate or confirms one, exactly as in
  // add(); otherwise it is kOutlier and changes nothing (a pending
  // candidate stays pending: a loose round cannot refute it).
  // Without this, a step that only loose rounds see (a saturated machine)
  // would go unnoticed for as long as the machine stays saturated.
  Verdict witness(const SyncObservation& obs);

  bool has_model() const { return c_->current.valid; }
  // The model fitted after the last accepted observation.
  const ClockModel& current() const { return current_; }
  uint32_t segment() const { return current_.segment; }
  // Robust sigma of the current window's residuals (ns).
  double residual_sigma_ns() const { return c_->sigma; }
  // Segments started because the clock's rate was not the model's (see
  // start_rate_segment): a clock or timer rate that is not what the device
  // declares looks exactly like this.
  uint32_t rate_breaks() const { return c_->rate_breaks; }
  // The model cannot vouch for itself now: the last observation was far
  // off its prediction and nothing has yet explained it (a step or a rate
  // break waiting for confirmation).
  bool contradicted() const { return c_->have_pending; }
  // Conversion with the model that was current at d (piecewise history).
  uint64_t to_host(uint64_t device_time) const { return history_.to_host(device_time); }
  const PiecewiseModel& history() const { return history_; }
  const ClockRates& rates() const { return rates_; }
  const SyncConfig& config() const { return cfg_; }

 private:
  friend class RoundGate;
  friend class DeviceClockSync;
  // The tracker is the device SDK's (perfq_sync_online); this class keeps
  // the history of its models through the SDK's hooks.
  void bind() noexcept;
  Verdict after(perfq_sync_verdict v);
  static void on_open(void* ctx, uint32_t id, uint64_t valid_from);
  static void on_close(void* ctx, uint64_t valid_until);
  static void on_drop(void* ctx);
  static void on_knot(void* ctx, const perfq_sync_line* m);
  static void on_observed(void* ctx, uint64_t host_ns);

  ClockRates rates_;
  SyncConfig cfg_;
  std::unique_ptr<perfq_sync_online> c_;
  ClockModel current_;
  size_t knots_total_ = 0;
  PiecewiseModel history_{false};
};

// ---- Which rounds the online model fits ----------------------------------------------

// The rule for the online model, the same on the host (HostSync, mode A)
// and on the device (DeviceClockSync, mode B): both fit the same rounds,
// so the host's model mirrors the one the device converts with.
struct GateConfig {
  // A round whose observation is much less certain than is usual for this
  // device (preempted on a busy machine) is not fitted: it is used only
  // when its uncertainty is at most max(floor_ns, factor x the lower
  // quartile of the last 64 rounds).
  double floor_ns = 2'000;
  double factor = 4;
  // A round whose tightest host read took longer than this waited for the
  // device thread to be scheduled (a saturated machine).  It is kept out of
  // the model while the model predicts its time better than the round can
  // tell.
  double contended_delay_ns = 20'000;
};

// Rounds a model must have taken in before it converts anything: the
// first ones do not know the drift yet, and one bad round weighs much.
inline constexpr uint64_t kMinModelRounds = PERFQ_SYNC_MIN_MODEL_ROUNDS;

class RoundGate {
 public:
  explicit RoundGate(const GateConfig& cfg = {});
  // sync.add(obs) when the rule lets the round in (always for the first
  // model), else sync.witness(obs): a round left out of the fit may still
  // witness a clock step.  kOutlier when gated and no step witness.
  ClockSync::Verdict feed(ClockSync& sync, const SyncObservation& obs);

  // The loosest claim (ClockModel::claim_at()) a model may make at a time
  // it converts without waiting for better rounds: max(floor_ns, factor x
  // the tightest of the last 64 rounds), and floor_ns until there are 64.
  // A model fitted while the first rounds were loose (a machine busy
  // starting the device) is honest about its tens of microseconds, but a
  // round or two later the same records convert within a few hundred ns:
  // they wait for that.  Infinite before the first round.
  double tight_ns() const { return g_.tight; }
  // Rounds taken into the model (taken_into_model()).
  uint64_t taken() const { return g_.taken; }

 private:
  friend class DeviceClockSync;
  perfq_sync_gate g_;  // the device SDK's gate
};

// ---- 3. Offline re-synchronization ---------------------------------------------------

struct OfflineFit {
  PiecewiseModel model{true};
  std::vector<ClockSync::Verdict> verdicts;  // per input observation
  std::vector<int32_t> segment_of;           // per observation, -1 when not used
};

// Whole-recording model: the same segmentation as the online tracker, then
// for every observation a robust fit over a window centered on it (data on
// both sides), and conversion by interpolation between those knots.
// Observations flagged in witness_only (when given, parallel to
// observations) are not fitted but may witness a step (ClockSync::witness).
OfflineFit fit_offline(std::span<const SyncObservation> observations, const ClockRates& rates,
                       const SyncConfig& cfg = {}, std::span<const uint8_t> witness_only = {});

// The same from raw rounds (host and device samples of each round).  Rounds
// much less certain than the recording's usual ones (above max(2 us, 4 x
// the lower quartile of all rounds): preempted or waiting for the device to
// be scheduled) are left out of the fit, as the online gate does; they
// still witness steps and narrow down where each step happened (a loose
// round tells which side of a step it was taken on), so only the interval
// between the two rounds around a step is ambiguous.  segment_of and
// verdicts are per usable round, in order.
struct SyncRound {
  uint32_t round = 0;
  std::vector<perfq_clock_sample> host;
  std::vector<perfq_clock_sample> device;
};
OfflineFit fit_offline_rounds(std::span<const SyncRound> rounds, const ClockRates& rates,
                              const SyncConfig& cfg = {}, const SelectionConfig& sel = {});

// ---- 4. Mode B: the device converts its own record times ------------------------------

// Runs on the device: pairs the host samples from the mailbox with the
// device's own samples of the same round, tracks the same model, and
// converts record times to host time.  One thread (the device collector).
class DeviceClockSync {
 public:
  explicit DeviceClockSync(const ClockRates& rates, const SyncConfig& cfg = {},
                           const SelectionConfig& sel = {}, const GateConfig& gate = {});

  Result<ClockSync::Verdict> update(std::span<const perfq_clock_sample> host_samples,
                                    std::span<const perfq_clock_sample> device_samples,
                                    uint32_t round);
  // Reads the mailbox (validated, under its seqlock) and requires its round
  // to be `round`, the round of device_samples.
  Result<ClockSync::Verdict> update_from_page(const perfq_sync_page* page,
                                              std::span<const perfq_clock_sample> device_samples,
                                              uint32_t round);

  // Add an observation made elsewhere (make_observation()), through
  // the same RoundGate as the host's HostSync: given the same rounds, the
  // device's model is the host's.
  ClockSync::Verdict add(const SyncObservation& obs);
  bool ready() const { return sync_.has_model(); }
  // Host time of a device time, with the model current now (records are
  // converted as they are collected, so the latest model is the one valid
  // for them).  Returns the input unchanged when no model exists yet.
  uint64_t to_host(uint64_t device_time) const;
  // Rewrites a PERFQ_CLOCK_DEVICE record into PERFQ_CLOCK_HOST_BY_DEVICE;
  // false (record untouched) when not ready, the record is in another
  // domain, or the model does not vouch for its time yet (fewer than
  // kMinModelRounds rounds, or ClockModel::vouches(): the drift is not
  // known well enough to extrapolate there, or the model is looser than
  // this device's good rounds make it).  A record left in D is the host's to convert, with
  // the model the same rounds give it, once a round after it is in.
  bool convert_record(perfq_record* r) const;
  const ClockSync& sync() const { return sync_; }

 private:
  ClockSync sync_;
  SelectionConfig sel_;
  RoundGate gate_;
};

const char* verdict_name(ClockSync::Verdict v);
// Whether a round with this verdict went into the model (accepted, or
// opening a segment).
constexpr bool taken_into_model(ClockSync::Verdict v) {
  return v == ClockSync::Verdict::kAccepted || v == ClockSync::Verdict::kNewSegment;
}

}  // namespace perfq
