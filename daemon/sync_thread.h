// pq-sync: the sync thread of one device in a recording (ARCHITECTURE.md,
// "Time synchronization").
//
// A sync round every sync interval (HostSync: bracketed reads of the timer
// register R, the clock model), faster while the model is young, slower
// while the device records nothing and the model predicts each round well
// (next_interval()); each
// round's samples and model go to the trace through the writer's side
// queue, and the model the device's drain converts with (ConversionModel)
// is replaced after every round the model took in.  The drain asks for a
// round early when many records wait for one (want_round()), and after the
// thread has stopped runs the last rounds itself (cover()).
//
// Threading: start()/stop() from the recording's control thread; model(),
// want_round(), last_error() and status() from any thread; cover() from
// the drain thread once this thread has ended.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "host/host_sync.h"
#include "host/transport.h"
#include "perfq/trace.h"
#include "recording.h"
#include "sync/online_convert.h"

namespace perfqd {

class DeviceSyncThread {
 public:
  // device_ended: the device's drain has ended (nothing left to synchronize).
  DeviceSyncThread(Recording& rec, uint16_t source, perfq::DeviceTransport& dev,
                   std::function<bool()> device_ended);
  ~DeviceSyncThread() { stop(); }

  void start(const RecordingOptions& o);
  void request_stop();
  void stop();  // request_stop(), then join

  // The model the drain converts with (null before the first round).
  std::shared_ptr<const perfq::ConversionModel> model() const;
  // The drain holds many records waiting for a round after them: the next
  // round comes as soon as kMinRoundGapMs allows.
  void want_round();
  // Device records wait for a round after them (the drain's converter): the
  // next round comes at the configured interval, not a lengthened one.
  // Cheap enough for every poll.
  void records_waiting();
  // After the thread ended: rounds of the drain's own, for about a second at
  // most, until `covers` accepts the drain's model.  False if the thread
  // did not end in time or no round covered.
  bool cover(const std::function<bool(const perfq::ConversionModel&)>& covers);

  std::string last_error() const;
  nlohmann::json status() const;  // the device status' "sync" object

  static constexpr uint32_t kWarmupIntervalMs = 10;
  static constexpr uint32_t kMinRoundGapMs = 10;
  static constexpr uint32_t kMaxFastRounds = 300;  // 3 s of 10 ms rounds at most
  // While nothing waits for a round, a settled model that predicted
  // kQuietRounds rounds in a row well doubles the interval, up to
  // kIdleFactor x the configured one and kMaxIdleIntervalMs (below the
  // converter's stale-model limit, so a record that comes then never finds
  // a model too old to wait for).
  static constexpr uint32_t kQuietRounds = 4;
  static constexpr uint32_t kIdleFactor = 8;
  static constexpr uint32_t kMaxIdleIntervalMs = 500;

 private:
  void run();
  void took_round(const perfq::RoundResult& r);
  void failed_round(const perfq::Status& s);
  // The round just taken: its samples and model to the trace, the drain's model.
  void trace_round(const perfq::RoundResult& r);
  uint32_t next_interval(bool predicted);
  uint32_t max_idle_interval() const;
  // Until `interval` after `from`, the configured interval once records
  // wait, a want_round() or a stop.
  void wait_next_round(std::chrono::steady_clock::time_point from, uint32_t interval);
  bool wait_stop_for(std::chrono::nanoseconds d);
  bool stopping() const;

  Recording& rec_;
  const uint16_t source_;
  perfq::DeviceTransport& dev_;
  std::function<bool()> device_ended_;
  RecordingOptions opts_;
  std::unique_ptr<perfq::HostSync> sync_;  // this thread's; the drain's after it ended
  std::thread thread_;
  std::atomic<bool> done_{false};
  std::atomic<bool> want_round_{false};
  std::atomic<bool> records_waited_{false};  // since the last next_interval()
  std::atomic<uint32_t> base_ms_{0};         // the configured interval (opts_)
  std::atomic<uint32_t> interval_ms_{0};     // the interval in force
  uint32_t fast_rounds_ = 0;                 // rounds taken at the warm-up interval
  uint32_t quiet_rounds_ = 0;  // predicted well, nothing waiting, since the last change

  mutable std::mutex wake_mu_;
  std::condition_variable wake_;
  bool stop_ = false;

  mutable std::mutex model_mu_;
  std::shared_ptr<const perfq::ConversionModel> model_;

  mutable std::mutex mu_;  // guards what status() reads
  uint64_t rounds_ = 0, failed_rounds_ = 0;
  std::string last_error_;
  bool has_model_ = false;
  perfq::ClockStanding standing_;
  int64_t last_round_ns_ = 0;
};

}  // namespace perfqd
