// make_observation(): one sync round -> one (D, H) observation.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/median.h"
#include "sync/sync.h"

namespace perfq {
namespace {

// Brackets wider than this are garbage, not slow reads.
constexpr int64_t kMaxBracketTicks = int64_t{1} << 62;
// Host and device samples of one round further apart than this (ns) are
// not from the same round.
constexpr long double kMaxPairingGapNs = 10e9L;
// Allowance for the drift between two clocks across one round when
// comparing the implied offsets of its samples (2000 ppm).
constexpr long double kRoundDriftAllowance = 2e-3L;

// One usable sample, reduced to numbers relative to the round's bases.
struct Cand {
  long double delay_ns;  // bracket width, ns
  long double at_ns;     // when it was taken (ns, relative), for the drift allowance
  long double implied;   // the quantity that must agree between samples (ns)
  long double a;         // side-specific payloads, averaged over the selection
  long double b;
};

struct Picked {
  long double a = 0, b = 0;  // means over the selection
  long double max_half_ns = 0;
  long double min_delay_ns = 0;
  size_t used = 0;
};

// Shifted-value vote among the tight candidates of one side (c sorted by
// delay): clears ok[i] for a sample whose implied value is too far from the
// median of the tight ones.  Returns the robust spread of those values.
long double vote(const std::vector<Cand>& c, const SelectionConfig& sel, std::vector<uint8_t>& ok,
                 size_t* ntight_out = nullptr) {
  ok.assign(c.size(), 1);
  const long double min_delay = c.front().delay_ns;
  const long double margin = std::max<long double>(sel.margin_ns, sel.margin_frac * min_delay);
  size_t ntight = 0;
  while (ntight < c.size() && (ntight < 3 || c[ntight].delay_ns <= 2 * min_delay + margin))
    ++ntight;
  if (ntight_out) *ntight_out = ntight;
  if (ntight < 3) return 0;
  std::vector<long double> v;
  v.reserve(ntight);
  for (size_t i = 0; i < ntight; ++i) v.push_back(c[i].implied);
  const long double med = median_in_place(v);
  long double med_at = 0;
  {
    std::vector<long double> t;
    t.reserve(ntight);
    for (size_t i = 0; i < ntight; ++i) t.push_back(c[i].at_ns);
    med_at = median_in_place(t);
  }
  for (auto& x : v) x = std::fabs(x - med);
  const long double spread = 1.4826L * median_in_place(v);
  for (size_t i = 0; i < c.size(); ++i) {
    const long double tol =
        std::max<long double>(sel.outlier_k * spread, c[i].delay_ns / 2 + min_delay / 2 + margin) +
        kRoundDriftAllowance * std::fabs(c[i].at_ns - med_at);
    if (std::fabs(c[i].implied - med) > tol) ok[i] = 0;
  }
  return spread;
}

// Selection by delay (see SelectionConfig): the host side.
Picked pick(std::vector<Cand>& c, const SelectionConfig& sel) {
  std::sort(c.begin(), c.end(),
            [](const Cand& x, const Cand& y) { return x.delay_ns < y.delay_ns; });
  const long double min_delay = c.front().delay_ns;
  std::vector<uint8_t> ok;
  const long double value_spread = vote(c, sel, ok);
  // When the values read scatter more than the delays differ (noise in the
  // clock reads themselves), the delay no longer tells good samples from
  // bad ones: widen the margin to that scatter and let averaging work.
  Picked p;
  long double best = -1;
  for (size_t i = 0; i < c.size(); ++i) {
    if (!ok[i]) continue;
    if (best < 0) best = c[i].delay_ns;
    const long double m2 =
        std::max<long double>({static_cast<long double>(sel.margin_ns), sel.margin_frac * best,
                               sel.average_scatter ? value_spread : 0.0L});
    if (c[i].delay_ns > best + m2) break;
    p.a += c[i].a;
    p.b += c[i].b;
    p.max_half_ns = std::max(p.max_half_ns, c[i].delay_ns / 2);
    ++p.used;
  }
  if (p.used == 0) {  // everything voted out: fall back to the tightest
    p.a = c.front().a;
    p.b = c.front().b;
    p.max_half_ns = c.front().delay_ns / 2;
    p.used = 1;
  } else {
    p.a /= static_cast<long double>(p.used);
    p.b /= static_cast<long double>(p.used);
  }
  p.min_delay_ns = best < 0 ? min_delay : best;
  return p;
}

// The device side: a weighted mean over every sample that survives the
// vote.  A device sample's error (where D lies inside its R bracket) is
// symmetric, uniform within +-width/2 at worst, so its variance is
// width^2/12; averaging many samples weighted by the inverse of that beats
// keeping the tightest few, and the weights make the tightest dominate.  Two
// more terms: noise in the values themselves (the scatter of the tight
// samples' implied values beyond what their widths explain), and the
// sample's distance in R from the host's selection, over which R is taken
// at its nominal rate (sel.rate_error of it).  `at_host_ns` is that
// position (R, in ns relative to the base).  The result's max_half_ns is,
// as for the host side, the largest half-bracket among the samples that
// carry the mean (weight at least 1/16 of the heaviest): a bound that
// does not move with the per-round estimates in the weights.
Picked weigh(std::vector<Cand>& c, const SelectionConfig& sel, long double at_host_ns) {
  std::sort(c.begin(), c.end(),
            [](const Cand& x, const Cand& y) { return x.delay_ns < y.delay_ns; });
  std::vector<uint8_t> ok;
  size_t ntight = 0;
  const long double spread = vote(c, sel, ok, &ntight);
  long double excess2 = 0;
  if (sel.average_scatter && ntight >= 3) {
    long double own = 0;
    for (size_t i = 0; i < ntight; ++i) own += c[i].delay_ns * c[i].delay_ns / 12;
    excess2 = std::max<long double>(0, spread * spread - own / static_cast<long double>(ntight));
  }
  Picked p;
  long double W = 0, wmax = 0;
  std::vector<long double> w(c.size(), 0);
  for (size_t i = 0; i < c.size(); ++i) {
    if (!ok[i]) continue;
    const long double gap = (c[i].at_ns - at_host_ns) * sel.rate_error;
    const long double var = c[i].delay_ns * c[i].delay_ns / 12 + excess2 + gap * gap;
    w[i] = 1 / (var + 1e-6L);
    W += w[i];
    wmax = std::max(wmax, w[i]);
  }
  if (W == 0) {  // everything voted out: fall back to the tightest
    p.a = c.front().a;
    p.b = c.front().b;
    p.max_half_ns = c.front().delay_ns / 2;
    p.min_delay_ns = c.front().delay_ns;
    p.used = 1;
    return p;
  }
  // Means relative to the heaviest sample (small numbers, exact sums).
  size_t ref = 0;
  while (w[ref] != wmax) ++ref;
  long double da = 0, db = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    if (w[i] == 0) continue;
    da += w[i] * (c[i].a - c[ref].a);
    db += w[i] * (c[i].b - c[ref].b);
    if (w[i] >= wmax / 16) {  // the samples that matter
      ++p.used;
      p.max_half_ns = std::max(p.max_half_ns, c[i].delay_ns / 2);
    }
  }
  p.a = c[ref].a + da / W;
  p.b = c[ref].b + db / W;
  p.min_delay_ns = c[ref].delay_ns;
  for (size_t i = 0; i < c.size(); ++i)
    if (ok[i]) {
      p.min_delay_ns = c[i].delay_ns;
      break;
    }
  return p;
}

}  // namespace

