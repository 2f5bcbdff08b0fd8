// host_clock.h - the clock of host records: CLOCK_MONOTONIC, read through
// the TSC where the machine allows it.
//
// clock_gettime(CLOCK_MONOTONIC) costs 20-30 ns in a VM (the vDSO reads the
// paravirtual clock page under its sequence word and fences the TSC read),
// more than the rest of a record.  perf does the same trick for user space
// (the perf_event mmap page's time_mult/time_shift): read the TSC, and scale
// it with a linear map to the kernel's clock.  Here the map is measured, not
// taken from the kernel: a background thread (the application's connector)
// brackets clock_gettime between two TSC reads now and then, fits the TSC's
// rate over a window of those points and republishes the map.  Each new map
// starts where the old one ends at that instant (no step) and steers toward
// the measured clock over the next interval, as the kernel's timekeeping
// slews, so a thread's times do not jump when the map changes.
//
// The TSC is used only on x86-64 with an invariant TSC (constant_tsc and
// nonstop_tsc) whose kernel clocksource is TSC-based (tsc, kvm-clock,
// hyperv_clocksource_tsc_page), and never with PERFQ_HOST_CLOCK=monotonic
// in the environment.  Otherwise, and until the first map is good (its rate
// measured over at least 100 ms), host_clock_ns() is clock_gettime.
#ifndef PERFQ_HOST_CLOCK_H
#define PERFQ_HOST_CLOCK_H

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>

