#include "recording.h"

#include <pthread.h>
#include <sys/fsuid.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <filesystem>
#include <map>
#include <iterator>
#include <chrono>
#include <spdlog/spdlog.h>

#include "device/device.h"
#include "device/device_clock.h"
#include "host/drain.h"
#include "host/host_sync.h"
#include "perfq_kevent.h"
#include "sync/online_convert.h"
#include "host/pci_scan.h"
#include "sync/sync.h"
#include "device/timer.h"
#include "host/transport.h"

namespace perfqd {

using namespace perfq;
using nlohmann::json;

namespace {


// Device records waiting for a first clock model are held, up to this many;
// beyond it they are counted as lost (the device cannot be synchronized).
constexpr size_t kMaxUnconverted = 1 << 20;
// Records the merge may hold for the writer before drains stop reading:
// 192 MiB at 48 B a record, well above what the watermark itself holds
// back (records of the last device-latency-ms: 1.25 M at 5 M/s and 250 ms).
constexpr size_t kMaxMergePending = 4 << 20;
constexpr size_t kDrainBatch = 16384;
constexpr size_t kWriteBatch = 65536;  // records the writer takes from the merger at a time
// The drain of a device that has been quiet for a second sleeps as long as
// its ring holds records at this rate (10 to 50 ms): each wakeup costs tens
// of microseconds on a VM, and an idle daemon should cost next to nothing.
// A burst faster than this right after a quiet second waits in the device's
// own queues, which keep the oldest records when full.
constexpr double kQuietDrainRate = 2e6;  // records per second
// Device time the drain's model snapshot keeps history for: records reach
// the drain seconds after they were taken at most, unless it stalls; an
// older one is converted with the oldest model kept for its segment.
constexpr double kSnapshotHorizonS = 60;

}  // namespace

// ---------------------------------------------------------------------------
// One device of a recording: its drain thread and its sync thread.

class DeviceRecorder {
 public:
  // backlog: records the ring held before the start, skipped unread.
  DeviceRecorder(Recording& rec, uint16_t source, std::unique_ptr<DeviceTransport> dev,
                 uint64_t backlog)
      : rec_(rec), source_(source), dev_(std::move(dev)), conv_(OnlineConverter::Options{}) {
    before_start_ = backlog;
    before_start_shown_ = backlog;
  }
  ~DeviceRecorder() { stop(); }

  TraceSource describe() const {
    const Region& region = dev_->region();
    TraceSource src;
    src.id = source_;
    src.kind = TraceSourceKind::kDevice;
    src.name = region.device_name();
    src.clock_hz = region.header().device_clock_hz;
    src.timer_hz = region.header().timer_hz;
    // Where the device sits on the bus (a /dev/perfqN; shm: has no PCI facts).
    if (auto pci = pci_device_for_spec(dev_->spec()); !pci) {
      spdlog::warn("{}: no PCI facts in the trace: {}", dev_->spec(), pci.status().message());
    } else if (pci.value()) {
      src.pci = *pci.value();
      src.pci_address = src.pci->address;
      if (src.pci->pcie && src.pci->pcie->link_current)
        src.link = pci_link_name(*src.pci->pcie->link_current);
    }
    if (auto dict = read_dictionary(region))
      for (const auto& e : *dict) src.events.push_back({e.event, static_cast<uint16_t>(e.kind), e.name});
    return src;
  }

