// The offline fit: a whole recording's rounds at once (fit_offline(),
// fit_offline_rounds()), segmented as the online tracker does.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "sync/robust_fit.h"
#include "sync/sync.h"

namespace perfq {

using namespace sync_fit;

// ---- Offline ---------------------------------------------------------------------------------

namespace {

// 1. Segmentation: the online tracker's, so both agree on the steps
//    (`sync` keeps its whole history: the segment ranges come from it).
void segment_as_online(ClockSync& sync, std::span<const SyncObservation> obs,
                       std::span<const uint8_t> witness_only, OfflineFit& out) {
  size_t pending = SIZE_MAX;
  for (size_t i = 0; i < obs.size(); ++i) {
    const bool loose = i < witness_only.size() && witness_only[i];
    const auto v = loose ? sync.witness(obs[i]) : sync.add(obs[i]);
    out.verdicts[i] = v;
    switch (v) {
      case ClockSync::Verdict::kAccepted:
      case ClockSync::Verdict::kRejected:
        out.segment_of[i] = static_cast<int32_t>(sync.segment());
        pending = SIZE_MAX;
        break;
      case ClockSync::Verdict::kStepPending:
        pending = i;
        break;
      case ClockSync::Verdict::kNewSegment:
        if (pending != SIZE_MAX) out.segment_of[pending] = static_cast<int32_t>(sync.segment());
        out.segment_of[i] = static_cast<int32_t>(sync.segment());
        pending = SIZE_MAX;
        break;
      default:
        break;
    }
  }
}

// The slope prior of the next segment's fit: the nominal rate for the
// first, then the previous segment's measured slope.
struct SlopePrior {
  long double slope = 0;
  long double var = 0;
  bool measured = false;  // slope is a segment's, not the nominal rate
};

// A knot at every observation idx[p] of a segment: a robust fit over a
// window of 2 half + 1 observations centered on it (shifted at the ends).
void local_knots(std::span<const SyncObservation> obs, const std::vector<size_t>& idx, size_t half,
                 long double seg_slope, long double local_var, const SyncConfig& cfg,
                 PiecewiseModel::Segment& seg) {
  const size_t n = idx.size();
  for (size_t p = 0; p < n; ++p) {
    size_t lo = p > half ? p - half : 0;
    size_t hi = std::min(n, lo + 2 * half + 1);
    if (hi - lo < std::min(n, 2 * half + 1)) lo = hi > 2 * half + 1 ? hi - (2 * half + 1) : 0;
    const SyncObservation& o = obs[idx[p]];
    std::vector<Pt> lp;
    lp.reserve(hi - lo);
    for (size_t q = lo; q < hi; ++q)
      lp.push_back(make_pt(obs[idx[q]], o.device_time, o.host_ns, seg_slope, cfg));
    const FitOut f = robust_fit(lp, local_var, cfg);
    seg.knots.push_back(
        knot_from(f, o, seg_slope, seg.id, p == 0 ? seg.valid_from : o.device_time, true));
  }
}

// 2. One segment (the observations idx of the online segment os): a
//    whole-segment fit gives the slope prior, then a robust fit over a
//    window centered on every observation.  Updates `prior` for the next.
PiecewiseModel::Segment fit_segment(std::span<const SyncObservation> obs,
                                    const std::vector<size_t>& idx,
                                    const PiecewiseModel::Segment& os, const ClockRates& rates,
                                    const SyncConfig& cfg, SlopePrior& prior) {
  const size_t half = std::max<uint32_t>(cfg.offline_window, 2) / 2;
  PiecewiseModel::Segment seg;
  seg.id = os.id;
  seg.valid_from = os.valid_from;
  seg.valid_until = os.valid_until;

  const SyncObservation& o0 = obs[idx.front()];
  std::vector<Pt> pts;
  for (size_t i : idx) pts.push_back(make_pt(obs[i], o0.device_time, o0.host_ns, prior.slope, cfg));
  const FitOut whole = robust_fit(pts, prior.var, cfg);
  const long double seg_slope = prior.slope + whole.c;
  // Local fits may bend away from the whole-segment slope where the data
  // says so (drift that changes with temperature), but not on noise.
  // The first segment's prior is the nominal rate: its pull counts.
  // (A segment of one observation measures none: its prior stays.)
  const long double whole_var =
      whole.var_c + (prior.measured || !std::isfinite(whole.bias_c2) ? 0 : whole.bias_c2);
  const long double local_var = whole_var * 4 + 1e-30L;

  local_knots(obs, idx, half, seg_slope, local_var, cfg, seg);
  std::sort(seg.knots.begin(), seg.knots.end(),
            [](const ClockModel& a, const ClockModel& b) { return a.device_ref < b.device_ref; });
  prior.slope = seg_slope;
  const long double floor_sd = 0.1e-6L * rates.device_ns_per_tick();
  prior.var = std::max(whole_var, floor_sd * floor_sd);
  prior.measured = prior.measured || idx.size() >= 2;
  return seg;
}

}  // namespace

OfflineFit fit_offline(std::span<const SyncObservation> obs, const ClockRates& rates,
                       const SyncConfig& cfg, std::span<const uint8_t> witness_only) {
  OfflineFit out;
  out.verdicts.assign(obs.size(), ClockSync::Verdict::kInvalid);
  out.segment_of.assign(obs.size(), -1);
  if (!rates.validate()) return out;

  SyncConfig all = cfg;
  all.max_history = UINT32_MAX;
  ClockSync sync(rates, all);
  segment_as_online(sync, obs, witness_only, out);

  SlopePrior prior;
  prior.slope = rates.device_ns_per_tick();
  {
    const long double sd = cfg.prior_drift_ppm * 1e-6L * prior.slope;
    prior.var = sd * sd;
  }
  for (const auto& os : sync.history().segments()) {
    std::vector<size_t> idx;
    for (size_t i = 0; i < obs.size(); ++i)
      if (out.segment_of[i] == static_cast<int32_t>(os.id)) idx.push_back(i);
    if (idx.empty()) continue;
    out.model.mutable_segments().push_back(fit_segment(obs, idx, os, rates, cfg, prior));
  }
  return out;
}

namespace {

// Where a step happened is only known to lie between the last observation
// of the old segment and the first of the new one.  The gate keeps loose
// rounds out of the fit, but a loose round (tens of microseconds) still
// tells on which side of a step (milliseconds) it was taken: narrow every
// boundary with the rounds that fit one side only, then split what is left
// at its host midpoint, as the online tracker does.
void narrow_steps(OfflineFit& fit, std::span<const SyncObservation> all, const SyncConfig& cfg) {
  auto& segs = fit.model.mutable_segments();
  const auto fits = [&](const PiecewiseModel::Segment& s, const SyncObservation& o) {
    const double resid =
        static_cast<double>(time_diff(o.host_ns, fit.model.to_host(o.device_time, s.id)));
    return std::fabs(resid) <= std::max(cfg.step_min_ns / 2, 3 * o.uncertainty_ns);
  };
  for (size_t j = 0; j + 1 < segs.size(); ++j) {
    auto& a = segs[j];
    auto& b = segs[j + 1];
    const SyncObservation* last_a = nullptr;
    const SyncObservation* first_b = nullptr;
    for (size_t i = 0; i < all.size(); ++i) {
      if (fit.segment_of[i] == static_cast<int32_t>(a.id)) last_a = &all[i];
      if (fit.segment_of[i] == static_cast<int32_t>(b.id) && !first_b) first_b = &all[i];
    }
    if (!last_a || !first_b || a.knots.empty() || b.knots.empty()) continue;
    const uint64_t lo = last_a->host_ns, hi = first_b->host_ns;
    const auto between = [&](const SyncObservation& o) {
      return time_diff(o.host_ns, lo) > 0 && time_diff(hi, o.host_ns) > 0 &&
             std::isfinite(o.uncertainty_ns) && o.uncertainty_ns >= 0;
    };
    for (const auto& o : all)
      if (between(o) && fits(b, o) && !fits(a, o) && time_diff(o.host_ns, first_b->host_ns) < 0)
        first_b = &o;
    for (const auto& o : all)
      if (between(o) && fits(a, o) && !fits(b, o) && time_diff(o.host_ns, last_a->host_ns) > 0 &&
          time_diff(o.host_ns, first_b->host_ns) < 0)
        last_a = &o;
    if (last_a->host_ns == lo && first_b->host_ns == hi) continue;
    const long double gap = static_cast<long double>(time_diff(first_b->host_ns, last_a->host_ns));
    const long double slope = a.knots.back().ns_per_tick;
    const uint64_t old_from = b.valid_from;
    a.valid_until = sat_add(last_a->device_time, gap / 2 / slope);
    b.valid_from = sat_add(first_b->device_time, -gap / 2 / slope);
    for (auto& k : b.knots)
      if (k.valid_from_device == old_from) k.valid_from_device = b.valid_from;
  }
}

}  // namespace

namespace {
OfflineFit fit_offline_rounds_with(std::span<const SyncRound> rounds, const ClockRates& rates,
                                   const SyncConfig& cfg, const SelectionConfig& sel,
                                   bool refine_rate);
}  // namespace

SelectionConfig selection_for(const SelectionConfig& base, const ClockModel& m,
                              const ClockRates& rates) {
  if (!m.valid) return base;
  SelectionConfig s = base;
  s.rate_error = std::max(base.rate_error, 1.5 * std::fabs(m.device_drift_ppb(rates)) * 1e-9);
  return s;
}

OfflineFit fit_offline_rounds(std::span<const SyncRound> rounds, const ClockRates& rates,
                              const SyncConfig& cfg, const SelectionConfig& sel) {
  return fit_offline_rounds_with(rounds, rates, cfg, sel, true);
}

namespace {
OfflineFit fit_offline_rounds_with(std::span<const SyncRound> rounds, const ClockRates& rates,
                                   const SyncConfig& cfg, const SelectionConfig& sel,
                                   bool refine_rate) {
  std::vector<SyncObservation> all;
  all.reserve(rounds.size());
  for (const auto& r : rounds) {
    auto o = make_observation(r.host, r.device, rates, sel, r.round);
    if (o) all.push_back(o.value());
  }
  std::vector<double> u;
  u.reserve(all.size());
  for (const auto& o : all) u.push_back(o.uncertainty_ns);
  const double gate = gate_of(u);
  std::vector<uint8_t> loose(all.size(), 0);
  size_t tight = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    loose[i] = all[i].uncertainty_ns > gate;
    tight += !loose[i];
  }
  if (tight < 2) std::fill(loose.begin(), loose.end(), 0);
  OfflineFit fit = fit_offline(all, rates, cfg, loose);
  narrow_steps(fit, all, cfg);
  // A clock far off its nominal rate: the rounds again, allowing for it
  // (selection_for()), as the online tracker did once it knew.
  if (refine_rate && !fit.model.empty() && !fit.model.segments().back().knots.empty()) {
    const SelectionConfig wider =
        selection_for(sel, fit.model.segments().back().knots.back(), rates);
    if (wider.rate_error > sel.rate_error)
      return fit_offline_rounds_with(rounds, rates, cfg, wider, false);
  }
  return fit;
}
}  // namespace

}  // namespace perfq
