// Tests of libperfq/src/sync/sync.h: observations from bracketed samples, the online
// clock model (offset, drift, outliers, steps, piecewise conversion), the
// offline whole-recording fit and the mode B helper, all against a simulated
// truth with a seeded RNG.
//
// The simulation: true time t (ns, long double) is host time, H = H0 + t.
// The device clock D = D0 + (t (1 + drift) + steps before t) * device_hz/1e9,
// the timer R = R0 + t (1 + timer_drift) * timer_hz/1e9, each read as the
// floor of its value (quantization).  A host sample starts at t: H1 = H(t),
// R2 = R(t + a), H2 = H(t + a + b); a device sample: R1b = R(t),
// D = D(t + c) (+ value noise), R1a = R(t + c + d).  Each leg a, b, c, d is
// base + Exp(jitter mean), plus a preemption of 50..500 us with some
// probability.  Host and device samples of a round alternate, as a sync
// thread interleaving its reads with the device's would.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "sync/sync.h"
#include "sync/sync_buffer.h"
#include "test_util.h"

namespace perfq {
namespace {

struct Step {
  long double at_ns;    // true time of the step
  long double size_ns;  // device clock jumps by this (either sign)
};

struct Sim {
  // Clocks.
  uint64_t H0 = 1'000'000'000'000ULL;
  uint64_t D0 = 0;
  uint64_t R0 = 0;
  uint64_t device_hz = 1'000'000'000;
  uint64_t timer_hz = 1'000'000'000;
  long double drift = 0;        // device rate error, relative
  long double timer_drift = 0;  // timer rate error, relative
  std::vector<Step> steps;
  // Sampling.
  int host_samples = 16;
  int device_samples = 16;
  long double base_ns = 0;         // fixed latency of each leg
  long double jitter_ns = 0;       // mean of the exponential part of each leg
  long double preempt_p = 0;       // probability a leg is preempted
  long double value_sigma_ns = 0;  // Gaussian noise on the D value read
  long double shift_p = 0;         // probability a device sample's D is shifted
  long double round_interval_ns = 100e6;

  std::mt19937_64 rng{12345};

  ClockRates rates() const { return ClockRates{device_hz, timer_hz}; }

  long double dev_ns(long double t) const {
    long double v = t * (1 + drift);
    for (const auto& s : steps)
      if (t >= s.at_ns) v += s.size_ns;
    return v;
  }
  uint64_t H(long double t) const {
    return H0 + static_cast<uint64_t>(static_cast<int64_t>(std::floor(t)));
  }
  uint64_t D_at_devns(long double dn) const {
    const long double ticks = std::floor(dn * static_cast<long double>(device_hz) / 1e9L);
    return D0 + static_cast<uint64_t>(static_cast<int64_t>(ticks));
  }
  uint64_t D(long double t) const { return D_at_devns(dev_ns(t)); }
  uint64_t R(long double t) const {
    const long double ticks =
        std::floor(t * (1 + timer_drift) * static_cast<long double>(timer_hz) / 1e9L);
    return R0 + static_cast<uint64_t>(static_cast<int64_t>(ticks));
  }

  long double leg() {
    long double v = base_ns;
    if (jitter_ns > 0)
      v += std::exponential_distribution<double>(1.0 / static_cast<double>(jitter_ns))(rng);
    if (preempt_p > 0 && std::uniform_real_distribution<double>(0, 1)(rng) < preempt_p)
      v += std::uniform_real_distribution<double>(50e3, 500e3)(rng);
    return v;
  }

  SyncRound round_at(long double t, uint32_t no, long double shift_round_ns = 0) {
    SyncRound r;
    r.round = no;
    const int n = std::max(host_samples, device_samples);
    for (int i = 0; i < n; ++i) {
      if (i < host_samples) {
        const long double a = leg(), b = leg();
        r.host.push_back(perfq_clock_sample{H(t), R(t + a), H(t + a + b), 0});
        t += a + b + 100;
      }
      if (i < device_samples) {
        const long double c = leg(), d = leg();
        long double dn = dev_ns(t + c) + shift_round_ns;
        if (value_sigma_ns > 0)
          dn += std::normal_distribution<double>(0, static_cast<double>(value_sigma_ns))(rng);
        if (shift_p > 0 && std::uniform_real_distribution<double>(0, 1)(rng) < shift_p)
          dn += std::uniform_real_distribution<double>(20e3, 200e3)(rng);
        r.device.push_back(perfq_clock_sample{R(t), D_at_devns(dn), R(t + c + d), 0});
        t += c + d + 100;
      }
    }
    return r;
  }

  // Rounds at t = 0, interval, 2 interval, ... < end.
  std::vector<SyncRound> rounds(long double end_ns) {
    std::vector<SyncRound> v;
    uint32_t no = 0;
    for (long double t = 0; t < end_ns; t += round_interval_ns) v.push_back(round_at(t, no++));
    return v;
  }