  void start(const RecordingOptions& o) {
    opts_ = o;
    OnlineConverter::Options co;
    co.source = source_;
    co.device_clock_hz = dev_->region().header().device_clock_hz;
    co.max_waiting = SIZE_MAX;  // poll_once() reads no more than kMaxUnconverted may wait
    // Rounds stop being taken (a device whose every round is loose): once
    // the first rounds' worth and a little more has gone by, what waits
    // converts with the model there is.
    co.stale_model_ns =
        static_cast<int64_t>(kMinModelRounds + 3) * o.sync_interval_ms * 1'000'000 + 200'000'000;
    co.on_back_step = [spec = dev_->spec()](uint16_t stream, int64_t ticks) {
      spdlog::info("{}: the device clock went back {} ticks (stream {}): its times after that "
                   "wait for the model to see the step",
                   spec, ticks, stream);
    };
    conv_ = OnlineConverter(std::move(co));
    input_ = rec_.merger().add_input(dev_->spec(), now_ns() - o.device_grace_ns);
    HostSyncOptions so;
    so.mode = o.sync_mode;
    so.keep_rounds = 1;  // each round goes to the trace at once
    // The models the drain converts with reach back kSnapshotHorizonS (the
    // trace keeps every one): twice that in rounds, not up to 2^18 models
    // (21 MB) over a long recording.
    const double horizon_rounds = kSnapshotHorizonS * 1000.0 / std::max(1u, o.sync_interval_ms);
    so.sync.max_history = static_cast<uint32_t>(
        std::max(4096.0, 2 * horizon_rounds + static_cast<double>(kMaxFastRounds)));
    sync_ = std::make_unique<HostSync>(*dev_, so);
    sync_thread_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "pq-sync");
      if (Status s = raise_sync_priority(); !s)
        spdlog::info("{}: sync rounds run at normal priority, less tight on a busy machine: {}",
                     dev_->spec(), s.message());
      sync_main();
    });
    drain_thread_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "pq-drain");
      drain_main();
    });
  }

  void stop() {
    {
      std::lock_guard lock(wake_mu_);
      stop_ = true;
    }
    wake_.notify_all();
    if (drain_thread_.joinable()) drain_thread_.join();
    if (sync_thread_.joinable()) sync_thread_.join();
  }

  // A record the device dropped consumed its index (a gap) and is also
  // reported by a LOST record: the same records, counted once.  A gap
  // without a report (a device that lost records silently) still counts.
  static uint64_t stream_lost(const StreamAccount& a) {
    return std::max(a.lost_reported, a.gap_records);
  }

  json status() const {
    std::lock_guard lock(mu_);
    json streams = json::array();
    for (const auto& [id, a] : accounts_)
      streams.push_back({{"stream", id},
                         {"records", a.received},
                         {"bytes", a.received * sizeof(perfq_record)},
                         {"lost", stream_lost(a)}});
    const Region& region = dev_->region();
    const uint64_t tail = load_acquire(&region.host_ctrl()->tail_mirror);
    const uint64_t fill = tail >= consumed_ ? tail - consumed_ : 0;
    const double secs = std::max(1e-9, static_cast<double>(now_ns() - started_ns_) / 1e9);
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
    if (!last_sync_error_.empty()) sync["last_error"] = last_sync_error_;
    json j = {{"source", source_},
              {"device", dev_->spec()},
              {"name", region.device_name()},
              {"state", state_},
              {"records", records_},
              {"bytes", records_ * sizeof(perfq_record)},
              {"lost", lost_},
              {"invalid", invalid_},
              {"before_start", before_start_shown_},
              {"waiting_for_clock", unconverted_},
              {"writer_waits", writer_waits_},
              {"ring_fill", fill},
              {"ring_capacity", region.ring_capacity()},
              {"rate_per_s", static_cast<double>(records_) / secs},
              {"streams", streams},
              {"sync", sync}};
    if (!error_.empty()) j["error"] = error_;
    return j;
  }

  // The drain has ended: the device stopped, went away or failed.
  bool ended() const {
    std::lock_guard lock(mu_);
    return state_ == "finished" || state_ == "gone" || state_ == "failed";
  }

  bool gone() const {
    std::lock_guard lock(mu_);
    return state_ == "gone" || state_ == "failed";
  }

  static constexpr uint32_t kWarmupIntervalMs = 10;
  // Records waiting for a round after them beyond which the drain asks the
  // sync thread for the next round now (at most every kMinRoundGapMs): at
  // 5 M records/s, 10 ms of them rather than 100 ms.
  static constexpr size_t kRoundOnDemand = 65536;
  static constexpr uint32_t kMinRoundGapMs = 10;
  static constexpr uint32_t kMaxFastRounds = 300;  // 3 s of 10 ms rounds at most

 private:
  // The clock model the drain converts with (ConversionModel::after_round()),
  // replaced by the sync thread after every round the model took in.

  // After a round: the drain's model (ConversionModel::after_round()).
  void publish(const HostSync& sync, ClockSync::Verdict v, const SyncObservation& obs) {
    std::lock_guard lock(model_mu_);
    model_ = ConversionModel::after_round(model_, sync.sync(), sync.gate(), v, obs, kSnapshotHorizonS);
  }

  std::shared_ptr<const ConversionModel> model() const {
    std::lock_guard lock(model_mu_);
    return model_;
  }

  bool wait_stop_for(std::chrono::nanoseconds d) {
    std::unique_lock lock(wake_mu_);
    return wake_.wait_for(lock, d, [this] { return stop_; });
  }
  bool stopping() const {
    std::lock_guard lock(wake_mu_);
    return stop_;
  }

  void sync_main() {
    HostSync& sync = *sync_;
    while (!stopping()) {
      if (dev_->gone() || ended()) break;  // nothing left to synchronize
      auto r = sync.round();
      if (!r) {
        if (ended()) break;  // the device stopped during the round
        std::lock_guard lock(mu_);
        ++failed_rounds_;
        last_sync_error_ = r.status().message();
        // The first failure, then one line per 100 (never a line per round).
        if (failed_rounds_ % 100 == 1)
          spdlog::warn("{}: sync round failed ({} so far): {}", dev_->spec(), failed_rounds_,
                       last_sync_error_);
      } else {
        const SyncRound& sr = sync.rounds().back();
        std::vector<TraceSyncSample> ss = samples_of(sr);
        const bool has = sync.sync().has_model();
        TraceClockModel m{source_, now_ns(), has ? sync.sync().current().to_abi() : perfq_sync_model{}};
        rec_.queue_sync(std::move(ss), has ? &m : nullptr);
        publish(sync, r->verdict, r->observation);
        if (has) {
          const ClockStanding st = clock_standing(sync.sync().current(), sync.rates());
          std::lock_guard lock(mu_);
          has_model_ = true;
          if (st.rate_implausible && !standing_.rate_implausible)
            spdlog::warn("{}: {}", dev_->spec(), standing_text(st));
          standing_ = st;
          last_round_ns_ = now_ns();
        }
        std::lock_guard lock(mu_);
        ++rounds_;
      }
      // Until the model has its first rounds, nothing of the device can be
      // converted and every record waits in memory; until it knows the
      // drift well (ClockModel::settled_at() over an interval and a half),
      // its claims between rounds are loose.  Take rounds quickly until
      // then (a fit over rounds 10 ms apart brackets the records between
      // them as well as one over 100 ms, and learns the drift sooner), for
      // at most kMaxFastRounds, then settle to the configured interval.
      // Records always wait for the round after them (OnlineConverter).
      bool fast = sync.gate().taken() < kMinModelRounds;
      if (!fast && fast_rounds_ < kMaxFastRounds && sync.sync().has_model()) {
        // Settled as far as records reach between rounds (and a half).
        fast = !sync.sync().current().settled_over(1.5e6 * opts_.sync_interval_ms);
      }
      if (fast) ++fast_rounds_;
      const uint32_t interval = fast
                                    ? std::min<uint32_t>(opts_.sync_interval_ms, kWarmupIntervalMs)
                                    : opts_.sync_interval_ms;
      // Many records waiting for a round after them (a high rate): the next
      // round comes as soon as kMinRoundGapMs allows, not a whole interval
      // later, so what waits stays bounded in memory.
      const auto gap = std::chrono::milliseconds(std::min<uint32_t>(interval, kMinRoundGapMs));
      if (!wait_stop_for(gap)) {
        std::unique_lock lock(wake_mu_);
        wake_.wait_for(lock, std::chrono::milliseconds(interval) - gap,
                       [this] { return stop_ || want_round_.load(std::memory_order_relaxed); });
      }
      want_round_.store(false, std::memory_order_relaxed);
    }
    sync_done_ = true;
  }

  // One round's paired samples as the trace stores them.
  std::vector<TraceSyncSample> samples_of(const SyncRound& sr) const {
    return trace_samples_of(source_, sr);
  }

  // One poll: returns records consumed, or -1 when the drain must end.
  long poll_once(DeviceDrain& drain, std::vector<perfq_record>& batch,
                 std::vector<TraceRecord>& out) {
    const int64_t t0 = now_ns();
    batch.clear();
    // With kMaxUnconverted records waiting for a clock model, leave the rest
    // in the device's ring (and its queues, which count what overflows)
    // rather than drop them here: a slow first model at millions of records
    // a second must cost latency, not records.
    // At the stop, take all the device published (the ring bounds it).
    const size_t cap = draining_out_ ? SIZE_MAX : kMaxUnconverted;
    const size_t waiting = conv_.waiting();
    size_t room = waiting < cap ? cap - waiting : 0;
    // The writer kMaxMergePending records behind (a slow disk, a starved
    // writer thread): leave the records in the ring, whose overflow the
    // device counts, rather than grow without bound here.  Nothing read
    // means no new promise either (below); the merge releases what is
    // older than the last one, or than its max_delay.
    const bool backlog =
        !draining_out_ && rec_.merger().pending_approx() >= kMaxMergePending;
    if (backlog) {
      room = 0;
      std::lock_guard lock(mu_);
      ++writer_waits_;
    }
    auto n = room ? drain.poll(batch, std::min(kDrainBatch, room)) : Result<size_t>(size_t{0});
    const int64_t read_ns = now_ns();  // everything in batch was read before
    if (dev_->gone()) {
      // The mapping was revoked under us: what this poll read is not data.
      set_state("gone", dev_->spec() + ": the device is gone (removed or reset); the trace "
                                       "holds everything read before");
      return -1;
    }
    if (!n) {
      set_state("failed", n.status().message());
      return -1;
    }
    auto model = this->model();
    // A newer model (or the wait is over): what waits and it converts,
    // passed on in batches (no bound yet: what waits is older).
    while (!conv_.release(model, t0, out, kDrainBatch)) {
      admit(drain, out, 0);
      rec_.merger().push(input_, out, INT64_MIN);
    }
    admit(drain, out, 0);
    const size_t fresh = out.size();
    const uint64_t dropped = conv_.feed(batch, model.get(), t0, read_ns, out);
    admit(drain, out, fresh);
    frontier_.clear();
    for (size_t i = fresh; i < out.size(); ++i) frontier_.note(out[i].rec.stream, out[i].time_ns);
    dropped_no_clock_ += dropped;
    if (conv_.waiting() > kRoundOnDemand && !want_round_.exchange(true, std::memory_order_relaxed)) {
      std::lock_guard lock(wake_mu_);
      wake_.notify_all();
    }
    show_counts(drain, batch.size());
    // Everything up to t0 has been read when the poll came back short; the
    // device may still hold records up to its collector's latency.
    // What waits lands no earlier than OnlineConverter::waiting_bound().
    // A full poll (the drain is behind the device) read each of its
    // streams up to some time: StreamFrontier.  Without that bound the
    // merge could release nothing while the drain is behind, and the
    // daemon would hold everything it read in memory until the merge's
    // max_delay (2 s of records).
    const bool caught_up = *n < std::min(kDrainBatch, room);
    int64_t bound = caught_up ? t0 - opts_.device_grace_ns : INT64_MIN;
    if (!caught_up) bound = frontier_.bound(t0, opts_.device_grace_ns);
    bound = std::min(bound, conv_.waiting_bound(model.get(), opts_.device_grace_ns));
    rec_.merger().push(input_, out, bound);  // also says this input is alive
    return static_cast<long>(*n);
  }

  // The drain's counters, for status(): `read` more records read.
  void show_counts(const DeviceDrain& drain, size_t read) {
    std::lock_guard lock(mu_);
    records_ += read;
    accounts_ = drain.streams();
    lost_ = dropped_no_clock_;
    for (const auto& [id, a] : accounts_) lost_ += stream_lost(a);
    invalid_ = drain.invalid();
    consumed_ = drain.consumed();
    before_start_shown_ = before_start_;
    unconverted_ = conv_.waiting();
  }

  // Converted records out[from..] enter the recording (and the drain's
  // accounting) if they happened after the recording started; one from
  // before (stamped before the start, delivered after it) is counted and
  // dropped.
  void admit(DeviceDrain& drain, std::vector<TraceRecord>& out, size_t from) {
    size_t w = from;
    for (size_t i = from; i < out.size(); ++i) {
      if (out[i].time_ns < rec_.start_ns()) {
        ++before_start_;
        continue;
      }
      drain.account(out[i].rec);
      if (w != i) out[w] = out[i];
      ++w;
    }
    out.resize(w);
  }

  void set_state(const std::string& state, const std::string& error) {
    std::lock_guard lock(mu_);
    state_ = state;
    error_ = error;
    if (!error.empty()) spdlog::error("{}", error);
  }

  void drain_main() {
    started_ns_ = now_ns();
    // Recording::start() skipped what the ring held before the start.
    DeviceDrain drain(dev_->region());
    set_state("recording", "");
    std::vector<perfq_record> batch;
    std::vector<TraceRecord> out;
    // Idle: back off to 1 ms sleeps, and once nothing came for a second to
    // as long as the ring holds at kQuietDrainRate.  Records coming in:
    // every 1 ms while a poll brings less than a quarter batch (4 M
    // records/s), back to back above that.
    const auto quiet_us = static_cast<int64_t>(
        std::clamp(static_cast<double>(dev_->region().ring_capacity()) / kQuietDrainRate * 1e6,
                   10'000.0, 50'000.0));
    Backoff idle(std::chrono::microseconds(1000), 64, std::chrono::microseconds(quiet_us),
                 std::chrono::microseconds(1'000'000));
    bool ended = false;
    while (!stopping()) {
      const long n = poll_once(drain, batch, out);
      if (n < 0) {
        ended = true;
        break;
      }
      if (n == 0) {
        if (drain.finished()) {
          set_state("finished", "");
          spdlog::info("{}: the device stopped; all it published was read", dev_->spec());
          ended = true;
          break;
        }
        idle.wait();
      } else if (static_cast<size_t>(n) >= kDrainBatch / 4) {
        idle.reset();  // the ring is filling: poll again at once
      } else {
        idle.steady();  // a trickle: take it in 1 ms batches
        idle.wait();
      }
    }
    if (!ended) {
      // Stop: take everything the device already published.
      draining_out_ = true;
      for (int i = 0; i < 4096; ++i) {
        const long n = poll_once(drain, batch, out);
        if (n <= 0) break;
      }
    }
    // Records waiting for a sync round after them: wait for one (bounded),
    // then convert what is left with the newest model.
    if (conv_.waiting() && !dev_->gone()) wait_for_cover();
    const auto last_model = this->model();
    const size_t left = conv_.finish(last_model.get(), out);
    admit(drain, out, 0);
    rec_.merger().push(input_, out, INT64_MIN);
    show_counts(drain, 0);  // what the last conversions took (LOST records among them)
    if (left) {
      std::lock_guard lock(mu_);
      error_ = std::to_string(left) +
               " device records could not be converted (no clock model for their time: " +
               (last_sync_error_.empty() ? "too few sync rounds" : last_sync_error_) +
               "); they are not in the trace";
      lost_ += left;
      spdlog::error("{}: {}", dev_->spec(), error_);
    }
    {
      std::lock_guard lock(mu_);
      if (state_ == "recording") state_ = "stopped";
    }
    rec_.merger().close(input_);
    if (drain.invalid() > 0 && !dev_->gone())  // a revoked mapping reads as zeros
      spdlog::warn("{}: {} invalid device records dropped; first: {}", dev_->spec(),
                   drain.invalid(), drain.first_invalid());
    // Device-side losses for the trace's loss table: those the device did
    // not report itself (its LOST records are in the trace already).
    for (const auto& [id, a] : drain.streams())
      if (a.gap_records > a.lost_reported)
        rec_.queue_loss({source_, id, TraceLossReason::kSharedQueueFull,
                         a.gap_records - a.lost_reported, now_ns(), a.next_index});
  }

  // Runs rounds of its own (the sync thread has stopped) until one covers
  // every held record, for at most about a second.
  void wait_for_cover() {
    // The sync thread's HostSync, once that thread is done with it.
    for (int i = 0; i < 400 && !sync_done_; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (!sync_done_) return;
    HostSync* sync = sync_.get();
    const int64_t until = now_ns() + 1'000'000'000;
    while (now_ns() < until && !dev_->gone()) {
      auto r = sync->round();
      if (!r) {
        if (ended()) return;
        continue;
      }
      if (!sync->sync().has_model()) continue;
      const SyncRound& sr = sync->rounds().back();
      std::vector<TraceSyncSample> ss = samples_of(sr);
      TraceClockModel m{source_, now_ns(), sync->sync().current().to_abi()};
      rec_.queue_sync(std::move(ss), &m);
      publish(*sync, r->verdict, r->observation);
      const auto snap = model();
      if (!snap) continue;
      if (conv_.covers_waiting(*snap)) return;
    }
  }

  Recording& rec_;
  uint16_t source_;
  std::unique_ptr<DeviceTransport> dev_;
  RecordingOptions opts_;
  Merger::Input* input_ = nullptr;
  std::thread drain_thread_, sync_thread_;

  mutable std::mutex wake_mu_;
  std::condition_variable wake_;
  bool stop_ = false;

  mutable std::mutex model_mu_;
  std::shared_ptr<const ConversionModel> model_;

  OnlineConverter conv_;  // drain thread
  bool draining_out_ = false;  // drain thread: stopping, what waits is not capped
  StreamFrontier frontier_;  // drain thread: each stream's newest converted time in a poll
  std::unique_ptr<HostSync> sync_;  // the sync thread's; the drain's after it ended
  std::atomic<bool> sync_done_{false};
  std::atomic<bool> want_round_{false};  // the drain asks for a round now
  uint32_t fast_rounds_ = 0;   // the sync thread's: rounds taken at the warm-up interval
  uint64_t dropped_no_clock_ = 0;                  // drain thread only
  uint64_t before_start_ = 0;                      // drain thread only

  mutable std::mutex mu_;  // guards what status() reads
  std::string state_ = "starting";
  std::string error_;
  std::map<uint16_t, StreamAccount> accounts_;
  uint64_t records_ = 0, lost_ = 0, invalid_ = 0, consumed_ = 0, unconverted_ = 0;
  // Records of the device from before the recording's start: the ring's
  // backlog skipped at the start, and those stamped before it that came
  // later.  Not in the trace and not losses.
  uint64_t before_start_shown_ = 0;
  uint64_t writer_waits_ = 0;  // polls skipped: the merge held kMaxMergePending records
  int64_t started_ns_ = now_ns();
  uint64_t rounds_ = 0, failed_rounds_ = 0;
  std::string last_sync_error_;
  bool has_model_ = false;
  ClockStanding standing_;
  int64_t last_round_ns_ = 0;
};