Status ClockRates::validate() const {
  if (device_hz == 0 || device_hz > PERFQ_CLOCK_HZ_MAX)
    return Status(Errc::kInvalidArgument, fmt::format("clock rates: device_hz {} outside 1..{}",
                                                      device_hz, PERFQ_CLOCK_HZ_MAX));
  if (timer_hz == 0 || timer_hz > PERFQ_CLOCK_HZ_MAX)
    return Status(Errc::kInvalidArgument, fmt::format("clock rates: timer_hz {} outside 1..{}",
                                                      timer_hz, PERFQ_CLOCK_HZ_MAX));
  return Status::ok();
}

namespace {

// The first well-formed sample (a bracket of 0..kMaxBracketTicks), or null.
const perfq_clock_sample* first_usable(std::span<const perfq_clock_sample> samples) {
  for (const auto& s : samples)
    if (time_diff(s.after, s.before) >= 0 && time_diff(s.after, s.before) <= kMaxBracketTicks)
      return &s;
  return nullptr;
}

// The host side's candidates, relative to its bases: H - R (ns) must agree
// between samples; payloads: Hmid, R2.
std::vector<Cand> host_candidates(std::span<const perfq_clock_sample> host, uint64_t base_h,
                                  uint64_t base_r, long double tns) {
  std::vector<Cand> hc;
  hc.reserve(host.size());
  for (const auto& s : host) {
    const int64_t delay = time_diff(s.after, s.before);
    if (delay < 0 || delay > kMaxBracketTicks) continue;
    const long double hmid =
        static_cast<long double>(time_diff(s.before, base_h)) + static_cast<long double>(delay) / 2;
    const long double r2 = static_cast<long double>(time_diff(s.value, base_r));
    hc.push_back(Cand{static_cast<long double>(delay), hmid, hmid - r2 * tns, hmid, r2});
  }
  return hc;
}

// The device side's candidates, relative to the bases: D - R (ns) must
// agree between samples; payloads: D, R1.
std::vector<Cand> device_candidates(std::span<const perfq_clock_sample> device, uint64_t base_r,
                                    uint64_t base_d, long double tns, long double dns) {
  std::vector<Cand> dc;
  dc.reserve(device.size());
  for (const auto& s : device) {
    const int64_t delay = time_diff(s.after, s.before);
    if (delay < 0 || delay > kMaxBracketTicks) continue;
    const long double r1 =
        static_cast<long double>(time_diff(s.before, base_r)) + static_cast<long double>(delay) / 2;
    const long double d = static_cast<long double>(time_diff(s.value, base_d));
    dc.push_back(Cand{static_cast<long double>(delay) * tns, r1 * tns, d * dns - r1 * tns, d, r1});
  }
  return dc;
}

}  // namespace

