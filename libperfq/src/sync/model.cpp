// Clock models: one fitted line (ClockModel), its ABI form, and the
// piecewise model of a recording (PiecewiseModel).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include "perfq/perfq_device.h"
#include "sync/robust_fit.h"
#include "sync/sync.h"

namespace perfq {

// ---- ClockModel -------------------------------------------------------------------

// The line's arithmetic is the device SDK's (perfq_sync_line_*): the one a
// device in mode B converts with.

uint64_t ClockModel::to_host(uint64_t device_time) const noexcept {
  const perfq_sync_line l = sync_fit::to_c(*this);
  return perfq_sync_line_to_host(&l, device_time);
}

double ClockModel::host_distance_ns(uint64_t d) const noexcept {
  const perfq_sync_line l = sync_fit::to_c(*this);
  return perfq_sync_line_distance_ns(&l, d);
}

double ClockModel::claim_at(uint64_t d) const noexcept {
  const perfq_sync_line l = sync_fit::to_c(*this);
  return perfq_sync_line_claim(&l, d);
}

double ClockModel::claim_at(uint64_t d, const ClockModel& newer) const noexcept {
  const perfq_sync_line l = sync_fit::to_c(*this), n = sync_fit::to_c(newer);
  return perfq_sync_line_claim_newer(&l, d, &n);
}

bool ClockModel::settled_over(double dx_ns) const noexcept {
  const perfq_sync_line l = sync_fit::to_c(*this);
  return perfq_sync_line_settled_over(&l, dx_ns);
}

bool ClockModel::vouches(uint64_t d, double tight_ns) const noexcept {
  const perfq_sync_line l = sync_fit::to_c(*this);
  return perfq_sync_line_vouches(&l, d, tight_ns);
}

double ClockModel::device_drift_ppb(const ClockRates& rates) const noexcept {
  const perfq_sync_line l = sync_fit::to_c(*this);
  const perfq_sync_rates r = sync_fit::to_c(rates);
  return perfq_sync_line_drift_ppb(&l, &r);
}

ClockStanding clock_standing(const ClockModel& m, const ClockRates& rates) noexcept {
  ClockStanding s;
  // Each clock's reading as a signed 64-bit value: an origin just below
  // 2^64 is a small negative time, as time_diff() reads differences.
  const long double device_ns =
      static_cast<long double>(static_cast<int64_t>(m.device_ref)) * rates.device_ns_per_tick();
  const long double host_ns =
      static_cast<long double>(static_cast<int64_t>(m.host_ref)) + m.host_frac;
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
  const perfq_sync_line l = sync_fit::to_c(*this);
  perfq_sync_model m;
  perfq_sync_line_to_abi(&l, &m);
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
  return perfq_sync_apply(&m, device_time);  // the device SDK's, integer only
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
  return sync_fit::add_ns(a, u * static_cast<long double>(time_diff(b, a)));
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
  uint64_t from = 0, until = 0;
  const ClockModel* k = knot_for(d, segment, &from, &until);
  return k ? *k : ClockModel{};
}

const ClockModel* PiecewiseModel::knot_for(uint64_t d, uint32_t segment, uint64_t* from,
                                           uint64_t* until) const {
  for (const auto& s : segments_) {
    if (s.id != segment || s.knots.empty()) continue;
    // knot_at(): the last knot at or before d, the first before it.
    const ClockModel& k = knot_at(s, d);
    const size_t i = static_cast<size_t>(&k - s.knots.data());
    *from = i == 0 ? 0 : k.device_ref;
    *until = i + 1 == s.knots.size() ? UINT64_MAX : s.knots[i + 1].device_ref - 1;
    return &k;
  }
  // Not in the segment: the one segment_for() picks, for d alone.
  const int i = segment_for(d);
  if (i < 0) return nullptr;
  *from = *until = d;
  return &knot_at(segments_[static_cast<size_t>(i)], d);
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

}  // namespace perfq
