#include "device/device_clock.h"

#include <time.h>

#include <algorithm>
#include <cmath>
#include <random>

namespace perfq {

uint64_t monotonic_ns() noexcept {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

void jitter_delay(uint64_t max_ns) noexcept {
  if (max_ns == 0) return;
  thread_local std::minstd_rand rng{std::random_device{}()};
  const uint64_t d = rng() % (max_ns + 1);
  const uint64_t until = monotonic_ns() + d;
  while (monotonic_ns() < until) {
  }
}

SimClock::SimClock(SimClockConfig cfg) : cfg_(std::move(cfg)) {
  if (std::fabs(cfg_.drift_ppm) <= kFixedMaxPpm) {
    fixed_drift_ = true;
    drift_mult_ = static_cast<Wide>(
        std::llround(static_cast<long double>(cfg_.drift_ppm) / 1e6L * 18446744073709551616.0L));
  }
  std::sort(cfg_.steps.begin(), cfg_.steps.end(),
            [](const ClockStep& a, const ClockStep& b) { return a.at_ns < b.at_ns; });
}

uint64_t SimClock::device_time_at(uint64_t t) const noexcept {
  // Modular arithmetic: the offset and steps may be any signed values.
  int64_t drift;
  if (fixed_drift_) {
    // |t * mult| < 2^64 * 2^61: fits; rounded to the nearest ns.
    drift = static_cast<int64_t>((static_cast<Wide>(t) * drift_mult_ + (Wide{1} << 63)) >> 64);
  } else {
    drift = static_cast<int64_t>(std::llround(static_cast<long double>(t) * cfg_.drift_ppm / 1e6L));
  }
  uint64_t d = t + static_cast<uint64_t>(cfg_.offset_ns) + static_cast<uint64_t>(drift);
  for (const ClockStep& s : cfg_.steps) {
    if (s.at_ns > t) break;
    d += static_cast<uint64_t>(s.step_ns);
  }
  return d;
}

uint64_t SimClock::timer_at(uint64_t t) const noexcept {
  const long double ticks = static_cast<long double>(t) * (1.0L + cfg_.drift_ppm / 1e6L) *
                            static_cast<long double>(cfg_.timer_hz) / 1e9L;
  return cfg_.timer_offset + static_cast<uint64_t>(std::llround(ticks));
}

perfq_dev_port device_port(const DeviceClock& clock) noexcept {
  perfq_dev_port p{};
  p.ctx = const_cast<DeviceClock*>(&clock);
  p.device_now = [](void* ctx) {
    const auto* c = static_cast<const DeviceClock*>(ctx);
    jitter_delay(c->jitter_ns());
    return c->now();
  };
  p.timer_read = [](void* ctx) {
    const auto* c = static_cast<const DeviceClock*>(ctx);
    jitter_delay(c->jitter_ns());
    return c->read_timer();
  };
  return p;
}

perfq_clock_sample sample_device_clock(const DeviceClock& clock) noexcept {
  const perfq_dev_port p = device_port(clock);
  return perfq_dev_sample(&p);
}

}  // namespace perfq
