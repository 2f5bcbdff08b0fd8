// perfqctl record: record one device into a trace file in the foreground,
// without the daemon (as `perf record` does): drain the device's ring, run
// sync rounds, convert device times to host time with the model valid at
// each time, and append records in host-time order behind a watermark.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "commands.h"
#include "perfq/device.h"
#include "perfq/device_clock.h"
#include "perfq/drain.h"
#include "perfq/host_sync.h"
#include "perfq/pci_scan.h"
#include "perfq/trace.h"
#include "perfq/transport.h"

namespace perfqctl {
namespace {

using namespace perfq;

constexpr uint16_t kDeviceSource = 1;

struct RecordOptions {
  std::string device;
  std::string output = "perfq.trace";
  double duration = 0;
  unsigned sync_interval_ms = 100;
  std::string sync_mode = "a";
  double watermark_ms = 200;
};

volatile sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

int fail(const std::string& msg) {
  std::fprintf(stderr, "perfqctl record: %s\n", msg.c_str());
  return kExitFail;
}

int run_record(const RecordOptions& o) {
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);

  // Open the device and wait (a little) for it to say it runs.
  std::unique_ptr<DeviceTransport> dev;
  const uint64_t wait_until = monotonic_ns() + 5'000'000'000ull;
  while (!dev) {
    auto t = open_transport(o.device);
    if (t && device_state(t.value()->region()) == PERFQ_DEVICE_RUNNING) {
      dev = std::move(t.value());
      break;
    }
    if (monotonic_ns() > wait_until || g_stop)
      return fail(t ? o.device + ": the device is not running (state " +
                          std::to_string(device_state(t.value()->region())) + ")"
                    : t.status().message());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const Region& region = dev->region();

  TraceMetadata meta;
  meta.describe_this_host();
  meta.options["device"] = o.device;
  meta.options["sync_mode"] = o.sync_mode;
  meta.options["sync_interval_ms"] = std::to_string(o.sync_interval_ms);
  meta.options["recorder"] = "perfqctl record";
  TraceSource src;
  src.id = kDeviceSource;
  src.kind = TraceSourceKind::kDevice;
  src.name = region.device_name();
  src.clock_hz = region.header().device_clock_hz;
  src.timer_hz = region.header().timer_hz;
  if (auto pci = pci_device_for_spec(o.device); !pci) {
    std::fprintf(stderr, "perfqctl record: %s: no PCI facts in the trace: %s\n", o.device.c_str(),
                 pci.status().message().c_str());
  } else if (pci.value()) {
    src.pci = *pci.value();
    src.pci_address = src.pci->address;
    if (src.pci->pcie && src.pci->pcie->link_current)
      src.link = pci_link_name(*src.pci->pcie->link_current);
  }
  auto dict = read_dictionary(region);
  if (!dict) return fail(o.device + ": " + dict.status().message());
  for (const auto& e : *dict)
    src.events.push_back({e.event, static_cast<uint16_t>(e.kind), e.name});
  meta.sources.push_back(src);

  auto writer = TraceWriter::open(o.output, meta);
  if (!writer) return fail(writer.status().message());

  HostSyncOptions so;
  so.mode = o.sync_mode == "b" ? PERFQ_SYNC_MODE_B : PERFQ_SYNC_MODE_A;
  so.keep_rounds = 1;  // each round goes to the trace at once
  HostSync sync(*dev, so);
  DeviceDrain drain(region);

  std::vector<perfq_record> batch;
  std::vector<perfq_record> unconverted;  // device records waiting for a first model
  std::vector<TraceRecord> pending;       // converted, waiting for the watermark
  const bool tty = isatty(2);
  const uint64_t start = monotonic_ns();
  uint64_t next_round = start, next_progress = start + 1'000'000'000ull;
  uint64_t written = 0, failed_rounds = 0;
  const auto watermark_ns = static_cast<uint64_t>(o.watermark_ms * 1e6);
  std::string first_round_error;

  auto convert = [&](const perfq_record& r, TraceRecord* out) {
    out->source = kDeviceSource;
    out->rec = r;
    const unsigned dom = (r.flags & PERFQ_FLAGS_DOMAIN_MASK) >> PERFQ_FLAGS_DOMAIN_SHIFT;
    if (dom == PERFQ_CLOCK_DEVICE) {
      if (!sync.sync().has_model()) return false;
      out->time_ns = static_cast<int64_t>(sync.sync().to_host(r.time));
    } else {
      out->time_ns = static_cast<int64_t>(r.time);  // already host time (mode B)
    }
    return true;
  };
  auto flush_below = [&](uint64_t limit) -> Status {
    std::sort(pending.begin(), pending.end(),
              [](const TraceRecord& a, const TraceRecord& b) { return a.time_ns < b.time_ns; });
    auto cut = std::find_if(pending.begin(), pending.end(), [&](const TraceRecord& r) {
      return static_cast<uint64_t>(r.time_ns) >= limit;
    });
    const size_t n = static_cast<size_t>(cut - pending.begin());
    if (n == 0) return Status::ok();
    Status s = writer->append_records(std::span(pending.data(), n));
    written += n;
    pending.erase(pending.begin(), cut);
    return s;
  };

  bool device_done = false;
  Backoff idle(std::chrono::microseconds(2000));
  while (!g_stop && !device_done) {
    const uint64_t now = monotonic_ns();
    if (o.duration > 0 && now - start >= static_cast<uint64_t>(o.duration * 1e9)) break;
    if (now >= next_round) {
      auto r = sync.round();
      if (!r) {
        if (failed_rounds++ == 0) first_round_error = r.status().message();
      } else {
        const SyncRound& sr = sync.rounds().back();
        if (Status s = writer->append_sync_samples(trace_samples_of(kDeviceSource, sr)); !s)
          return fail(s.message());
        if (sync.sync().has_model()) {
          TraceClockModel m{kDeviceSource, static_cast<int64_t>(monotonic_ns()),
                            sync.sync().current().to_abi()};
          if (Status s = writer->append_clock_model(m); !s) return fail(s.message());
        }
      }
      next_round += o.sync_interval_ms * 1'000'000ull;
      if (next_round < now) next_round = now;
    }
    batch.clear();
    auto n = drain.poll(batch, 16384);
    if (dev->gone()) {
      // The device was removed: what this poll read is not data.  Finish
      // the trace with everything read before.
      std::fprintf(stderr, "perfqctl record: %s: the device is gone (removed or reset); the "
                   "trace keeps everything read before\n", o.device.c_str());
      batch.clear();
      break;
    }
    if (!n) return fail(n.status().message());
    for (const auto& r : batch) {
      TraceRecord tr;
      if (convert(r, &tr))
        pending.push_back(tr);
      else
        unconverted.push_back(r);
    }
    if (!unconverted.empty() && sync.sync().has_model()) {
      for (const auto& r : unconverted) {
        TraceRecord tr;
        if (convert(r, &tr)) pending.push_back(tr);
      }
      unconverted.clear();
    }
    if (Status s = flush_below(monotonic_ns() - watermark_ns); !s) return fail(s.message());
    if (*n == 0) {
      device_done = drain.finished();
      idle.wait();
    } else {
      idle.reset();
    }
    if (tty && monotonic_ns() >= next_progress) {
      next_progress += 1'000'000'000ull;
      const double unc = sync.sync().has_model() ? sync.sync().current().uncertainty_ns : 0;
      std::fprintf(stderr, "\rrecording %s: %.0f s, %llu records, sync rounds %u (+-%.0f ns)   ",
                   o.device.c_str(), static_cast<double>(monotonic_ns() - start) / 1e9,
                   static_cast<unsigned long long>(written + pending.size()), sync.rounds_done(),
                   unc);
    }
  }
  if (tty) std::fprintf(stderr, "\n");
  // Take what the device already published, then write everything.
  for (int i = 0; i < 1000 && !dev->gone(); ++i) {
    batch.clear();
    auto n = drain.poll(batch, 16384);
    if (!n || *n == 0) break;
    for (const auto& r : batch) {
      TraceRecord tr;
      if (convert(r, &tr)) pending.push_back(tr);
      else unconverted.push_back(r);
    }
  }
  if (!unconverted.empty())
    std::fprintf(stderr,
                 "perfqctl record: %zu device records could not be converted (no clock model: "
                 "%s); they are not in the trace\n",
                 unconverted.size(),
                 first_round_error.empty() ? "too few sync rounds" : first_round_error.c_str());
  if (drain.invalid() > 0)
    std::fprintf(stderr, "perfqctl record: %llu invalid device records dropped; first: %s\n",
                 static_cast<unsigned long long>(drain.invalid()), drain.first_invalid().c_str());
  if (Status s = flush_below(UINT64_MAX); !s) return fail(s.message());
  if (Status s = writer->close(); !s) return fail(s.message());
  if (failed_rounds)
    std::fprintf(stderr, "perfqctl record: %llu sync rounds failed; first: %s\n",
                 static_cast<unsigned long long>(failed_rounds), first_round_error.c_str());
  std::printf("wrote %s: %llu records, %u sync rounds, %llu bytes\n", o.output.c_str(),
              static_cast<unsigned long long>(written), sync.rounds_done(),
              static_cast<unsigned long long>(writer->bytes_written()));
  return kExitOk;
}

}  // namespace

void add_record_command(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<RecordOptions>();
  CLI::App* cmd = app.add_subcommand(
      "record",
      "Record one device into a trace file in the foreground, without the daemon: drain its "
      "ring, synchronize its clock, write records in host-time order. Stops on SIGINT/SIGTERM, "
      "after --duration, or when the device stops.");
  cmd->add_option("--device", o->device, "Device: shm:PATH")->required();
  cmd->add_option("-o,--output", o->output, "Trace file to write")->capture_default_str();
  cmd->add_option("--duration", o->duration, "Stop after S seconds")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--sync-interval-ms", o->sync_interval_ms, "Time between sync rounds")
      ->capture_default_str()
      ->check(CLI::Range(1u, 60000u));
  cmd->add_option("--sync-mode", o->sync_mode,
                  "a: the host converts device times; b: the device converts them")
      ->capture_default_str()
      ->check(CLI::IsMember({"a", "b"}));
  cmd->callback([o, &exit_code] { exit_code = run_record(*o); });
}

}  // namespace perfqctl
