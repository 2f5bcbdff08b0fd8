// What the clock model (model.cpp), the online fit (fit.cpp) and the
// offline fit (offline_fit.cpp) share: time arithmetic on u64 times and the
// robust weighted fit (robust_fit.cpp).  Internal to sync/.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "perfq/perfq_device.h"
#include "sync/sync.h"

namespace perfq::sync_fit {

// ---- The C++ types and the device SDK's C ones --------------------------------------
// The math is the SDK's (perfq/perfq_device.h): one implementation for the
// host and for a device in mode B.  These convert between the two faces.

inline perfq_sync_rates to_c(const ClockRates& r) { return {r.device_hz, r.timer_hz}; }
inline perfq_sync_selection to_c(const SelectionConfig& s) {
  return {s.margin_ns, s.margin_frac, s.outlier_k, s.average_scatter, s.rate_error};
}
inline perfq_sync_config to_c(const SyncConfig& c) {
  return {c.window,      c.reject_k, c.reject_floor_ns, c.sigma_floor_ns,    c.prior_drift_ppm,
          c.step_min_ns, c.step_k,   c.witness_k,       c.max_uncertainty_ns};
}
inline perfq_sync_gate_config to_c(const GateConfig& g) {
  return {g.floor_ns, g.factor, g.contended_delay_ns};
}
inline perfq_sync_obs to_c(const SyncObservation& o) {
  return {o.device_time,     o.host_ns, o.uncertainty_ns, o.host_delay_ns,
          o.device_delay_ns, o.round,   o.host_used,      o.device_used};
}
inline SyncObservation from_c(const perfq_sync_obs& o) {
  SyncObservation s;
  s.device_time = o.device_time;
  s.host_ns = o.host_ns;
  s.uncertainty_ns = o.uncertainty_ns;
  s.host_delay_ns = o.host_delay_ns;
  s.device_delay_ns = o.device_delay_ns;
  s.round = o.round;
  s.host_used = o.host_used;
  s.device_used = o.device_used;
  return s;
}
inline perfq_sync_line to_c(const ClockModel& m) {
  perfq_sync_line l{};
  l.device_ref = m.device_ref;
  l.host_ref = m.host_ref;
  l.host_frac = m.host_frac;
  l.ns_per_tick = static_cast<double>(m.ns_per_tick);
  l.uncertainty_ns = m.uncertainty_ns;
  l.rate_sigma_ppb = m.rate_sigma_ppb;
  l.valid_from_device = m.valid_from_device;
  l.segment = m.segment;
  l.valid = m.valid;
  return l;
}
inline ClockModel from_c(const perfq_sync_line& l) {
  ClockModel m;
  m.device_ref = l.device_ref;
  m.host_ref = l.host_ref;
  m.host_frac = l.host_frac;
  m.ns_per_tick = l.ns_per_tick;
  m.uncertainty_ns = l.uncertainty_ns;
  m.rate_sigma_ppb = l.rate_sigma_ppb;
  m.valid_from_device = l.valid_from_device;
  m.segment = l.segment;
  m.valid = l.valid;
  return m;
}
inline ClockSync::Verdict from_c(perfq_sync_verdict v) {
  return static_cast<ClockSync::Verdict>(v);
}

inline uint64_t add_ns(uint64_t base, long double delta) noexcept {
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

inline uint64_t sat_add(uint64_t base, long double delta) noexcept {
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
// The SDK's types (perfq_device.h): a point carries its inlier flag.
using FitOut = perfq_sync_fit;
using Pt = perfq_sync_pt;

// The fit of points p (their `in` flags: the inlier mask, updated).
FitOut robust_fit(std::vector<Pt>& p, long double prior_var, const SyncConfig& cfg);

// Observation o as a point relative to origin (d_o, h_o) and prior slope s0.
Pt make_pt(const SyncObservation& o, uint64_t d_o, uint64_t h_o, long double s0,
           const SyncConfig& cfg);

// The knot at origin o from a fit.  `prior_measured`: the slope prior is
// the device's own measured rate (a segment after a step, the offline
// fit's whole segment), not the nominal one; otherwise the prior's pull
// on the slope (FitOut::bias_c2) is part of the knot's rate sigma and of
// its uncertainty at the origin, for the nominal prior may be wrong.
ClockModel knot_from(const FitOut& f, const SyncObservation& o, long double s0, uint32_t segment,
                     uint64_t valid_from, bool prior_measured);

// The uncertainty above which a round is much worse than the usual ones:
// max(floor, factor x the lower quartile of `u`), reordering u.  (A low
// quantile: on a machine that is saturated half of the time the median
// would let the slow half in.)
double gate_of(std::vector<double>& u, const GateConfig& cfg = {});

// An observation with a finite uncertainty within cfg's limit.
bool usable(const SyncObservation& o, const SyncConfig& cfg);

}  // namespace perfq::sync_fit
