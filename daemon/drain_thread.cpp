#include "drain_thread.h"

#include <pthread.h>

#include <spdlog/spdlog.h>
#include <algorithm>

#include "core/region.h"
#include "device/device.h"
#include "sync/sync.h"

namespace perfqd {

using namespace perfq;
using nlohmann::json;

namespace {

constexpr size_t kDrainBatch = 16384;
// The drain of a device that has been quiet for a second sleeps as long as
// its ring holds records at this rate (10 to 50 ms): each wakeup costs tens
// of microseconds on a VM, and an idle daemon should cost next to nothing.
// A burst faster than this right after a quiet second waits in the device's
// own queues, which keep the oldest records when full.
constexpr double kQuietDrainRate = 2e6;  // records per second

// A record the device dropped consumed its index (a gap) and is also
// reported by a LOST record: the same records, counted once.  A gap
// without a report (a device that lost records silently) still counts.
uint64_t stream_lost(const StreamAccount& a) { return std::max(a.lost_reported, a.gap_records); }

}  // namespace

DeviceDrainThread::DeviceDrainThread(Recording& rec, uint16_t source, DeviceTransport& dev,
                                     DeviceSyncThread& sync, uint64_t backlog)
    : rec_(rec), source_(source), dev_(dev), sync_(sync), conv_(OnlineConverter::Options{}) {
  before_start_ = backlog;
  before_start_shown_ = backlog;
}

void DeviceDrainThread::open_input(const RecordingOptions& o) {
  opts_ = o;
  OnlineConverter::Options co;
  co.source = source_;
  co.device_clock_hz = dev_.region().header().device_clock_hz;
  co.max_waiting = SIZE_MAX;  // poll_once() reads no more than kMaxUnconverted may wait
  // Rounds stop being taken (a device whose every round is loose): once
  // the first rounds' worth and a little more has gone by, what waits
  // converts with the model there is.
  co.stale_model_ns =
      static_cast<int64_t>(kMinModelRounds + 3) * o.sync_interval_ms * 1'000'000 + 200'000'000;
  co.on_back_step = [spec = dev_.spec()](uint16_t stream, int64_t ticks) {
    spdlog::info(
        "{}: the device clock went back {} ticks (stream {}): its times after that "
        "wait for the model to see the step",
        spec, ticks, stream);
  };
  conv_ = OnlineConverter(std::move(co));
  input_ = rec_.merger().add_input(dev_.spec(), now_ns() - o.device_grace_ns);
}

void DeviceDrainThread::start() {
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "pq-drain");
    run();
  });
}

void DeviceDrainThread::stop() {
  request_stop();
  if (thread_.joinable()) thread_.join();
}

bool DeviceDrainThread::ended() const {
  std::lock_guard lock(mu_);
  return state_ == "finished" || state_ == "gone" || state_ == "failed" || state_ == "silent";
}

bool DeviceDrainThread::gone() const {
  std::lock_guard lock(mu_);
  return state_ == "gone" || state_ == "failed";
}

json DeviceDrainThread::status() const {
  std::lock_guard lock(mu_);
  json streams = json::array();
  for (const auto& [id, a] : accounts_)
    streams.push_back({{"stream", id},
                       {"records", a.received},
                       {"bytes", a.received * sizeof(perfq_record)},
                       {"lost", stream_lost(a)}});
  // Records in the shared queue now: the device's tail less the head the
  // drain published, both read now (a head remembered at the last poll is
  // stale: the device refills what a poll frees, and such a head showed
  // fills above the capacity).  The tail first: the
  // device writes at most capacity past the head it saw, and the head only
  // grows, so tail - head <= capacity unless the device broke the protocol
  // (which the drain reports as corruption); clamped, as "full".
  const Region& region = dev_.region();
  const uint64_t tail = load_acquire(&region.host_ctrl()->tail_mirror);
  const uint64_t head = load_acquire(&region.host_ctrl()->head);
  const uint64_t fill = std::min(tail >= head ? tail - head : 0, region.ring_capacity());
  const double secs = std::max(1e-9, static_cast<double>(now_ns() - started_ns_) / 1e9);
  json j = {{"source", source_},
            {"device", dev_.spec()},
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
            {"streams", streams}};
  if (!error_.empty()) j["error"] = error_;
  return j;
}

// Records one poll may read.  With kMaxUnconverted records waiting for a
// clock model, leave the rest in the device's ring (and its queues, which
// count what overflows) rather than drop them here: a slow first model at
// millions of records a second must cost latency, not records.  At the
// stop, take all the device published (the ring bounds it).  With the
// writer kMaxMergePending records behind (a slow disk, a starved writer
// thread), leave the records in the ring, whose overflow the device counts,
// rather than grow without bound here.  Nothing read means no new promise
// either (poll_once()); the merge releases what is older than the last
// one, or than its max_delay.
size_t DeviceDrainThread::room_to_read() {
  const size_t cap = draining_out_ ? SIZE_MAX : kMaxUnconverted;
  const size_t waiting = conv_.waiting();
  size_t room = waiting < cap ? cap - waiting : 0;
  if (!draining_out_ && rec_.merger().pending_approx() >= kMaxMergePending) {
    room = 0;
    std::lock_guard lock(mu_);
    ++writer_waits_;
  }
  return room;
}