Result<SyncObservation> make_observation(std::span<const perfq_clock_sample> host,
                                         std::span<const perfq_clock_sample> device,
                                         const ClockRates& rates, const SelectionConfig& sel,
                                         uint32_t round) {
  if (Status s = rates.validate(); !s) return s;
  const long double tns = rates.timer_ns_per_tick();
  const long double dns = rates.device_ns_per_tick();

  // Bases: the first well-formed sample of each side; all arithmetic below
  // is on signed differences from them (any u64 origin works).
  const perfq_clock_sample* h0 = first_usable(host);
  if (!h0)
    return Status(Errc::kInvalidArgument,
                  fmt::format("sync round {}: no usable host sample among {}", round, host.size()));
  const uint64_t base_h = h0->before;
  const uint64_t base_r = h0->value;
  std::vector<Cand> hc = host_candidates(host, base_h, base_r, tns);

  const perfq_clock_sample* d0 = first_usable(device);
  if (!d0)
    return Status(
        Errc::kInvalidArgument,
        fmt::format("sync round {}: no usable device sample among {}", round, device.size()));
  const uint64_t base_d = d0->value;
  std::vector<Cand> dc = device_candidates(device, base_r, base_d, tns, dns);

  // Host side first: the tightest brackets (their error is the one that
  // does not average out).  Device side: the weighted mean around them.
  const Picked hp = pick(hc, sel);
  const Picked dp = weigh(dc, sel, hp.b * tns);
  // D* and R* are the device means (exact for linear clocks, no rate
  // needed).  Host side: H at R*, moving the mean Hmid by the R distance at
  // R's nominal rate.
  const long double dstar = dp.a;
  const long double rstar = dp.b;
  const long double gap_ns = (rstar - hp.b) * tns;
  if (std::fabs(gap_ns) > kMaxPairingGapNs)
    return Status(Errc::kInvalidArgument,
                  fmt::format("sync round {}: device timer reads are {:.0f} ns away from the "
                              "host's: not the same round",
                              round, static_cast<double>(gap_ns)));
  long double hstar = hp.a + gap_ns;
  // Make the device time an integer, moving H to the same instant.
  const long double dround = std::round(dstar);
  hstar += (dround - dstar) * dns;
  const long double hround = std::round(hstar);

  SyncObservation o;
  o.device_time = base_d + static_cast<uint64_t>(static_cast<int64_t>(dround));
  o.host_ns = base_h + static_cast<uint64_t>(static_cast<int64_t>(hround));
  o.uncertainty_ns =
      static_cast<double>(hp.max_half_ns + dp.max_half_ns + std::fabs(gap_ns) * sel.rate_error);
  o.host_delay_ns = static_cast<double>(hp.min_delay_ns);
  o.device_delay_ns = static_cast<double>(dp.min_delay_ns);
  o.round = round;
  o.host_used = static_cast<uint16_t>(std::min<size_t>(hp.used, UINT16_MAX));
  o.device_used = static_cast<uint16_t>(std::min<size_t>(dp.used, UINT16_MAX));
  return o;
}

}  // namespace perfq