// ---------------------------------------------------------------------------

Recording::Recording(const RecordingOptions& opts) : opts_(opts), merger_(opts.merge) {}

Recording::~Recording() {
  // A recording that never started (start() failed) has nothing to stop.
  if (writer_thread_.joinable() && !stopped_) stop();
  if (kernel_thread_.joinable()) {
    kernel_stop_ = true;
    kernel_thread_.join();
  }
}

namespace {

// Open (create) the trace file with the requesting user's file-system
// identity, so that a root daemon never writes where that user may not.
Result<TraceWriter> open_as(const RecordingOptions& o, const TraceMetadata& meta) {
  const bool switch_id = geteuid() == 0 && o.owner_uid != 0;
  if (switch_id) {
    setfsgid(o.owner_gid);
    setfsuid(o.owner_uid);
  }
  auto w = TraceWriter::open(o.output, meta, o.writer);
  if (switch_id) {
    setfsuid(0);
    setfsgid(0);
  }
  return w;
}

}  // namespace

Result<std::unique_ptr<Recording>> Recording::start(const RecordingOptions& o) {
  std::unique_ptr<Recording> rec(new Recording(o));

  // Devices first: a device that cannot be opened fails the start.
  std::vector<std::unique_ptr<DeviceTransport>> transports;
  std::map<std::string, std::string> seen;  // canonical path -> the spec that named it
  for (const auto& spec : o.devices) {
    // A device has one consumer: the same one twice in a request would
    // steal its own records and rounds.
    std::error_code ec;
    const std::string canon = std::filesystem::weakly_canonical(transport_path(spec), ec).string();
    if (auto [it, fresh] = seen.emplace(ec ? transport_path(spec) : canon, spec); !fresh)
      return Status(Errc::kInvalidArgument, spec + ": the request lists this device twice (as '" +
                                                it->second + "' and '" + spec + "')");
    auto t = open_transport(spec);
    if (!t) return Status(t.status().code(), spec + ": " + t.status().message());
    if (Status c = t.value()->claim(); !c) return c;
    const auto state = device_state(t.value()->region());
    if (state == PERFQ_DEVICE_STOPPED)
      return Status(Errc::kUnavailable,
                    spec + ": the device has stopped (its collector exited); restart it first");
    transports.push_back(std::move(t.value()));
  }
  // What the rings hold now was published before the recording (by a device
  // that ran before it, or for an earlier recording): skipped unread, then
  // the recording starts.  Records stamped before the start that arrive
  // later are left out by their time (DeviceRecorder::take()).
  std::vector<uint64_t> backlog;
  for (auto& t : transports) {
    auto skipped = DeviceDrain(t->region()).skip_backlog();
    if (!skipped) return Status(skipped.status().code(), t->spec() + ": " + skipped.status().message());
    backlog.push_back(*skipped);
    if (*skipped)
      spdlog::info("{}: {} records published before the start discarded", t->spec(), *skipped);
  }
  rec->start_ns_ = now_ns();
  rec->host_start_ns_ = rec->start_ns_;

  TraceMetadata& meta = rec->metadata_;
  meta.describe_this_host();
  meta.options["recorder"] = o.recorder;
  meta.options["sync_mode"] = o.sync_mode == PERFQ_SYNC_MODE_B ? "b" : "a";
  meta.options["sync_interval_ms"] = std::to_string(o.sync_interval_ms);
  meta.options["start_ns"] = std::to_string(rec->start_ns_);
  if (o.duration_s > 0) meta.options["duration_s"] = std::to_string(o.duration_s);
  if (o.ring_records) meta.options["host_ring_records"] = std::to_string(o.ring_records);
  if (!o.requested_by.empty()) meta.options["requested_by"] = o.requested_by;
  std::string devs;
  for (const auto& d : o.devices) devs += (devs.empty() ? "" : ",") + d;
  meta.options["devices"] = devs;

  uint16_t source = 1;
  for (size_t i = 0; i < transports.size(); ++i) {
    rec->devices_.push_back(
        std::make_unique<DeviceRecorder>(*rec, source++, std::move(transports[i]), backlog[i]));
    meta.sources.push_back(rec->devices_.back()->describe());
  }

  if (o.kernel.any()) {
    auto k = KernelEvents::open(o.kernel);
    // A uprobe on a function that is not there is the request's fault: refused.
    if (!k && (k.status().code() == Errc::kNotFound || k.status().code() == Errc::kInvalidArgument))
      return Status(k.status().code(), "kernel events: " + k.status().message());
    if (!k) {
      // Said once, here; the recording goes on with everything else.
      rec->kernel_error_ = k.status().message();
      rec->warnings_.push_back("kernel events: " + rec->kernel_error_ +
                               "; recording everything else");
      spdlog::warn("{}", rec->warnings_.back());
      meta.options["kernel_events_error"] = rec->kernel_error_;
    } else {
      rec->kernel_ = std::move(k.value());
      meta.sources.push_back(rec->kernel_->describe());
      std::string what = std::string(o.kernel.sched ? "sched," : "") + (o.kernel.syscalls ? "syscalls," : "");
      for (const auto& u : o.kernel.uprobes) what += "uprobe " + u + ",";
      if (!what.empty()) what.pop_back();
      meta.options["kernel_events"] = what;
    }
  }

  auto w = open_as(o, meta);
  if (!w) return w.status();
  rec->writer_ = std::make_unique<TraceWriter>(std::move(w.value()));

  rec->host_input_ = rec->merger_.add_input("host", rec->start_ns_ - o.host_grace_ns);
  for (auto& d : rec->devices_) d->start(o);
  if (rec->kernel_) {
    rec->kernel_input_ = rec->merger_.add_input("kernel", rec->start_ns_ - o.host_grace_ns);
    rec->kernel_thread_ = std::thread([r = rec.get()] {
      pthread_setname_np(pthread_self(), "pq-kernel");
      r->kernel_main();
    });
  }
  rec->writer_thread_ = std::thread([r = rec.get()] {
    pthread_setname_np(pthread_self(), "pq-writer");
    r->writer_main();
  });
  return rec;
}

