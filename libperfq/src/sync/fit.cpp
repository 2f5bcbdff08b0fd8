// The online fit: ClockSync (the robust fit and step detection as rounds
// come), RoundGate and mode B's DeviceClockSync.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include "sync/robust_fit.h"
#include "sync/sync.h"
#include "sync/sync_buffer.h"

namespace perfq {

using namespace sync_fit;

// ---- ClockSync ----------------------------------------------------------------------------

ClockSync::ClockSync(const ClockRates& rates, const SyncConfig& cfg) : rates_(rates), cfg_(cfg) {
  if (cfg_.window < 2) cfg_.window = 2;
  prior_slope_ = rates_.device_ns_per_tick();
  const long double sd = cfg_.prior_drift_ppm * 1e-6L * prior_slope_;
  prior_var_ = sd * sd;
}

const char* verdict_name(ClockSync::Verdict v) {
  switch (v) {
    case ClockSync::Verdict::kAccepted:
      return "accepted";
    case ClockSync::Verdict::kRejected:
      return "rejected";
    case ClockSync::Verdict::kOutlier:
      return "outlier";
    case ClockSync::Verdict::kStepPending:
      return "step pending";
    case ClockSync::Verdict::kNewSegment:
      return "new segment";
    case ClockSync::Verdict::kInvalid:
      return "invalid";
  }
  return "?";
}

void ClockSync::refit() {
  const SyncObservation& o = window_.back();
  std::vector<Pt> pts;
  pts.reserve(window_.size());
  for (const auto& w : window_)
    pts.push_back(make_pt(w, o.device_time, o.host_ns, seg_slope0_, cfg_));
  // Start from all points: an observation rejected earlier may fit now.
  std::fill(inlier_.begin(), inlier_.end(), 1);
  const FitOut f = robust_fit(pts, inlier_, seg_var0_, cfg_);
  fit_xbar_ = f.xbar;
  fit_var_ybar_ = f.var_ybar;
  fit_var_c_ = f.var_c;
  fit_bias_c2_ = seg_prior_measured_ || !std::isfinite(f.bias_c2) ? 0 : f.bias_c2;
  sigma_ = f.sigma;
  current_ =
      knot_from(f, o, seg_slope0_, seg_id_,
                history_.segments().back().knots.empty() ? history_.segments().back().valid_from
                                                         : o.device_time,
                seg_prior_measured_);
}

void ClockSync::push_knot() {
  auto& segs = history_.mutable_segments();
  segs.back().knots.push_back(current_);
  if (++knots_total_ > cfg_.max_history && segs.size() > 0) {
    // Drop the oldest eighth of the history.
    size_t drop = std::max<size_t>(1, cfg_.max_history / 8);
    while (drop > 0 && !segs.empty()) {
      auto& k = segs.front().knots;
      const size_t n = std::min(drop, k.size());
      k.erase(k.begin(), k.begin() + static_cast<std::ptrdiff_t>(n));
      knots_total_ -= n;
      drop -= n;
      if (k.empty() && segs.size() > 1)
        segs.erase(segs.begin());
      else if (k.empty())
        break;
    }
  }
}

void ClockSync::note_observed(const SyncObservation& o) {
  auto& seg = history_.mutable_segments().back();
  if (seg.first_host == 0) seg.first_host = o.host_ns;
  seg.last_host = std::max(seg.last_host, o.host_ns);
}

void ClockSync::open_segment(PiecewiseModel::Segment s) {
  seg_id_ = s.id;
  history_.mutable_segments().push_back(std::move(s));
  window_.clear();
  inlier_.clear();
  have_pending_ = false;
  have_pending2_ = false;
}

void ClockSync::start_segment(const SyncObservation* first, const SyncObservation& second) {
  auto& segs = history_.mutable_segments();
  const SyncObservation& head = first ? *first : second;
  PiecewiseModel::Segment s;
  s.id = next_segment_++;
  s.valid_from = 0;
  if (!window_.empty()) {
    // The step happened between the last observation of the old segment
    // and `head`: split that interval at its host midpoint.
    const SyncObservation& last = window_.back();
    const long double gap = static_cast<long double>(time_diff(head.host_ns, last.host_ns));
    const long double old_slope = current_.ns_per_tick;
    segs.back().valid_until = sat_add(last.device_time, gap / 2 / old_slope);
    s.valid_from = sat_add(head.device_time, -gap / 2 / old_slope);
    // The device clock's rate does not change at a step: start from it
    // (measured if the old segment had two observations, else the prior's).
    seg_slope0_ = old_slope;
    const long double floor_sd = 0.1e-6L * rates_.device_ns_per_tick();
    seg_var0_ = std::max(fit_var_c_ + fit_bias_c2_, floor_sd * floor_sd);
    seg_prior_measured_ = seg_prior_measured_ || window_.size() >= 2;
  } else {
    seg_slope0_ = prior_slope_;
    seg_var0_ = prior_var_;
    seg_prior_measured_ = false;
  }
  open_segment(std::move(s));
  if (first) {
    window_.push_back(*first);
    note_observed(*first);
    inlier_.push_back(1);
    refit();
    push_knot();
  }
  window_.push_back(second);
  note_observed(second);
  inlier_.push_back(1);
  refit();
  push_knot();
}

bool ClockSync::far_off(const SyncObservation& obs, double at_least_ns) const {
  // Distance from the prediction, against what the model and the
  // observation can vouch for.
  const long double x = static_cast<long double>(time_diff(obs.device_time, current_.device_ref));
  const double resid =
      static_cast<double>(time_diff(obs.host_ns, current_.to_host(obs.device_time)));
  const long double dxb = x - fit_xbar_;
  const double model_unc =
      3 * std::sqrt(static_cast<double>(fit_var_ybar_ + dxb * dxb * fit_var_c_));
  const double tol = std::max(
      {cfg_.step_min_ns, cfg_.step_k * sigma_, 2 * obs.uncertainty_ns + model_unc, at_least_ns});
  return std::fabs(resid) > tol;
}

ClockSync::Verdict ClockSync::step_candidate(const SyncObservation& obs) {
  if (have_pending_) {
    const long double dx =
        static_cast<long double>(time_diff(obs.device_time, pending_.device_time));
    const long double e = static_cast<long double>(time_diff(obs.host_ns, pending_.host_ns)) -
                          current_.ns_per_tick * dx;
    const double confirm =
        std::max({cfg_.step_min_ns / 2, cfg_.step_k * sigma_,
                  2 * (obs.uncertainty_ns + pending_.uncertainty_ns)}) +
        3 * std::sqrt(static_cast<double>(fit_var_c_)) * std::fabs(static_cast<double>(dx));
    if (std::fabs(static_cast<double>(e)) <= confirm) {
      const SyncObservation first = pending_;
      start_segment(&first, obs);
      return Verdict::kNewSegment;
    }
    if (have_pending2_) {
      // No one offset: one line?  The middle candidate against the line
      // through the other two.
      const SyncObservation& a = pending2_;
      const SyncObservation& b = pending_;
      const long double dxc = static_cast<long double>(time_diff(obs.device_time, a.device_time));
      const long double dxb = static_cast<long double>(time_diff(b.device_time, a.device_time));
      if (dxc > 0 && dxb > 0 && dxb < dxc) {
        const long double slope = static_cast<long double>(time_diff(obs.host_ns, a.host_ns)) / dxc;
        const long double eb =
            static_cast<long double>(time_diff(b.host_ns, a.host_ns)) - slope * dxb;
        const double tol =
            std::max({cfg_.step_min_ns / 2, cfg_.step_k * sigma_,
                      2 * (a.uncertainty_ns + b.uncertainty_ns + obs.uncertainty_ns)});
        if (slope > 0 && std::fabs(static_cast<double>(eb)) <= tol) {
          // The slope is known to within the two ends' uncertainties over
          // their distance: that, twice, is the new segment's prior.
          const long double sd = 2 * (a.uncertainty_ns + obs.uncertainty_ns) / dxc;
          const SyncObservation first = a, second = b;
          start_rate_segment(first, second, obs, slope, sd * sd);
          return Verdict::kNewSegment;
        }
      }
    }
    pending2_ = pending_;
    have_pending2_ = true;
  }
  pending_ = obs;
  have_pending_ = true;
  return Verdict::kStepPending;
}

void ClockSync::start_rate_segment(const SyncObservation& a, const SyncObservation& b,
                                   const SyncObservation& c, long double slope,
                                   long double slope_var) {
  ++rate_breaks_;
  auto& segs = history_.mutable_segments();
  // A segment that never measured a rate (one observation: the first of a
  // recording) was wrong from its start: the new one replaces it, with its
  // observation if that lies on the new line.
  std::vector<SyncObservation> keep;
  uint64_t valid_from = 0;
  bool replace = false;
  if (window_.size() <= 1 && !segs.empty()) {
    replace = true;
    valid_from = segs.back().valid_from;
    if (!window_.empty()) {
      const SyncObservation& o = window_.front();
      const long double dx = static_cast<long double>(time_diff(o.device_time, a.device_time));
      const long double e = static_cast<long double>(time_diff(o.host_ns, a.host_ns)) - slope * dx;
      const double tol =
          std::max({cfg_.step_min_ns / 2, 2 * (o.uncertainty_ns + a.uncertainty_ns)}) +
          3 * std::sqrt(static_cast<double>(slope_var)) * std::fabs(static_cast<double>(dx));
      if (std::fabs(static_cast<double>(e)) <= tol) keep.push_back(o);
    }
    knots_total_ -= std::min(knots_total_, segs.back().knots.size());
    segs.pop_back();
  }
  PiecewiseModel::Segment s;
  s.id = next_segment_++;
  s.valid_from = valid_from;
  if (!replace && !window_.empty()) {
    // Split between the last observation of the old segment and `a`.
    const SyncObservation& last = window_.back();
    const long double gap = static_cast<long double>(time_diff(a.host_ns, last.host_ns));
    segs.back().valid_until = sat_add(last.device_time, gap / 2 / current_.ns_per_tick);
    s.valid_from = sat_add(a.device_time, -gap / 2 / slope);
  }
  const long double floor_sd = 0.1e-6L * rates_.device_ns_per_tick();
  seg_slope0_ = slope;
  seg_var0_ = std::max(slope_var, floor_sd * floor_sd);
  seg_prior_measured_ = true;  // the line through three observations
  open_segment(std::move(s));
  keep.insert(keep.end(), {a, b, c});
  for (const auto& o : keep) {
    window_.push_back(o);
    note_observed(o);
    inlier_.push_back(1);
    refit();
    push_knot();
  }
}

ClockSync::Verdict ClockSync::add(const SyncObservation& obs) {
  if (!usable(obs, cfg_))
    return std::isfinite(obs.uncertainty_ns) && obs.uncertainty_ns >= 0 ? Verdict::kOutlier
                                                                        : Verdict::kInvalid;
  if (!current_.valid) {
    start_segment(nullptr, obs);
    return Verdict::kAccepted;
  }
  if (far_off(obs)) return step_candidate(obs);
  have_pending_ = false;  // a lone far-off observation was an outlier
  have_pending2_ = false;
  window_.push_back(obs);
  note_observed(obs);
  inlier_.push_back(1);
  if (window_.size() > cfg_.window) {
    window_.erase(window_.begin());
    inlier_.erase(inlier_.begin());
  }
  refit();
  push_knot();
  return inlier_.back() ? Verdict::kAccepted : Verdict::kRejected;
}

ClockSync::Verdict ClockSync::witness(const SyncObservation& obs) {
  if (!usable(obs, cfg_))
    return std::isfinite(obs.uncertainty_ns) && obs.uncertainty_ns >= 0 ? Verdict::kOutlier
                                                                        : Verdict::kInvalid;
  // Only a step much wider than the observation itself: a loose round is
  // loose because something got in the way, and what got in the way may
  // have skewed it beyond its bracket too.
  if (!current_.valid || !far_off(obs, cfg_.witness_k * obs.uncertainty_ns))
    return Verdict::kOutlier;
  return step_candidate(obs);
}

// ---- RoundGate ---------------------------------------------------------------------------

ClockSync::Verdict RoundGate::feed(ClockSync& sync, const SyncObservation& obs) {
  // Against the usual uncertainty of this device's rounds before this one.
  scratch_ = recent_;
  const double gate = gate_of(scratch_, cfg_);
  if (recent_.size() < kRounds)
    recent_.push_back(obs.uncertainty_ns);
  else
    recent_[pos_++ % kRounds] = obs.uncertainty_ns;
  // A contended round (the device was not running: its tightest read waited
  // for it to be scheduled) that agrees with the model is kept out of it
  // while the model already predicts its time better than the round can
  // tell (the model's 3 sigma there, with its rate uncertainty over the
  // distance, below the round's uncertainty): extrapolating a fit of fast
  // rounds beats it.
  bool useless = false;
  if (obs.host_delay_ns > cfg_.contended_delay_ns && sync.has_model()) {
    const ClockModel& m = sync.current();
    const double rate_3s = 3 * m.rate_sigma_ppb * 1e-9 * m.host_distance_ns(obs.device_time);
    const double model_unc = std::sqrt(m.uncertainty_ns * m.uncertainty_ns + rate_3s * rate_3s);
    // Only a round that agrees with the model: one far off may be a clock
    // step, which the model's step detector must see.
    const double resid =
        std::fabs(static_cast<double>(time_diff(obs.host_ns, sync.to_host(obs.device_time))));
    useless = model_unc < obs.uncertainty_ns && resid <= obs.uncertainty_ns + model_unc;
  }
  const ClockSync::Verdict v = !sync.has_model() || (obs.uncertainty_ns <= gate && !useless)
                                   ? sync.add(obs)
                                   : sync.witness(obs);
  if (taken_into_model(v)) ++taken_;
  // Until 64 rounds tell what this device's rounds give, the floor: the
  // first rounds may all be loose (the machine busy starting the device).
  tight_ = recent_.size() < kRounds
               ? cfg_.floor_ns
               : std::max(cfg_.floor_ns,
                          cfg_.factor * *std::min_element(recent_.begin(), recent_.end()));
  return v;
}

// ---- Mode B ------------------------------------------------------------------------------

DeviceClockSync::DeviceClockSync(const ClockRates& rates, const SyncConfig& cfg,
                                 const SelectionConfig& sel, const GateConfig& gate)
    : sync_(rates, cfg), sel_(sel), gate_(gate) {}

Result<ClockSync::Verdict> DeviceClockSync::update(
    std::span<const perfq_clock_sample> host_samples,
    std::span<const perfq_clock_sample> device_samples, uint32_t round) {
  auto o = make_observation(host_samples, device_samples, sync_.rates(),
                            selection_for(sel_, sync_.current(), sync_.rates()), round);
  if (!o) return o.status();
  return add(o.value());
}

Result<ClockSync::Verdict> DeviceClockSync::update_from_page(
    const perfq_sync_page* page, std::span<const perfq_clock_sample> device_samples,
    uint32_t round) {
  auto b = read_sample_batch(&page->mailbox);
  if (!b) return b.status();
  if (b->round != round)
    return Status(
        Errc::kUnavailable,
        fmt::format("mailbox holds round {}, device samples are of round {}", b->round, round));
  return update(b->samples, device_samples, round);
}

ClockSync::Verdict DeviceClockSync::add(const SyncObservation& obs) {
  return gate_.feed(sync_, obs);
}

uint64_t DeviceClockSync::to_host(uint64_t device_time) const {
  return sync_.has_model() ? sync_.current().to_host(device_time) : device_time;
}

bool DeviceClockSync::convert_record(perfq_record* r) const {
  if (!ready()) return false;
  const unsigned domain = PERFQ_FLAGS_DOMAIN(r->flags);
  if (domain != PERFQ_CLOCK_DEVICE) return false;
  // The host's rule for extrapolating past the newest round: a time the
  // model does not vouch for stays in D, and the host converts it once a
  // round after it is in (the same rounds give the host the same model).
  // Nor while the newest round contradicts the model (a clock step or a
  // rate break waiting for confirmation): the host marks what was
  // converted before that round came as possibly across a step.
  if (gate_.taken() < kMinModelRounds || sync_.contradicted() ||
      !sync_.current().vouches(r->time, gate_.tight_ns()))
    return false;
  r->time = to_host(r->time);
  r->flags = static_cast<uint16_t>((r->flags & ~PERFQ_FLAGS_DOMAIN_MASK) |
                                   (PERFQ_CLOCK_HOST_BY_DEVICE << PERFQ_FLAGS_DOMAIN_SHIFT));
  return true;
}

}  // namespace perfq
