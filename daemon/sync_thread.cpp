#include "sync_thread.h"

#include <pthread.h>

#include <spdlog/spdlog.h>
#include <algorithm>
#include <cmath>
#include <optional>

#include "device/timer.h"
#include "sync/sync.h"

namespace perfqd {

using namespace perfq;
using nlohmann::json;

namespace {

// Device time the drain's model snapshot keeps history for: records reach
// the drain seconds after they were taken at most, unless it stalls; an
// older one is converted with the oldest model kept for its segment.
constexpr double kSnapshotHorizonS = 60;

}  // namespace

DeviceSyncThread::DeviceSyncThread(Recording& rec, uint16_t source, DeviceTransport& dev,
                                   std::function<bool()> device_ended)
    : rec_(rec), source_(source), dev_(dev), device_ended_(std::move(device_ended)) {}

void DeviceSyncThread::start(const RecordingOptions& o) {
  opts_ = o;
  base_ms_.store(std::max(1u, o.sync_interval_ms), std::memory_order_relaxed);
  interval_ms_.store(std::max(1u, o.sync_interval_ms), std::memory_order_relaxed);
  HostSyncOptions so;
  so.mode = o.sync_mode;
  so.keep_rounds = 1;  // each round goes to the trace at once
  // The models the drain converts with reach back kSnapshotHorizonS (the
  // trace keeps every one): twice that in rounds, not up to 2^18 models
  // (21 MB) over a long recording.
  const double horizon_rounds = kSnapshotHorizonS * 1000.0 / std::max(1u, o.sync_interval_ms);
  so.sync.max_history = static_cast<uint32_t>(
      std::max(4096.0, 2 * horizon_rounds + static_cast<double>(kMaxFastRounds)));
  sync_ = std::make_unique<HostSync>(dev_, so);
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "pq-sync");
    if (Status s = raise_sync_priority(); !s)
      spdlog::info("{}: sync rounds run at normal priority, less tight on a busy machine: {}",
                   dev_.spec(), s.message());
    run();
  });
}

void DeviceSyncThread::request_stop() {
  {
    std::lock_guard lock(wake_mu_);
    stop_ = true;
  }
  wake_.notify_all();
}

void DeviceSyncThread::stop() {
  request_stop();
  if (thread_.joinable()) thread_.join();
}

std::shared_ptr<const ConversionModel> DeviceSyncThread::model() const {
  std::lock_guard lock(model_mu_);
  return model_;
}

void DeviceSyncThread::want_round() {
  if (want_round_.exchange(true, std::memory_order_relaxed)) return;
  std::lock_guard lock(wake_mu_);
  wake_.notify_all();
}

void DeviceSyncThread::records_waiting() {
  if (records_waited_.load(std::memory_order_relaxed)) return;
  records_waited_.store(true, std::memory_order_relaxed);
  // At the configured interval the round comes in time anyway.
  if (interval_ms_.load(std::memory_order_relaxed) <= base_ms_.load(std::memory_order_relaxed))
    return;
  std::lock_guard lock(wake_mu_);  // the waiter reads the flag under it
  wake_.notify_all();
}

std::string DeviceSyncThread::last_error() const {
  std::lock_guard lock(mu_);
  return last_error_;
}

bool DeviceSyncThread::wait_stop_for(std::chrono::nanoseconds d) {
  std::unique_lock lock(wake_mu_);
  return wake_.wait_for(lock, d, [this] { return stop_; });
}

bool DeviceSyncThread::stopping() const {
  std::lock_guard lock(wake_mu_);
  return stop_;
}

void DeviceSyncThread::trace_round(const RoundResult& r) {
  HostSync& sync = *sync_;
  std::vector<TraceSyncSample> ss = trace_samples_of(source_, sync.rounds().back());
  const bool has = sync.sync().has_model();
  TraceClockModel m{source_, now_ns(), has ? sync.sync().current().to_abi() : perfq_sync_model{}};
  rec_.queue_sync(std::move(ss), has ? &m : nullptr);
  // After a round: the drain's model (ConversionModel::after_round()).
  std::lock_guard lock(model_mu_);
  model_ = ConversionModel::after_round(model_, sync.sync(), sync.gate(), r.verdict, r.observation,
                                        kSnapshotHorizonS);
}

