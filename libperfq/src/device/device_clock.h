// Device clocks: the device system clock D that device records are stamped
// with, and the timer register R that both sides can read.
//
// SimClock is the software device's clock: both D and R are exact functions
// of the host's CLOCK_MONOTONIC time t (the "true" time), so accuracy can be
// measured against the truth:
//
//   D(t) = t + offset_ns + t * drift_ppm / 1e6 + sum of steps whose time <= t
//   R(t) = timer_offset + t * (1 + drift_ppm / 1e6) * timer_hz / 1e9
//
// D and R run on the same (drifting) crystal; D may also step (a device
// that sets its clock), R never does.  Both wrap modulo 2^64, so any signed
// offset works.  Jitter models what disturbs reads on real hardware: a
// random busy delay of up to jitter_ns.
//
// device_port() hands a DeviceClock to the device SDK (perfq_device.h) as
// its port layer.
#pragma once

#include <cstdint>
#include <vector>

#include "perfq/perfq_abi.h"
#include "perfq/perfq_device.h"

namespace perfq {

// CLOCK_MONOTONIC in nanoseconds.
uint64_t monotonic_ns() noexcept;

// Busy-wait a uniformly random 0..max_ns (per-thread generator).
void jitter_delay(uint64_t max_ns) noexcept;

// What the device side needs from its clocks.
class DeviceClock {
 public:
  virtual ~DeviceClock() = default;
  virtual uint64_t now() const noexcept = 0;         // D
  virtual uint64_t read_timer() const noexcept = 0;  // R
  virtual uint64_t jitter_ns() const noexcept { return 0; }
};

struct ClockStep {
  uint64_t at_ns;   // true time (CLOCK_MONOTONIC) of the step
  int64_t step_ns;  // how far D jumps, either direction
};

struct SimClockConfig {
  int64_t offset_ns = 0;
  double drift_ppm = 0;
  std::vector<ClockStep> steps;
  uint64_t timer_hz = 1'000'000'000;
  uint64_t timer_offset = 0;  // R at t = 0, in ticks
  uint64_t jitter_ns = 0;
};

class SimClock final : public DeviceClock {
 public:
  explicit SimClock(SimClockConfig cfg);

  uint64_t now() const noexcept override { return device_time_at(monotonic_ns()); }
  uint64_t read_timer() const noexcept override { return timer_at(monotonic_ns()); }
  uint64_t jitter_ns() const noexcept override { return cfg_.jitter_ns; }

  // The exact functions of the true time t.
  uint64_t device_time_at(uint64_t t) const noexcept;
  uint64_t timer_at(uint64_t t) const noexcept;
  const SimClockConfig& config() const { return cfg_; }

 private:
  __extension__ typedef __int128 Wide;
  SimClockConfig cfg_;
  // drift_ppm / 1e6 in 0.64 fixed point, when |drift_ppm| <= kFixedMaxPpm:
  // now() is a worker's hot path, and a long double product costs as much
  // as the rest of a device record.
  static constexpr double kFixedMaxPpm = 1e5;
  bool fixed_drift_ = false;
  Wide drift_mult_ = 0;
};

// The SDK's port layer over a clock: D and R, each read after the clock's
// jitter (a random busy delay of up to jitter_ns()), as reads of a real
// device's clocks are disturbed.  The port refers to the clock: keep it alive.
perfq_dev_port device_port(const DeviceClock& clock) noexcept;

// One device sample (the SDK's perfq_dev_sample()): R read before and after
// D, with the jitter before each read.  {before = R, value = D, after = R}.
perfq_clock_sample sample_device_clock(const DeviceClock& clock) noexcept;

}  // namespace perfq
