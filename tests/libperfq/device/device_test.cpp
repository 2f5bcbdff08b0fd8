// Tests of the device side (device.h, device_clock.h, timer.h, jobq.h,
// drain.h) with real threads over a real /dev/shm region.
#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "core/region.h"
#include "device/device.h"
#include "device/device_clock.h"
#include "device/timer.h"
#include "host/drain.h"
#include "host/host_sync.h"
#include "host/transport.h"
#include "jobq.h"
#include "sync/sync_buffer.h"
#include "test_util.h"

namespace perfq {
namespace {

constexpr uint64_t kScale = kSanitized ? 4 : 1;  // smaller runs where they are slower

Region make_region(const TempShm& shm, uint64_t capacity) {
  RegionGeometry g;
  g.ring_capacity = capacity;
  g.features = PERFQ_FEAT_TIMER_REQRESP | PERFQ_FEAT_JOB_QUEUE;
  auto r = Region::create(shm.path(), g);
  REQUIRE(r.is_ok());
  return std::move(r.value());
}

TEST_CASE("sim clock: D and R are exact functions of the true time", "[device][clock]") {
  SimClockConfig c;
  c.offset_ns = -5'000'000'000'000;  // any signed offset
  c.drift_ppm = 100;
  c.timer_hz = 25'000'000;
  c.timer_offset = 1000;
  const uint64_t t0 = 10'000'000'000;
  c.steps = {{t0 + 1000, -300}, {t0 + 2000, 7000}};
  SimClock clk(c);
  // D(t) = t + offset + t*drift, modulo 2^64.
  CHECK(clk.device_time_at(t0) == t0 - 5'000'000'000'000ull + 1'000'000);
  CHECK(clk.device_time_at(t0 + 1000) == t0 + 1000 - 5'000'000'000'000ull + 1'000'000 - 300);
  CHECK(clk.device_time_at(t0 + 2000) == t0 + 2000 - 5'000'000'000'000ull + 1'000'000 - 300 + 7000);
  // R(t) = offset + t * (1 + drift) * hz / 1e9.
  CHECK(clk.timer_at(t0) == 1000 + 250'025'000);
  // A negative offset bigger than t wraps instead of failing.
  SimClockConfig w;
  w.offset_ns = -static_cast<int64_t>(t0) - 1;
  CHECK(SimClock(w).device_time_at(t0) == ~uint64_t{0});
}

TEST_CASE("sim clock: its drift is the exact product, rounded, for any time and drift",
          "[device][clock]") {
  std::mt19937_64 rng(11);
  for (double ppm : {0.0, 0.001, -0.5, 40.0, -1000.0, 999.999, 12345.678, -99999.0, 250000.0}) {
    SimClockConfig c;
    c.drift_ppm = ppm;
    SimClock clk(c);
    for (int i = 0; i < 2000; ++i) {
      // Times from boot-like to 1970-like to the top of the range.
      const uint64_t t = rng() >> (rng() % 40);
      const long double exact = static_cast<long double>(t) * ppm / 1e6L;
      const auto drift = static_cast<int64_t>(clk.device_time_at(t) - t);
      INFO("ppm " << ppm << " t " << t);
      CHECK(std::fabs(static_cast<long double>(drift) - exact) <= 1.0L);
    }
  }
}

TEST_CASE("device: workers, collector and host drain account for every record",
          "[device][stress]") {
  TempShm shm("dev-e2e");
  Region region = make_region(shm, 4096);
  SimClock clock({});
  const unsigned kWorkers = 3;
  const uint64_t per_worker = 300'000 / kScale;
  std::vector<std::unique_ptr<DeviceQueue>> streams;
  std::vector<DeviceQueue*> raw;
  for (unsigned i = 0; i < kWorkers; ++i) {
    streams.push_back(std::make_unique<DeviceQueue>(i, 1024, clock));
    raw.push_back(streams.back().get());
  }
  DeviceCollector collector(region, raw, clock);
  std::atomic<bool> stop_device{false};
  std::thread col([&] { collector.run(stop_device); });
  set_device_state(region, PERFQ_DEVICE_RUNNING);
  std::vector<std::thread> workers;
  std::atomic<uint64_t> worker_drops{0};
  for (unsigned i = 0; i < kWorkers; ++i)
    workers.emplace_back([&, i] {
      for (uint64_t k = 0; k < per_worker; ++k) {
        if (!raw[i]->record(7, PERFQ_KIND_INSTANT, k)) worker_drops.fetch_add(1);
        if ((k & 63) == 63) std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    });

  auto host = Region::open(shm.path());
  REQUIRE(host.is_ok());
  DeviceDrain drain(*host);
  std::vector<perfq_record> got;
  std::vector<uint64_t> next_arg(kWorkers, 0);
  uint64_t bad_order = 0;
  bool joined = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!drain.finished() && std::chrono::steady_clock::now() < deadline) {
    got.clear();
    auto n = drain.poll(got);
    REQUIRE(n.is_ok());
    for (const auto& r : got) drain.account(r);
    for (const auto& r : got) {
      if ((r.flags & PERFQ_FLAGS_KIND_MASK) == PERFQ_KIND_LOST) continue;
      if (r.arg < next_arg[r.stream]) ++bad_order;  // per-stream order kept
      next_arg[r.stream] = r.arg + 1;
    }
    if (!joined && got.empty()) {
      bool all = true;
      for (auto* s : raw) all = all && s->emitted() == per_worker;
      if (all) {
        for (auto& w : workers) w.join();
        joined = true;
        stop_device = true;
      }
      std::this_thread::yield();
    }
  }
  if (!joined)
    for (auto& w : workers) w.join();
  stop_device = true;
  col.join();
  REQUIRE(drain.finished());
  REQUIRE(bad_order == 0);
  REQUIRE(drain.invalid() == 0);
  for (unsigned i = 0; i < kWorkers; ++i) {
    const StreamAccount& a = drain.streams().at(static_cast<uint16_t>(i));
    INFO("stream " << i);
    // Every record arrived, or its loss was reported: nothing unaccounted.
    CHECK(a.received + a.lost_reported == per_worker);
    CHECK(a.lost_reported == raw[i]->dropped());
    CHECK(a.gap_records + (per_worker - a.next_index) == raw[i]->dropped());
    CHECK(a.out_of_order == 0);
  }
}

TEST_CASE("device: overload keeps the oldest data and reports every loss", "[device]") {
  TempShm shm("dev-overload");
  Region region = make_region(shm, 64);  // a tiny shared ring
  SimClock clock({});
  DeviceQueue s0(0, 128, clock), s1(1, 128, clock);
  DeviceCollector collector(region, {&s0, &s1}, clock);
  std::atomic<bool> stop_device{false}, stop_workers{false};
  std::thread col([&] { collector.run(stop_device); });
  std::atomic<uint64_t> worker_ns{0};
  auto work = [&](DeviceQueue& s) {
    const uint64_t t0 = monotonic_ns();
    for (uint64_t k = 0; k < 200'000 / kScale; ++k) (void)s.record(3, PERFQ_KIND_INSTANT, k);
    worker_ns.fetch_add(monotonic_ns() - t0);
  };
  std::thread w0([&] { work(s0); }), w1([&] { work(s1); });

  // A slow host: drains a little, then stalls.
  DeviceDrain drain(region);
  std::vector<perfq_record> got;
  for (int i = 0; i < 50; ++i) {
    got.clear();
    REQUIRE(drain.poll(got, 16).is_ok());
    for (const auto& r : got) drain.account(r);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  w0.join();
  w1.join();
  stop_device = true;
  while (!drain.finished()) {
    got.clear();
    REQUIRE(drain.poll(got).is_ok());
    for (const auto& r : got) drain.account(r);
  }
  col.join();

  uint64_t dropped_total = 0;
  for (DeviceQueue* s : {&s0, &s1}) {
    const StreamAccount& a = drain.streams().at(s->id());
    const StreamDelivery& d = collector.delivery()[s->id()];
    INFO("stream " << s->id());
    CHECK(d.undelivered == 0);  // the host drained to the end
    CHECK(s->dropped() > 0);
    // emitted = received + dropped, exactly, counted two ways.
    CHECK(a.received + a.lost_reported == s->emitted());
    CHECK(a.received + a.gap_records + (s->emitted() - a.next_index) == s->emitted());
    CHECK(a.out_of_order == 0);
    dropped_total += s->dropped();
  }
  CHECK(dropped_total > 0);
}

TEST_CASE("timer: every answer lies inside its bracket", "[device][timer]") {
  TempShm shm("timer");
  Region region = make_region(shm, 64);
  SimClockConfig c;
  c.timer_hz = GENERATE(1'000'000'000ull, 19'200'000ull, 3'000'000'000ull);
  c.timer_offset = 123456789;
  c.drift_ppm = GENERATE(0.0, -250.0);
  c.jitter_ns = 2000;
  SimClock clock(c);
  TimerServer server(region, clock);
  std::atomic<bool> stop{false};
  std::thread srv([&] { server.run(stop); });

  auto host = Region::open(shm.path());
  REQUIRE(host.is_ok());
  TimerReader reader(*host);
  reader.open_window(7);
  uint64_t outside = 0;
  std::vector<perfq_clock_sample> samples;
  for (int i = 0; i < 500; ++i) {
    auto s = reader.read(std::chrono::milliseconds(200));
    REQUIRE(s.is_ok());
    samples.push_back(*s);
  }
  reader.close_window();
  // The device publishes its own samples of round 7 once the window closes.
  // (A read that meets the write in progress retries; only the device
  // thread writes, so it finishes.)
  Result<SampleBatch> batch = Status(Errc::kTimeout, "");
  for (int i = 0; i < 5000; ++i) {
    batch = read_sample_batch(&host->sync()->device_samples);
    if (batch.is_ok() && batch->round == 7) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  stop = true;
  srv.join();
  REQUIRE(batch.is_ok());
  REQUIRE(batch->round == 7);
  REQUIRE(batch->samples.size() == PERFQ_SYNC_MAX_SAMPLES);
  for (const auto& d : batch->samples) {
    CHECK(d.before <= d.after);  // R read before and after D
    // D lies between the device times at the R bracket's true times.
    const auto t_of = [&](uint64_t r) {
      return static_cast<uint64_t>(static_cast<long double>(r - c.timer_offset) * 1e9L /
                                   c.timer_hz / (1 + c.drift_ppm / 1e6L));
    };
    CHECK(d.value + 2 >= clock.device_time_at(t_of(d.before)));
    CHECK(d.value <= clock.device_time_at(t_of(d.after)) + 2);
  }
  for (const auto& s : samples) {
    // R at the bracket's ends, from the clock's own definition (monotonic).
    if (s.value < clock.timer_at(s.before) || s.value > clock.timer_at(s.after)) ++outside;
    CHECK(s.before <= s.after);
  }
  CHECK(outside == 0);
  CHECK(server.served() == 500);
}

TEST_CASE("timer: a read with no device answering times out clearly", "[device][timer]") {
  TempShm shm("timer-dead");
  Region region = make_region(shm, 64);
  TimerReader reader(region);
  reader.open_window(1);
  const uint64_t t0 = monotonic_ns();
  auto s = reader.read(std::chrono::milliseconds(30));
  const uint64_t waited = monotonic_ns() - t0;
  REQUIRE_FALSE(s.is_ok());
  CHECK(s.status().code() == Errc::kTimeout);
  CHECK(s.status().message().find("timed out") != std::string::npos);
  CHECK(waited >= 30'000'000);
  CHECK(waited < 5'000'000'000);
}

// A device that answers `answers` timer requests of the window, then stops
// (preempted for good, or hung): a bare server over the timer page.
// `last` is the request tag before any read (taken before the thread
// starts: a read may be posted before the thread first looks).
void serve_then_stop(const Region& region, uint64_t last, uint64_t answers,
                     const std::atomic<bool>& stop) {
  perfq_timer_page* t = region.timer();
  for (uint64_t served = 0; served < answers && !stop.load();) {
    const uint64_t req = load_acquire(&t->req_tag);
    if (req == last) {
      std::this_thread::yield();
      continue;
    }
    store_relaxed(&t->resp_value, monotonic_ns());
    store_release(&t->resp_tag, req);
    last = req;
    ++served;
  }
}

// serve_then_stop on its own thread, stopped however the test ends.
struct StoppingServer {
  StoppingServer(const Region& region, uint64_t answers)
      : thread([&region, answers, this, tag0 = load_acquire(&region.timer()->req_tag)] {
          serve_then_stop(region, tag0, answers, stop);
        }) {}
  ~StoppingServer() {
    stop = true;
    thread.join();
  }
  std::atomic<bool> stop{false};
  std::thread thread;
};

TEST_CASE("timer: a device that stops answering partway leaves the round what it read",
          "[device][timer]") {
  TempShm shm("timer-partial");
  Region region = make_region(shm, 64);
  auto t = open_transport("shm:" + shm.path());
  REQUIRE(t.is_ok());
  const uint64_t answers = DeviceTransport::kMinRoundSamples + GENERATE(as<uint64_t>{}, 0, 7);
  StoppingServer srv(region, answers);
  const uint64_t t0 = monotonic_ns();
  auto s = (*t)->clock_samples(3, 48, std::chrono::milliseconds(30));
  const uint64_t took = monotonic_ns() - t0;
  INFO(s.status().message());
  REQUIRE(s.is_ok());
  CHECK(s->size() == answers);
  for (const auto& x : *s) {
    CHECK(x.before <= x.value);
    CHECK(x.value <= x.after);
  }
  CHECK(took < 2'000'000'000ull);      // one timed-out read, not 37 of them
  CHECK(region.timer()->window == 0);  // the window is closed
}

TEST_CASE("timer: a round with fewer answers than it needs fails with what it read",
          "[device][timer]") {
  TempShm shm("timer-short");
  Region region = make_region(shm, 64);
  auto t = open_transport("shm:" + shm.path());
  REQUIRE(t.is_ok());
  StoppingServer srv(region, DeviceTransport::kMinRoundSamples - 1);
  auto s = (*t)->clock_samples(4, 48, std::chrono::milliseconds(30));
  REQUIRE_FALSE(s.is_ok());
  CHECK(s.status().code() == Errc::kTimeout);
  std::string read = std::to_string(DeviceTransport::kMinRoundSamples - 1);
  read.append(" of 48 samples read");
  CHECK(s.status().message().find(read) != std::string::npos);
  CHECK(s.status().message().find(shm.path()) != std::string::npos);
}

// A device's timer server on its own thread, stopped however the test ends.
struct RunningTimer {
  RunningTimer(const Region& region, const DeviceClock& clock,
               TimerServer::Options o = TimerServer::Options{})
      : server(region, clock, o), thread([this] { server.run(stop); }) {}
  ~RunningTimer() { finish(); }
  void finish() {
    stop = true;
    if (thread.joinable()) thread.join();
  }
  TimerServer server;
  std::atomic<bool> stop{false};
  std::thread thread;
};

// A region with a running timer server and the host's transport to it.
struct ServedRegion {
  explicit ServedRegion(const char* name) : shm(name), region(make_region(shm, 64)) {
    auto t = open_transport("shm:" + shm.path());
    INFO(t.status().message());
    REQUIRE(t.is_ok());
    transport = std::move(*t);
  }
  TempShm shm;
  Region region;
  SimClock clock{SimClockConfig{}};
  RunningTimer timer{region, clock};
  std::unique_ptr<DeviceTransport> transport;
};

TEST_CASE("host sync: a recorder keeps only the last rounds' samples", "[device][timer][sync]") {
  ServedRegion sr("sync-keep");
  const size_t keep = GENERATE(as<size_t>{}, 1, 3, SIZE_MAX);
  HostSyncOptions o;
  o.samples = 8;
  o.keep_rounds = keep;
  HostSync hs(*sr.transport, o);
  const uint32_t n = 25;
  for (uint32_t i = 0; i < n; ++i) {
    auto r = hs.round();
    INFO(r.status().message());
    REQUIRE(r.is_ok());
    // The last round is always there, with its own samples.
    REQUIRE_FALSE(hs.rounds().empty());
    CHECK(hs.rounds().back().round == hs.rounds_done());
    CHECK(hs.rounds().back().host.size() <= 8);
    CHECK(hs.rounds().back().host.size() >= DeviceTransport::kMinRoundSamples);
    CHECK(hs.rounds().size() <= std::min<size_t>(2 * keep, i + 1));
    CHECK(hs.rounds().size() >= std::min<size_t>(keep, i + 1));
  }
  sr.timer.finish();
  // Oldest first, consecutive.
  for (size_t i = 1; i < hs.rounds().size(); ++i)
    CHECK(hs.rounds()[i].round == hs.rounds()[i - 1].round + 1);
  if (keep == SIZE_MAX) CHECK(hs.rounds().size() == n);
}

// A round reads until `enough` of its reads were tight (at most delay_ns
// between their brackets), never fewer than kMinRoundSamples; no read
// that tight, all n.
TEST_CASE("timer: a round ends its reads once enough were tight", "[device][timer][sync]") {
  ServedRegion sr("timer-enough");
  const size_t want = GENERATE(as<size_t>{}, 1, 6, 12);
  auto s = sr.transport->clock_samples(1, 48, std::chrono::milliseconds(30), {want, UINT64_MAX});
  INFO(s.status().message());
  REQUIRE(s.is_ok());
  CHECK(s->size() == std::max(want, DeviceTransport::kMinRoundSamples));
  // Nothing takes 0 ns between its brackets: every read.
  s = sr.transport->clock_samples(2, 48, std::chrono::milliseconds(30), {want, 0});
  REQUIRE(s.is_ok());
  CHECK(s->size() == 48);
  CHECK(sr.region.timer()->window == 0);
}

// HostSync asks for fewer reads once it knows how tight this device's reads
// are (16 rounds), never fewer than enough_reads or kMinRoundSamples; with
// enough_reads 0 every round reads all.
TEST_CASE("host sync: rounds end their reads once enough were as tight as usual",
          "[device][timer][sync]") {
  ServedRegion sr("sync-enough");
  const size_t enough = GENERATE(as<size_t>{}, 0, 12);
  HostSyncOptions o;
  o.enough_reads = enough;
  HostSync hs(*sr.transport, o);
  size_t early = 0, later = 0;
  for (uint32_t i = 0; i < 60; ++i) {
    auto r = hs.round();
    INFO(r.status().message());
    REQUIRE(r.is_ok());
    const size_t reads = hs.rounds().back().host.size();
    CHECK(reads >= std::max(enough, DeviceTransport::kMinRoundSamples));
    if (i < 16)
      early += reads;
    else
      later += reads;
  }
  INFO("reads: " << early << " in the first 16 rounds, " << later << " in the 44 after");
  CHECK(early == 16 * 48);  // nothing known yet: every read
  // Idle here, rounds read 17 times on average; a busy machine cuts fewer
  // short or none (a sanitizer's reads, or another test's load, are too
  // uneven), so that rounds are cut is checked with made-up reads ("host
  // sync: rounds ask for enough reads as tight as the usual best").
  if (enough == 0) CHECK(later == 44 * 48);
}

// The SDK's side of a round the host announced (perfq_timer_page's
// next_window_us and serving), with R moved by hand: asleep until `lead`
// before the window is due, awake (serving set: the host opens the window
// without a wakeup) until `grace` after, then asleep for good; nothing
// announced, or an announcement beyond an hour, is none.
TEST_CASE("timer: the server is awake for the round the host announced, and only then",
          "[device][timer]") {
  TempShm shm("timer-announce");
  Region region = make_region(shm, 64);
  const uint64_t hz = GENERATE(as<uint64_t>{}, 1'000'000'000, 62'500'000, PERFQ_CLOCK_HZ_MAX);
  perfq_region_header h = region.header();
  h.timer_hz = hz;
  uint64_t r = UINT64_MAX - 3'000'000;  // R: wraps on the way
  const perfq_dev_port port{[](void*) -> uint64_t { return 0; },
                            [](void* c) { return *static_cast<uint64_t*>(c); }, &r};
  perfq_dev_timer t;
  perfq_dev_timer_init(&t, region.base(), &h, &port);
  const perfq_timer_page* page = region.timer();
  TimerReader reader(region);
  auto idle = [&] { return perfq_dev_timer_idle_us(&t, 200, 1000); };
  uint64_t closed = 0;
  auto after_close_us = [&](uint64_t us) {
    r = closed + us / 1000 * hz / 1000 + us % 1000 * hz / 1'000'000;
  };
  auto round = [&](uint32_t n) {
    const bool awake = reader.open_window(n);
    CHECK(perfq_dev_timer_poll(&t) == PERFQ_DEV_TIMER_WAITING);
    reader.close_window();
    closed = r;
    CHECK(perfq_dev_timer_poll(&t) == PERFQ_DEV_TIMER_PUBLISHED);
    CHECK(perfq_dev_timer_poll(&t) == PERFQ_DEV_TIMER_CLOSED);
    return awake;
  };

  reader.announce_window(std::chrono::milliseconds(10));
  CHECK(idle() == UINT64_MAX);  // no window closed yet: 10 ms after what?
  CHECK_FALSE(round(1));        // the server was asleep: woken
  after_close_us(1000);
  CHECK(idle() == 8801);  // until 200 us before the 10 ms (rounded up)
  CHECK(page->serving == 0);
  after_close_us(9850);
  CHECK(idle() == 0);
  CHECK(page->serving == 1);
  after_close_us(10900);  // the host is late, within the grace
  CHECK(idle() == 0);
  CHECK(round(2));        // opened without a wakeup
  after_close_us(11100);  // announced 10 ms again; 1.1 ms late: asleep
  CHECK(idle() == UINT64_MAX);
  CHECK(page->serving == 0);
  after_close_us(10000);  // used up
  CHECK(idle() == UINT64_MAX);
  CHECK_FALSE(round(3));
  // Withdrawn, or beyond an hour: none.
  for (uint32_t us : {0u, 3'600'000'001u, UINT32_MAX}) {
    region.timer()->next_window_us = us;
    after_close_us(us == 0 ? 100 : 3'600'000'000);
    CHECK(idle() == UINT64_MAX);
    CHECK(page->serving == 0);
  }
}

// With the real server thread: a round announced 30 ms ahead finds it
// awake, not long before; the round works; and it sleeps again after.
TEST_CASE("host sync: the device is awake for an announced round", "[device][timer][sync]") {
  TempShm shm("timer-announced");
  Region region = make_region(shm, 64);
  SimClock clock{SimClockConfig{}};
  TimerServer::Options o;
  o.grace = std::chrono::seconds(2);  // a test thread may be late on a busy machine
  RunningTimer timer(region, clock, o);
  auto tr = open_transport("shm:" + shm.path());
  REQUIRE(tr.is_ok());
  HostSyncOptions ho;
  ho.samples = 8;
  HostSync hs(**tr, ho);
  REQUIRE(hs.round().is_ok());
  const perfq_timer_page* page = region.timer();
  const auto asleep_soon = [&] {  // after a round: the server goes to sleep on its own time
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (__atomic_load_n(&page->serving, __ATOMIC_ACQUIRE) == 1 &&
           std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    return __atomic_load_n(&page->serving, __ATOMIC_ACQUIRE) == 0;
  };
  for (int i = 0; i < 3; ++i) {
    REQUIRE(asleep_soon());
    const auto announced = std::chrono::steady_clock::now();
    hs.next_round_in(std::chrono::milliseconds(30));
    while (__atomic_load_n(&page->serving, __ATOMIC_ACQUIRE) == 0 &&
           std::chrono::steady_clock::now() - announced < std::chrono::seconds(5))
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    const auto awake = std::chrono::steady_clock::now() - announced;
    const double awake_ms = std::chrono::duration<double, std::milli>(awake).count();
    INFO("round " << i << ": awake " << awake_ms << " ms after the announcement");
    REQUIRE(__atomic_load_n(&page->serving, __ATOMIC_ACQUIRE) == 1);
    CHECK(awake >= std::chrono::microseconds(29'700));  // lead 200 us
    auto r = hs.round();
    INFO(r.status().message());
    REQUIRE(r.is_ok());
  }
  hs.next_round_in(std::chrono::microseconds(0));  // nothing more: asleep
  CHECK(asleep_soon());
}

// A device whose rounds are made up: every host read of a round takes
// `delay_ns` but the loose ones (every 4th, 20x as long); R and D are the
// host's time.  Records what HostSync asked of each round.
class MadeUpRounds final : public DeviceTransport {
 public:
  explicit MadeUpRounds(Region region) : region_(std::move(region)) {}
  const std::string& spec() const override { return spec_; }
  const Region& region() const override { return region_; }
  Result<std::vector<perfq_clock_sample>> clock_samples(uint32_t round, size_t n,
                                                        std::chrono::microseconds,
                                                        EnoughReads enough) override {
    asked.push_back(enough);
    const uint64_t t0 = 1'000'000'000 + uint64_t{round} * 100'000'000;
    std::vector<perfq_clock_sample> host(n);
    for (size_t i = 0; i < n; ++i) {
      const uint64_t d = i % 4 == 3 ? 20 * delay_ns : delay_ns;
      host[i] = {t0 + i * 10'000, t0 + i * 10'000 + d / 2, t0 + i * 10'000 + d, 0};
    }
    const perfq_clock_sample dev{t0 + 5'000, t0 + 5'050, t0 + 5'100, 0};
    write_sample_batch(&region_.sync()->device_samples, round, std::span(&dev, 1));
    return host;
  }
  uint64_t delay_ns = 400;
  std::vector<EnoughReads> asked;

 private:
  std::string spec_ = "made-up";
  Region region_;
};

// What HostSync asks of a round (EnoughReads, which the shm transport
// honours: "timer: a round ends its reads once enough were tight"): all
// reads until 16 rounds are known, then enough_reads within the selection's
// margin (max(50 ns, 10 %)) of the lower quartile of the last 64 rounds'
// tightest read, which follows the device as its reads get tighter.
TEST_CASE("host sync: rounds ask for enough reads as tight as the usual best", "[device][sync]") {
  TempShm shm("sync-enough-made-up");
  Region region = make_region(shm, 64);
  MadeUpRounds dev(std::move(region));
  const size_t enough = GENERATE(as<size_t>{}, 0, 6, 12);
  HostSyncOptions o;
  o.enough_reads = enough;
  HostSync hs(dev, o);
  for (int i = 0; i < 80; ++i) {
    if (i == 40) dev.delay_ns = 200;  // tighter from here
    auto r = hs.round();
    INFO("round " << i << ": " << r.status().message());
    REQUIRE(r.is_ok());
    CHECK(hs.rounds().back().host.size() == 48);
  }
  REQUIRE(dev.asked.size() == 80);
  for (size_t i = 0; i < 80; ++i) {
    INFO("round " << i);
    const EnoughReads& a = dev.asked[i];
    if (enough == 0 || i < 16) {
      CHECK(a.reads == 0);
      continue;
    }
    CHECK(a.reads == enough);
    // 400 ns until the rounds at 200 ns from the 40th on are over a
    // quarter of those before (14 of 54), then 200 ns; plus 50.
    CHECK(a.delay_ns == (i < 54 ? 450u : 250u));
  }
}

TEST_CASE("timer: the server sleeps between windows", "[device][timer]") {
  TempShm shm("timer-sleep");
  Region region = make_region(shm, 64);
  SimClock clock({});
  RunningTimer timer(region, clock);
  // Measure the server thread's CPU time over a quiet period.
  timespec a, b;
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
  timer.finish();
  const double cpu_ms = (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6;
  CHECK(cpu_ms < 30);  // a spinning server would burn all 300 ms
  CHECK(timer.server.windows() == 0);
}

TEST_CASE("job queue: channels are claimed, used and released", "[device][jobs]") {
  TempShm shm("jobq");
  Region region = make_region(shm, 64);
  auto dq = JobQueue::format(region.app_area(), 4);
  REQUIRE(dq.is_ok());
  auto hq = JobQueue::attach(region.app_area());
  REQUIRE(hq.is_ok());
  CHECK(hq->channels() == 4);
  CHECK(hq->ring_capacity() >= 16);

  const uint64_t me = static_cast<uint64_t>(getpid());
  std::vector<HostJobChannel> claimed;
  for (int i = 0; i < 4; ++i) {
    auto c = hq->claim(me);
    REQUIRE(c.is_ok());
    claimed.push_back(std::move(c.value()));
  }
  auto none = hq->claim(me);
  REQUIRE_FALSE(none.is_ok());
  CHECK(none.status().message().find("all 4 channels") != std::string::npos);

  // A job round trip on channel 2.
  HostJobChannel& ch = claimed[2];
  REQUIRE(ch.submit(perfq_job{42, 1000, 5, 0}));
  const perfq_dev_jobq dev = dq->device();
  perfq_job job;
  REQUIRE(perfq_dev_jobq_take(&dev, ch.index(), &job));
  CHECK(job.corr_id == 42);
  CHECK_FALSE(perfq_dev_jobq_take(&dev, ch.index(), &job));  // one job, taken once
  const perfq_job_completion done{42, 10, 20, 0, 0};
  REQUIRE(perfq_dev_jobq_complete(&dev, ch.index(), &done));
  perfq_job_completion c;
  REQUIRE(ch.poll_completion(&c));
  CHECK(c.corr_id == 42);
  CHECK(c.end_time == 20);

  claimed.pop_back();  // releases channel 3
  auto again = hq->claim(me);
  REQUIRE(again.is_ok());
  CHECK(again->index() == 3);
}

TEST_CASE("job queue: a dead owner's channel can be claimed again", "[device][jobs]") {
  TempShm shm("jobq-dead");
  Region region = make_region(shm, 64);
  auto q = JobQueue::format(region.app_area(), 1);
  REQUIRE(q.is_ok());
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    auto c = q->claim(static_cast<uint64_t>(getpid()));
    _exit(c.is_ok() ? 0 : 1);  // exits without releasing (as if killed)
  }
  int st = 0;
  REQUIRE(waitpid(child, &st, 0) == child);
  REQUIRE(WEXITSTATUS(st) == 0);
  auto c = q->claim(static_cast<uint64_t>(getpid()));
  REQUIRE(c.is_ok());
}

TEST_CASE("job queue: a corrupt queue header is refused", "[device][jobs][hostile]") {
  TempShm shm("jobq-bad");
  Region region = make_region(shm, 64);
  REQUIRE(JobQueue::format(region.app_area()).is_ok());
  auto* h = reinterpret_cast<perfq_jobq_header*>(region.app_area().data());
  SECTION("stride runs past the area") { h->channel_stride = 1ull << 40; }
  SECTION("capacity not a power of two") { h->ring_capacity = 100; }
  SECTION("no channels") { h->channels = 0; }
  SECTION("magic") { h->magic = 0; }
  auto q = JobQueue::attach(region.app_area());
  REQUIRE_FALSE(q.is_ok());
  CHECK(q.status().code() == Errc::kCorrupt);
}

TEST_CASE("dictionary: published by the device, validated by the host", "[device][hostile]") {
  TempShm shm("dict");
  Region region = make_region(shm, 64);
  std::vector<EventInfo> ev = {{0, PERFQ_KIND_LOST, "perfq_lost"},
                               {1, PERFQ_KIND_BEGIN, "job_start"},
                               {9, PERFQ_KIND_COUNTER, "queue_depth"}};
  REQUIRE(publish_dictionary(region, ev).is_ok());
  auto got = read_dictionary(region);
  REQUIRE(got.is_ok());
  REQUIRE(got->size() == 3);
  CHECK((*got)[2].name == "queue_depth");
  CHECK((*got)[2].kind == PERFQ_KIND_COUNTER);

  auto* entries = reinterpret_cast<perfq_dict_entry*>(region.dict() + 1);
  SECTION("count beyond capacity") { region.dict()->count = 100000; }
  SECTION("name without NUL") { std::memset(entries[1].name, 'x', PERFQ_EVENT_NAME_LEN); }
  SECTION("bad kind") { entries[2].kind = 77; }
  auto bad = read_dictionary(region);
  REQUIRE_FALSE(bad.is_ok());
  CHECK(bad.status().message().find("device dictionary") != std::string::npos);
}

// A device declares an event's arg a byte count (PERFQ_DEV_ARG_BYTES in the
// SDK, PERFQ_DICT_ARG_BYTES in the region); the host names it "bytes" and
// ignores flags it does not know.
TEST_CASE("dictionary: an event whose arg is a byte count", "[device][hostile]") {
  TempShm shm("dictbytes");
  Region region = make_region(shm, 64);
  const std::vector<EventInfo> ev = {{1, PERFQ_KIND_BEGIN, "dma", {"bytes"}},
                                     {2, PERFQ_KIND_INSTANT, "tick"}};
  REQUIRE(publish_dictionary(region, ev).is_ok());
  auto* entries = reinterpret_cast<perfq_dict_entry*>(region.dict() + 1);
  CHECK(entries[0].flags == PERFQ_DICT_ARG_BYTES);
  CHECK(entries[0].kind == PERFQ_KIND_BEGIN);
  CHECK(entries[1].flags == 0);
  auto got = read_dictionary(region);
  REQUIRE(got.is_ok());
  CHECK(*got == ev);

  // Firmware's way: the SDK's kind bit.
  const perfq_dev_event sdk[] = {{3, PERFQ_KIND_INSTANT | PERFQ_DEV_ARG_BYTES, "rx"}};
  REQUIRE(perfq_dev_dictionary_write(region.base(), &region.header(), sdk, 1) == PERFQ_DEV_OK);
  got = read_dictionary(region);
  REQUIRE(got.is_ok());
  REQUIRE(got->size() == 1);
  CHECK((*got)[0] == EventInfo{3, PERFQ_KIND_INSTANT, "rx", {"bytes"}});
  // A counter's arg is its value.
  const perfq_dev_event counter[] = {{4, PERFQ_KIND_COUNTER | PERFQ_DEV_ARG_BYTES, "depth"}};
  CHECK(perfq_dev_dictionary_write(region.base(), &region.header(), counter, 1) ==
        PERFQ_DEV_EINVAL);
  CHECK_FALSE(publish_dictionary(region, {{5, PERFQ_KIND_INSTANT, "x", {"count"}}}).is_ok());

  // A hostile or newer device: unknown flags are ignored, and a counter
  // flagged as bytes keeps its value unnamed.
  entries[0].flags = 0xfffe;
  got = read_dictionary(region);
  REQUIRE(got.is_ok());
  CHECK((*got)[0].args.empty());
  entries[0].kind = PERFQ_KIND_COUNTER;
  entries[0].flags = PERFQ_DICT_ARG_BYTES;
  got = read_dictionary(region);
  REQUIRE(got.is_ok());
  CHECK((*got)[0].args.empty());
}

TEST_CASE("drain: invalid records from the device are counted and dropped", "[device][hostile]") {
  TempShm shm("drain-bad");
  Region region = make_region(shm, 64);
  auto p = region.device_producer();
  REQUIRE(p.try_push({0, 1, 0, PERFQ_FLAGS(PERFQ_KIND_INSTANT, PERFQ_CLOCK_DEVICE), 5, 0}));
  REQUIRE(p.try_push({1, 1, 0, 0 /* kind invalid */, 6, 0}));
  REQUIRE(p.try_push({2, 1, 0, PERFQ_FLAGS(PERFQ_KIND_END, 9), 7, 0}));
  REQUIRE(p.try_push({3, 1, 0, PERFQ_FLAGS(PERFQ_KIND_END, PERFQ_CLOCK_DEVICE) | 0x100, 8, 0}));
  REQUIRE(p.try_push({4, 1, 0, PERFQ_FLAGS(PERFQ_KIND_INSTANT, PERFQ_CLOCK_DEVICE), 9, 0}));
  // Times the host cannot convert: the timer register R, and "host time"
  // that the device did not compute in mode B.  Once they passed as host
  // times, unconverted.
  REQUIRE(p.try_push({5, 1, 0, PERFQ_FLAGS(PERFQ_KIND_INSTANT, PERFQ_CLOCK_DEVICE_TIMER), 10, 0}));
  REQUIRE(p.try_push({6, 1, 0, PERFQ_FLAGS(PERFQ_KIND_INSTANT, PERFQ_CLOCK_HOST), 11, 0}));
  REQUIRE(
      p.try_push({7, 1, 0, PERFQ_FLAGS(PERFQ_KIND_INSTANT, PERFQ_CLOCK_HOST_BY_DEVICE), 12, 0}));
  DeviceDrain drain(region);
  std::vector<perfq_record> got;
  auto n = drain.poll(got);
  REQUIRE(n.is_ok());
  CHECK(*n == 8);
  REQUIRE(got.size() == 3);
  CHECK(got[0].index == 0);
  CHECK(got[1].index == 4);
  CHECK(got[2].index == 7);
  CHECK(drain.invalid() == 5);
  CHECK(drain.first_invalid().find("kind 0") != std::string::npos);
  for (const auto& r : got) drain.account(r);
  CHECK(drain.streams().at(0).gap_records == 5);
  CHECK(drain.streams().at(0).received == 3);
  CHECK(validate_record(
            perfq_record{0, 1, 0, PERFQ_FLAGS(PERFQ_KIND_INSTANT, PERFQ_CLOCK_DEVICE_TIMER), 1, 0})
            .find("timer register R") != std::string::npos);
  // An application's ring holds host times, and never a LOST record.
  CHECK(validate_record(
            perfq_record{0, 1, 0, PERFQ_FLAGS(PERFQ_KIND_INSTANT, PERFQ_CLOCK_HOST), 1, 0},
            RecordOrigin::kHostApp)
            .empty());
  CHECK(
      !validate_record(perfq_record{0, 1, 0, PERFQ_FLAGS(PERFQ_KIND_LOST, PERFQ_CLOCK_HOST), 1, 0},
                       RecordOrigin::kHostApp)
           .empty());
  CHECK(!validate_record(
             perfq_record{0, 1, 0, PERFQ_FLAGS(PERFQ_KIND_INSTANT, PERFQ_CLOCK_DEVICE), 1, 0},
             RecordOrigin::kHostApp)
             .empty());

  // A corrupt tail stops the drain with the values seen.
  store_release(&region.host_ctrl()->tail_mirror, 1u << 20);
  auto e = drain.poll(got);
  REQUIRE_FALSE(e.is_ok());
  CHECK(e.status().message().find("1048576") != std::string::npos);
}

// Mode B: the device publishes each line before it converts with it; the
// drain says, for each read, which lines its records may have used.  A
// device thread publishes lines and, after each, records naming it (in
// arg); the host reads in batches of every size while it runs.
TEST_CASE("drain: each read names the lines its records were converted with",
          "[device][drain][sync]") {
  TempShm shm("drain-lines");
  Region region = make_region(shm, 1024);
  perfq_sync_page* page = region.sync();
  constexpr uint64_t kLines = 3000 / kScale;
  std::atomic<bool> done{false};
  std::thread dev([&] {
    auto p = region.device_producer();
    std::mt19937 rng(11);
    uint64_t index = 0;
    for (uint64_t id = 1; id <= kLines; ++id) {
      perfq_sync_line_pub l{};
      l.id = id;
      l.device_ref = id * 10;
      l.host_ref_ns = id * 20;
      perfq_dev_line_publish(page, &l);
      const int n = std::uniform_int_distribution<int>(0, 120)(rng);
      for (int k = 0; k < n; ++k) {
        const perfq_record r{
            index, 1, 0, PERFQ_FLAGS(PERFQ_KIND_INSTANT, PERFQ_CLOCK_HOST_BY_DEVICE), index, id};
        while (!p.try_push(r)) std::this_thread::yield();
        ++index;
      }
      if (id % 64 == 0) std::this_thread::yield();
    }
    done = true;
  });
  DeviceDrain drain(region);
  std::vector<perfq_record> got;
  std::vector<perfq_sync_line_pub> lines;
  std::mt19937 rng(5);
  uint64_t records = 0, outside = 0, wrong_line = 0, reads = 0, widest = 0, seen_lines = 0;
  uint64_t next_index = 0;
  while (true) {
    const bool last = done.load();
    got.clear();
    auto n = drain.poll(got, std::uniform_int_distribution<size_t>(1, 700)(rng));
    REQUIRE(n.is_ok());
    lines.clear();
    drain.new_lines(lines);
    for (const auto& l : lines) {
      ++seen_lines;
      if (l.device_ref != l.id * 10 || l.host_ref_ns != l.id * 20) ++wrong_line;
    }
    if (!got.empty()) {
      ++reads;
      const LineIds ids = drain.last_lines();
      widest = std::max(widest, ids.hi - ids.lo);
      for (const auto& r : got) {
        CHECK(r.index == next_index++);
        if (r.arg < ids.lo || r.arg > ids.hi) ++outside;
      }
      records += got.size();
    }
    if (last && *n == 0) break;
  }
  dev.join();
  INFO("records " << records << " in " << reads << " reads, widest bracket " << widest
                  << ", lines read " << seen_lines);
  CHECK(records == next_index);
  CHECK(records > kLines * 40);
  CHECK(outside == 0);
  CHECK(wrong_line == 0);
  CHECK(seen_lines > 0);
  // A device whose count goes back is believed no more.
  store_release(&page->lines_newest, 2);
  auto p = region.device_producer();
  REQUIRE(p.try_push(
      {next_index, 1, 0, PERFQ_FLAGS(PERFQ_KIND_INSTANT, PERFQ_CLOCK_HOST_BY_DEVICE), 1, 2}));
  got.clear();
  REQUIRE(drain.poll(got).is_ok());
  REQUIRE(got.size() == 1);
  CHECK(drain.last_lines().hi == 0);
}

TEST_CASE("drain: a recording counts from its own first records, not from what came before",
          "[device][drain]") {
  TempShm shm("drain-backlog");
  Region region = make_region(shm, 64);
  auto p = region.device_producer();
  const uint16_t inst = PERFQ_FLAGS(PERFQ_KIND_INSTANT, PERFQ_CLOCK_DEVICE);
  // An earlier recording took indexes 0..9 of stream 0; 10..19 wait in the
  // ring from before this recording's start.
  {
    DeviceDrain earlier(region);
    for (uint64_t i = 0; i < 10; ++i) REQUIRE(p.try_push({i, 1, 0, inst, 100 + i, 0}));
    std::vector<perfq_record> got;
    REQUIRE(earlier.poll(got).is_ok());
    REQUIRE(got.size() == 10);
  }
  for (uint64_t i = 10; i < 20; ++i) REQUIRE(p.try_push({i, 1, 0, inst, 100 + i, 0}));
  DeviceDrain drain(region);
  auto skipped = drain.skip_backlog();
  REQUIRE(skipped.is_ok());
  CHECK(*skipped == 10);
  // The recording's records: 20..29 of stream 0 with 25 lost (and reported),
  // and stream 1 from index 500 (a stream that ran long before).
  for (uint64_t i = 20; i < 30; ++i)
    if (i != 25) REQUIRE(p.try_push({i, 1, 0, inst, 100 + i, 0}));
  REQUIRE(p.try_push({30, 0, 0, PERFQ_FLAGS(PERFQ_KIND_LOST, PERFQ_CLOCK_DEVICE), 131, 1}));
  for (uint64_t i = 500; i < 505; ++i) REQUIRE(p.try_push({i, 1, 1, inst, 100 + i, 0}));
  std::vector<perfq_record> got;
  auto n = drain.poll(got);
  REQUIRE(n.is_ok());
  REQUIRE(got.size() == 15);
  CHECK(got.front().index == 20);  // nothing of the backlog
  for (const auto& r : got) drain.account(r);
  const StreamAccount& a = drain.streams().at(0);
  CHECK(a.received == 9);
  CHECK(a.gap_records == 1);  // index 25, not the 20 before the recording
  CHECK(a.lost_reported == 1);
  const StreamAccount& b = drain.streams().at(1);
  CHECK(b.gap_records == 0);
  CHECK(b.received == 5);
  // An empty ring skips nothing.
  auto none = drain.skip_backlog();
  REQUIRE(none.is_ok());
  CHECK(*none == 0);
}

}  // namespace
}  // namespace perfq