// Everything up to t0 has been read when the poll came back short; the
// device may still hold records up to its collector's latency.  What waits
// lands no earlier than OnlineConverter::waiting_bound().  A full poll (the
// drain is behind the device) read each of its streams up to some time:
// StreamFrontier.  Without that bound the merge could release nothing while
// the drain is behind, and the daemon would hold everything it read in
// memory until the merge's max_delay (2 s of records).
int64_t DeviceDrainThread::bound_after_poll(bool caught_up, int64_t t0,
                                            const ConversionModel* model) const {
  const int64_t bound =
      caught_up ? t0 - opts_.device_grace_ns : frontier_.bound(t0, opts_.device_grace_ns);
  return std::min(bound, conv_.waiting_bound(model, opts_.device_grace_ns));
}

// One poll: returns records consumed, or -1 when the drain must end.
long DeviceDrainThread::poll_once(DeviceDrain& drain, std::vector<perfq_record>& batch,
                                  std::vector<TraceRecord>& out) {
  const int64_t t0 = now_ns();
  batch.clear();
  const size_t room = room_to_read();
  auto n = room ? drain.poll(batch, std::min(kDrainBatch, room)) : Result<size_t>(size_t{0});
  const int64_t read_ns = now_ns();  // everything in batch was read before
  if (dev_.gone()) {
    // The mapping was revoked under us: what this poll read is not data.
    set_state("gone", dev_.spec() +
                          ": the device is gone (removed or reset); the trace "
                          "holds everything read before");
    return -1;
  }
  if (!n) {
    set_state("failed", n.status().message());
    return -1;
  }
  // Mode B: the lines the device converted with, for the bounds.
  lines_.clear();
  drain.new_lines(lines_);
  for (const auto& l : lines_) conv_.add_device_line(l);
  auto model = sync_.model();
  // A newer model (or the wait is over): what waits and it converts,
  // passed on in batches (no bound yet: what waits is older).
  while (!conv_.release(model, t0, out, kDrainBatch)) {
    admit(drain, out, 0);
    rec_.merger().push(input_, out, INT64_MIN);
  }
  admit(drain, out, 0);
  const size_t fresh = out.size();
  dropped_no_clock_ += conv_.feed(batch, model.get(), t0, read_ns, out, drain.last_lines());
  admit(drain, out, fresh);
  frontier_.clear();
  for (size_t i = fresh; i < out.size(); ++i) frontier_.note(out[i].rec.stream, out[i].time_ns);
  if (conv_.waiting() > kRoundOnDemand)
    sync_.want_round();
  else if (conv_.waiting() > 0)
    sync_.records_waiting();
  show_counts(drain);
  const bool caught_up = *n < std::min(kDrainBatch, room);
  rec_.merger().push(input_, out, bound_after_poll(caught_up, t0, model.get()));  // also: alive
  return static_cast<long>(*n);
}

// The drain's counters, for status().  Records: those the recording took
// (admit()), as the trace and the report count them: not the device's LOST
// records (counts, not records) nor what it published before the start.
void DeviceDrainThread::show_counts(const DeviceDrain& drain) {
  std::lock_guard lock(mu_);
  accounts_ = drain.streams();
  records_ = 0;
  lost_ = dropped_no_clock_;
  for (const auto& [id, a] : accounts_) {
    records_ += a.received;
    lost_ += stream_lost(a);
  }
  invalid_ = drain.invalid();
  before_start_shown_ = before_start_;
  unconverted_ = conv_.waiting();
}