void DeviceSyncThread::took_round(const RoundResult& r) {
  trace_round(r);
  const HostSync& sync = *sync_;
  if (sync.sync().has_model()) {
    const ClockStanding st = clock_standing(sync.sync().current(), sync.rates());
    std::lock_guard lock(mu_);
    has_model_ = true;
    if (st.rate_implausible && !standing_.rate_implausible)
      spdlog::warn("{}: {}", dev_.spec(), standing_text(st));
    standing_ = st;
    last_round_ns_ = now_ns();
  }
  std::lock_guard lock(mu_);
  ++rounds_;
}

void DeviceSyncThread::failed_round(const Status& s) {
  std::lock_guard lock(mu_);
  ++failed_rounds_;
  last_error_ = s.message();
  // The first failure, then one line per 100 (never a line per round).
  if (failed_rounds_ % 100 == 1)
    spdlog::warn("{}: sync round failed ({} so far): {}", dev_.spec(), failed_rounds_, last_error_);
}

// Until the model has its first rounds, nothing of the device can be
// converted and every record waits in memory; until it knows the drift
// well (ClockModel::settled_at() over an interval and a half), its claims
// between rounds are loose.  Take rounds quickly until then (a fit over
// rounds 10 ms apart brackets the records between them as well as one over
// 100 ms, and learns the drift sooner), for at most kMaxFastRounds, then
// settle to the configured interval.  Records always wait for the round
// after them (OnlineConverter).
//
// Then, as chrony lengthens its polling interval while its estimate holds:
// while no device record waited for a round and the model predicted
// kQuietRounds rounds in a row within half of what it claimed there
// (`predicted`), the interval doubles, as long as the model stays settled
// over an interval and a half of the longer one, up to max_idle_interval().
// Records waiting, a round the model did not predict (a step, wander, a
// loose or failed round) bring it back to the configured interval at once.
// An idle device costs a round every half second instead of ten a second;
// what records there are get their rounds as before.
uint32_t DeviceSyncThread::next_interval(bool predicted) {
  const HostSync& sync = *sync_;
  const uint32_t base = base_ms_.load(std::memory_order_relaxed);
  bool fast = sync.gate().taken() < kMinModelRounds;
  if (!fast && fast_rounds_ < kMaxFastRounds && sync.sync().has_model()) {
    // Settled as far as records reach between rounds (and a half).
    fast = !sync.sync().current().settled_over(1.5e6 * base);
  }
  const bool waited = records_waited_.exchange(false, std::memory_order_relaxed);
  uint32_t interval = std::max(interval_ms_.load(std::memory_order_relaxed), base);
  if (fast) {
    ++fast_rounds_;
    quiet_rounds_ = 0;
    interval = std::min<uint32_t>(base, kWarmupIntervalMs);
  } else if (waited || !predicted || !sync.sync().has_model()) {
    quiet_rounds_ = 0;
    interval = base;
  } else if (++quiet_rounds_ >= kQuietRounds) {
    quiet_rounds_ = 0;
    const uint32_t longer = std::min(interval * 2, max_idle_interval());
    if (longer > interval && sync.sync().current().settled_over(1.5e6 * longer)) interval = longer;
  }
  interval_ms_.store(interval, std::memory_order_relaxed);
  return interval;
}

uint32_t DeviceSyncThread::max_idle_interval() const {
  const uint32_t base = base_ms_.load(std::memory_order_relaxed);
  return std::max(base, std::min(base * kIdleFactor, kMaxIdleIntervalMs));
}

