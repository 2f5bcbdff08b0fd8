// The record clock of host applications (host_clock.h): the calibration on
// synthetic clocks, and the real TSC map against clock_gettime from threads.
#include "app/host_clock.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace perfq {
namespace {

// A synthetic machine: a TSC at `hz` from `tsc0`, and CLOCK_MONOTONIC that
// runs at (1 + ppm) of the TSC's nominal rate from `ns0`; the rate may
// change at `change_ns` by `change_ppm` (an NTP frequency change).
struct SynthClock {
  double hz = 2.5e9;
  uint64_t tsc0 = 123'456'789'012ull;
  uint64_t ns0 = 5'000'000'000ull;
  double ppm = 0;
  uint64_t change_ns = UINT64_MAX;  // elapsed ns of the change
  double change_ppm = 0;

  // The clock at `elapsed` ns of TSC time after the start.
  uint64_t ns_at(double elapsed) const {
    double e = elapsed * (1 + ppm * 1e-6);
    const double c = static_cast<double>(change_ns);
    if (elapsed > c) e += (elapsed - c) * change_ppm * 1e-6;
    return ns0 + static_cast<uint64_t>(std::llround(e));
  }
  uint64_t tsc_at(double elapsed) const {
    return tsc0 + static_cast<uint64_t>(std::llround(elapsed * hz / 1e9));
  }
  TscPoint point(double elapsed, uint64_t width = 100) const {
    return TscPoint{tsc_at(elapsed), ns_at(elapsed), width};
  }
};

// Feeds the calibrator a point whenever it asks, for `seconds` of TSC time;
// after every point, `check(elapsed)` may look at the map.
template <typename Check>
void drive(TscCalibrator& cal, const SynthClock& c, double seconds, Check check,
           std::function<TscPoint(double)> make = nullptr) {
  double t = 0;
  while (t < seconds * 1e9) {
    const TscPoint p = make ? make(t) : c.point(t);
    const auto a = cal.add(p);
    REQUIRE(a != TscCalibrator::Action::kDisable);
    check(t, a);
    t += static_cast<double>(std::chrono::nanoseconds(cal.next_interval()).count());
  }
}

TEST_CASE("host clock: an exact TSC is mapped exactly, once its rate is known", "[host_clock]") {
  SynthClock c;
  c.hz = GENERATE(1.0e9, 2.5e9, 3.7e9);
  c.ppm = GENERATE(0.0, 37.5, -250.0);
  TscCalibrator cal;
  bool published = false;
  drive(cal, c, 20, [&](double t, TscCalibrator::Action a) {
    if (a == TscCalibrator::Action::kPublish && !published) {
      published = true;
      // Not before its rate is measured over kMinBaselineNs.
      CHECK(t >= static_cast<double>(TscCalibrator::kMinBaselineNs));
    }
    if (!cal.has_map()) return;
    // Exact at the point, and extrapolated to the next point.
    const double next =
        t + static_cast<double>(std::chrono::nanoseconds(cal.next_interval()).count());
    for (double e : {t, t + 1e6, next}) {
      INFO("hz " << c.hz << " ppm " << c.ppm << " at " << e);
      CHECK(std::llabs(static_cast<long long>(cal.map().at(c.tsc_at(e)) - c.ns_at(e))) <= 2);
    }
  });
  CHECK(published);
  CHECK(cal.next_interval() == TscCalibrator::kMaxInterval);
  CHECK(cal.resets() == 0);
}

TEST_CASE("host clock: a rate change is followed without a step", "[host_clock]") {
  SynthClock c;
  c.ppm = 12;
  c.change_ns = 10'000'000'000ull;
  c.change_ppm = GENERATE(-100.0, 40.0, 300.0);
  TscCalibrator cal;
  TscMap prev;
  bool had = false;
  double worst_after = 0;
  drive(cal, c, 60, [&](double t, TscCalibrator::Action a) {
    if (a != TscCalibrator::Action::kPublish) return;
    const TscMap& m = cal.map();
    if (had) {
      // The new map starts where the old one is at that instant.
      CHECK(std::llabs(static_cast<long long>(m.at(m.base_tsc) - prev.at(m.base_tsc))) <= 1);
    }
    prev = m;
    had = true;
    // Off by at most what the rate change does in the last interval, and
    // steered back: 30 s after it, within 100 ns.
    if (t > 40e9) worst_after = std::max(worst_after, std::fabs(cal.last_error_ns()));
  });
  INFO("change " << c.change_ppm << " ppm");
  CHECK(worst_after < 100);
  CHECK(cal.resets() == 0);
}

TEST_CASE("host clock: noisy and preempted points keep the map within the noise", "[host_clock]") {
  SynthClock c;
  c.ppm = -80;
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> jitter(-20, 20);  // inside a 100-tick bracket
  uint64_t n = 0;
  auto make = [&](double t) {
    // Every fifth point was preempted for up to 50 us inside its bracket,
    // which says so: the clock read is anywhere in it, up to half of it off.
    if (++n % 5 == 0) {
      const double late = 50'000.0 * static_cast<double>(rng() % 1000) / 1000.0;
      TscPoint p = c.point(t, 100 + static_cast<uint64_t>(late * 2.5));
      p.ns += static_cast<uint64_t>(late / 2);
      return p;
    }
    TscPoint p = c.point(t);
    p.ns = static_cast<uint64_t>(static_cast<double>(p.ns) + jitter(rng));
    return p;
  };
  TscCalibrator cal;
  double worst = 0;
  drive(
      cal, c, 60,
      [&](double t, TscCalibrator::Action) {
        if (!cal.has_map() || t < 5e9) return;
        for (double e = t; e < t + 1e9; e += 1e8)
          worst = std::max(worst, std::fabs(static_cast<double>(static_cast<int64_t>(
                                      cal.map().at(c.tsc_at(e)) - c.ns_at(e)))));
      },
      make);
  CHECK(worst < 200);
  CHECK(cal.resets() == 0);
}

TEST_CASE("host clock: a TSC that goes backwards or runs at no clock's rate is not used",
          "[host_clock]") {
  SynthClock c;
  TscCalibrator cal;
  double t = 0;
  while (!cal.has_map()) {
    REQUIRE(cal.add(c.point(t)) != TscCalibrator::Action::kDisable);
    t += static_cast<double>(std::chrono::nanoseconds(cal.next_interval()).count());
  }
  SECTION("backwards: the map is withdrawn, and after three times the TSC is given up") {
    TscPoint back = c.point(t);
    back.tsc = c.tsc0;  // reset to where it started
    CHECK(cal.add(back) == TscCalibrator::Action::kWithdraw);
    CHECK_FALSE(cal.has_map());
    CHECK(cal.add(back) == TscCalibrator::Action::kNone);  // the same point again: no progress
    CHECK(cal.add(back) == TscCalibrator::Action::kDisable);
  }
  SECTION("a clock that jumped by more than the reset bound: withdrawn, then recalibrated") {
    SynthClock j = c;
    j.ns0 += 5'000'000;  // 5 ms
    CHECK(cal.add(j.point(t)) == TscCalibrator::Action::kWithdraw);
    CHECK(cal.resets() == 1);
    bool again = false;
    for (double u = t; u < t + 2e9 && !again;) {
      u += static_cast<double>(std::chrono::nanoseconds(cal.next_interval()).count());
      again = cal.add(j.point(u)) == TscCalibrator::Action::kPublish;
    }
    CHECK(again);
    CHECK(std::llabs(static_cast<long long>(cal.map().at(j.tsc_at(t + 3e9)) - j.ns_at(t + 3e9))) <
          50);
  }
  SECTION("a rate no clock has (10 MHz)") {
    SynthClock slow = c;
    slow.hz = 1e7;
    TscCalibrator s;
    CHECK(s.add(slow.point(0)) == TscCalibrator::Action::kNone);
    CHECK(s.add(slow.point(1e7)) == TscCalibrator::Action::kDisable);
  }
}

TEST_CASE("host clock: a map is used only from its base to kReachNs after it", "[host_clock]") {
  const double hz = GENERATE(1.0e9, 2.5e9, 3.7e9);
  const TscMap m{~uint64_t{0} - 1000, 77,
                 static_cast<uint64_t>(std::llround(1e9 / hz * 4294967296.0))};
  const uint64_t reach = m.reach();
  INFO("hz " << hz << " reach " << reach);
  // kReachNs of ticks, to the tick's rounding.
  CHECK(std::fabs(static_cast<double>(reach) - TscMap::kReachNs * hz / 1e9) <= 2);
  CHECK(TscMap::covers(m.base_tsc, reach, m.base_tsc));
  CHECK(TscMap::covers(m.base_tsc, reach, m.base_tsc + reach));  // across the TSC's wrap
  CHECK_FALSE(TscMap::covers(m.base_tsc, reach, m.base_tsc + reach + 1));
  CHECK_FALSE(TscMap::covers(m.base_tsc, reach, m.base_tsc - 1));    // read before a renewal
  CHECK_FALSE(TscMap::covers(5'000'000'000'000ull, reach, 0x1000));  // a TSC reset
  CHECK(TscMap{}.reach() == 0);
}

TEST_CASE(
    "host clock: the real record clock agrees with CLOCK_MONOTONIC, from threads, "
    "while it is recalibrated",
    "[host_clock][threads]") {
  std::atomic<bool> stop{false};
  std::thread updater([&] {
    while (!stop.load()) {
      const auto next = host_clock_update();
      if (next == std::chrono::milliseconds::max()) return;
      std::this_thread::sleep_for(std::min(next, std::chrono::milliseconds(50)));
    }
  });
  // Whether this machine's TSC is used: then within a few seconds.
  const uint64_t t0 = monotonic_ns();
  while (std::string(host_clock_source()) == "calibrating" &&
         monotonic_ns() - t0 < 5'000'000'000ull)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const std::string source = host_clock_source();
  INFO("host clock source: " << source);
  REQUIRE(source != "calibrating");

  // Readers bracket the record clock with clock_gettime while the updater
  // goes on republishing (every 10 ms .. 1 s) for 1.5 s.
  constexpr uint64_t kTolNs = 2'000;
  struct Seen {
    uint64_t reads = 0, outside = 0, backwards = 0;
    int64_t worst = 0;
  };
  std::vector<Seen> seen(3);
  std::vector<std::thread> readers;
  const uint64_t until = monotonic_ns() + 1'500'000'000ull;
  for (auto& s : seen)
    readers.emplace_back([&s, until] {
      uint64_t last = 0;
      for (uint64_t b = 0; b < until;) {
        const uint64_t a = monotonic_ns();
        const uint64_t x = host_clock_ns();
        b = monotonic_ns();
        ++s.reads;
        if (x + kTolNs < a || x > b + kTolNs) {
          ++s.outside;
          s.worst = std::max<int64_t>(
              s.worst, x < a ? static_cast<int64_t>(a - x) : static_cast<int64_t>(x - b));
        }
        if (x < last) ++s.backwards;
        last = x;
      }
    });
  for (auto& r : readers) r.join();
  stop = true;
  updater.join();
  for (const auto& s : seen) {
    INFO("reads " << s.reads << " outside +-" << kTolNs << " ns: " << s.outside << " (worst "
                  << s.worst << " ns), backwards " << s.backwards);
    CHECK(s.reads > 1000);
    CHECK(s.outside == 0);
  }
}

// A map nobody renews (the application's connector thread stopped running)
// lapses kReachNs after its base: records go back to clock_gettime, and the
// source says so, until an update renews it.
TEST_CASE("host clock: a map nobody renews lapses, and says so, until it is renewed",
          "[host_clock]") {
  const uint64_t t0 = monotonic_ns();
  while (std::string(host_clock_source()) == "calibrating" &&
         monotonic_ns() - t0 < 5'000'000'000ull)
    std::this_thread::sleep_for(std::min(host_clock_update(), std::chrono::milliseconds(5)));
  const std::string source = host_clock_source();
  INFO("host clock source: " << source);
  if (source == "monotonic") {
    WARN("this machine's TSC is not used for records: nothing lapses");
    return;
  }
  REQUIRE(source == "tsc");
  // No update from here: the map lapses kReachNs after its base, at the
  // latest kReachNs from now (the TSC runs at >= 1 GHz, so a tick is <= 1 ns).
  const uint64_t lapsed_by = monotonic_ns() + TscMap::kReachNs + 100'000'000;
  while (monotonic_ns() < lapsed_by && std::string(host_clock_source()) == "tsc")
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(std::string(host_clock_source()) == "calibrating");
  // The records' clock is clock_gettime now.
  const uint64_t a = monotonic_ns();
  const uint64_t x = host_clock_ns();
  const uint64_t b = monotonic_ns();
  CHECK(x >= a);
  CHECK(x <= b);
  // One update renews it.
  const uint64_t t1 = monotonic_ns();
  while (std::string(host_clock_source()) != "tsc" && monotonic_ns() - t1 < 5'000'000'000ull)
    std::this_thread::sleep_for(std::min(host_clock_update(), std::chrono::milliseconds(5)));
  CHECK(std::string(host_clock_source()) == "tsc");
}

}  // namespace
}  // namespace perfq
