// One recording of the daemon: from `perfqctl start` to `perfqctl stop`.
// This file starts, stops and reports it; each of its threads lives in a
// file of its own (docs/architecture.md):
//   - per device, the drain thread pq-drain (drain_thread.h) and the sync
//     thread pq-sync (sync_thread.h), owned together by DeviceThreads
//     (recording.cpp);
//   - with kernel events, the kernel collector pq-kernel (kernel_collect.cpp):
//     drains the BPF ring buffer into the merger as one more host input;
//   - the writer thread pq-writer (writer_thread.cpp): releases records from
//     the merger behind its watermark and appends them, with metadata, sync
//     data and losses, to the trace file.
// Host application records arrive from the daemon's host collector thread
// pq-collect through on_host_records() (host_collect.cpp; the collector
// outlives recordings: applications connect whenever they like).
//
// Threading: start() and stop() from one control thread at a time;
// status() from any thread; on_host_* from the host collector thread only.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "kernel_events.h"
#include "merge.h"
#include "perfq/perfq_abi.h"
#include "perfq/status.h"
#include "perfq/trace.h"

namespace perfqd {

// The longest recording a duration may ask for, in seconds (about 4 months).
inline constexpr double kMaxDurationS = 1e7;

struct RecordingOptions {
  std::string output;                // absolute path of the trace file
  bool force = false;                // replace an existing file at output (else refused)
  std::vector<std::string> devices;  // transport specs
  unsigned sync_interval_ms = 100;
  perfq_sync_mode sync_mode = PERFQ_SYNC_MODE_A;
  double duration_s = 0;                      // 0: until stopped
  uint64_t ring_records = 0;                  // host app ring size in use (for the metadata)
  int64_t device_grace_ns = 100'000'000;      // device records may trail the drain by this
  int64_t host_grace_ns = 10'000'000;         // host records may trail the collector by this
  int64_t device_timeout_ns = 2'000'000'000;  // heartbeat still this long: stopped (0: never)
  MergeOptions merge;
  perfq::TraceWriterOptions writer;
  uid_t owner_uid = 0;  // the trace file is created as this user
  gid_t owner_gid = 0;
  std::string requested_by;               // "uid 1000 (pid 42)"
  std::string recorder = "perfq-daemon";  // who records (trace metadata)
  KernelEventOptions kernel;              // BPF host kernel events, if any
};

class DeviceThreads;

class Recording {
 public:
  // Opens every device (a device that cannot be opened fails the start with
  // its reason) and the trace file, then starts the threads.
  static perfq::Result<std::unique_ptr<Recording>> start(const RecordingOptions& opts);
  ~Recording();  // stops if still running

  // Stop the devices and the host input, write everything pending, close the
  // file.  Returns the summary (also when a device failed on the way: the
  // trace is complete up to what arrived; errors are listed).  `progress`,
  // if set, is called about every 250 ms while stopping.
  nlohmann::json stop(const std::function<void(const nlohmann::json&)>& progress = {});

  // The duration elapsed, or the trace file cannot be written any more: the
  // daemon should stop this recording.
  bool wants_stop() const;
  nlohmann::json status() const;
  const RecordingOptions& options() const { return opts_; }
  int64_t start_ns() const { return start_ns_; }
  // What the recording goes on without (kernel events it could not load).
  const std::vector<std::string>& warnings() const { return warnings_; }

  // Host collector thread.
  void on_host_sources(const std::vector<perfq::TraceSource>& sources);
  void on_host_records(uint16_t source, std::span<const perfq_record> records);
  void on_host_losses(const std::vector<perfq::TraceLoss>& losses);
  void on_host_idle(int64_t bound);  // everything the collector will still pass is >= bound
  // No application is connected: the host input does not hold the merge's
  // watermark back while the collector sleeps.  resume_host_input() (any
  // thread) must come before an application that connects may record.
  void suspend_host_input();
  void resume_host_input();
  // Host records older than this are left out (set when the collector
  // starts passing records to this recording).
  void set_host_start(int64_t t);

  // From the device threads: things for the writer thread.
  void queue_sync(std::vector<perfq::TraceSyncSample> samples, const perfq::TraceClockModel* model);
  void queue_loss(const perfq::TraceLoss& loss);
  void queue_metadata(const perfq::TraceMetadata& m);
  // A device's records ended before the recording (gone, failed, silent):
  // the trace's metadata says so for its source.  Once per source.
  void note_source_ended(uint16_t source, perfq::TraceSourceEnd end);
  Merger& merger() { return merger_; }

 private:
  explicit Recording(const RecordingOptions& opts);
  // pq-writer (writer_thread.cpp).
  perfq::Status open_trace();
  void writer_main();
  // pq-kernel (kernel_collect.cpp): fails only for a request at fault.
  perfq::Status open_kernel_events();
  void start_kernel_thread();
  void kernel_main();
  nlohmann::json kernel_status() const;
  perfq::Status write_side_queue();

  RecordingOptions opts_;
  int64_t start_ns_ = 0;
  perfq::TraceMetadata metadata_;
  std::unique_ptr<perfq::TraceWriter> writer_;
  Merger merger_;
  std::vector<std::unique_ptr<DeviceThreads>> devices_;
  std::vector<std::string> warnings_;

  // Kernel events (none when not asked for or not available).
  std::unique_ptr<KernelEvents> kernel_;
  std::string kernel_error_;
  Merger::Input* kernel_input_ = nullptr;
  std::thread kernel_thread_;
  std::atomic<bool> kernel_stop_{false};
  std::atomic<uint64_t> kernel_records_{0}, kernel_dropped_{0};
  mutable std::mutex kernel_mu_;       // guards traced_pids_
  std::vector<uint32_t> traced_pids_;  // registered applications traced so far

  // Host input (host collector thread).
  Merger::Input* host_input_ = nullptr;
  std::vector<perfq::TraceRecord> host_batch_;
  std::map<uint16_t, std::string> host_names_;

  // Writer side queue.
  mutable std::mutex side_mu_;
  std::vector<perfq::TraceSyncSample> side_samples_;
  std::vector<perfq::TraceClockModel> side_models_;
  std::vector<perfq::TraceLoss> side_losses_;
  std::vector<perfq::TraceMetadata> side_metadata_;

  // Statistics, guarded by stats_mu_.
  mutable std::mutex stats_mu_;
  struct HostStream {
    std::string app;
    uint64_t records = 0;
    uint64_t lost = 0;
    int64_t last_ns = 0;
  };
  std::map<std::pair<uint16_t, uint16_t>, HostStream> host_streams_;
  std::string write_error_;
  uint64_t records_written_ = 0;  // as the report counts them: LOST records left out
  uint64_t bytes_written_ = 0;
  uint64_t loss_records_ = 0;  // LOST records written (a device's counts of records it lost)
  uint64_t before_start_ = 0;  // host records older than the start, left out
  int64_t host_start_ns_ = 0;

  std::thread writer_thread_;
  std::atomic<bool> writer_stop_{false};
  std::atomic<bool> write_failed_{false};
  std::atomic<bool> stopped_{false};
};

}  // namespace perfqd