namespace {

// The round's observation lies within half of what the model before it
// claimed there (its extrapolation's claim and the round's own bound).
bool predicted_by(const ClockModel& before, const RoundResult& r) {
  if (r.verdict != ClockSync::Verdict::kAccepted) return false;
  const SyncObservation& o = r.observation;
  const double err =
      std::abs(static_cast<double>(time_diff(o.host_ns, before.to_host(o.device_time))));
  return err <= 0.5 * (before.claim_at(o.device_time) + o.uncertainty_ns);
}

}  // namespace

void DeviceSyncThread::wait_next_round(std::chrono::steady_clock::time_point from,
                                       uint32_t interval) {
  // Many records waiting for a round after them (a high rate): the next
  // round comes as soon as kMinRoundGapMs allows, not a whole interval
  // later, so what waits stays bounded in memory.
  const auto gap = std::chrono::milliseconds(std::min<uint32_t>(interval, kMinRoundGapMs));
  if (wait_stop_for(gap)) return;
  const auto base =
      std::chrono::milliseconds(std::min(interval, base_ms_.load(std::memory_order_relaxed)));
  std::unique_lock lock(wake_mu_);
  while (!stop_ && !want_round_.load(std::memory_order_relaxed)) {
    const auto until = from + (records_waited_.load(std::memory_order_relaxed)
                                   ? base
                                   : std::chrono::milliseconds(interval));
    if (std::chrono::steady_clock::now() >= until) break;
    wake_.wait_until(lock, until);
  }
}

void DeviceSyncThread::run() {
  while (!stopping()) {
    if (dev_.gone() || device_ended_()) break;  // nothing left to synchronize
    std::optional<ClockModel> before;
    if (sync_->sync().has_model()) before = sync_->sync().current();
    auto r = sync_->round();
    bool predicted = false;
    if (r) {
      took_round(*r);
      predicted = before && predicted_by(*before, *r);
    } else {
      if (device_ended_()) break;  // the device stopped during the round
      failed_round(r.status());
    }
    const uint32_t interval = next_interval(predicted);
    // The device may be awake for it (HostSync::next_round_in()).
    sync_->next_round_in(std::chrono::milliseconds(interval));
    wait_next_round(std::chrono::steady_clock::now(), interval);
    want_round_.store(false, std::memory_order_relaxed);
  }
  sync_->next_round_in(std::chrono::microseconds(0));  // none announced: the device may sleep
  done_ = true;
}

bool DeviceSyncThread::cover(const std::function<bool(const ConversionModel&)>& covers) {
  // This thread's HostSync, once the thread is done with it.
  for (int i = 0; i < 400 && !done_; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (!done_) return false;
  const int64_t until = now_ns() + 1'000'000'000;
  while (now_ns() < until && !dev_.gone()) {
    auto r = sync_->round();
    if (!r) {
      if (device_ended_()) return false;
      continue;
    }
    if (!sync_->sync().has_model()) continue;
    trace_round(*r);
    const auto snap = model();
    if (snap && covers(*snap)) return true;
  }
  return false;
}

json DeviceSyncThread::status() const {
  std::lock_guard lock(mu_);
  json sync = {{"mode", opts_.sync_mode == PERFQ_SYNC_MODE_B ? "b" : "a"},
               {"rounds", rounds_},
               {"failed_rounds", failed_rounds_},
               {"synchronized", has_model_}};
  if (has_model_) {
    sync["device_ahead_ns"] = standing_.device_ahead_ns;
    sync["device_fast_ppm"] = standing_.device_fast_ppm;
    sync["uncertainty_ns"] = standing_.bound_ns;
    sync["standing"] = standing_text(standing_);
    sync["rate_implausible"] = standing_.rate_implausible;
    sync["last_round_ago_ms"] = static_cast<double>(now_ns() - last_round_ns_) / 1e6;
  }
  sync["interval_ms"] = interval_ms_.load(std::memory_order_relaxed);
  if (!last_error_.empty()) sync["last_error"] = last_error_;
  return sync;
}

}  // namespace perfqd
