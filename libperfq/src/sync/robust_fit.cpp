// The robust weighted fit of sync observations (see robust_fit.h), which
// the online tracker (fit.cpp) and the offline fit (offline_fit.cpp) use.
#include "sync/robust_fit.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/median.h"

namespace perfq::sync_fit {

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
    const long double scale2 =
        m > 2 ? std::max<long double>(1, chi2 / static_cast<long double>(m - 2)) : 1;
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

double gate_of(std::vector<double>& u, const GateConfig& cfg) {
  if (u.empty()) return std::numeric_limits<double>::infinity();
  const size_t q = u.size() / 4;
  std::nth_element(u.begin(), u.begin() + static_cast<std::ptrdiff_t>(q), u.end());
  return std::max(cfg.floor_ns, cfg.factor * u[q]);
}

bool usable(const SyncObservation& o, const SyncConfig& cfg) {
  return std::isfinite(o.uncertainty_ns) && o.uncertainty_ns >= 0 &&
         o.uncertainty_ns <= cfg.max_uncertainty_ns;
}

}  // namespace perfq::sync_fit