void Recording::on_host_sources(const std::vector<TraceSource>& sources) {
  if (sources.empty()) return;
  if (kernel_) {
    // Registered applications are traced from the moment they are known.
    std::lock_guard lock(kernel_mu_);
    for (const auto& s : sources) {
      if (s.kind != TraceSourceKind::kHost || s.pid == 0 ||
          std::find(traced_pids_.begin(), traced_pids_.end(), s.pid) != traced_pids_.end())
        continue;
      if (Status st = kernel_->trace_pid(s.pid); !st)
        spdlog::warn("kernel events: {}", st.message());
      else
        traced_pids_.push_back(s.pid);
    }
  }
  TraceMetadata m;
  m.sources = sources;
  {
    std::lock_guard lock(stats_mu_);
    for (const auto& s : sources) host_names_[s.id] = s.name;
  }
  queue_metadata(m);
}

void Recording::on_host_records(uint16_t source, std::span<const perfq_record> records) {
  std::lock_guard lock(stats_mu_);
  const auto it_name = host_names_.find(source);
  for (const auto& r : records) {
    if (static_cast<int64_t>(r.time) < host_start_ns_) {
      ++before_start_;
      continue;
    }
    TraceRecord tr;
    tr.source = source;
    tr.rec = r;
    tr.time_ns = static_cast<int64_t>(r.time);
    host_batch_.push_back(tr);
    auto& hs = host_streams_[{source, r.stream}];
    if (hs.app.empty() && it_name != host_names_.end()) hs.app = it_name->second;
    ++hs.records;
    hs.last_ns = tr.time_ns;
  }
}