  // The true time at which the (unstepped) device clock reads d.
  long double true_time_of(uint64_t d) const {
    const long double dn =
        static_cast<long double>(time_diff(d, D0)) * 1e9L / static_cast<long double>(device_hz);
    return dn / (1 + drift);
  }
};

struct Errors {
  std::vector<double> abs;
  double p(double q) const {
    if (abs.empty()) return 0;
    std::vector<double> v = abs;
    const size_t k = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
    return v[k];
  }
  double max() const { return abs.empty() ? 0 : *std::max_element(abs.begin(), abs.end()); }
  double rms() const {
    double s = 0;
    for (double x : abs) s += x * x;
    return abs.empty() ? 0 : std::sqrt(s / static_cast<double>(abs.size()));
  }
};

// Conversion error of records stamped at random true times in [from, to),
// skipping times inside any of the `skip` intervals.
template <class Conv>
Errors record_errors(const Sim& sim, long double from, long double to, int n, Conv conv,
                     const std::vector<std::pair<long double, long double>>& skip = {}) {
  std::mt19937_64 rng(777);
  std::uniform_real_distribution<double> u(static_cast<double>(from), static_cast<double>(to));
  Errors e;
  for (int i = 0; i < n; ++i) {
    const long double t = u(rng);
    bool bad = false;
    for (const auto& s : skip) bad |= t > s.first && t < s.second;
    if (bad) continue;
    const uint64_t d = sim.D(t);
    e.abs.push_back(std::fabs(static_cast<double>(time_diff(conv(d), sim.H(t)))));
  }
  return e;
}

std::vector<SyncObservation> observe_all(const std::vector<SyncRound>& rounds, const ClockRates& r,
                                         const SelectionConfig& sel = {}) {
  std::vector<SyncObservation> obs;
  for (const auto& rd : rounds) {
    auto o = make_observation(rd.host, rd.device, r, sel, rd.round);
    REQUIRE(o.is_ok());
    obs.push_back(o.value());
  }
  return obs;
}

// RMS error of the observations themselves against the truth (no steps),
// leaving out the rounds listed.
double observation_rms(const Sim& sim, const std::vector<SyncObservation>& obs,
                       const std::vector<uint32_t>& leave_out = {}) {
  double s = 0;
  for (const auto& o : obs) {
    if (std::find(leave_out.begin(), leave_out.end(), o.round) != leave_out.end()) continue;
    const long double t = sim.true_time_of(o.device_time);
    const double e =
        static_cast<double>(static_cast<long double>(time_diff(o.host_ns, sim.H0)) - t);
    s += e * e;
  }
  return std::sqrt(s / static_cast<double>(obs.size() - leave_out.size()));
}

// ---- make_observation -------------------------------------------------------------------

TEST_CASE("sync: observation from one round, formula and validation", "[sync]") {
  const ClockRates rates{1'000'000'000, 1'000'000'000};
  // H - D = (H1+H2)/2 - R2 - (D - R1): host (100, 5000, 120) -> Hmid 110 at
  // R 5000; device (4990, 77, 5010) -> D 77 at R 5000.  So H(D=77) = 110.
  std::vector<perfq_clock_sample> h{{100, 5000, 120, 0}};
  std::vector<perfq_clock_sample> d{{4990, 77, 5010, 0}};
  auto o = make_observation(h, d, rates);
  REQUIRE(o.is_ok());
  CHECK(o->device_time == 77);
  CHECK(o->host_ns == 110);
  CHECK(o->uncertainty_ns == Approx(20));  // 10 + 10
  CHECK(o->host_delay_ns == Approx(20));

  SECTION("different nominal rates: R at 10 MHz, D at 250 MHz") {
    // R2 = 1000 (t = 100000 ns), R1 = 1001 (t = 100100 ns): H at R1 is Hmid + 100.
    const ClockRates r2{250'000'000, 10'000'000};
    std::vector<perfq_clock_sample> hh{{200'000, 1000, 200'000, 0}};
    std::vector<perfq_clock_sample> dd{{1001, 9'999, 1001, 0}};
    auto x = make_observation(hh, dd, r2);
    REQUIRE(x.is_ok());
    CHECK(x->device_time == 9'999);
    CHECK(x->host_ns == 200'100);
  }
  SECTION("huge origins: any u64 values") {
    std::vector<perfq_clock_sample> hh{{UINT64_MAX - 10, 3, 9, 0}};  // H wraps inside the bracket
    std::vector<perfq_clock_sample> dd{{1, 0x8000'0000'0000'0000ULL, 5, 0}};
    auto x = make_observation(hh, dd, rates);
    REQUIRE(x.is_ok());
    CHECK(x->device_time == 0x8000'0000'0000'0000ULL);
    // Hmid = MAX - 10 + 10 = MAX - 0 ... bracket 20: Hmid = UINT64_MAX; R2 = 3, R1 = 3.
    CHECK(x->host_ns == UINT64_MAX);
  }
  SECTION("the untrusted device: inverted brackets are skipped") {
    std::vector<perfq_clock_sample> dd{{5010, 1, 4990, 0}, {4990, 77, 5010, 0}};
    auto x = make_observation(h, dd, rates);
    REQUIRE(x.is_ok());
    CHECK(x->device_time == 77);
    CHECK(x->device_used == 1);
    std::vector<perfq_clock_sample> bad{{5010, 1, 4990, 0}};
    CHECK(make_observation(h, bad, rates).status().code() == Errc::kInvalidArgument);
    CHECK_FALSE(make_observation(h, {}, rates).is_ok());
    CHECK_FALSE(make_observation({}, d, rates).is_ok());
    CHECK_FALSE(make_observation(h, d, ClockRates{0, 1}).is_ok());
    CHECK_FALSE(make_observation(h, d, ClockRates{1, PERFQ_CLOCK_HZ_MAX + 1}).is_ok());
    // Timer reads an hour away from the host's: not the same round.
    std::vector<perfq_clock_sample> far{{3'600'000'000'000ULL, 77, 3'600'000'000'010ULL, 0}};
    CHECK_FALSE(make_observation(h, far, rates).is_ok());
  }
  SECTION("selection by delay, and a shifted tightest value voted out") {
    // Four host samples of the same truth H = R + 1000; the tightest one has
    // its R shifted by 50 us (a bad read), one is preempted.
    std::vector<perfq_clock_sample> hh{
        {100'000, 99'000 - 50'000, 100'004, 0},  // delay 4, shifted
        {200'000, 199'005, 200'010, 0},          // delay 10
        {300'000, 299'006, 300'012, 0},          // delay 12
        {400'000, 399'006, 400'012, 0},          // delay 12
        {500'000, 550'000, 600'000, 0},          // delay 100000 (preempted)
    };
    std::vector<perfq_clock_sample> dd{{299'000, 5, 299'000, 0}};  // D 5 at R 299000
    SelectionConfig sel;
    sel.margin_ns = 1;
    sel.margin_frac = 0;
    auto x = make_observation(hh, dd, rates, sel);
    REQUIRE(x.is_ok());
    CHECK(x->host_used == 1);
    CHECK(x->host_delay_ns == Approx(10));
    CHECK(x->host_ns == 300'000);  // H at R 299000 = 299000 + 1000
    // 5 (half the bracket) + 99995 ns of R at its nominal rate x 1000 ppm.
    CHECK(x->uncertainty_ns == Approx(5 + 99.995));
    // A margin of 2 ns averages the three samples of delay 10..12.
    sel.margin_ns = 2;
    auto y = make_observation(hh, dd, rates, sel);
    REQUIRE(y.is_ok());
    CHECK(y->host_used == 3);
    CHECK(y->host_ns == 300'000);
    CHECK(y->uncertainty_ns == Approx(6 + 5.667e-3).margin(1e-3));
  }
}

// ---- exact recovery ---------------------------------------------------------------------------

TEST_CASE("sync: exact recovery without noise", "[sync]") {
  struct Case {
    uint64_t H0, D0, R0;
    uint64_t dhz, thz;
    long double drift;
  };
  const Case c = GENERATE(
      Case{1'000'000'000'000ULL, 0, 0, 1'000'000'000, 1'000'000'000, 0},
      // Device clock at 1970 epoch ns, host at 11 days of uptime: H - D ~ -1.7e18.
      Case{1'000'000'000'000'000ULL, 1'700'000'000'000'000'000ULL, 55, 1'000'000'000, 1'000'000'000,
           1e-3L},
      // H - D ~ +9e18 as u64 (beyond s64: modular), drift -1000 ppm.
      Case{9'000'000'000'000'000'000ULL, 12345, 1ULL << 63, 1'000'000'000, 1'000'000'000, -1e-3L},
      // H - D ~ -2^63: D near the top of u64.
      Case{5'000'000'000ULL, UINT64_MAX - 1'000'000'000'000'000ULL, 7, 1'000'000'000, 100'000'000,
           250e-6L},
      // Different nominal rates: D 250 MHz, R 19.2 MHz.
      Case{77'000'000'000ULL, 3'000'000'000'000ULL, 999, 250'000'000, 19'200'000, -1e-3L},
      // D slower than R: D 100 MHz, R 1 GHz, +1000 ppm.
      Case{77'000'000'000ULL, 123'456'789ULL, 0, 100'000'000, 1'000'000'000, 1e-3L});
  Sim sim;
  sim.H0 = c.H0;
  sim.D0 = c.D0;
  sim.R0 = c.R0;
  sim.device_hz = c.dhz;
  sim.timer_hz = c.thz;
  sim.drift = c.drift;
  sim.timer_drift = 20e-6L;  // the timer drifts too; interleaving keeps it harmless
  sim.host_samples = sim.device_samples = 8;
  const auto rounds = sim.rounds(10e9L);
  const auto obs = observe_all(rounds, sim.rates());
  ClockSync sync(sim.rates());
  for (const auto& o : obs) CHECK(sync.add(o) == ClockSync::Verdict::kAccepted);
  REQUIRE(sync.has_model());
  CHECK(sync.history().segments().size() == 1);

  // Error budget without noise: D and R are read as floors, so an
  // observation can be off by up to one timer tick (host R2 vs device R1)
  // plus one device tick; a record stamped with a floored D is late by up
  // to one device tick; plus rounding (1 ns).
  const double tick_budget =
      1e9 / static_cast<double>(c.thz) + 2e9 / static_cast<double>(c.dhz) + 2;
  // Rounds 0 and 1 only have the nominal rate prior: check from round 2 on.
  auto on = record_errors(sim, 0.2e9L, 10e9L, 3000, [&](uint64_t d) { return sync.to_host(d); });
  INFO("online p50 " << on.p(0.5) << " p99 " << on.p(0.99) << " max " << on.max() << " budget "
                     << tick_budget);
  CHECK(on.max() <= tick_budget);
  const double drift_err_ppb =
      sync.current().device_drift_ppb(sim.rates()) - static_cast<double>(c.drift * 1e9L);
  INFO("drift error " << drift_err_ppb << " ppb");
  CHECK(std::fabs(drift_err_ppb) < 10);  // 0.01 ppm

  // The ABI form converts the same (rate_ppb is rounded to 1 ppb: 0.5 ppb x
  // 100 ms = 0.05 ns; 1 ns for rounding each way).
  const perfq_sync_model m = sync.current().to_abi();
  CHECK(m.flags == PERFQ_SYNC_MODEL_VALID);
  for (long double dt : {0.0L, 1e6L, 50e6L, 100e6L}) {
    const uint64_t d =
        sync.current().device_ref +
        static_cast<uint64_t>(static_cast<int64_t>(dt * static_cast<long double>(c.dhz) / 1e9L));
    CHECK(std::llabs(time_diff(apply_abi_model(m, d), sync.current().to_host(d))) <= 2);
  }
  // Exact integer conversion over hours at 1000 ppm: 3 h = 1.08e13 ticks.
  perfq_sync_model big{};
  big.device_ref = c.D0;
  big.host_ref_ns = static_cast<int64_t>(c.H0);
  big.rate_ppb = 1'000'000;
  CHECK(apply_abi_model(big, c.D0 + 10'800'000'000'000ULL) == c.H0 + 10'810'800'000'000ULL);
  CHECK(apply_abi_model(big, c.D0 - 10'800'000'000'000ULL) == c.H0 - 10'810'800'000'000ULL);

  auto off = fit_offline(obs, sim.rates());
  auto offe = record_errors(sim, 0, 10e9L, 3000, [&](uint64_t d) { return off.model.to_host(d); });
  INFO("offline p50 " << offe.p(0.5) << " max " << offe.max());
  CHECK(offe.max() <= tick_budget);
}

// ---- noise --------------------------------------------------------------------------------------

// Bound of the online conversion error, derived.  A window of N evenly
// spaced observations with independent errors of RMS s, fitted by least
// squares and used at its newest end (the online case): the fitted value
// there has variance s^2 (1/N + 3(N-1)/(N(N+1))) ~ 4 s^2 / N, and the slope
// error over the <= 100 ms until the next round adds s_b * 0.1 s, negligible
// (s_b ~ s sqrt(12/N) / span).  So the error is ~ N(0, 4 s^2/N) and
// p99 <= 2.58 * 2 s / sqrt(N).  We allow a factor 2 for non-Gaussian tails
// and weights that are not the inverse true variances, plus the device tick.
double derived_p99_bound(double obs_rms, uint32_t n, double device_tick_ns) {
  return 2.0 * 2.58 * 2 * obs_rms / std::sqrt(static_cast<double>(n)) + device_tick_ns + 1;
}

TEST_CASE("sync: bounded error with jitter", "[sync]") {
  Sim sim;
  sim.D0 = 1'700'000'000'000'000'000ULL;
  sim.drift = -437e-6L;
  sim.timer_drift = 15e-6L;
  sim.base_ns = 150;
  const bool value_noise = GENERATE(false, true);
  if (value_noise) {
    // 3 us of Gaussian jitter on every device clock read, tight brackets.
    sim.jitter_ns = 100;
    sim.value_sigma_ns = 3000;
  } else {
    // 3 us mean exponential jitter on every leg of every bracket.
    sim.jitter_ns = 3000;
  }
  const auto rounds = sim.rounds(20e9L);
  const auto obs = observe_all(rounds, sim.rates());
  ClockSync sync(sim.rates());
  using Clock = std::chrono::steady_clock;
  std::vector<double> round_us;
  ClockModel at10s;
  for (size_t i = 0; i < rounds.size(); ++i) {
    const auto t0 = Clock::now();
    auto o = make_observation(rounds[i].host, rounds[i].device, sim.rates(), {}, rounds[i].round);
    REQUIRE(o.is_ok());
    (void)sync.add(o.value());
    round_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    if (i == 100) at10s = sync.current();  // 10 s of rounds at 100 ms
  }
  const double obs_rms = observation_rms(sim, obs);
  auto conv = [&](uint64_t d) { return sync.to_host(d); };
  // The targets, from 2 s on (20 observations and more).
  auto e = record_errors(sim, 2e9L, 20e9L, 5000, conv);
  // The derived bound where the window is full (128 rounds = 12.8 s).
  auto full = record_errors(sim, 13e9L, 20e9L, 3000, conv);
  const double bound = derived_p99_bound(obs_rms, sync.config().window, 1);
  std::nth_element(round_us.begin(),
                   round_us.begin() + static_cast<std::ptrdiff_t>(round_us.size() / 2),
                   round_us.end());
  const double drift_err_ppm =
      (at10s.device_drift_ppb(sim.rates()) - static_cast<double>(sim.drift * 1e9L)) / 1000;
  WARN((value_noise ? "value jitter 3us" : "bracket jitter 3us")
       << ": observation rms " << obs_rms << " ns; online error p50 " << e.p(0.5) << " p99 "
       << e.p(0.99) << " max " << e.max() << " ns; full window p99 " << full.p(0.99)
       << " (derived bound " << bound << "); drift error at 10 s " << drift_err_ppm
       << " ppm; round cpu median " << round_us[round_us.size() / 2] << " us");
  CHECK(full.p(0.99) <= bound);
  CHECK(e.p(0.99) <= 1000);  // target: p99 <= 1 us with 3 us jitter
  CHECK(e.p(0.5) <= 200);    // target: median <= 200 ns
  CHECK(std::fabs(drift_err_ppm) < 0.1);
  CHECK(sync.history().segments().size() == 1);
  if (!kSanitized) CHECK(round_us[round_us.size() / 2] < 250);
}

// The shared-memory device's exchange (devsim --clock-jitter-ns J): the
// server waits a uniform 0..J before reading R for a host read, so a read's
// delay lies before R and its bracket midpoint is early by half of it; after
// every third answer it takes a device sample, R1 / uniform 0..J / D /
// uniform 0..J / R1, and the host read that arrives meanwhile waits for it.
// Host selection by delay and the weighted device mean must keep that
// one-sided error small: the targets (median <= 200 ns, p99 <=
// 1 us) with margin.  Averaging the host side instead of selecting it puts
// ~1 us of that error into every observation.
TEST_CASE("sync: one-sided read delays of the shared-memory exchange", "[sync]") {
  Sim sim;
  sim.D0 = 3'000'000'000'000'000'000ULL;
  sim.drift = -800e-6L;
  sim.timer_drift = -800e-6L;  // D and R on one crystal, as in devsim
  sim.timer_hz = 19'200'000;
  const long double J = 3000, lat = 250;
  std::uniform_real_distribution<double> u(0, static_cast<double>(J));
  std::vector<SyncRound> rounds;
  for (uint32_t no = 0; no < 200; ++no) {
    SyncRound r;
    r.round = no;
    long double t = static_cast<long double>(no) * 100e6L, busy = 0;
    for (int i = 0; i < 48; ++i) {
      const long double h1 = t;
      const long double read = std::max(t + lat, busy) + u(sim.rng);
      const long double h2 = read + lat;
      r.host.push_back(perfq_clock_sample{sim.H(h1), sim.R(read), sim.H(h2), 0});
      busy = read + 20;
      if (i % 3 == 2) {
        const long double b = busy, d = b + u(sim.rng), a = d + u(sim.rng);
        r.device.push_back(perfq_clock_sample{sim.R(b), sim.D(d), sim.R(a), 0});
        busy = a + 20;
      }
      t = h2 + 60;
    }
    rounds.push_back(std::move(r));
  }
  ClockSync sync(sim.rates());
  for (const auto& r : rounds) {
    auto o = make_observation(r.host, r.device, sim.rates(), {}, r.round);
    REQUIRE(o.is_ok());
    (void)sync.add(o.value());
  }
  const double obs_rms = observation_rms(sim, observe_all(rounds, sim.rates()));
  auto e = record_errors(sim, 2e9L, 20e9L, 5000, [&](uint64_t d) { return sync.to_host(d); });
  WARN("one-sided 3 us read delays: observation rms " << obs_rms << " ns; online error p50 "
                                                      << e.p(0.5) << " p99 " << e.p(0.99) << " max "
                                                      << e.max() << " ns");
  CHECK(e.p(0.5) <= 120);
  CHECK(e.p(0.99) <= 500);
  CHECK(sync.history().segments().size() == 1);
}

TEST_CASE("sync: preemption outliers are rejected", "[sync]") {
  Sim sim;
  sim.D0 = 42;
  sim.drift = 800e-6L;
  sim.base_ns = 150;
  sim.jitter_ns = 500;
  sim.preempt_p = 0.05;  // 5% of legs preempted by 50..500 us
  sim.shift_p = 0.02;    // 2% of device samples read a value off by 20..200 us
  std::vector<SyncRound> rounds;
  std::vector<uint32_t> shifted_rounds = {37, 81, 82 + 40, 150};
  for (uint32_t i = 0; i < 200; ++i) {
    const bool shift =
        std::find(shifted_rounds.begin(), shifted_rounds.end(), i) != shifted_rounds.end();
    // A whole round off by 300 us: a single outlier observation.
    rounds.push_back(sim.round_at(static_cast<long double>(i) * 100e6L, i, shift ? 300e3L : 0));
  }
  // And one round where every sample was preempted.
  sim.preempt_p = 1;
  rounds[60] = sim.round_at(60 * 100e6L, 60);
  sim.preempt_p = 0.05;

  ClockSync sync(sim.rates());
  int pending = 0, segments = 0;
  for (const auto& r : rounds) {
    auto o = make_observation(r.host, r.device, sim.rates(), {}, r.round);
    REQUIRE(o.is_ok());
    const auto v = sync.add(o.value());
    pending += v == ClockSync::Verdict::kStepPending;
    segments += v == ClockSync::Verdict::kNewSegment;
  }
  CHECK(segments == 0);
  CHECK(pending == static_cast<int>(shifted_rounds.size()));
  CHECK(sync.history().segments().size() == 1);
  auto e = record_errors(sim, 2e9L, 20e9L, 5000, [&](uint64_t d) { return sync.to_host(d); });

  // Without selection by delay (plain averages of every sample) preemption
  // goes straight into the observations.
  SelectionConfig naive;
  naive.margin_ns = 1e18;
  naive.outlier_k = 1e18;
  ClockSync nsync(sim.rates());
  for (const auto& r : rounds)
    (void)nsync.add(make_observation(r.host, r.device, sim.rates(), naive, r.round).value());
  const auto obs = observe_all(rounds, sim.rates());
  const auto nobs = observe_all(rounds, sim.rates(), naive);
  std::vector<uint32_t> leave_out = shifted_rounds;
  leave_out.push_back(60);
  const double sel_rms = observation_rms(sim, obs, leave_out);
  const double naive_rms = observation_rms(sim, nobs, leave_out);
  WARN("preemption: observation rms (whole-round outliers left out) selected "
       << sel_rms << " ns, naive " << naive_rms << " ns; online error p50 " << e.p(0.5) << " p99 "
       << e.p(0.99) << " max " << e.max() << " ns");
  // 500 ns jitter: same derivation as the jitter test.
  auto full = record_errors(sim, 13e9L, 20e9L, 3000, [&](uint64_t d) { return sync.to_host(d); });
  CHECK(full.p(0.99) <= derived_p99_bound(sel_rms, sync.config().window, 1));
  CHECK(e.max() <= 1000);
  CHECK(sel_rms * 10 < naive_rms);
}

// ---- steps
// ----------------------------------------------------------------------------------------

TEST_CASE("sync: steps start segments, a single outlier does not", "[sync]") {
  Sim sim;
  sim.H0 = 3'000'000'000'000ULL;
  sim.D0 = 500'000'000'000ULL;
  sim.device_hz = 500'000'000;  // 2 ns ticks
  sim.drift = -300e-6L;
  sim.base_ns = 150;
  sim.jitter_ns = 1000;
  // Steps between rounds (rounds every 100 ms from 0).
  sim.steps = {{3.05e9L, 1e9L}, {6.05e9L, -3e6L}, {9.05e9L, 200e3L}};
  std::vector<SyncRound> rounds;
  for (uint32_t i = 0; i < 130; ++i)
    rounds.push_back(sim.round_at(static_cast<long double>(i) * 100e6L, i, i == 45 ? 500e3L : 0));
  ClockSync sync(sim.rates());
  std::vector<ClockSync::Verdict> v;
  std::vector<SyncObservation> obs;
  for (const auto& r : rounds) {
    auto o = make_observation(r.host, r.device, sim.rates(), {}, r.round);
    REQUIRE(o.is_ok());
    obs.push_back(o.value());
    v.push_back(sync.add(o.value()));
  }
  // Round 45 is a lone outlier; rounds 31, 61, 91 see the steps first and
  // 32, 62, 92 confirm them.
  CHECK(v[45] == ClockSync::Verdict::kStepPending);
  CHECK(v[46] == ClockSync::Verdict::kAccepted);
  for (size_t s : {31u, 61u, 91u}) {
    CHECK(v[s] == ClockSync::Verdict::kStepPending);
    CHECK(v[s + 1] == ClockSync::Verdict::kNewSegment);
  }
  const auto& segs = sync.history().segments();
  REQUIRE(segs.size() == 4);
  CHECK(sync.segment() == 3);

  // Records outside the interval between the last observation before a
  // step and the first after it convert exactly as without steps (1 us
  // jitter: the same derivation as above gives well under 500 ns).  Inside
  // that interval device times may be ambiguous (a backward step repeats
  // them) and are checked separately below.
  const std::vector<std::pair<long double, long double>> skip = {
      {3.0e9L, 3.1e9L}, {6.0e9L, 6.1e9L}, {9.0e9L, 9.1e9L}};
  auto conv = [&](uint64_t d) { return sync.to_host(d); };
  auto e = record_errors(sim, 0.3e9L, 13e9L, 6000, conv, skip);
  WARN("steps: online error outside step intervals p50 " << e.p(0.5) << " p99 " << e.p(0.99)
                                                         << " max " << e.max() << " ns");
  CHECK(e.p(0.99) <= 500);
  CHECK(e.max() <= 2000);
  // Each side of each step, with the segment valid there.
  for (int s = 0; s < 3; ++s) {
    const long double at = sim.steps[static_cast<size_t>(s)].at_ns;
    auto before = record_errors(sim, at - 2e9L, at - 0.06e9L, 500, conv);
    auto after = record_errors(sim, at + 0.06e9L, at + 2e9L, 500, conv);
    INFO("step " << s << ": before max " << before.max() << " after max " << after.max());
    CHECK(before.max() <= 2000);
    CHECK(after.max() <= 2000);
  }
  // The forward step of 1 s is larger than the round gap: device times on
  // either side cannot be confused, even right at the step.
  auto around = record_errors(sim, 3.0e9L + 1, 3.1e9L, 500, conv);
  CHECK(around.max() <= 2000);
  // With the segment known, device times a backward step repeats convert
  // right too: 6.03 s (before the -3 ms step) and 6.07 s (after it).
  for (long double t : {6.03e9L, 6.07e9L}) {
    const uint64_t d = sim.D(t);
    const uint32_t seg = t < 6.05e9L ? 1 : 2;
    CHECK(std::llabs(time_diff(sync.history().to_host(d, seg), sim.H(t))) <= 2000);
  }

  // The offline fit finds the same segments.
  auto off = fit_offline(obs, sim.rates());
  CHECK(off.model.segments().size() == 4);
  auto oe = record_errors(
      sim, 0, 13e9L, 6000, [&](uint64_t d) { return off.model.to_host(d); }, skip);
  WARN("steps: offline error p50 " << oe.p(0.5) << " p99 " << oe.p(0.99) << " max " << oe.max()
                                   << " ns");
  CHECK(oe.p(0.99) <= 500);
}

// A device clock (or timer) far off the rate it declares: -100 000 ppm is
// 1 ms per 10 ms round.  Each round was then far off the prediction, no two
// agreed on one offset, and the first model stayed in place, claiming
// +-324 ns while 250 ms off ("drift 0.000 ppm, synchronized").  Three far-off
// rounds on one line are a rate break: a segment at that rate.
TEST_CASE("sync: a clock far off its declared rate is followed, and said to be implausible",
          "[sync]") {
  const long double drift = GENERATE(-100000e-6L, -5000e-6L, 20000e-6L, 100000e-6L);
  INFO("drift " << static_cast<double>(drift * 1e6L) << " ppm");
  Sim sim;
  sim.drift = drift;
  sim.timer_drift = drift;  // one crystal, as in devsim: the timer runs off too
  sim.base_ns = 150;
  sim.jitter_ns = 100;
  ClockSync sync(sim.rates());
  std::vector<SyncRound> rounds;
  uint32_t no = 0;
  for (long double t = 0; t < 5e9L; t += t < 0.5e9L ? 10e6L : 100e6L)
    rounds.push_back(sim.round_at(t, no++));
  std::vector<ClockSync::Verdict> verdicts;
  for (const auto& o : observe_all(rounds, sim.rates())) verdicts.push_back(sync.add(o));
  CHECK(sync.rate_breaks() == 1);
  CHECK(sync.history().segments().size() == 1);  // the first, rate-less one was replaced
  CHECK(std::count(verdicts.begin(), verdicts.end(), ClockSync::Verdict::kNewSegment) == 1);
  CHECK(!sync.contradicted());
  const double drift_err_ppm =
      (sync.current().device_drift_ppb(sim.rates()) - static_cast<double>(drift * 1e9L)) / 1000;
  CHECK(std::fabs(drift_err_ppm) < 0.1);
  const ClockStanding st = clock_standing(sync.current(), sim.rates());
  CHECK(st.rate_implausible);
  CHECK((st.device_fast_ppm > 0) == (drift > 0));
  CHECK_THAT(standing_text(st), Catch::Contains("no real clock is that far off"));
  // Records from the fourth round on, converted as the daemon does (the
  // model valid at their time), and the whole-recording model.
  auto on = record_errors(sim, 0.05e9L, 4.9e9L, 4000, [&](uint64_t d) { return sync.to_host(d); });
  auto off = fit_offline_rounds(rounds, sim.rates());
  auto offe =
      record_errors(sim, 0.05e9L, 4.9e9L, 4000, [&](uint64_t d) { return off.model.to_host(d); });
  WARN("rate break at " << static_cast<double>(drift * 1e6L) << " ppm: online p99 " << on.p(0.99)
                        << " max " << on.max() << " ns; offline p99 " << offe.p(0.99) << " max "
                        << offe.max() << " ns");
  CHECK(on.max() < 2'000);
  CHECK(offe.max() < 2'000);
}

// The soak's scenario c: a clock thousands of ppm off, rounds from 3 us to
// 250 us loose (a jittery device on a loaded machine).  The first rounds
// disagree with a first model that took its rate from the nominal prior
// (0 +-1000 ppm) and start a segment by a step, not by a rate break; that
// segment's prior was the old rate, its young fits were pulled toward it
// (3 844 ppm for 5 025) and claimed their posterior's sigma.  Every model
// after five rounds must claim what it can vouch for, 250 ms either side
// of its newest round; before, 832 of 35 200 claims at -5000 ppm did not
// hold.
TEST_CASE("sync: a young model's claim holds where the prior's rate is wrong", "[sync]") {
  const double drift = GENERATE(-5000e-6, 5000e-6, -100000e-6, 20000e-6, 100e-6);
  INFO("drift " << drift * 1e6 << " ppm");
  constexpr uint64_t kH0 = 1'000'000'000'000ull;
  const auto device = [&](uint64_t h) {
    return h + 2'570'000'000ull +
           static_cast<uint64_t>(
               static_cast<int64_t>(static_cast<double>(static_cast<int64_t>(h - kH0)) * drift));
  };
  uint64_t checked = 0, beyond = 0;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    std::mt19937_64 rng(seed);
    ClockSync sync{ClockRates{}};
    RoundGate gate;
    for (int k = 0; k < 20; ++k) {
      const uint64_t h = kH0 + static_cast<uint64_t>(k) * 100'000'000 + rng() % 10'000'000;
      double u = std::uniform_real_distribution<double>(3'000, 250'000)(rng);
      if (rng() % 3 == 0) u = 3'000;
      SyncObservation o;
      o.round = static_cast<uint32_t>(k + 1);
      o.device_time = device(h);
      o.host_ns = h + static_cast<uint64_t>(static_cast<int64_t>(
                          std::uniform_real_distribution<double>(-u / 2, u / 2)(rng)));
      o.uncertainty_ns = u;
      gate.feed(sync, o);
      // Whatever the gate took: a forced conversion, or an older segment's
      // model around a step, uses the model there is.
      if (!sync.has_model() || k + 1 < static_cast<int>(kMinModelRounds)) continue;
      const ClockModel& m = sync.current();
      for (int j = -5; j <= 5; ++j) {
        const uint64_t t = h + static_cast<uint64_t>(j * 50'000'000ll);
        const uint64_t d = device(t);
        const double err = std::fabs(static_cast<double>(static_cast<int64_t>(m.to_host(d) - t)));
        ++checked;
        if (err > m.claim_at(d)) ++beyond;
      }
    }
  }
  INFO(beyond << " of " << checked << " claims did not hold");
  CHECK(checked > 20'000);
  CHECK(beyond == 0);
}

// 12 s of rounds 100 ms apart of a clock that steps forward 1 s at 3.05 s
// and back 3 ms at 6.05 s: a history of three segments.
static ClockSync stepped_history(Sim& sim) {
  sim.H0 = 3'000'000'000'000ULL;
  sim.D0 = 500'000'000'000ULL;
  sim.drift = 120e-6L;
  sim.jitter_ns = 500;
  sim.steps = {{3.05e9L, 1e9L}, {6.05e9L, -3e6L}};
  ClockSync sync(sim.rates());
  for (uint32_t i = 0; i < 120; ++i) {
    const SyncRound r = sim.round_at(static_cast<long double>(i) * 100e6L, i);
    auto o = make_observation(r.host, r.device, sim.rates(), {}, r.round);
    REQUIRE(o.is_ok());
    sync.add(o.value());
  }
  return sync;
}

TEST_CASE("sync: the recent part of the history converts recent times as the whole does",
          "[sync]") {
  Sim sim;
  const ClockSync sync = stepped_history(sim);
  const PiecewiseModel& all = sync.history();
  REQUIRE(all.segments().size() == 3);
  size_t all_knots = 0;
  for (const auto& seg : all.segments()) all_knots += seg.knots.size();
  // From a time in the middle segment, and from one in the last.
  for (long double from_t : {4.5e9L, 9.0e9L}) {
    const uint64_t from = sim.D(from_t);
    const PiecewiseModel recent = all.recent(from);
    REQUIRE(recent.segments().size() == all.segments().size());
    size_t kept = 0;
    for (size_t i = 0; i < recent.segments().size(); ++i) {
      const auto& a = all.segments()[i];
      const auto& b = recent.segments()[i];
      CHECK(b.id == a.id);
      CHECK(b.valid_from == a.valid_from);
      CHECK(b.valid_until == a.valid_until);
      CHECK_FALSE(b.knots.empty());
      kept += b.knots.size();
    }
    INFO("from " << from_t / 1e9L << " s: " << kept << " of " << all_knots << " knots kept");
    CHECK(kept < all_knots);
    // Every device time from `from` on converts exactly as with the whole
    // history, on both sides of the steps after it.
    uint64_t compared = 0;
    for (long double t = 0; t < 12.5e9L; t += 7.3e6L) {
      const uint64_t d = sim.D(t);
      if (d < from) continue;
      ++compared;
      REQUIRE(recent.to_host(d) == all.to_host(d));
      REQUIRE(recent.model_at(d).device_ref == all.model_at(d).device_ref);
    }
    CHECK(compared > 300);
  }
}

TEST_CASE("sync: knot_for() names the knot model_at() uses and each time it is used for",
          "[sync]") {
  Sim sim;
  const ClockSync sync = stepped_history(sim);
  const PiecewiseModel& h = sync.history();
  REQUIRE(h.segments().size() == 3);
  const auto same = [](const ClockModel& a, const ClockModel& b) {
    return a.device_ref == b.device_ref && a.host_ref == b.host_ref && a.segment == b.segment &&
           a.ns_per_tick == b.ns_per_tick && a.uncertainty_ns == b.uncertainty_ns;
  };
  uint64_t checked = 0, spans = 0;
  // Each segment asked for times across the whole history (outside its own
  // range too), and a segment that is not there (model_at()'s fallback).
  for (uint32_t seg : {h.segments()[0].id, h.segments()[1].id, h.segments()[2].id, 99u}) {
    uint64_t from = 1, until = 0;
    for (long double t = -1e9L; t < 13e9L; t += 3.7e6L) {
      const uint64_t d = sim.D(t);
      const ClockModel want = h.model_at(d, seg);
      REQUIRE(want.valid);
      if (d >= from && d <= until) {  // within the span found before: the same knot
        ++checked;
        continue;
      }
      const ClockModel* k = h.knot_for(d, seg, &from, &until);
      REQUIRE(k != nullptr);
      INFO("segment " << seg << ", device time " << d << ": [" << from << ", " << until << "]");
      REQUIRE(from <= d);
      REQUIRE(d <= until);
      REQUIRE(same(*k, want));
      // Both ends of the span use that knot too, and the times just past
      // them another.
      REQUIRE(same(h.model_at(from, seg), *k));
      REQUIRE(same(h.model_at(until, seg), *k));
      if (seg != 99u && until != UINT64_MAX) CHECK_FALSE(same(h.model_at(until + 1, seg), *k));
      if (seg != 99u && from != 0) CHECK_FALSE(same(h.model_at(from - 1, seg), *k));
      ++spans;
    }
  }
  CHECK(spans > 100);
  CHECK(checked > spans);
  CHECK(PiecewiseModel().knot_for(5, 0, &checked, &spans) == nullptr);
}

// ---- offline
// ---------------------------------------------------------------------------------------

TEST_CASE("sync: offline re-synchronization beats or equals online", "[sync]") {
  Sim sim;
  sim.D0 = 9'000'000'000'000'000'000ULL;
  sim.drift = 612e-6L;
  sim.base_ns = 150;
  sim.jitter_ns = 3000;
  sim.steps = {{12.05e9L, -50e6L}};
  const auto rounds = sim.rounds(25e9L);
  const auto obs = observe_all(rounds, sim.rates());
  ClockSync sync(sim.rates());
  for (const auto& o : obs) (void)sync.add(o);
  auto off = fit_offline(obs, sim.rates());
  auto off2 = fit_offline_rounds(rounds, sim.rates());
  REQUIRE(off.model.segments().size() == 2);
  REQUIRE(off2.model.segments().size() == 2);
  const std::vector<std::pair<long double, long double>> skip = {{12.0e9L, 12.1e9L}};
  auto on = record_errors(
      sim, 0.3e9L, 25e9L, 8000, [&](uint64_t d) { return sync.to_host(d); }, skip);
  auto of = record_errors(
      sim, 0.3e9L, 25e9L, 8000, [&](uint64_t d) { return off.model.to_host(d); }, skip);
  auto of2 = record_errors(
      sim, 0.3e9L, 25e9L, 8000, [&](uint64_t d) { return off2.model.to_host(d); }, skip);
  WARN("offline vs online (3 us bracket jitter, one step): online p50 "
       << on.p(0.5) << " p99 " << on.p(0.99) << " rms " << on.rms() << " max " << on.max()
       << "; offline p50 " << of.p(0.5) << " p99 " << of.p(0.99) << " rms " << of.rms() << " max "
       << of.max() << " ns");
  CHECK(of.rms() <= on.rms());
  CHECK(of.p(0.99) <= on.p(0.99));
  // From raw rounds: the same fit, less the rounds the gate leaves out.
  CHECK(of2.rms() == Approx(of.rms()).epsilon(0.05));
  // Every knot is an ABI model.
  const auto abi = off.model.to_abi();
  CHECK(abi.size() == obs.size() - static_cast<size_t>(std::count(off.segment_of.begin(),
                                                                  off.segment_of.end(), -1)));
  for (const auto& m : abi) CHECK(m.flags == PERFQ_SYNC_MODEL_VALID);
}

// A loaded machine: the rounds around a step are slow (tens of microseconds
// of bracket), so the gate leaves them out of the fit.  They still tell on
// which side of a 5 ms step they were taken: the offline model places the
// step between the two rounds around it, not at the midpoint of the gap
// between the tight rounds (where records on a whole second would convert
// 5 ms off).
TEST_CASE("sync: offline, loose rounds narrow down where a step happened", "[sync]") {
  Sim sim;
  sim.drift = 40e-6L;
  sim.base_ns = 150;
  sim.jitter_ns = 300;
  sim.steps = {{3.05e9L, 5e6L}};
  std::vector<SyncRound> rounds;
  for (uint32_t i = 0; i < 60; ++i) {
    const bool loose = i >= 21 && i <= 45;
    sim.base_ns = loose ? 20e3L : 150;
    sim.jitter_ns = loose ? 10e3L : 300;
    rounds.push_back(sim.round_at(static_cast<long double>(i) * 100e6L, i));
  }
  auto off = fit_offline_rounds(rounds, sim.rates());
  REQUIRE(off.model.segments().size() == 2);
  // The loose rounds were left out of the fit, but for the two that
  // witnessed the step (rounds 31 and 32) and so start the new segment.
  REQUIRE(off.segment_of.size() == 60);
  CHECK(std::count(off.segment_of.begin(), off.segment_of.end(), -1) == 25 - 2);
  CHECK(off.verdicts[31] == ClockSync::Verdict::kStepPending);
  CHECK(off.verdicts[32] == ClockSync::Verdict::kNewSegment);
  CHECK(off.segment_of[32] == 1);
  auto conv = [&](uint64_t d) { return off.model.to_host(d); };
  // Only the interval between rounds 30 and 31 is ambiguous.
  auto e = record_errors(sim, 0.2e9L, 5.9e9L, 8000, conv, {{3.0e9L, 3.1e9L}});
  WARN("offline with loose rounds around a step: p50 " << e.p(0.5) << " p99 " << e.p(0.99)
                                                       << " max " << e.max() << " ns");
  CHECK(e.max() <= 20'000);
  // The boundary lies in that interval, on the host midpoint of it.
  const auto& segs = off.model.segments();
  CHECK(sim.true_time_of(segs[0].valid_until) == Approx(3.05e9L).margin(5e6));
  CHECK(sim.true_time_of(segs[1].valid_from) - 5e6L == Approx(3.05e9L).margin(5e6));
}

// A saturated machine after a step: every round from the step on is loose
// (tens of microseconds), so a gate keeps them all out of the fit.  They
// must still witness the step, online and offline; otherwise the model
// stays on the old segment, milliseconds off, while claiming a microsecond.
TEST_CASE("sync: loose rounds alone witness a step", "[sync]") {
  Sim sim;
  sim.drift = 40e-6L;
  sim.steps = {{3.05e9L, 5e6L}};
  std::vector<SyncRound> rounds;
  for (uint32_t i = 0; i < 60; ++i) {
    const bool loose = i > 30;
    sim.base_ns = loose ? 20e3L : 150;
    sim.jitter_ns = loose ? 10e3L : 300;
    rounds.push_back(sim.round_at(static_cast<long double>(i) * 100e6L, i));
  }
  const auto obs = observe_all(rounds, sim.rates());

  ClockSync sync(sim.rates());
  std::vector<ClockSync::Verdict> v;
  for (size_t i = 0; i < obs.size(); ++i) {
    // A loose round that agrees with the model changes nothing.
    if (i == 20) {
      auto loose = obs[i];
      loose.uncertainty_ns = 30e3;
      const ClockModel before = sync.current();
      CHECK(sync.witness(loose) == ClockSync::Verdict::kOutlier);
      CHECK(sync.current().device_ref == before.device_ref);
      CHECK(sync.history().segments().size() == 1);
    }
    v.push_back(i <= 30 ? sync.add(obs[i]) : sync.witness(obs[i]));
  }
  CHECK(v[31] == ClockSync::Verdict::kStepPending);
  CHECK(v[32] == ClockSync::Verdict::kNewSegment);
  for (size_t i = 33; i < v.size(); ++i) CHECK(v[i] == ClockSync::Verdict::kOutlier);
  REQUIRE(sync.history().segments().size() == 2);
  // The new segment rests on two loose rounds: tens of microseconds, not
  // milliseconds, and the model says so.
  auto conv = [&](uint64_t d) { return sync.to_host(d); };
  auto after = record_errors(sim, 3.3e9L, 5.9e9L, 2000, conv);
  WARN("loose witnesses, online after the step: p50 "
       << after.p(0.5) << " max " << after.max() << " ns; claim " << sync.current().uncertainty_ns
       << " ns");
  CHECK(after.max() <= 100'000);
  CHECK(sync.current().uncertainty_ns >= 1'000);
  auto before = record_errors(sim, 0.2e9L, 3.0e9L, 2000, conv);
  CHECK(before.max() <= 2'000);

  // Offline, from the rounds: the same two segments.
  auto off = fit_offline_rounds(rounds, sim.rates());
  REQUIRE(off.model.segments().size() == 2);
  auto oconv = [&](uint64_t d) { return off.model.to_host(d); };
  CHECK(record_errors(sim, 3.3e9L, 5.9e9L, 2000, oconv).max() <= 100'000);
  CHECK(record_errors(sim, 0.2e9L, 3.0e9L, 2000, oconv).max() <= 2'000);
}

// ---- mode B
// ------------------------------------------------------------------------------------------

TEST_CASE("sync: mode B, the device converts its own record times", "[sync]") {
  Sim sim;
  sim.D0 = 123'456'789'000ULL;
  sim.device_hz = 250'000'000;
  sim.timer_hz = 19'200'000;
  sim.drift = 1e-3L;
  sim.base_ns = 150;
  sim.jitter_ns = 1000;
  auto page = std::make_unique<perfq_sync_page>();
  std::memset(page.get(), 0, sizeof(*page));
  page->mode = PERFQ_SYNC_MODE_B;

  DeviceClockSync dev(sim.rates());
  ClockSync host(sim.rates());  // the same math on the host, for comparison
  perfq_record r{};
  r.flags = PERFQ_FLAGS(PERFQ_KIND_INSTANT, PERFQ_CLOCK_DEVICE);
  CHECK_FALSE(dev.convert_record(&r));  // no model yet
  const auto rounds = sim.rounds(10e9L);
  for (const auto& rd : rounds) {
    // Host: samples into the mailbox.  Device: its own samples of the round.
    write_sample_batch(&page->mailbox, rd.round, rd.host);
    auto v = dev.update_from_page(page.get(), rd.device, rd.round);
    REQUIRE(v.is_ok());
    (void)host.add(make_observation(rd.host, rd.device, sim.rates(),
                                    selection_for({}, host.current(), sim.rates()), rd.round)
                       .value());
  }
  CHECK(dev.update_from_page(page.get(), rounds.back().device, 9999).status().code() ==
        Errc::kUnavailable);
  REQUIRE(dev.ready());
  // Records stamped after the last round, converted by the device as it
  // collects them.
  auto e = record_errors(sim, 9.9e9L, 10e9L, 1000, [&](uint64_t d) { return dev.to_host(d); });
  WARN("mode B: device-side conversion p50 " << e.p(0.5) << " p99 " << e.p(0.99) << " max "
                                             << e.max() << " ns");
  CHECK(e.p(0.99) <= 500);
  const uint64_t d = sim.D(9.95e9L);
  CHECK(dev.to_host(d) == host.current().to_host(d));
  r.time = d;
  r.arg = 5;
  REQUIRE(dev.convert_record(&r));
  CHECK(r.time == dev.to_host(d));
  CHECK((r.flags & PERFQ_FLAGS_DOMAIN_MASK) >> PERFQ_FLAGS_DOMAIN_SHIFT ==
        PERFQ_CLOCK_HOST_BY_DEVICE);
  CHECK((r.flags & PERFQ_FLAGS_KIND_MASK) == PERFQ_KIND_INSTANT);
  CHECK_FALSE(dev.convert_record(&r));  // already in host time
}

// The SDK's mode B publishes each line it converts with, before it does:
// the host bounds those times by them (OnlineConverter::add_device_line()).
TEST_CASE("sync: mode B's device publishes the lines it converts with", "[sync]") {
  Sim sim;
  sim.device_hz = 250'000'000;
  sim.timer_hz = 19'200'000;
  sim.drift = 1e-4L;
  sim.base_ns = 150;
  sim.jitter_ns = 300;
  // The device's view of the region: its sync section only.
  auto page = std::make_unique<perfq_sync_page>();
  std::memset(page.get(), 0, sizeof(*page));
  perfq_region_header h{};
  h.device_clock_hz = sim.device_hz;
  h.timer_hz = sim.timer_hz;
  h.sections[PERFQ_SECTION_SYNC].offset = 0;
  h.sections[PERFQ_SECTION_SYNC].size = sizeof(perfq_sync_page);
  auto mb = std::make_unique<perfq_dev_mode_b>();
  perfq_dev_mode_b_init(mb.get(), page.get(), &h);
  page->mode = PERFQ_SYNC_MODE_B;
  uint64_t changes = 0;
  perfq_sync_line before{};
  for (const auto& rd : sim.rounds(8e9L)) {
    perfq_dev_batch_write(&page->device_samples, rd.round + 1, rd.device.data(),
                          static_cast<uint32_t>(rd.device.size()));
    perfq_dev_batch_write(&page->mailbox, rd.round + 1, rd.host.data(),
                          static_cast<uint32_t>(rd.host.size()));
    perfq_dev_mode_b_poll(mb.get());
    const perfq_sync_line& c = mb->online.current;
    if (c.valid && (c.device_ref != before.device_ref || c.host_ref != before.host_ref ||
                    c.ns_per_tick != before.ns_per_tick || c.host_frac != before.host_frac)) {
      ++changes;
      before = c;
    }
    // The newest line published is the one it converts with.
    REQUIRE(page->lines_newest == changes);
    if (!changes) continue;
    perfq_sync_line_pub l{};
    REQUIRE(perfq_dev_line_read(page.get(), page->lines_newest, &l, 4) == PERFQ_DEV_OK);
    REQUIRE(l.id == changes);
    double frac, npt;
    std::memcpy(&frac, &l.host_frac, sizeof frac);
    std::memcpy(&npt, &l.ns_per_tick, sizeof npt);
    CHECK(l.device_ref == c.device_ref);
    CHECK(l.host_ref_ns == c.host_ref);
    CHECK(frac == c.host_frac);
    CHECK(npt == c.ns_per_tick);
  }
  CHECK(changes > 40);
  // A collector started again on the region numbers on from there.
  auto again = std::make_unique<perfq_dev_mode_b>();
  perfq_dev_mode_b_init(again.get(), page.get(), &h);
  CHECK(again->line.id == changes);
}

// How loose a claim may be for a record to convert without waiting: the
// floor while the first rounds may all be loose, then what this device's
// rounds give (a jittery one's, factor x its tightest round).
TEST_CASE("sync: RoundGate::tight_ns follows the device's tightest rounds", "[sync]") {
  Sim sim;
  ClockSync sync(sim.rates());
  RoundGate gate;
  CHECK(std::isinf(gate.tight_ns()));
  auto feed = [&](double unc, uint32_t no) {
    SyncObservation o;
    o.round = no;
    o.host_ns = sim.H0 + static_cast<uint64_t>(no) * 100'000'000ull;
    o.device_time = o.host_ns;  // D == H
    o.uncertainty_ns = unc;
    return gate.feed(sync, o);
  };
  uint32_t no = 1;
  (void)feed(40'000, no++);  // a busy start: every round loose
  (void)feed(35'000, no++);
  CHECK(gate.tight_ns() == GateConfig{}.floor_ns);
  for (; no < 64; ++no) (void)feed(1'500 + (no % 7) * 100, no);
  CHECK(gate.tight_ns() == GateConfig{}.floor_ns);
  for (; no <= 200; ++no) (void)feed(1'500 + (no % 7) * 100, no);
  // 64 rounds of 1.5-2.1 us: 4 x 1.5 us.
  CHECK(gate.tight_ns() == Approx(6'000));
  CHECK(gate.taken() >= 190);
}

// The device converts only what its model vouches for: from the first
// round on, each record it stamps before the next round is either left in
// D (for the host, which waits for a round after it) or converted within
// the model's claim.  With the first rounds' model (the drift barely
// known) it used to extrapolate 100 ms at +-300 ppm: tens of microseconds
// off while the model claimed a few hundred ns.
TEST_CASE("sync: mode B, the device converts a record only where its model holds", "[sync]") {
  for (long double drift : {300e-6L, -300e-6L, 80e-6L, -50e-6L}) {
    Sim sim;
    sim.D0 = 4'000'000'000ULL;
    sim.drift = drift;
    sim.base_ns = 200;
    sim.jitter_ns = 300;
    DeviceClockSync dev(sim.rates());
    size_t converted = 0, left = 0, beyond = 0;
    double worst = 0;
    uint32_t no = 0;
    for (long double t = 0; t < 4e9L; t += sim.round_interval_ns) {
      const SyncRound rd = sim.round_at(t, no++);
      (void)dev.add(make_observation(rd.host, rd.device, sim.rates(), {}, rd.round).value());
      // Records stamped between this round and the next.
      for (int k = 1; k <= 20; ++k) {
        const long double at = t + sim.round_interval_ns * k / 21;
        perfq_record r{};
        r.flags = PERFQ_FLAGS(PERFQ_KIND_INSTANT, PERFQ_CLOCK_DEVICE);
        r.time = sim.D(at);
        const uint64_t d = r.time;
        if (!dev.convert_record(&r)) {
          ++left;
          CHECK(PERFQ_FLAGS_DOMAIN(r.flags) == PERFQ_CLOCK_DEVICE);
          CHECK(r.time == d);
          continue;
        }
        ++converted;
        const double err = std::fabs(static_cast<double>(time_diff(r.time, sim.H(at))));
        const double claim = dev.sync().current().claim_at(d);
        worst = std::max(worst, err);
        // 1 ns of slack: the host clock's integer ns.  And as tight as the
        // host's own extrapolation (ClockModel::settled_at()).
        if (err > claim + 1 || claim > 1.25 * dev.sync().current().uncertainty_ns + 1) ++beyond;
      }
    }
    INFO("drift " << static_cast<double>(drift * 1e6L) << " ppm: " << converted << " converted, "
                  << left << " left in D, " << beyond << " beyond the claim (worst " << worst
                  << " ns)");
    CHECK(beyond == 0);
    CHECK(worst < 2000);
    CHECK(left > 0);             // the first rounds' records wait for the host
    CHECK(converted > 20 * 30);  // and the device converts once it holds
  }
}

// The device fits the rounds the host fits: both go through one RoundGate,
// so the host's model (whose claims the host can check and report) is the
// one the device converts with, also on a machine where whole rounds wait
// for the device to be scheduled, from the first rounds on.
TEST_CASE("sync: mode B, the device's model is the host's, loose rounds included", "[sync]") {
  Sim sim;
  sim.D0 = 987'654'321ULL;
  sim.device_hz = 250'000'000;
  sim.timer_hz = 19'200'000;
  sim.drift = 250e-6L;
  sim.base_ns = 150;
  sim.jitter_ns = 300;
  DeviceClockSync dev(sim.rates());
  ClockSync host(sim.rates());
  RoundGate gate;
  std::mt19937_64 rng(99);
  std::vector<SyncObservation> loose;
  size_t gated = 0;
  for (uint32_t no = 0; no < 60; ++no) {
    // Rounds 1, 2 and 5, and a third of the others at random: every leg
    // waits 50..500 us for the other side to be scheduled.
    const bool contended = no == 1 || no == 2 || no == 5 || (no > 5 && rng() % 3 == 0);
    sim.preempt_p = contended ? 1 : 0;
    const auto rd = sim.round_at(static_cast<long double>(no) * 100e6L, no);
    auto o = make_observation(rd.host, rd.device, sim.rates(), {}, no);
    REQUIRE(o.is_ok());
    const auto vh = gate.feed(host, *o);
    const auto vd = dev.add(*o);
    CHECK(vd == vh);
    if (contended) {
      CHECK(o->host_delay_ns > 20'000);
      gated += vh == ClockSync::Verdict::kOutlier;
    }
    for (long double t = static_cast<long double>(no) * 100e6L; t < (no + 1) * 100e6L; t += 7e6L) {
      const uint64_t d = sim.D(t);
      REQUIRE(dev.to_host(d) == host.current().to_host(d));
    }
  }
  CHECK(gated >= 10);  // the gate kept the contended rounds out of both
  // And the model it converts with is the fast rounds' one.
  auto e = record_errors(sim, 5.9e9L, 6e9L, 1000, [&](uint64_t d) { return dev.to_host(d); });
  CHECK(e.max() <= 1'000);
}

}  // namespace
}  // namespace perfq

namespace perfq {
namespace {

TEST_CASE("sync: useless observations and a bounded history", "[sync]") {
  Sim sim;
  sim.drift = 100e-6L;
  const auto obs = observe_all(sim.rounds(5e9L), sim.rates());
  SyncConfig cfg;
  cfg.max_history = 16;
  ClockSync sync(sim.rates(), cfg);
  SyncObservation bad = obs[0];
  bad.uncertainty_ns = std::nan("");
  CHECK(sync.add(bad) == ClockSync::Verdict::kInvalid);
  bad.uncertainty_ns = 2e6;  // a fully preempted round
  CHECK(sync.add(bad) == ClockSync::Verdict::kOutlier);
  CHECK_FALSE(sync.has_model());
  CHECK(sync.to_host(obs[0].device_time) == 0);  // nothing to convert with yet
  for (const auto& o : obs) CHECK(sync.add(o) == ClockSync::Verdict::kAccepted);
  size_t knots = 0;
  for (const auto& s : sync.history().segments()) knots += s.knots.size();
  CHECK(knots <= 16);
  CHECK(knots >= 14);
  // Old times convert with the oldest kept knot: still right, the clock is linear.
  CHECK(std::llabs(time_diff(sync.to_host(sim.D(1e9L)), sim.H(1e9L))) <= 2);
  CHECK(std::llabs(time_diff(sync.to_host(sim.D(4.95e9L)), sim.H(4.95e9L))) <= 2);
  CHECK(sync.history().model_at(sim.D(4.95e9L)).valid);
}

}  // namespace
}  // namespace perfq
