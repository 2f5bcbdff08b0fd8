// Reading the device timer register R across the bus, modelled as a PCIe
// non-posted read (see perfq_timer_page in perfq_abi.h):
//
//   reader (host):  H1 = now; req_tag = tag (release); spin until
//                   resp_tag == tag (acquire), with a timeout; H2 = now.
//   server (device): sees req_tag != the last served tag, samples R,
//                   stores resp_value, then resp_tag = tag (release).
//
// So R always lies inside the reader's [H1, H2] bracket, as on hardware.
//
// Between sync rounds nothing spins: the server sleeps on the `window` word
// (a futex wait with a short timeout: woken at once where host and device
// share a kernel, as with a /dev/shm file; a low-frequency poll of the flag
// where they do not, as across the QEMU boundary).  The reader opens the
// window for a round and closes it after.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

#include "core/region.h"
#include "device/device_clock.h"
#include "perfq/perfq_device.h"
#include "perfq/status.h"

namespace perfq {

// The nice value of the threads that time sync rounds: the host's sync
// thread and a software device's timer server (the register a real device
// answers in hardware).  A round measures how long a register read takes;
// a thread that waits behind a busy machine's other threads measures the
// wait instead, and the host's bracket around a read that waited is
// lopsided (tens of microseconds off its midpoint).  chronyd and ptp4l run
// at real-time priority for the same reason.  A round is short and rare:
// the others lose nothing measurable.
constexpr int kSyncNice = -15;

// Sets the calling thread's nice value to kSyncNice (a thread already at
// or above that priority is left as it is).  Needs root or CAP_SYS_NICE;
// without, the error says so and nothing changes: rounds still work, less
// tightly on a busy machine.
Status raise_sync_priority();

// Device side.  run() belongs to one thread.
//
// The window word carries the sync round (nonzero).  After answering every
// sample_every-th request the server also takes one device sample (R
// before, D, R after), so device and host samples interleave in time; when
// the window closes it publishes them as the SYNC page's device_samples
// batch of that round (at least one sample: it takes one then if it has
// none).  Not after every answer: the server is busy while it samples, and
// the host's next read, which arrives at once, would wait for it; that wait
// lies before R is read, so it biases the read's bracket midpoint early by
// half of it.  With a sample after every third answer, two reads in three
// find the server idle and the host's selection by delay picks those.
// The exchange itself is the SDK's perfq_dev_timer_poll(); this class is
// its thread, with the idle waits.
class TimerServer {
 public:
  struct Options {
    std::chrono::milliseconds poll{2};         // window check period when asleep
    std::chrono::milliseconds spin_limit{20};  // spin without requests before sleeping again
    // Awake for a round the host announced (perfq_dev_timer_idle_us()):
    // from lead before it is due until grace after.
    std::chrono::microseconds lead{PERFQ_DEV_TIMER_LEAD_US};
    std::chrono::microseconds grace{PERFQ_DEV_TIMER_GRACE_US};
    uint32_t sample_every = 3;  // device sample after every n-th answer (>= 1)
  };
  TimerServer(const Region& region, const DeviceClock& clock, Options opts);
  TimerServer(const Region& region, const DeviceClock& clock)
      : TimerServer(region, clock, Options{}) {}

  // Serves until stop.  Runs at kSyncNice where it may
  // (raise_sync_priority()).
  void run(const std::atomic<bool>& stop);
  uint64_t served() const { return served_.load(std::memory_order_relaxed); }
  uint64_t windows() const { return windows_.load(std::memory_order_relaxed); }

 private:
  const Region& region_;
  const DeviceClock& clock_;
  Options opts_;
  std::atomic<uint64_t> served_{0};
  std::atomic<uint64_t> windows_{0};
};

// Host side.  One reader per region at a time.
class TimerReader {
 public:
  explicit TimerReader(const Region& region);

  // Open the window of sync round `round` (nonzero) and wake the server,
  // unless it said it was awake for it (`serving`): then true.
  bool open_window(uint32_t round) noexcept;
  void close_window() noexcept;
  // When the next window opens, after this one closed: the server may
  // stay awake for it (perfq_timer_page::next_window_us; 0: not known).
  void announce_window(std::chrono::microseconds after_close) noexcept;

  // One bracketed read: {before = H1, value = R, after = H2}.  Times out with
  // a clear error when the device does not answer.
  Result<perfq_clock_sample> read(std::chrono::microseconds timeout);

 private:
  const Region& region_;
  uint64_t tag_;
};

}  // namespace perfq
