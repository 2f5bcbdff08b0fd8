// pq-drain: the drain thread of one device in a recording (ARCHITECTURE.md,
// data flow step 4).
//
// Polls the host copy of the shared queue's tail; reads, validates and
// accounts every record (DeviceDrain, which publishes the head to both
// copies); converts device times to host time with the model its device's
// sync thread keeps (OnlineConverter: a time waits for a round after it);
// and pushes them into the recording's merge with a bound on what is still
// to come.  At the stop it takes everything the device published, waits
// (bounded) for a round that covers what still waits, and reports what it
// could not convert.
//
// Threading: start()/stop() from the recording's control thread; ended(),
// gone() and status() from any thread; the rest runs on the drain thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "host/drain.h"
#include "host/transport.h"
#include "merge.h"
#include "recording.h"
#include "sync/online_convert.h"
#include "sync_thread.h"

namespace perfqd {

class DeviceDrainThread {
 public:
  // backlog: records the shared queue held before the start, skipped unread.
  DeviceDrainThread(Recording& rec, uint16_t source, perfq::DeviceTransport& dev,
                    DeviceSyncThread& sync, uint64_t backlog);
  ~DeviceDrainThread() { stop(); }

  // The converter and the merge input (before the sync thread starts), then
  // the thread.
  void open_input(const RecordingOptions& o);
  void start();
  void request_stop() { stop_ = true; }
  void stop();  // request_stop(), then join

  // The drain has ended: the device stopped, went away or failed.
  bool ended() const;
  bool gone() const;
  nlohmann::json status() const;  // the device's status, without "sync"

  // The daemon's memory per device is bounded by these, not by the rate or
  // the recording's length (at 5 M records/s on 2 CPUs the daemon's peak RSS
  // was 61-70 MiB, 32 MiB of it the device's shared ring: docs/benchmarks.md).
  //
  // Device records waiting for a clock model are held, up to this many (5
  // MiB at 40 B a record: 26 ms at 5 M records/s, two on-demand rounds);
  // beyond it the drain leaves them in the device's ring (room_to_read()),
  // which holds the rest until a round covers them.  It was 1 Mi: at 3 M
  // records/s the daemon's peak RSS was 110 MiB, set in the first second.
  static constexpr size_t kMaxUnconverted = 1 << 17;
  // Records the merge may hold for the writer before drains stop reading:
  // 12 MiB at 48 B a record, four times what wakes the writer
  // (MergeOptions::wake_writer_at); a writer behind that (a slow disk, a
  // starved thread) leaves the records in the device's ring, whose overflow
  // the device counts.  It was 1 Mi (48 MiB).
  static constexpr size_t kMaxMergePending = 1 << 18;

  // Records waiting for a round after them beyond which the drain asks the
  // sync thread for the next round now (at most every kMinRoundGapMs): at
  // 5 M records/s, 10 ms of them rather than 100 ms.
  static constexpr size_t kRoundOnDemand = 65536;

 private:
  void run();
  long poll_once(perfq::DeviceDrain& drain, std::vector<perfq_record>& batch,
                 std::vector<perfq::TraceRecord>& out);
  size_t room_to_read();
  int64_t bound_after_poll(bool caught_up, int64_t t0, const perfq::ConversionModel* model) const;
  void drain_out(perfq::DeviceDrain& drain, std::vector<perfq_record>& batch,
                 std::vector<perfq::TraceRecord>& out);
  void finish(perfq::DeviceDrain& drain, std::vector<perfq::TraceRecord>& out);
  void show_counts(const perfq::DeviceDrain& drain);
  void admit(perfq::DeviceDrain& drain, std::vector<perfq::TraceRecord>& out, size_t from);
  // since_ns: when the state began (0: now); an early end is noted in the trace.
  void set_state(const std::string& state, const std::string& error, int64_t since_ns = 0);
  bool heartbeat_stopped(int64_t now);

  Recording& rec_;
  const uint16_t source_;
  perfq::DeviceTransport& dev_;
  DeviceSyncThread& sync_;
  RecordingOptions opts_;
  Merger::Input* input_ = nullptr;
  std::thread thread_;
  std::atomic<bool> stop_{false};

  perfq::OnlineConverter conv_;
  std::vector<perfq_sync_line_pub> lines_;  // poll_once()'s scratch
  bool draining_out_ = false;               // stopping: what waits is not capped
  StreamFrontier frontier_;                 // each stream's newest converted time in a poll
  uint64_t dropped_no_clock_ = 0;
  uint64_t before_start_ = 0;

  mutable std::mutex mu_;  // guards what status() reads
  std::string state_ = "starting";
  std::string error_;
  std::map<uint16_t, perfq::StreamAccount> accounts_;
  uint64_t records_ = 0, lost_ = 0, invalid_ = 0, unconverted_ = 0;
  // Records of the device from before the recording's start: the backlog
  // skipped at the start, and those stamped before it that came later.
  // Not in the trace and not losses.
  uint64_t before_start_shown_ = 0;
  uint64_t writer_waits_ = 0;  // polls skipped: the merge held kMaxMergePending records
  int64_t started_ns_ = now_ns();
  // The device collector's heartbeat as last read, and when it last moved.
  uint64_t last_beat_ = 0;
  int64_t beat_seen_at_ = 0;
  bool beat_moved_ = false;
};

}  // namespace perfqd