// Converted records out[from..] enter the recording (and the drain's
// accounting) if they happened after the recording started; one from
// before (stamped before the start, delivered after it) is counted and
// dropped.
void DeviceDrainThread::admit(DeviceDrain& drain, std::vector<TraceRecord>& out, size_t from) {
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

void DeviceDrainThread::set_state(const std::string& state, const std::string& error,
                                  int64_t since_ns) {
  {
    std::lock_guard lock(mu_);
    state_ = state;
    error_ = error;
  }
  if (!error.empty()) spdlog::error("{}", error);
  // An end before the recording's: the trace says when and why.
  if (state == "gone" || state == "failed" || state == "silent")
    rec_.note_source_ended(source_, {state, since_ns ? since_ns : now_ns(), error});
}

// Whether the device's collector has stood still for the device timeout:
// its heartbeat (bumped on every pass, busy or idle) unchanged.  Judged
// only once it has been seen to move: a device that never bumps it is
// never called silent.
bool DeviceDrainThread::heartbeat_stopped(int64_t now) {
  const uint64_t beat = load_relaxed(&dev_.region().host_ctrl()->heartbeat);
  if (beat != last_beat_) {
    if (beat_seen_at_ != 0 || last_beat_ != 0) beat_moved_ = true;
    last_beat_ = beat;
    beat_seen_at_ = now;
    return false;
  }
  if (beat_seen_at_ == 0) beat_seen_at_ = now;
  return beat_moved_ && opts_.device_timeout_ns > 0 &&
         now - beat_seen_at_ > opts_.device_timeout_ns;
}

void DeviceDrainThread::run() {
  started_ns_ = now_ns();
  // Recording::start() skipped what the ring held before the start.
  DeviceDrain drain(dev_.region());
  set_state("recording", "");
  std::vector<perfq_record> batch;
  std::vector<TraceRecord> out;
  // Idle: back off to 1 ms sleeps, and once nothing came for a second to
  // as long as the ring holds at kQuietDrainRate.  Records coming in:
  // every 1 ms while a poll brings less than a quarter batch (4 M
  // records/s), back to back above that.
  const auto quiet_us = static_cast<int64_t>(
      std::clamp(static_cast<double>(dev_.region().ring_capacity()) / kQuietDrainRate * 1e6,
                 10'000.0, 50'000.0));
  Backoff idle(std::chrono::microseconds(1000), 64, std::chrono::microseconds(quiet_us),
               std::chrono::microseconds(1'000'000));
  bool ended = false;
  while (!stop_) {
    const long n = poll_once(drain, batch, out);
    if (n < 0) {
      ended = true;
      break;
    }
    // Read on every poll, so that its last move is known to within one.
    const int64_t polled = now_ns();
    const bool still = heartbeat_stopped(polled);
    if (n == 0) {
      if (drain.finished()) {
        set_state("finished", "");
        spdlog::info("{}: the device stopped; all it published was read", dev_.spec());
        ended = true;
        break;
      }
      if (still) {
        set_state("silent",
                  fmt::format("{}: the device stopped answering: its collector's heartbeat has "
                              "not moved for {:.1f} s (--device-timeout-ms {}), and its queue is "
                              "empty; the recording goes on without it, and the trace holds "
                              "everything it published before",
                              dev_.spec(), static_cast<double>(polled - beat_seen_at_) / 1e9,
                              opts_.device_timeout_ns / 1'000'000),
                  beat_seen_at_);
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
  if (!ended) drain_out(drain, batch, out);
  finish(drain, out);
}

// Stop: take everything the device already published.
void DeviceDrainThread::drain_out(DeviceDrain& drain, std::vector<perfq_record>& batch,
                                  std::vector<TraceRecord>& out) {
  draining_out_ = true;
  for (int i = 0; i < 4096; ++i) {
    const long n = poll_once(drain, batch, out);
    if (n <= 0) break;
  }
}

// Records waiting for a sync round after them: wait for one (bounded), then
// convert what is left with the newest model; close the input and report
// the device-side losses the device did not report itself (its LOST
// records are in the trace already).
void DeviceDrainThread::finish(DeviceDrain& drain, std::vector<TraceRecord>& out) {
  if (conv_.waiting() && !dev_.gone())
    sync_.cover([this](const ConversionModel& m) { return conv_.covers_waiting(m); });
  const auto last_model = sync_.model();
  const size_t left = conv_.finish(last_model.get(), out);
  admit(drain, out, 0);
  rec_.merger().push(input_, out, INT64_MIN);
  show_counts(drain);  // what the last conversions took (LOST records among them)
  if (left) {
    const std::string why = sync_.last_error();
    std::lock_guard lock(mu_);
    error_ = std::to_string(left) +
             " device records could not be converted (no clock model for their time: " +
             (why.empty() ? "too few sync rounds" : why) + "); they are not in the trace";
    lost_ += left;
    spdlog::error("{}: {}", dev_.spec(), error_);
  }
  {
    std::lock_guard lock(mu_);
    if (state_ == "recording") state_ = "stopped";
  }
  rec_.merger().close(input_);
  if (drain.invalid() > 0 && !dev_.gone())  // a revoked mapping reads as zeros
    spdlog::warn("{}: {} invalid device records dropped; first: {}", dev_.spec(), drain.invalid(),
                 drain.first_invalid());
  for (const auto& [id, a] : drain.streams())
    if (a.gap_records > a.lost_reported)
      rec_.queue_loss({source_, id, TraceLossReason::kSharedQueueFull,
                       a.gap_records - a.lost_reported, now_ns(), a.next_index});
}

}  // namespace perfqd