void Recording::set_host_start(int64_t t) {
  std::lock_guard lock(stats_mu_);
  host_start_ns_ = t;
}

void Recording::on_host_losses(const std::vector<TraceLoss>& losses) {
  for (const auto& l : losses) {
    {
      std::lock_guard lock(stats_mu_);
      host_streams_[{l.source, l.stream}].lost += l.count;
    }
    queue_loss(l);
  }
}

void Recording::on_host_idle(int64_t bound) {
  std::vector<TraceRecord> batch;
  {
    std::lock_guard lock(stats_mu_);
    batch.swap(host_batch_);
  }
  merger_.push(host_input_, batch, bound);
}

void Recording::suspend_host_input() { merger_.suspend(host_input_); }

void Recording::resume_host_input() { merger_.resume(host_input_, now_ns() - opts_.host_grace_ns); }

// The kernel collector: everything the BPF program stored, every 10 ms (the
// program wakes this thread early only when its buffer fills up), into the
// merger with the host grace; kernel-side drops into the loss table.
void Recording::kernel_main() {
  std::vector<TraceRecord> out;
  std::vector<uint64_t> dropped_seen;
  std::vector<uint64_t> last_index;
  bool failed = false;
  auto pass = [&](int timeout_ms) {
    const int64_t t0 = now_ns();
    out.clear();
    auto n = kernel_->poll(out, timeout_ms);
    if (!n && !failed) {
      failed = true;
      spdlog::error("kernel events: {}; no more kernel events in this recording",
                    n.status().message());
    }
    for (const auto& r : out) {
      if (r.rec.stream >= last_index.size()) last_index.resize(r.rec.stream + 1u, 0);
      last_index[r.rec.stream] = r.rec.index;
    }
    kernel_records_ += out.size();
    merger_.push(kernel_input_, out, t0 - opts_.host_grace_ns);
    const auto dropped = kernel_->dropped();
    if (dropped_seen.size() < dropped.size()) dropped_seen.resize(dropped.size(), 0);
    for (size_t cpu = 0; cpu < dropped.size(); ++cpu) {
      if (dropped[cpu] <= dropped_seen[cpu]) continue;
      const uint64_t d = dropped[cpu] - dropped_seen[cpu];
      dropped_seen[cpu] = dropped[cpu];
      kernel_dropped_ += d;
      queue_loss({PERFQ_KERNEL_SOURCE, static_cast<uint16_t>(cpu), TraceLossReason::kKernelBufferFull,
                  d, now_ns(), cpu < last_index.size() ? last_index[cpu] : 0});
    }
  };
  while (!kernel_stop_) pass(10);
  pass(0);  // what was stored before the stop
  merger_.close(kernel_input_);
}

