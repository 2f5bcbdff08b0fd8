// perfqctl record: record one device into a trace file in the foreground,
// without a daemon (as `perf record` does).  A thin front end of the
// daemon's own recording pipeline (perfqd::Recording: the drain, sync and
// writer threads, the same conversion and merge): one recorder, whichever
// way it is started.
#include <signal.h>
#include <unistd.h>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <thread>

#include "commands.h"
#include "device/device.h"
#include "host/transport.h"
#include "recording.h"

namespace perfqctl {
namespace {

using namespace perfq;
using nlohmann::json;

struct RecordOptions {
  std::string device;
  std::string output;  // default_trace_name() when empty
  bool force = false;  // replace an existing output file
  double duration = 0;
  unsigned sync_interval_ms = 100;
  std::string sync_mode = "a";
};

volatile sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

int fail(const std::string& msg) {
  std::fprintf(stderr, "perfqctl record: %s\n", msg.c_str());
  return kExitFail;
}

// The device has said it runs, within 5 s (a device started just before us).
Status wait_running(const std::string& spec) {
  const uint64_t until = monotonic_ns() + 5'000'000'000ull;
  for (;;) {
    auto t = open_transport(spec);
    if (t && device_state(t.value()->region()) == PERFQ_DEVICE_RUNNING) return Status::ok();
    if (monotonic_ns() > until || g_stop)
      return t ? Status(Errc::kUnavailable, spec + ": the device is not running (state " +
                                                std::to_string(device_state(t.value()->region())) +
                                                ")")
               : t.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

bool devices_ended(const json& status) {
  if (!status.contains("devices") || status["devices"].empty()) return false;
  for (const auto& d : status["devices"]) {
    const std::string st = d.value("state", "");
    if (st != "finished" && st != "gone" && st != "failed") return false;
  }
  return true;
}

int run_record(const RecordOptions& o) {
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);
  // The pipeline logs through spdlog: its warnings and errors, to stderr.
  auto log = spdlog::stderr_color_st("perfqctl");
  log->set_pattern("perfqctl record: %l: %v");
  log->set_level(spdlog::level::warn);
  spdlog::set_default_logger(log);

  if (Status s = wait_running(o.device); !s) return fail(s.message());

  perfqd::RecordingOptions ro;
  const std::string output = o.output.empty() ? default_trace_name() : o.output;
  std::error_code ec;
  ro.output = std::filesystem::absolute(output, ec).string();
  if (ec) ro.output = output;
  ro.force = o.force;  // else an existing file is refused as it is created
  ro.devices = {o.device};
  ro.sync_interval_ms = o.sync_interval_ms;
  ro.sync_mode = o.sync_mode == "b" ? PERFQ_SYNC_MODE_B : PERFQ_SYNC_MODE_A;
  ro.duration_s = o.duration;
  ro.recorder = "perfqctl record";
  auto rec = perfqd::Recording::start(ro);
  if (!rec) return fail(rec.status().message());
  if (o.output.empty())
    std::fprintf(stderr, "perfqctl record: no -o given: the trace is %s\n", ro.output.c_str());
  // No applications: the host input never holds the merge back.
  rec.value()->suspend_host_input();

  const bool tty = isatty(2);
  auto next_progress = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (!g_stop && !rec.value()->wants_stop()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const json st = rec.value()->status();
    if (devices_ended(st)) break;  // the device stopped: everything it published is read
    if (tty && std::chrono::steady_clock::now() >= next_progress) {
      next_progress += std::chrono::seconds(1);
      const json& d = st["devices"][0];
      std::fprintf(stderr, "\rrecording %s: %.0f s, %llu records, %llu lost, sync rounds %llu%s   ",
                   o.device.c_str(), st.value("elapsed_s", 0.0),
                   static_cast<unsigned long long>(d.value("records", uint64_t{0})),
                   static_cast<unsigned long long>(d.value("lost", uint64_t{0})),
                   static_cast<unsigned long long>(d["sync"].value("rounds", uint64_t{0})),
                   d["sync"].value("synchronized", false) ? "" : " (not synchronized yet)");
    }
  }
  if (tty) std::fprintf(stderr, "\n");
  const json sum = rec.value()->stop();
  rec.value().reset();
  int rc = kExitOk;
  for (const auto& d : sum["devices"]) {
    if (d.contains("error")) {
      std::fprintf(stderr, "perfqctl record: %s: %s\n", d.value("device", "?").c_str(),
                   d["error"].get<std::string>().c_str());
      if (d.value("state", "") == "failed") rc = kExitFail;
    }
    if (d.value("invalid", uint64_t{0}) > 0)
      std::fprintf(stderr, "perfqctl record: %s: %llu invalid device records dropped\n",
                   d.value("device", "?").c_str(),
                   static_cast<unsigned long long>(d["invalid"].get<uint64_t>()));
    const json& sy = d["sync"];
    if (sy.value("failed_rounds", uint64_t{0}) > 0)
      std::fprintf(stderr, "perfqctl record: %llu sync rounds failed; last: %s\n",
                   static_cast<unsigned long long>(sy["failed_rounds"].get<uint64_t>()),
                   sy.value("last_error", "?").c_str());
  }
  if (sum.contains("error")) {
    std::fprintf(stderr, "perfqctl record: %s\n", sum["error"].get<std::string>().c_str());
    rc = kExitFail;
  }
  if (!sum.value("complete", false)) rc = kExitFail;
  const json& d0 = sum["devices"].empty() ? json::object() : sum["devices"][0];
  std::printf("wrote %s: %llu records, %llu sync rounds, %llu bytes%s\n", output.c_str(),
              static_cast<unsigned long long>(sum.value("records", uint64_t{0})),
              static_cast<unsigned long long>(
                  d0.contains("sync") ? d0["sync"].value("rounds", uint64_t{0}) : 0),
              static_cast<unsigned long long>(sum.value("bytes", uint64_t{0})),
              sum.value("complete", false) ? "" : " (INCOMPLETE)");
  return rc;
}

}  // namespace

void add_record_command(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<RecordOptions>();
  CLI::App* cmd = app.add_subcommand(
      "record",
      "Record one device into a trace file in the foreground, without the daemon, through the "
      "daemon's own recording pipeline: drain its ring, synchronize its clock, write records in "
      "host-time order. Stops on SIGINT/SIGTERM, after --duration, or when the device stops.");
  cmd->add_option("--device", o->device, "Device to record: " + std::string(kDeviceForms))
      ->required();
  cmd->add_option("-o,--output", o->output,
                  "Trace file to write; an existing one is refused unless --force (default: "
                  "perfq-YYYYMMDD-HHMMSS.trace here)");
  cmd->add_flag("--force", o->force, "Overwrite the -o file if it exists");
  cmd->add_option("--duration", o->duration, "Stop after S seconds")->check(duration_check());
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