#include "device/device_clock.h"

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace perfq {

__extension__ typedef __int128 TscProduct;  // a 64 x 64-bit product

// ns = base_ns + (tsc - base_tsc) * mult / 2^32, for tsc on either side of
// base_tsc (the calibration extrapolates both ways; records use it only
// within covers()).
struct TscMap {
  uint64_t base_tsc = 0;
  uint64_t base_ns = 0;
  uint64_t mult = 0;  // ns per tick, 32.32 fixed point

  uint64_t at(uint64_t tsc) const noexcept {
    const auto d = static_cast<TscProduct>(static_cast<int64_t>(tsc - base_tsc));
    return base_ns + static_cast<uint64_t>(static_cast<int64_t>((d * mult) >> 32));
  }
  // How far past base_tsc the map is trusted, in ticks: kReachNs.  The map
  // is renewed every second at most; a TSC further on (a connector thread
  // that did not run: a stopped process, a suspended machine, whose TSC may
  // have gone on while CLOCK_MONOTONIC did not) or behind base_tsc (read
  // just before a renewal, or reset) is left to clock_gettime.
  static constexpr uint64_t kReachNs = 3'000'000'000;
  uint64_t reach() const noexcept {
    return mult ? static_cast<uint64_t>((static_cast<TscProduct>(kReachNs) << 32) / mult) : 0;
  }
  // base_tsc <= tsc <= base_tsc + reach, without overflow.
  static bool covers(uint64_t base, uint64_t reach, uint64_t tsc) noexcept {
    return tsc - base <= reach;
  }
};

// One calibration point: CLOCK_MONOTONIC `ns` read between two TSC reads
// `width` ticks apart; `tsc` is their midpoint.
struct TscPoint {
  uint64_t tsc = 0;
  uint64_t ns = 0;
  uint64_t width = 0;
};

// The calibration: points in, maps out.  No clock is read here, so tests
// drive it with synthetic clocks.  No allocation, trivially destructible:
// the process-wide one is used by the connector thread up to exit().
class TscCalibrator {
 public:
  enum class Action { kNone, kPublish, kWithdraw, kDisable };

  static constexpr uint64_t kWindowNs = 4'000'000'000;  // the rate's baseline, at most
  static constexpr size_t kMaxPoints = 64;
  static constexpr double kCloseNs = 500;  // an error below this lets the interval grow
  static constexpr double kFarNs = 2'000;  // one above this shortens it
  static constexpr uint64_t kMinBaselineNs = 100'000'000;  // before the first map
  static constexpr uint64_t kResetNs = 1'000'000;          // a larger error restarts
  static constexpr double kMaxSlew = 500e-6;               // steering, relative to the rate
  static constexpr auto kFirstInterval = std::chrono::milliseconds(10);
  static constexpr auto kMaxInterval = std::chrono::milliseconds(1000);

  // Takes a point; kPublish when map() is new; kWithdraw when the map in
  // use is wrong (off by more than kResetNs, or the TSC went backwards) and
  // calibration starts over; kDisable when the TSC is no clock to trust
  // (its measured rate is not 50 MHz..20 GHz, or it was wrong three times
  // in a row).
  Action add(const TscPoint& p);

  const TscMap& map() const noexcept { return map_; }
  bool has_map() const noexcept { return has_map_; }
  // When the next point is due: 10 ms at first, doubling up to 1 s while
  // the map stays within kCloseNs; a quarter as long when it was kFarNs off
  // (the clock's rate changed: NTP slews CLOCK_MONOTONIC).
  std::chrono::milliseconds next_interval() const noexcept { return interval_; }
  // The last published map's error at its point (ns, map minus clock), and
  // how many times it restarted.
  double last_error_ns() const noexcept { return last_error_ns_; }
  uint64_t resets() const noexcept { return resets_; }

 private:
  void restart(const TscPoint& p);
  void pop_front();

  std::array<TscPoint, kMaxPoints> points_{};  // oldest first
  size_t n_ = 0;
  TscMap map_;
  bool has_map_ = false;
  uint64_t min_width_ = UINT64_MAX;
  uint64_t rejected_in_row_ = 0;
  double last_error_ns_ = 0;
  uint64_t resets_ = 0;
  uint64_t resets_in_row_ = 0;
  std::chrono::milliseconds interval_ = kFirstInterval;
};

namespace host_clock_detail {
// The published map, under a sequence word: 0 while there is none, odd
// while it is rewritten or for good once the TSC is disabled.  Every field
// is atomic; the field loads are acquire (plain loads on x86), which orders
// the second read of the sequence word after them without a fence.
struct alignas(64) Published {
  std::atomic<uint64_t> seq{0};
  std::atomic<uint64_t> base_tsc{0};
  std::atomic<uint64_t> base_ns{0};
  std::atomic<uint64_t> mult{0};
  std::atomic<uint64_t> reach{0};  // TscMap::reach()
};
extern Published g_published;

// The published map, when there is one (a consistent copy) that covers
// `tsc`: what host_clock_ns() converts with, and what host_clock_source()
// reports on.
inline bool map_for(uint64_t tsc, TscMap* m) noexcept {
  const uint64_t s = g_published.seq.load(std::memory_order_acquire);
  if (__builtin_expect((s & 1) != 0 || s == 0, 0)) return false;
  *m = TscMap{g_published.base_tsc.load(std::memory_order_acquire),
              g_published.base_ns.load(std::memory_order_acquire),
              g_published.mult.load(std::memory_order_acquire)};
  const uint64_t reach = g_published.reach.load(std::memory_order_acquire);
  return g_published.seq.load(std::memory_order_relaxed) == s &&
         TscMap::covers(m->base_tsc, reach, tsc);
}
}  // namespace host_clock_detail

// CLOCK_MONOTONIC in ns, for a record.  Lock-free, no system call.
inline uint64_t host_clock_ns() noexcept {
#if defined(__x86_64__)
  const uint64_t tsc = __rdtsc();
  TscMap m;
  if (__builtin_expect(host_clock_detail::map_for(tsc, &m), 1)) return m.at(tsc);
#endif
  return monotonic_ns();
}

// The background part: takes a calibration point when one is due and
// republishes the map.  Returns how long until it wants to run again
// (milliseconds::max() once the TSC is not used: never).  Thread-safe;
// concurrent callers skip while another one calibrates.
std::chrono::milliseconds host_clock_update() noexcept;

// What the host clock is now: "tsc" (a published map covers this instant),
// "monotonic" (clock_gettime: no usable TSC, or switched off), or
// "calibrating" (clock_gettime until a map is published, or renewed: one
// nobody renewed for kReachNs has lapsed).
const char* host_clock_source() noexcept;

// Reads one calibration point now: the tightest of `tries` brackets.
TscPoint host_clock_sample(int tries = 16) noexcept;

}  // namespace perfq

#endif  // PERFQ_HOST_CLOCK_H