nlohmann::json Recording::kernel_status() const {
  if (!opts_.kernel.any()) return {{"state", "off"}};
  if (!kernel_) return {{"state", "unavailable"}, {"error", kernel_error_}};
  json pids = json::array();
  {
    std::lock_guard lock(kernel_mu_);
    for (uint32_t p : opts_.kernel.pids) pids.push_back(p);
    for (uint32_t p : traced_pids_) pids.push_back(p);
  }
  return {{"state", kernel_stop_ ? "stopped" : "recording"},
          {"records", kernel_records_.load()},
          {"dropped", kernel_dropped_.load()},
          {"missed", kernel_->missed()},
          {"traced_pids", pids},
          {"sched", opts_.kernel.sched},
          {"syscalls", opts_.kernel.syscalls},
          {"uprobes", opts_.kernel.uprobes}};
}

void Recording::queue_sync(std::vector<TraceSyncSample> samples, const TraceClockModel* model) {
  std::lock_guard lock(side_mu_);
  side_samples_.insert(side_samples_.end(), samples.begin(), samples.end());
  if (model) side_models_.push_back(*model);
}

void Recording::queue_loss(const TraceLoss& loss) {
  std::lock_guard lock(side_mu_);
  side_losses_.push_back(loss);
}

void Recording::queue_metadata(const TraceMetadata& m) {
  std::lock_guard lock(side_mu_);
  side_metadata_.push_back(m);
}

