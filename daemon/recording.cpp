#include "recording.h"

#include <pthread.h>
#include <time.h>

#include <spdlog/spdlog.h>
#include <algorithm>
#include <chrono>
#include <climits>
#include <filesystem>
#include <map>

#include "device/device.h"
#include "drain_thread.h"
#include "host/drain.h"
#include "host/pci_scan.h"
#include "host/transport.h"
#include "sync_thread.h"

namespace perfqd {

using namespace perfq;
using nlohmann::json;

// ---------------------------------------------------------------------------
// One device of a recording: its transport, its sync thread (pq-sync,
// sync_thread.h) and its drain thread (pq-drain, drain_thread.h).

class DeviceThreads {
 public:
  DeviceThreads(Recording& rec, uint16_t source, std::unique_ptr<DeviceTransport> dev,
                uint64_t backlog)
      : source_(source),
        dev_(std::move(dev)),
        sync_(rec, source, *dev_, [this] { return drain_.ended(); }),
        drain_(rec, source, *dev_, sync_, backlog) {}
  ~DeviceThreads() { stop(); }

  // The device as the trace's metadata describes it.
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
    if (auto dict = read_dictionary(region)) src.events = std::move(dict.value());
    return src;
  }

  void start(const RecordingOptions& o) {
    drain_.open_input(o);
    sync_.start(o);
    drain_.start();
  }

  // Both threads are told at once: the drain's last rounds (cover()) wait
  // for the sync thread to have ended.
  void stop() {
    sync_.request_stop();
    drain_.request_stop();
    drain_.stop();
    sync_.stop();
  }

  json status() const {
    json j = drain_.status();
    j["sync"] = sync_.status();
    return j;
  }

 private:
  const uint16_t source_;
  std::unique_ptr<DeviceTransport> dev_;
  DeviceSyncThread sync_;
  DeviceDrainThread drain_;
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

struct OpenedDevices {
  std::vector<std::unique_ptr<DeviceTransport>> transports;
  std::vector<uint64_t> backlog;  // records each ring held before the start, skipped
};

// Opens and claims every device of the request; a device that cannot be
// opened, or one listed twice, fails the start.  What the rings hold now was
// published before the recording (by a device that ran before it, or for an
// earlier recording): skipped unread.  Records stamped before the start
// that arrive later are left out by their time (DeviceDrainThread::admit()).
Result<OpenedDevices> open_devices(const std::vector<std::string>& specs) {
  OpenedDevices d;
  std::map<std::string, std::string> seen;  // canonical path -> the spec that named it
  for (const auto& spec : specs) {
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
    d.transports.push_back(std::move(t.value()));
  }
  for (auto& t : d.transports) {
    auto skipped = DeviceDrain(t->region()).skip_backlog();
    if (!skipped)
      return Status(skipped.status().code(), t->spec() + ": " + skipped.status().message());
    d.backlog.push_back(*skipped);
    if (*skipped)
      spdlog::info("{}: {} records published before the start discarded", t->spec(), *skipped);
  }
  return d;
}

// CLOCK_MONOTONIC (the trace's host clock) and CLOCK_BOOTTIME read
// together: BOOTTIME between two MONOTONIC reads, the tightest of a few
// tries; the pair is the bracket's midpoint, good to its half-width.  Trace
// exports state the relation (Perfetto's ClockSnapshot) so perfq's times
// line up with other traces of the machine.
void describe_clocks(TraceMetadata& meta) {
  auto read = [](clockid_t id) {
    timespec ts{};
    clock_gettime(id, &ts);
    return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
  };
  int64_t best_width = INT64_MAX, mono = 0, boot = 0;
  for (int i = 0; i < 8; ++i) {
    const int64_t m1 = read(CLOCK_MONOTONIC);
    const int64_t b = read(CLOCK_BOOTTIME);
    const int64_t m2 = read(CLOCK_MONOTONIC);
    if (m2 - m1 < best_width) {
      best_width = m2 - m1;
      mono = m1 + (m2 - m1) / 2;
      boot = b;
    }
  }
  meta.options["clock_monotonic_ns"] = std::to_string(mono);
  meta.options["clock_boottime_ns"] = std::to_string(boot);
  meta.options["clock_pair_bound_ns"] = std::to_string((best_width + 1) / 2);
  // And against CLOCK_REALTIME: what lines this trace up with other hosts'.
  meta.host_clocks.push_back(read_host_clock());
}

// The recording's options as the trace's metadata states them.
void describe_options(const RecordingOptions& o, int64_t start_ns, TraceMetadata& meta) {
  meta.describe_this_host();
  meta.options["recorder"] = o.recorder;
  meta.options["sync_mode"] = std::string(o.sync_mode == PERFQ_SYNC_MODE_B ? "b" : "a");
  meta.options["sync_interval_ms"] = std::to_string(o.sync_interval_ms);
  meta.options["start_ns"] = std::to_string(start_ns);
  if (o.duration_s > 0) meta.options["duration_s"] = std::to_string(o.duration_s);
  if (o.ring_records) meta.options["host_ring_records"] = std::to_string(o.ring_records);
  if (!o.requested_by.empty()) meta.options["requested_by"] = o.requested_by;
  std::string devs;
  for (const auto& d : o.devices) devs += (devs.empty() ? "" : ",") + d;
  meta.options["devices"] = devs;
  describe_clocks(meta);
}

}  // namespace

