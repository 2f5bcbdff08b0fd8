// Clock models, the robust fit, step detection, the online tracker, the
// offline whole-recording fit and the mode B helper.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include "sync/sync.h"
#include "core/median.h"
#include "sync/sync_buffer.h"

namespace perfq {
namespace {

__extension__ typedef __int128 i128;

uint64_t add_ns(uint64_t base, long double delta) noexcept {
  // Modular add of a rounded signed delta; deltas beyond s64 are clamped.
  const long double r = std::round(delta);
  int64_t v;
  if (!std::isfinite(r))
    v = 0;
  else if (r >= 9.2e18L)
    v = std::numeric_limits<int64_t>::max();
  else if (r <= -9.2e18L)
    v = std::numeric_limits<int64_t>::min();
  else
    v = static_cast<int64_t>(r);
  return base + static_cast<uint64_t>(v);
}

uint64_t sat_add(uint64_t base, long double delta) noexcept {
  // Saturating (not modular) add, for range bounds.
  const long double r = static_cast<long double>(base) + delta;
  if (!std::isfinite(r)) return base;
  if (r <= 0) return 0;
  if (r >= 1.8446744073709551615e19L) return UINT64_MAX;
  return static_cast<uint64_t>(r);
}


// ---- The robust weighted fit ----------------------------------------------------------
//
// Points relative to an origin observation o: x = D - D_o (ticks),
// y = (H - H_o) - s0 * x (ns), s0 the prior slope.  Model y = a + c x with a
// Gaussian prior c ~ N(0, prior_var) (which also makes one point, or points
// close together, well posed: the slope stays at the prior).  Weights
// 1 / (u^2/3 + floor^2): an error uniform within the bracket bound u has
// variance u^2/3.  Residuals beyond max(k x 1.4826 x MAD, 2u, floor) are
// rejected and the fit repeated until the inlier set is stable.
struct FitOut {
  long double a = 0, c = 0;  // at x = 0
  long double xbar = 0;      // weighted mean x of the inliers
  long double var_ybar = 0;  // variance of the fitted value at xbar
  long double var_c = 0;     // variance of the slope
  // The prior's pull on the slope, squared: (c - the data's own slope)^2.
  // Negligible once rounds span a second; most of the slope for a young
  // fit whose prior is wrong (a clock 5000 ppm off, a prior of +-1000).
  long double bias_c2 = 0;
  double sigma = 0;          // robust sigma of the residuals (ns)
  size_t inliers = 0;

