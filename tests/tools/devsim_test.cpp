// perfq-devsim and perfq-demo-app as real processes, with a host reader in
// the test process, over a /dev/shm region.
#include <signal.h>

#include <catch2/catch.hpp>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "core/region.h"
#include "device/device.h"
#include "device/device_clock.h"
#include "host/drain.h"
#include "host/transport.h"
#include "test_util.h"

namespace perfq {
namespace {

constexpr double kRateScale = kSanitized ? 0.25 : 1;  // lighter loads where they are slower

// Open the region once the device has created it and says it is running.
Region wait_for_region(const std::string& path, Child& dev) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (true) {
    auto r = Region::open(path);
    if (r.is_ok() && device_state(*r) != PERFQ_DEVICE_INIT) return std::move(r.value());
    INFO("devsim stderr: " << dev.err());
    REQUIRE(dev.running());
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

struct Drained {
  std::vector<perfq_record> records;
  std::map<uint16_t, StreamAccount> streams;
  uint64_t invalid = 0;
};

// Drain until the device says it stopped and nothing is left.  `stall`
// makes a slow reader: a pause after every small batch.
Drained drain_all(const Region& region, Child& dev, std::chrono::microseconds stall = {},
                  size_t batch = 4096) {
  DeviceDrain drain(region);
  Drained d;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!drain.finished()) {
    const size_t before = d.records.size();
    auto n = drain.poll(d.records, batch);
    REQUIRE(n.is_ok());
    for (size_t i = before; i < d.records.size(); ++i) drain.account(d.records[i]);
    if (stall.count()) std::this_thread::sleep_for(stall);
    if (*n == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
    if (std::chrono::steady_clock::now() > deadline) FAIL("drain did not finish: " << dev.err());
  }
  d.streams = drain.streams();
  d.invalid = drain.invalid();
  return d;
}

nlohmann::json finish(Child& dev) {
  REQUIRE(dev.wait(std::chrono::seconds(60)));
  INFO("devsim stderr: " << dev.err());
  REQUIRE(dev.exit_code() == 0);
  const std::string out = dev.out();
  REQUIRE(std::count(out.begin(), out.end(), '\n') == 1);  // exactly one JSON line
  return nlohmann::json::parse(out);
}

TEST_CASE("devsim: at a moderate rate every emitted record arrives in order", "[devsim][process]") {
  TempShm shm("devsim-ok");
  const auto rate = static_cast<uint64_t>(40000 * kRateScale);
  Child dev({kBin + "/perfq-devsim", "--region", shm.path(), "--create", "--workers", "3", "--rate",
             std::to_string(rate), "--duration", "1.5"});
  REQUIRE(dev.started());
  Region region = wait_for_region(shm.path(), dev);
  Drained d = drain_all(region, dev);
  auto js = finish(dev);

  CHECK(d.invalid == 0);
  CHECK(js["dropped"] == 0);
  CHECK(js["emitted"].get<uint64_t>() > rate / 2);
  uint64_t received = 0;
  for (const auto& s : js["streams"]) {
    const auto id = s["stream"].get<uint16_t>();
    const uint64_t emitted = s["emitted"];
    INFO("stream " << id);
    if (emitted == 0) continue;
    const StreamAccount& a = d.streams.at(id);
    CHECK(a.received == emitted);
    CHECK(a.gap_records == 0);  // contiguous indices
    CHECK(a.out_of_order == 0);
    CHECK(a.next_index == emitted);
    received += a.received;
  }
  CHECK(received == js["emitted"].get<uint64_t>());
  // The dictionary names the events the records use.
  auto dict = read_dictionary(region);
  REQUIRE(dict.is_ok());
  std::set<uint32_t> known;
  for (const auto& e : *dict) known.insert(e.event);
  for (const auto& r : d.records) REQUIRE(known.count(r.event) == 1);
}

TEST_CASE("devsim: overload is accounted exactly and does not slow the workers",
          "[devsim][process]") {
  TempShm shm("devsim-overload");
  const double rate = 200000 * kRateScale, duration = 2.0;
  Child dev({kBin + "/perfq-devsim", "--region", shm.path(), "--create", "--ring-records", "64",
             "--queue-records", "256", "--workers", "2", "--job-workers", "0", "--rate",
             std::to_string(rate), "--duration", std::to_string(duration)});
  REQUIRE(dev.started());
  Region region = wait_for_region(shm.path(), dev);
  // A slow reader: 32 records, then a 2 ms pause.
  Drained d = drain_all(region, dev, std::chrono::milliseconds(2), 32);
  auto js = finish(dev);

  const uint64_t emitted = js["emitted"], dropped = js["dropped"];
  CHECK(dropped > 0);
  uint64_t received = 0, lost = 0;
  for (const auto& s : js["streams"]) {
    const auto id = s["stream"].get<uint16_t>();
    const uint64_t e = s["emitted"], dr = s["dropped"];
    const StreamAccount& a = d.streams.at(id);
    INFO("stream " << id);
    // Both ways of counting agree with the device, exactly.
    CHECK(a.received + a.lost_reported == e);
    CHECK(a.lost_reported == dr);
    CHECK(a.received + a.gap_records + (e - a.next_index) == e);
    received += a.received;
    lost += a.lost_reported;
  }
  CHECK(emitted == received + dropped);
  CHECK(lost == dropped);
  // The workers kept their pace while the host stalled.
  const double achieved = static_cast<double>(emitted) / js["duration_s"].get<double>();
  CHECK(achieved > 0.8 * rate);
}

TEST_CASE("devsim: timer reads answer inside the bracket, and time out on a stopped device",
          "[devsim][process][timer]") {
  TempShm shm("devsim-timer");
  Child dev({kBin + "/perfq-devsim", "--region", shm.path(), "--create", "--rate", "0",
             "--job-workers", "0", "--workers", "1", "--clock-jitter-ns", "1000"});
  REQUIRE(dev.started());
  { Region r = wait_for_region(shm.path(), dev); }
  auto t = open_transport("shm:" + shm.path());
  REQUIRE(t.is_ok());
  // The default timer is R = CLOCK_MONOTONIC ns: H1 <= R <= H2.  What is
  // checked is that devsim answers, not how soon: a sanitizer build beside
  // another test may leave devsim without a CPU for longer than the
  // daemon's 50 ms, so the reads here wait up to a second.
  constexpr auto kPatient = std::chrono::seconds(1);
  uint64_t read = 0;
  for (int round = 0; round < 5; ++round) {
    auto s = (*t)->clock_samples(round + 1, PERFQ_SYNC_MAX_SAMPLES, kPatient);
    INFO(s.status().message());
    REQUIRE(s.is_ok());
    REQUIRE(s->size() >= DeviceTransport::kMinRoundSamples);
    read += s->size();
    for (const auto& x : *s) {
      CHECK(x.before <= x.value);
      CHECK(x.value <= x.after);
    }
  }
  dev.signal(SIGSTOP);
  // Stopping is asynchronous: wait until the kernel says it is stopped.
  for (int i = 0; i < 1000; ++i) {
    const std::string st = slurp("/proc/" + std::to_string(dev.pid()) + "/stat");
    const auto p = st.rfind(')');
    if (p != std::string::npos && p + 2 < st.size() && st[p + 2] == 'T') break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const uint64_t t0 = monotonic_ns();
  auto s = (*t)->clock_samples(100, 4, std::chrono::milliseconds(50));
  const uint64_t waited = monotonic_ns() - t0;
  dev.signal(SIGCONT);
  REQUIRE_FALSE(s.is_ok());
  CHECK(s.status().code() == Errc::kTimeout);
  CHECK(s.status().message().find(shm.path()) != std::string::npos);
  CHECK(waited < 2'000'000'000ull);  // a clear error, not a hang
  // The device answers again once it runs (once it is given a CPU).
  auto again = (*t)->clock_samples(101, 8, kPatient);
  INFO(again.status().message());
  REQUIRE(again.is_ok());
  dev.signal(SIGTERM);
  auto js = finish(dev);
  CHECK(js["signal"] != "none");
  CHECK(js["timer_reads_served"].get<uint64_t>() >= read + again->size());
}

// The host converts a device time once a sync round after it is in its
// model, so after the collector has published its last records (state
// STOPPED) devsim keeps its timer answering while the host asks, and
// exits once it stops asking.  Before, the timer stopped with the
// collector, and every recording ended with the records after the last
// round forced, without a bound (45 ms of them in a 200 k/s run).
TEST_CASE("devsim: the timer answers after the collector stops, until the host stops asking",
          "[devsim][process][timer]") {
  TempShm shm("devsim-linger");
  Child dev({kBin + "/perfq-devsim", "--region", shm.path(), "--create", "--rate", "1000",
             "--job-workers", "0", "--workers", "1", "--duration", "0.3"});
  REQUIRE(dev.started());
  { Region r = wait_for_region(shm.path(), dev); }
  auto t = open_transport("shm:" + shm.path());
  REQUIRE(t.is_ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (device_state((*t)->region()) != PERFQ_DEVICE_STOPPED) {
    INFO("devsim stderr: " << dev.err());
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    // Rounds every 50 ms keep it answering (a daemon's, every 100 ms).
    auto s = (*t)->clock_samples(1, 8);
    REQUIRE(s.is_ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  // Stopped: rounds still work, for as long as they keep coming.
  for (uint32_t round = 2; round < 12; ++round) {
    auto s = (*t)->clock_samples(round, 8);
    INFO(s.status().message());
    REQUIRE(s.is_ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  // Then no more: it exits (300 ms without a round; at most 2 s in all).
  const uint64_t t0 = monotonic_ns();
  auto js = finish(dev);
  const double waited = static_cast<double>(monotonic_ns() - t0) / 1e9;
  CHECK(waited < 10);
  CHECK(js["timer_lingered_s"].get<double>() >= 0.25);
  CHECK(js["timer_lingered_s"].get<double>() <= 2.5);
}

TEST_CASE("devsim: with --wait-host the workers emit only once the host opens a sync round",
          "[devsim][process]") {
  TempShm shm("devsim-wait");
  const auto rate = static_cast<uint64_t>(20000 * kRateScale);
  Child dev({kBin + "/perfq-devsim", "--region", shm.path(), "--create", "--workers", "2", "--rate",
             std::to_string(rate), "--duration", "0.5", "--wait-host"});
  REQUIRE(dev.started());
  Region region = wait_for_region(shm.path(), dev);
  // No host yet: at this rate a worker that did not wait would have
  // published thousands of records within the 300 ms.
  const uint64_t waited_from = monotonic_ns();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK(load_acquire(&region.host_ctrl()->tail_mirror) == 0);
  CHECK(load_acquire(&region.dev_ctrl()->tail) == 0);
  // The host's first sync round starts them; --duration counts from there.
  auto t = open_transport("shm:" + shm.path());
  REQUIRE(t.is_ok());
  REQUIRE((*t)->clock_samples(1, 8).is_ok());
  const Drained d = drain_all(region, dev);
  const auto js = finish(dev);
  INFO("devsim: " << js.dump());
  const double waited = js["waited_for_host_s"].get<double>();
  CHECK(waited >= 0.3);
  CHECK(waited <= static_cast<double>(monotonic_ns() - waited_from) / 1e9 + 10);
  CHECK(js["duration_s"].get<double>() >= 0.5);
  CHECK(js["emitted"].get<uint64_t>() > 0);
  CHECK(js["dropped"] == 0);
  CHECK(d.records.size() == js["emitted"].get<uint64_t>());
}

TEST_CASE("devsim + demo-app: every job runs once with its start/end pair on the device",
          "[devsim][process][jobs]") {
  TempShm shm("devsim-jobs");
  Child dev({kBin + "/perfq-devsim", "--region", shm.path(), "--create", "--rate", "1000",
             "--job-workers", "2"});
  REQUIRE(dev.started());
  Region region = wait_for_region(shm.path(), dev);
  const uint64_t jobs = 600;
  Child app({kBin + "/perfq-demo-app", "--device", "shm:" + shm.path(), "--jobs",
             std::to_string(jobs), "--threads", "3", "--job-us", "30"});
  REQUIRE(app.started());

  // Drain while the jobs run; stop the device once the app is done.
  DeviceDrain drain(region);
  std::vector<perfq_record> recs;
  bool app_done = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!drain.finished()) {
    auto n = drain.poll(recs);
    REQUIRE(n.is_ok());
    if (!app_done && app.wait(std::chrono::milliseconds(0))) {
      app_done = true;
      dev.signal(SIGTERM);
    }
    if (*n == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
    REQUIRE(std::chrono::steady_clock::now() < deadline);
  }
  INFO("demo-app stderr: " << app.err());
  REQUIRE(app.exit_code() == 0);
  auto appjs = nlohmann::json::parse(app.out());
  CHECK(appjs["submitted"] == jobs);
  CHECK(appjs["completed"] == jobs);
  CHECK(appjs["unknown_completions"] == 0);
  auto devjs = finish(dev);
  CHECK(devjs["jobs_completed"] == jobs);
  CHECK(devjs["dropped"] == 0);

  std::map<uint64_t, std::pair<int, int>> seen;            // corr id -> (starts, ends)
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> span;  // corr id -> (start, end)
  for (const auto& r : recs) {
    if (r.event == 1) {
      ++seen[r.arg].first;
      span[r.arg].first = r.time;
    } else if (r.event == 2) {
      ++seen[r.arg].second;
      span[r.arg].second = r.time;
    }
  }
  CHECK(seen.size() == jobs);
  uint64_t bad = 0;
  for (const auto& [corr, c] : seen) {
    if (c.first != 1 || c.second != 1) ++bad;
    if (span[corr].second < span[corr].first + 30'000) ++bad;  // ran for the requested time
  }
  CHECK(bad == 0);
}

TEST_CASE("devsim: bad arguments are refused with a message", "[devsim][process]") {
  TempShm shm("devsim-args");
  SECTION("missing region") {
    Child dev({kBin + "/perfq-devsim", "--region", shm.path(), "--duration", "1"});
    REQUIRE(dev.wait(std::chrono::seconds(10)));
    CHECK(dev.exit_code() == 1);
    CHECK(dev.err().find(shm.path()) != std::string::npos);
  }
  SECTION("ring not a power of two") {
    Child dev(
        {kBin + "/perfq-devsim", "--region", shm.path(), "--create", "--ring-records", "1000"});
    REQUIRE(dev.wait(std::chrono::seconds(10)));
    CHECK(dev.exit_code() == 1);
    CHECK(dev.err().find("power of two") != std::string::npos);
  }
  SECTION("unpaired clock step") {
    Child dev({kBin + "/perfq-devsim", "--region", shm.path(), "--create", "--clock-step-at", "1"});
    REQUIRE(dev.wait(std::chrono::seconds(10)));
    CHECK(dev.exit_code() == 2);
  }
}

}  // namespace
}  // namespace perfq