Result<std::unique_ptr<Recording>> Recording::start(const RecordingOptions& o) {
  std::unique_ptr<Recording> rec(new Recording(o));
  auto opened = open_devices(o.devices);
  if (!opened) return opened.status();
  rec->start_ns_ = now_ns();
  rec->host_start_ns_ = rec->start_ns_;
  TraceMetadata& meta = rec->metadata_;
  describe_options(o, rec->start_ns_, meta);
  uint16_t source = 1;
  for (size_t i = 0; i < opened->transports.size(); ++i) {
    rec->devices_.push_back(std::make_unique<DeviceThreads>(
        *rec, source++, std::move(opened->transports[i]), opened->backlog[i]));
    meta.sources.push_back(rec->devices_.back()->describe());
  }
  if (Status k = rec->open_kernel_events(); !k) return k;
  if (Status w = rec->open_trace(); !w) return w;

  rec->host_input_ = rec->merger_.add_input("host", rec->start_ns_ - o.host_grace_ns);
  for (auto& d : rec->devices_) d->start(o);
  rec->start_kernel_thread();
  rec->writer_thread_ = std::thread([r = rec.get()] {
    pthread_setname_np(pthread_self(), "pq-writer");
    r->writer_main();
  });
  return rec;
}

bool Recording::wants_stop() const {
  if (write_failed_) return true;
  if (opts_.duration_s > 0 && now_ns() - start_ns_ >= static_cast<int64_t>(opts_.duration_s * 1e9))
    return true;
  return false;
}

json Recording::stop(const std::function<void(const json&)>& progress) {
  if (stopped_.exchange(true)) return status();
  const int64_t t0 = now_ns();
  // The reporter wakes at `done` (not at its next 250 ms tick): a stop
  // that takes 10 ms answers in 10 ms.
  std::mutex done_mu;
  std::condition_variable done_cv;
  bool done = false;
  std::thread reporter;
  if (progress)
    reporter = std::thread([&] {
      while (true) {
        {
          std::unique_lock lock(done_mu);
          if (done_cv.wait_for(lock, std::chrono::milliseconds(250), [&] { return done; })) break;
        }
        const auto ms = merger_.stats();
        progress({{"phase", "flushing"},
                  {"pending", ms.pending},
                  {"written", ms.released},
                  {"elapsed_s", static_cast<double>(now_ns() - t0) / 1e9}});
      }
    });
  const int64_t stop_ns = now_ns();
  {
    // The recording's interval, for the report's duration and rates, and
    // the host's clocks at its end.
    TraceMetadata m;
    m.options["stop_ns"] = std::to_string(stop_ns);
    m.host_clocks.push_back(read_host_clock());
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
  {
    std::lock_guard lock(done_mu);
    done = true;
  }
  done_cv.notify_all();
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
    // Records as the report counts them: a device's LOST records are
    // counts of records lost (in "lost"), not records.
    j["records"] = writer_->records_written() - loss_records_;
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
  j["merge"] = {
      {"pending", ms.pending},
      {"released", ms.released},  // taken by the writer: in the file at once
      {"late", ms.late},
      {"watermark_lag_ms", ms.watermark ? static_cast<double>(now_ns() - ms.watermark) / 1e6 : 0.0},
      {"watermark_held_by", ms.held_by}};
  j["devices"] = devices;
  j["host_streams"] = host;
  j["kernel"] = kernel_status();
  return j;
}

}  // namespace perfqd
