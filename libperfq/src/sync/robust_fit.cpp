// The robust weighted fit of sync observations (see robust_fit.h), which
// the online tracker (fit.cpp) and the offline fit (offline_fit.cpp) use:
// the device SDK's (perfq_sync_robust_fit() and its helpers).
#include "sync/robust_fit.h"

#include <vector>

namespace perfq::sync_fit {

FitOut robust_fit(std::vector<Pt>& p, long double prior_var, const SyncConfig& cfg) {
  const perfq_sync_config cc = to_c(cfg);
  FitOut f;
  perfq_sync_robust_fit(p.data(), static_cast<uint32_t>(p.size()), static_cast<double>(prior_var),
                        &cc, &f);
  return f;
}

Pt make_pt(const SyncObservation& o, uint64_t d_o, uint64_t h_o, long double s0,
           const SyncConfig& cfg) {
  const perfq_sync_obs co = to_c(o);
  const perfq_sync_config cc = to_c(cfg);
  return perfq_sync_make_pt(&co, d_o, h_o, static_cast<double>(s0), &cc);
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
                          static_cast<uint32_t>(f.inliers),
                          f.misfit};
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