  long double var_at(long double x) const { return var_ybar + (x - xbar) * (x - xbar) * var_c; }
};

struct Pt {
  long double x, y, w;
  double u;
};

FitOut robust_fit(const std::vector<Pt>& p, std::vector<uint8_t>& in, long double prior_var,
                  const SyncConfig& cfg) {
  FitOut f;
  const size_t n = p.size();
  const long double lambda = prior_var > 0 ? 1 / prior_var : 1e30L;
  std::vector<long double> r(n), tmp;
  tmp.reserve(n);
  for (int iter = 0; iter < 6; ++iter) {
    long double W = 0, sx = 0, sy = 0;
    size_t m = 0;
    for (size_t i = 0; i < n; ++i)
      if (in[i]) {
        W += p[i].w;
        sx += p[i].w * p[i].x;
        sy += p[i].w * p[i].y;
        ++m;
      }
    const long double xbar = sx / W, ybar = sy / W;
    long double sxx = 0, sxy = 0;
    for (size_t i = 0; i < n; ++i)
      if (in[i]) {
        const long double dx = p[i].x - xbar;
        sxx += p[i].w * dx * dx;
        sxy += p[i].w * dx * (p[i].y - ybar);
      }
    f.c = sxy / (sxx + lambda);
    f.a = ybar - f.c * xbar;
    // One observation (or all at one device time) measures no slope at
    // all: nothing but the prior vouches for it.
    f.bias_c2 = sxx > 0 ? (f.c - sxy / sxx) * (f.c - sxy / sxx)
                        : std::numeric_limits<long double>::infinity();
    f.xbar = xbar;
    long double chi2 = 0;
    tmp.clear();
    for (size_t i = 0; i < n; ++i) {
      r[i] = p[i].y - (f.a + f.c * p[i].x);
      if (in[i]) {
        chi2 += p[i].w * r[i] * r[i];
        tmp.push_back(r[i]);
      }
    }
    const long double med = median_in_place(tmp);
    for (auto& v : tmp) v = std::fabs(v - med);
    const long double mad = 1.4826L * median_in_place(tmp);
    f.sigma = std::max(static_cast<double>(mad), cfg.sigma_floor_ns);
    const long double scale2 = m > 2 ? std::max<long double>(1, chi2 / static_cast<long double>(m - 2)) : 1;
    f.var_ybar = scale2 / W;
    f.var_c = scale2 / (sxx + lambda);
    f.inliers = m;
    if (n < 3) break;
    bool changed = false;
    size_t kept = 0;
    std::vector<uint8_t> next(n);
    for (size_t i = 0; i < n; ++i) {
      const long double thr = std::max<long double>(
          {cfg.reject_k * f.sigma, 2.0L * p[i].u, static_cast<long double>(cfg.reject_floor_ns)});
      next[i] = std::fabs(r[i]) <= thr;
      kept += next[i];
    }
    if (kept < 2) break;  // keep the previous set rather than fit nothing
    for (size_t i = 0; i < n; ++i) changed |= next[i] != in[i];
    if (!changed) break;
    in.swap(next);
  }
  return f;
}

Pt make_pt(const SyncObservation& o, uint64_t d_o, uint64_t h_o, long double s0,
           const SyncConfig& cfg) {
  const long double x = static_cast<long double>(time_diff(o.device_time, d_o));
  const long double y = static_cast<long double>(time_diff(o.host_ns, h_o)) - s0 * x;
  const long double u = o.uncertainty_ns;
  const long double fl = cfg.sigma_floor_ns;
  return Pt{x, y, 1 / (u * u / 3 + fl * fl), o.uncertainty_ns};
}

// The knot at origin o from a fit.  `prior_measured`: the slope prior is
// the device's own measured rate (a segment after a step, the offline
// fit's whole segment), not the nominal one; otherwise the prior's pull
// on the slope (FitOut::bias_c2) is part of the knot's rate sigma and of
// its uncertainty at the origin, for the nominal prior may be wrong.
ClockModel knot_from(const FitOut& f, const SyncObservation& o, long double s0, uint32_t segment,
                     uint64_t valid_from, bool prior_measured) {
  ClockModel m;
  m.device_ref = o.device_time;
  const long double fl = std::floor(f.a);
  m.host_ref = add_ns(o.host_ns, fl);
  m.host_frac = static_cast<double>(f.a - fl);
  m.ns_per_tick = s0 + f.c;
  const long double bias2 = prior_measured ? 0 : f.bias_c2;
  const long double off2 = f.xbar != 0 ? bias2 * f.xbar * f.xbar : 0;
  m.uncertainty_ns = 3 * std::sqrt(static_cast<double>(f.var_at(0) + off2));
  m.rate_sigma_ppb = std::sqrt(static_cast<double>(f.var_c + bias2)) * 1e9;  // relative to ns/tick
  m.valid_from_device = valid_from;
  m.segment = segment;
  m.valid = true;
  return m;
}

// The uncertainty above which a round is much worse than the usual ones:
// max(floor, factor x the lower quartile of `u`), reordering u.  (A low
// quantile: on a machine that is saturated half of the time the median
// would let the slow half in.)
double gate_of(std::vector<double>& u, const GateConfig& cfg = {}) {
  if (u.empty()) return std::numeric_limits<double>::infinity();
  const size_t q = u.size() / 4;
  std::nth_element(u.begin(), u.begin() + static_cast<std::ptrdiff_t>(q), u.end());
  return std::max(cfg.floor_ns, cfg.factor * u[q]);
}

bool usable(const SyncObservation& o, const SyncConfig& cfg) {
  return std::isfinite(o.uncertainty_ns) && o.uncertainty_ns >= 0 &&
         o.uncertainty_ns <= cfg.max_uncertainty_ns;
}

}  // namespace

// ---- ClockModel -------------------------------------------------------------------

uint64_t ClockModel::to_host(uint64_t device_time) const noexcept {
  const long double dx = static_cast<long double>(time_diff(device_time, device_ref));
  return add_ns(host_ref, host_frac + dx * ns_per_tick);
}

double ClockModel::host_distance_ns(uint64_t d) const noexcept {
  return std::fabs(static_cast<double>(time_diff(d, device_ref)) * static_cast<double>(ns_per_tick));
}

double ClockModel::claim_at(uint64_t d) const noexcept {
  // A rate sigma may be infinite (a first model of one observation).
  const double dx = host_distance_ns(d);
  return dx > 0 ? uncertainty_ns + 3 * rate_sigma_ppb * 1e-9 * dx : uncertainty_ns;
}

double ClockModel::claim_at(uint64_t d, const ClockModel& newer) const noexcept {
  const double gap_ppb = std::fabs(static_cast<double>((ns_per_tick / newer.ns_per_tick - 1) * 1e9L));
  const double rate_ppb = std::max(3 * rate_sigma_ppb, gap_ppb + 3 * newer.rate_sigma_ppb);
  const double dx = host_distance_ns(d);
  return dx > 0 ? uncertainty_ns + rate_ppb * 1e-9 * dx : uncertainty_ns;
}

double ClockModel::device_drift_ppb(const ClockRates& rates) const noexcept {
  return static_cast<double>((rates.device_ns_per_tick() / ns_per_tick - 1) * 1e9L);
}

ClockStanding clock_standing(const ClockModel& m, const ClockRates& rates) noexcept {
  ClockStanding s;
  // Each clock's reading as a signed 64-bit value: an origin just below
  // 2^64 is a small negative time, as time_diff() reads differences.
  const long double device_ns =
      static_cast<long double>(static_cast<int64_t>(m.device_ref)) * rates.device_ns_per_tick();
  const long double host_ns = static_cast<long double>(static_cast<int64_t>(m.host_ref)) + m.host_frac;
  s.device_ahead_ns = static_cast<double>(device_ns - host_ns);
  s.device_fast_ppm = m.device_drift_ppb(rates) / 1000.0;
  s.bound_ns = m.uncertainty_ns;
  s.rate_implausible = std::fabs(s.device_fast_ppm) > kPlausibleDriftPpm;
  return s;
}

std::string standing_text(const ClockStanding& s) {
  const double a = std::fabs(s.device_ahead_ns);
  std::string by;
  if (a >= 1e9)
    by = fmt::format("{:.3f} s", a / 1e9);
  else if (a >= 1e6)
    by = fmt::format("{:.3f} ms", a / 1e6);
  else if (a >= 1e3)
    by = fmt::format("{:.3f} us", a / 1e3);
  else
    by = fmt::format("{:.0f} ns", a);
  return fmt::format("device clock {} {} the host, running {:.3f} ppm {}{}", by,
                     s.device_ahead_ns >= 0 ? "ahead of" : "behind", std::fabs(s.device_fast_ppm),
                     s.device_fast_ppm >= 0 ? "fast" : "slow",
                     s.rate_implausible ? " (no real clock is that far off: is the device's "
                                          "declared clock or timer rate right?)"
                                        : "");
}

perfq_sync_model ClockModel::to_abi() const noexcept {
  perfq_sync_model m{};
  m.device_ref = device_ref;
  m.host_ref_ns = static_cast<int64_t>(host_ref + (host_frac >= 0.5 ? 1 : 0));
  const long double ppb = std::round((ns_per_tick - 1) * 1e9L);
  m.rate_ppb = ppb > 9.2e18L ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(ppb);
  m.uncertainty_ns = static_cast<uint64_t>(std::ceil(std::min(uncertainty_ns, 1.8e19)));
  m.valid_from_device = valid_from_device;
  m.segment = segment;
  m.flags = valid ? PERFQ_SYNC_MODEL_VALID : 0;
  return m;
}

Result<ClockModel> ClockModel::from_abi(const perfq_sync_model& m) {
  if (m.flags & ~PERFQ_SYNC_MODEL_VALID)
    return Status(Errc::kCorrupt, fmt::format("sync model: unknown flags {:#x}", m.flags));
  if (m.rate_ppb <= -1'000'000'000LL || m.rate_ppb > 1'000'000'000'000'000'000LL - 1'000'000'000LL)
    return Status(Errc::kCorrupt,
                  fmt::format("sync model: rate_ppb {} is not a positive rate", m.rate_ppb));
  ClockModel c;
  c.device_ref = m.device_ref;
  c.host_ref = static_cast<uint64_t>(m.host_ref_ns);
  c.ns_per_tick = 1 + static_cast<long double>(m.rate_ppb) / 1e9L;
  c.uncertainty_ns = static_cast<double>(m.uncertainty_ns);
  c.valid_from_device = m.valid_from_device;
  c.segment = m.segment;
  c.valid = (m.flags & PERFQ_SYNC_MODEL_VALID) != 0;
  return c;
}

uint64_t apply_abi_model(const perfq_sync_model& m, uint64_t device_time) noexcept {
  const i128 dx = time_diff(device_time, m.device_ref);
  const i128 num = dx * (i128{1'000'000'000} + m.rate_ppb);
  const i128 half = 500'000'000;
  const i128 q = num >= 0 ? (num + half) / 1'000'000'000 : -((-num + half) / 1'000'000'000);
  return static_cast<uint64_t>(m.host_ref_ns) + static_cast<uint64_t>(q);
}

// ---- PiecewiseModel ---------------------------------------------------------------------

int PiecewiseModel::segment_for(uint64_t d) const { return segment_for(d, 0, UINT32_MAX); }

int PiecewiseModel::segment_for(uint64_t d, uint32_t min_id, uint32_t max_id) const {
  int best = -1;
  uint64_t best_dist = UINT64_MAX;
  for (int i = static_cast<int>(segments_.size()) - 1; i >= 0; --i) {
    const Segment& s = segments_[static_cast<size_t>(i)];
    if (s.knots.empty() || s.id < min_id || s.id > max_id) continue;
    if (d >= s.valid_from && d <= s.valid_until) return i;
    const uint64_t dist = d < s.valid_from ? s.valid_from - d : d - s.valid_until;
    if (dist < best_dist) {
      best_dist = dist;
      best = i;
    }
  }
  return best;
}

uint64_t PiecewiseModel::to_host_near(uint64_t d, uint64_t hint) const {
  const Segment* best = nullptr;
  uint64_t best_h = 0, best_dist = UINT64_MAX;
  for (const auto& s : segments_) {
    if (s.knots.empty() || d < s.valid_from || d > s.valid_until) continue;
    const uint64_t h = convert(s, d);
    const int64_t e = time_diff(h, hint);
    const uint64_t dist = e < 0 ? static_cast<uint64_t>(-(e + 1)) + 1 : static_cast<uint64_t>(e);
    if (dist < best_dist) {
      best_dist = dist;
      best_h = h;
      best = &s;
    }
  }
  return best ? best_h : to_host(d);
}

const ClockModel& PiecewiseModel::knot_at(const Segment& s, uint64_t d) {
  const auto& k = s.knots;
  // Knots are in device-time order inside a segment.
  auto it = std::upper_bound(k.begin(), k.end(), d,
                             [](uint64_t v, const ClockModel& m) { return v < m.device_ref; });
  return it == k.begin() ? k.front() : *(it - 1);
}

uint64_t PiecewiseModel::convert(const Segment& s, uint64_t d) const {
  const auto& k = s.knots;
  const ClockModel& lo = knot_at(s, d);
  if (!interpolate_ || d < lo.device_ref) return lo.to_host(d);
  const auto it = k.begin() + (&lo - k.data()) + 1;
  if (it == k.end() || it->device_ref == lo.device_ref) return lo.to_host(d);
  const ClockModel& hi = *it;
  const long double u = static_cast<long double>(d - lo.device_ref) /
                        static_cast<long double>(hi.device_ref - lo.device_ref);
  const uint64_t a = lo.to_host(d), b = hi.to_host(d);
  return add_ns(a, u * static_cast<long double>(time_diff(b, a)));
}

uint64_t PiecewiseModel::to_host(uint64_t d) const {
  const int i = segment_for(d);
  if (i < 0) return 0;
  return convert(segments_[static_cast<size_t>(i)], d);
}

uint64_t PiecewiseModel::to_host(uint64_t d, uint32_t segment) const {
  for (const auto& s : segments_)
    if (s.id == segment && !s.knots.empty()) return convert(s, d);
  return to_host(d);
}

ClockModel PiecewiseModel::model_at(uint64_t d) const {
  const int i = segment_for(d);
  if (i < 0) return {};
  return knot_at(segments_[static_cast<size_t>(i)], d);
}

ClockModel PiecewiseModel::model_at(uint64_t d, uint32_t segment) const {
  for (const auto& s : segments_)
    if (s.id == segment && !s.knots.empty()) return knot_at(s, d);
  return model_at(d);
}

PiecewiseModel PiecewiseModel::recent(uint64_t from_device) const {
  PiecewiseModel out(interpolate_);
  out.segments_.reserve(segments_.size());
  for (const auto& s : segments_) {
    Segment c;
    c.id = s.id;
    c.valid_from = s.valid_from;
    c.valid_until = s.valid_until;
    c.first_host = s.first_host;
    c.last_host = s.last_host;
    const auto& k = s.knots;
    auto it = std::upper_bound(k.begin(), k.end(), from_device,
                               [](uint64_t v, const ClockModel& m) { return v < m.device_ref; });
    if (it != k.begin()) --it;  // the knot in use at from_device (or the last)
    c.knots.assign(it, k.end());
    out.segments_.push_back(std::move(c));
  }
  return out;
}

std::vector<perfq_sync_model> PiecewiseModel::to_abi() const {
  std::vector<perfq_sync_model> out;
  for (const auto& s : segments_)
    for (const auto& k : s.knots) out.push_back(k.to_abi());
  return out;
}

// ---- ClockSync ----------------------------------------------------------------------------

ClockSync::ClockSync(const ClockRates& rates, const SyncConfig& cfg) : rates_(rates), cfg_(cfg) {
  if (cfg_.window < 2) cfg_.window = 2;
  prior_slope_ = rates_.device_ns_per_tick();
  const long double sd = cfg_.prior_drift_ppm * 1e-6L * prior_slope_;
  prior_var_ = sd * sd;
}

const char* verdict_name(ClockSync::Verdict v) {
  switch (v) {
    case ClockSync::Verdict::kAccepted: return "accepted";
    case ClockSync::Verdict::kRejected: return "rejected";
    case ClockSync::Verdict::kOutlier: return "outlier";
    case ClockSync::Verdict::kStepPending: return "step pending";
    case ClockSync::Verdict::kNewSegment: return "new segment";
    case ClockSync::Verdict::kInvalid: return "invalid";
  }
  return "?";
}

void ClockSync::refit() {
  const SyncObservation& o = window_.back();
  std::vector<Pt> pts;
  pts.reserve(window_.size());
  for (const auto& w : window_) pts.push_back(make_pt(w, o.device_time, o.host_ns, seg_slope0_, cfg_));
  // Start from all points: an observation rejected earlier may fit now.
  std::fill(inlier_.begin(), inlier_.end(), 1);
  const FitOut f = robust_fit(pts, inlier_, seg_var0_, cfg_);
  fit_xbar_ = f.xbar;
  fit_var_ybar_ = f.var_ybar;
  fit_var_c_ = f.var_c;
  fit_bias_c2_ = seg_prior_measured_ || !std::isfinite(f.bias_c2) ? 0 : f.bias_c2;
  sigma_ = f.sigma;
  current_ = knot_from(f, o, seg_slope0_, seg_id_,
                       history_.segments().back().knots.empty()
                           ? history_.segments().back().valid_from
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
      if (k.empty() && segs.size() > 1) segs.erase(segs.begin());
      else if (k.empty()) break;
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
  const double resid = static_cast<double>(time_diff(obs.host_ns, current_.to_host(obs.device_time)));
  const long double dxb = x - fit_xbar_;
  const double model_unc =
      3 * std::sqrt(static_cast<double>(fit_var_ybar_ + dxb * dxb * fit_var_c_));
  const double tol = std::max({cfg_.step_min_ns, cfg_.step_k * sigma_,
                               2 * obs.uncertainty_ns + model_unc, at_least_ns});
  return std::fabs(resid) > tol;
}

ClockSync::Verdict ClockSync::step_candidate(const SyncObservation& obs) {
  if (have_pending_) {
    const long double dx =
        static_cast<long double>(time_diff(obs.device_time, pending_.device_time));
    const long double e = static_cast<long double>(time_diff(obs.host_ns, pending_.host_ns)) -
                          current_.ns_per_tick * dx;
    const double confirm = std::max({cfg_.step_min_ns / 2, cfg_.step_k * sigma_,
                                     2 * (obs.uncertainty_ns + pending_.uncertainty_ns)}) +
                           3 * std::sqrt(static_cast<double>(fit_var_c_)) *
                               std::fabs(static_cast<double>(dx));
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
        const double tol = std::max({cfg_.step_min_ns / 2, cfg_.step_k * sigma_,
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
      const double tol = std::max({cfg_.step_min_ns / 2, 2 * (o.uncertainty_ns + a.uncertainty_ns)}) +
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
  if (!usable(obs, cfg_)) return std::isfinite(obs.uncertainty_ns) && obs.uncertainty_ns >= 0
                                     ? Verdict::kOutlier
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
  if (!usable(obs, cfg_)) return std::isfinite(obs.uncertainty_ns) && obs.uncertainty_ns >= 0
                                     ? Verdict::kOutlier
                                     : Verdict::kInvalid;
  // Only a step much wider than the observation itself: a loose round is
  // loose because something got in the way, and what got in the way may
  // have skewed it beyond its bracket too.
  if (!current_.valid || !far_off(obs, cfg_.witness_k * obs.uncertainty_ns)) return Verdict::kOutlier;
  return step_candidate(obs);
}

// ---- Offline ---------------------------------------------------------------------------------

OfflineFit fit_offline(std::span<const SyncObservation> obs, const ClockRates& rates,
                       const SyncConfig& cfg, std::span<const uint8_t> witness_only) {
  OfflineFit out;
  out.verdicts.assign(obs.size(), ClockSync::Verdict::kInvalid);
  out.segment_of.assign(obs.size(), -1);
  if (!rates.validate()) return out;

  // 1. Segmentation: the online tracker's, so both agree on the steps
  //    (keeping its whole history: the segment ranges come from it).
  SyncConfig all = cfg;
  all.max_history = UINT32_MAX;
  ClockSync sync(rates, all);
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

  // 2. Per segment: a whole-segment fit gives the slope prior, then a
  //    robust fit over a window centered on every observation.
  const auto& online = sync.history().segments();
  const size_t half = std::max<uint32_t>(cfg.offline_window, 2) / 2;
  long double prev_slope = rates.device_ns_per_tick();
  long double prev_var;
  bool prev_measured = false;  // prev_slope is a segment's, not the nominal rate
  {
    const long double sd = cfg.prior_drift_ppm * 1e-6L * prev_slope;
    prev_var = sd * sd;
  }
  for (const auto& os : online) {
    std::vector<size_t> idx;
    for (size_t i = 0; i < obs.size(); ++i)
      if (out.segment_of[i] == static_cast<int32_t>(os.id)) idx.push_back(i);
    if (idx.empty()) continue;
    PiecewiseModel::Segment seg;
    seg.id = os.id;
    seg.valid_from = os.valid_from;
    seg.valid_until = os.valid_until;

    const SyncObservation& o0 = obs[idx.front()];
    std::vector<Pt> pts;
    for (size_t i : idx) pts.push_back(make_pt(obs[i], o0.device_time, o0.host_ns, prev_slope, cfg));
    std::vector<uint8_t> in(pts.size(), 1);
    const FitOut whole = robust_fit(pts, in, prev_var, cfg);
    const long double seg_slope = prev_slope + whole.c;
    // Local fits may bend away from the whole-segment slope where the data
    // says so (drift that changes with temperature), but not on noise.
    // The first segment's prior is the nominal rate: its pull counts.
    // (A segment of one observation measures none: its prior stays.)
    const long double whole_var =
        whole.var_c + (prev_measured || !std::isfinite(whole.bias_c2) ? 0 : whole.bias_c2);
    const long double local_var = whole_var * 4 + 1e-30L;

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
      std::vector<uint8_t> lin(lp.size(), 1);
      const FitOut f = robust_fit(lp, lin, local_var, cfg);
      seg.knots.push_back(
          knot_from(f, o, seg_slope, seg.id, p == 0 ? seg.valid_from : o.device_time, true));
    }
    std::sort(seg.knots.begin(), seg.knots.end(),
              [](const ClockModel& a, const ClockModel& b) { return a.device_ref < b.device_ref; });
    out.model.mutable_segments().push_back(std::move(seg));
    prev_slope = seg_slope;
    const long double floor_sd = 0.1e-6L * rates.device_ns_per_tick();
    prev_var = std::max(whole_var, floor_sd * floor_sd);
    prev_measured = prev_measured || idx.size() >= 2;
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
    const SelectionConfig wider = selection_for(sel, fit.model.segments().back().knots.back(), rates);
    if (wider.rate_error > sel.rate_error) return fit_offline_rounds_with(rounds, rates, cfg, wider, false);
  }
  return fit;
}
}  // namespace

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

Result<ClockSync::Verdict> DeviceClockSync::update(std::span<const perfq_clock_sample> host_samples,
                                                   std::span<const perfq_clock_sample> device_samples,
                                                   uint32_t round) {
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
    return Status(Errc::kUnavailable,
                  fmt::format("mailbox holds round {}, device samples are of round {}", b->round,
                              round));
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
