// The robust weighted fit of sync observations (see robust_fit.h), which
// the online tracker (fit.cpp) and the offline fit (offline_fit.cpp) use:
// the device SDK's (perfq_sync_robust_fit() and its helpers).
#include "sync/robust_fit.h"

#include <vector>

namespace perfq::sync_fit {

FitOut robust_fit(const std::vector<Pt>& p, std::vector<uint8_t>& in, long double prior_var,
                  const SyncConfig& cfg) {
  std::vector<perfq_sync_pt> c(p.size());
  for (size_t i = 0; i < p.size(); ++i) {
    c[i] = perfq_sync_pt{};
    c[i].x = static_cast<double>(p[i].x);
    c[i].y = static_cast<double>(p[i].y);
    c[i].w = static_cast<double>(p[i].w);
    c[i].u = p[i].u;
    c[i].in = in[i];
  }
  const perfq_sync_config cc = to_c(cfg);
  perfq_sync_fit f{};
  perfq_sync_robust_fit(c.data(), static_cast<uint32_t>(c.size()), static_cast<double>(prior_var),
                        &cc, &f);
  for (size_t i = 0; i < p.size(); ++i) in[i] = c[i].in;
  FitOut out;
  out.a = f.a;
  out.c = f.c;
  out.xbar = f.xbar;
  out.var_ybar = f.var_ybar;
  out.var_c = f.var_c;
  out.bias_c2 = f.bias_c2;
  out.sigma = f.sigma;
  out.inliers = f.inliers;
  return out;
}

Pt make_pt(const SyncObservation& o, uint64_t d_o, uint64_t h_o, long double s0,
           const SyncConfig& cfg) {
  const perfq_sync_obs co = to_c(o);
  const perfq_sync_config cc = to_c(cfg);
  const perfq_sync_pt c = perfq_sync_make_pt(&co, d_o, h_o, static_cast<double>(s0), &cc);
  return Pt{c.x, c.y, c.w, c.u};
}

ClockModel knot_from(const FitOut& f, const SyncObservation& o, long double s0, uint32_t segment,
                     uint64_t valid_from, bool prior_measured) {
  const perfq_sync_fit cf{static_cast<double>(f.a),
                          static_cast<double>(f.c),
                          static_cast<double>(f.xbar),
                          static_cast<double>(f.var_ybar),
                          static_cast<double>(f.var_c),
                          static_cast<double>(f.bias_c2),
                          f.sigma,
                          static_cast<uint32_t>(f.inliers)};
  const perfq_sync_obs co = to_c(o);
  perfq_sync_line m;
  perfq_sync_knot_from(&cf, &co, static_cast<double>(s0), segment, valid_from, prior_measured, &m);
  return from_c(m);
}

double gate_of(std::vector<double>& u, const GateConfig& cfg) {
  const perfq_sync_gate_config g = to_c(cfg);
  return perfq_sync_gate_of(u.data(), static_cast<uint32_t>(u.size()), &g);
}

bool usable(const SyncObservation& o, const SyncConfig& cfg) {
  const perfq_sync_obs co = to_c(o);
  const perfq_sync_config cc = to_c(cfg);
  return perfq_sync_usable(&co, &cc);
}

}  // namespace perfq::sync_fit