Status Recording::write_side_queue() {
  std::vector<TraceSyncSample> samples;
  std::vector<TraceClockModel> models;
  std::vector<TraceLoss> losses;
  std::vector<TraceMetadata> metas;
  {
    std::lock_guard lock(side_mu_);
    samples.swap(side_samples_);
    models.swap(side_models_);
    losses.swap(side_losses_);
    metas.swap(side_metadata_);
  }
  for (const auto& m : metas)
    if (Status s = writer_->append_metadata(m); !s) return s;
  if (!samples.empty())
    if (Status s = writer_->append_sync_samples(samples); !s) return s;
  for (const auto& m : models)
    if (Status s = writer_->append_clock_model(m); !s) return s;
  for (const auto& l : losses)
    if (Status s = writer_->append_loss(l); !s) return s;
  return Status::ok();
}

void Recording::writer_main() {
  std::vector<TraceRecord> out;
  auto fail = [this](const Status& s) {
    std::lock_guard lock(stats_mu_);
    if (write_error_.empty()) {
      write_error_ = s.message();
      spdlog::error("trace {}: {}; the recording stops, the file holds what was written before",
                    opts_.output, write_error_);
    }
    write_failed_ = true;
  };
  auto write = [&](bool all) {
    out.clear();
    if (all)
      merger_.take_all(out);
    else
      merger_.take_ready(out, now_ns(), 50'000'000, kWriteBatch);
    if (write_failed_) return;  // keep the merger empty; nothing more can be written
    Status s = write_side_queue();
    if (s && !out.empty()) s = writer_->append_records(out);
    if (!s) return fail(s);
    std::lock_guard lock(stats_mu_);
    records_written_ = writer_->records_written();
    bytes_written_ = writer_->bytes_written();
  };
  while (!writer_stop_) write(false);
  write(true);
}

