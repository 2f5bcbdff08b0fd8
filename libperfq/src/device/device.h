// The device side: worker queues, the collector, the event dictionary.
//
//   device worker threads --record()--> DeviceQueue (the device queue: its
//   own SPSC queue, the "first queue") --DeviceCollector (one thread)--> the
//   shared queue (the region's record ring) --> host.
//
// A worker never blocks: a full queue drops the record and counts it; the
// record's index (a per-stream sequence number) is consumed either way, so
// a gap also reveals the loss.  When the shared ring is full the collector
// keeps the oldest data: it stops reading the worker queues (they fill and
// their workers drop) and, once there is room again, emits one record of
// kind LOST per stream with the number of records dropped since the last
// report.  emitted = delivered + dropped, exactly.
//
// The device side itself is the SDK (perfq/perfq_device.h, C for firmware);
// these classes drive it with host threads for perfq-devsim and the tests.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/region.h"
#include "device/device_clock.h"
#include "perfq/event_info.h"
#include "perfq/perfq_abi.h"
#include "perfq/perfq_device.h"
#include "sync/sync.h"

namespace perfq {

// The device queue of one device worker: the SDK's perfq_dev_queue (see
// perfq/perfq_device.h) over heap slots.  record()/record_at() are called by
// that worker thread only; the collector is the queue's only consumer.
class DeviceQueue {
 public:
  DeviceQueue(uint16_t stream, uint64_t queue_capacity, const DeviceClock& clock);
  DeviceQueue(const DeviceQueue&) = delete;
  DeviceQueue& operator=(const DeviceQueue&) = delete;

  // Stamp with the device clock D and queue; false if the queue was full.
  bool record(uint32_t event, perfq_kind kind, uint64_t arg) noexcept {
    return perfq_dev_record_at(&q_, event, kind, clock_.now(), arg);
  }
  // Queue with an explicit device time.
  bool record_at(uint32_t event, perfq_kind kind, uint64_t time, uint64_t arg) noexcept {
    return perfq_dev_record_at(&q_, event, kind, time, arg);
  }

  uint16_t id() const noexcept { return q_.stream; }
  // Records the worker tried to record (delivered or dropped), so far.
  uint64_t emitted() const noexcept { return perfq_dev_queue_emitted(&q_); }
  // Records the worker dropped because its queue was full, so far.
  uint64_t dropped() const noexcept { return perfq_dev_queue_dropped(&q_); }
  perfq_dev_queue* sdk() noexcept { return &q_; }

 private:
  struct Free {
    void operator()(void* p) const noexcept { std::free(p); }
  };
  const DeviceClock& clock_;
  std::unique_ptr<perfq_record[], Free> slots_;
  alignas(PERFQ_CACHELINE) perfq_dev_queue q_;
};

// Per-stream accounting kept by the collector (the SDK's).
using StreamDelivery = perfq_dev_delivery;

struct CollectorOptions {
  size_t batch = 256;  // records per copy
  // Sync mode B: when the host asks for it (SYNC page mode), pair the host
  // samples in the mailbox with the device's own samples of the same round,
  // track the clock model here, and convert record times to host time
  // (PERFQ_CLOCK_HOST_BY_DEVICE) as they are copied into the shared ring.
  // (The SDK's perfq_dev_mode_b: it looks at the mailbox's sequence word
  // on every pass, and takes each round once.)
  bool mode_b = true;
  std::chrono::microseconds max_sleep{1000};         // idle back-off ceiling
  std::chrono::milliseconds shutdown_timeout{5000};  // to deliver what is queued
};

// The device collector (the "first thread"): the SDK's collector
// (perfq_dev_collect()) driven by one thread, with an adaptive idle wait.
// run() belongs to one thread; stats are read after it returns.
class DeviceCollector {
 public:
  DeviceCollector(const Region& region, std::vector<DeviceQueue*> streams, const DeviceClock& clock,
                  CollectorOptions opts = {});
  DeviceCollector(const DeviceCollector&) = delete;
  DeviceCollector& operator=(const DeviceCollector&) = delete;

  // Collect until stop is set, then deliver what the workers queued (call it
  // after the workers have stopped recording, or they keep adding) within the
  // shutdown timeout, and mark the device STOPPED.  (The device marks itself
  // RUNNING, with set_device_state(), once all its threads are up.)
  void run(const std::atomic<bool>& stop);

  // One pass over all streams; returns the records moved (LOST included).
  size_t pass() { return perfq_dev_collect(&c_); }

  const std::vector<StreamDelivery>& delivery() const { return delivery_; }
  // The host wrote a head that makes no sense (kind kNone: it did not).
  RingFault fault() const;
  // Mode B: whether records are being converted now.
  bool converting() const { return mode_b_ && mode_b_->converting; }

 private:
  const Region& region_;
  std::vector<DeviceQueue*> streams_;
  std::vector<perfq_dev_queue*> queues_;
  CollectorOptions opts_;
  perfq_dev_port port_;
  std::vector<StreamDelivery> delivery_;
  perfq_dev_collector c_;
  std::unique_ptr<perfq_dev_mode_b> mode_b_;  // the SDK's (null: mode B off)
};

// Device: write the dictionary into the region (entries first, then count).
Status publish_dictionary(const Region& region, const std::vector<EventInfo>& events);
// Host: read and validate the device's dictionary.
Result<std::vector<EventInfo>> read_dictionary(const Region& region);

// Set the device state word in the host control page (posted write).
void set_device_state(const Region& region, perfq_device_state state) noexcept;
perfq_device_state device_state(const Region& region) noexcept;

// Adaptive idle wait: spin a little, then sleep with exponential back-off up
// to a ceiling.  reset() after doing work.  With a deep ceiling, a waiter
// idle for deep_after in all may sleep longer still (an idle daemon then
// costs nearly nothing; the first work after a long idle waits at most
// deep_sleep, which the rings behind it must absorb).
class Backoff {
 public:
  explicit Backoff(std::chrono::microseconds max_sleep = std::chrono::microseconds(1000),
                   unsigned spins = 64,
                   std::chrono::microseconds deep_sleep = std::chrono::microseconds(0),
                   std::chrono::microseconds deep_after = std::chrono::microseconds(0))
      : max_sleep_us_(static_cast<uint64_t>(max_sleep.count())),
        deep_sleep_us_(std::max(max_sleep_us_, static_cast<uint64_t>(deep_sleep.count()))),
        deep_after_us_(static_cast<uint64_t>(deep_after.count())),
        spins_(spins) {}
  void reset() noexcept {
    idle_ = 0;
    sleep_us_ = 1;
    slept_us_ = 0;
  }
  // After a pass that found some work but far from a full batch: a steady
  // trickle.  The next waits sleep max_sleep at once, without spinning or
  // climbing from 1 us, so that work is taken in batches of max_sleep's
  // worth: every wakeup costs a context switch (tens of microseconds of CPU
  // on a VM), and a waiter that polls again at once after each handful of
  // records spends more on wakeups than on the records.
  void steady() noexcept {
    idle_ = spins_;
    sleep_us_ = max_sleep_us_;
    slept_us_ = 0;
  }
  void wait() noexcept;

 private:
  uint64_t max_sleep_us_;
  uint64_t deep_sleep_us_;
  uint64_t deep_after_us_;
  unsigned spins_;
  unsigned idle_ = 0;
  uint64_t sleep_us_ = 1;
  uint64_t slept_us_ = 0;  // asked-for sleep since the last reset()
};

}  // namespace perfq