bool Recording::wants_stop() const {
  if (write_failed_) return true;
  if (opts_.duration_s > 0 &&
      now_ns() - start_ns_ >= static_cast<int64_t>(opts_.duration_s * 1e9))
    return true;
  return false;
}

json Recording::stop(const std::function<void(const json&)>& progress) {
  if (stopped_.exchange(true)) return status();
  const int64_t t0 = now_ns();
  std::atomic<bool> done{false};
  std::thread reporter;
  if (progress)
    reporter = std::thread([&] {
      while (!done) {
        std::this_thread::sleep_for(std::chrono::milliseconds(250));
        if (done) break;
        const auto ms = merger_.stats();
        progress({{"phase", "flushing"},
                  {"pending", ms.pending},
                  {"written", ms.released},
                  {"elapsed_s", static_cast<double>(now_ns() - t0) / 1e9}});
      }
    });
  const int64_t stop_ns = now_ns();
  {
    // The recording's interval, for the report's duration and rates.
    TraceMetadata m;
    m.options["stop_ns"] = std::to_string(stop_ns);
    queue_metadata(m);
  }
  for (auto& d : devices_) d->stop();
  // The host collector keeps passing records up to the stop time; the last
  // on_host_idle() from it (or this one) closes the host input.
  on_host_idle(stop_ns);
  merger_.close(host_input_);
  if (kernel_thread_.joinable()) {
    kernel_stop_ = true;
    kernel_thread_.join();
  }
  writer_stop_ = true;
  merger_.wake_writer();
  if (writer_thread_.joinable()) writer_thread_.join();
  Status closed = write_failed_ ? Status::ok() : write_side_queue();
  if (closed && !write_failed_) closed = writer_->close();
  done = true;
  if (reporter.joinable()) reporter.join();
  json j = status();
  j["state"] = "stopped";
  j["duration_s"] = static_cast<double>(stop_ns - start_ns_) / 1e9;
  j["stop_s"] = static_cast<double>(now_ns() - t0) / 1e9;
  if (!closed) {
    j["error"] = closed.message();
    spdlog::error("trace {}: {}", opts_.output, closed.message());
  }
  {
    std::lock_guard lock(stats_mu_);
    j["records"] = writer_->records_written();
    j["bytes"] = writer_->bytes_written();
    j["complete"] = closed.is_ok() && write_error_.empty();
  }
  spdlog::info("recording stopped: {} ({} records, {} bytes)", opts_.output,
               j["records"].get<uint64_t>(), j["bytes"].get<uint64_t>());
  return j;
}

json Recording::status() const {
  json devices = json::array();
  for (const auto& d : devices_) devices.push_back(d->status());
  json host = json::array();
  const double secs = std::max(1e-9, static_cast<double>(now_ns() - start_ns_) / 1e9);
  json j;
  {
    std::lock_guard lock(stats_mu_);
    for (const auto& [key, hs] : host_streams_)
      host.push_back({{"source", key.first},
                      {"stream", key.second},
                      {"app", hs.app},
                      {"records", hs.records},
                      {"bytes", hs.records * sizeof(perfq_record)},
                      {"lost", hs.lost},
                      {"rate_per_s", static_cast<double>(hs.records) / secs}});
    j = {{"state", stopped_ ? "stopping" : "recording"},
         {"output", opts_.output},
         {"elapsed_s", secs},
         {"records", records_written_},
         {"bytes", bytes_written_},
         {"host_records_before_start", before_start_}};
    if (opts_.duration_s > 0) j["duration_s"] = opts_.duration_s;
    if (!write_error_.empty()) j["error"] = write_error_;
  }
  const auto ms = merger_.stats();
  j["merge"] = {{"pending", ms.pending}, {"late", ms.late},
                {"watermark_lag_ms", ms.watermark ? static_cast<double>(now_ns() - ms.watermark) / 1e6 : 0.0},
                {"watermark_held_by", ms.held_by}};
  j["devices"] = devices;
  j["host_streams"] = host;
  j["kernel"] = kernel_status();
  return j;
}

}  // namespace perfqd
