// Host instrumentation API benchmarks, each beside a baseline measured in
// the same run:
//
//   perfq_instant_ns         perfq_instant() connected to a daemon (HostApps
//                            in this process, a collector thread draining)
//   bare_push_ns             SpscProducer::try_push of the same record into
//                            a heap ring, a consumer thread draining
//   bare_push_rdtsc_ns       the same stamped with rdtsc instead of the
//                            clock: the near-physical limit
//   perfq_instant_nodaemon_ns  perfq_instant() with no daemon (a no-op that counts)
//   category_off_ns          perfq_instant() behind a disabled category
//                            (perfq_category_enabled(): a load and a branch)
//   clock_ns                 monotonic_ns() alone (clock_gettime)
//   host_clock_ns            host_clock_ns() alone: the records' timestamp
//                            (the TSC scaled to CLOCK_MONOTONIC, host_clock.h)
//
// Every figure is the median of the repetitions (5 unless
// --benchmark_repetitions is given); the table is printed at the end and
// written as JSON with --out=FILE.
#include <benchmark/benchmark.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <x86intrin.h>

#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "app/host_apps.h"
#include "app/host_clock.h"
#include "bare_ring.h"
#include "bench_main.h"
#include "core/spsc_ring.h"
#include "device/device_clock.h"
#include "perfq/perfq.h"

namespace perfq {
namespace {

constexpr uint64_t kCapacity = 1u << 16;

// HostApps behind a listening socket, and a collector thread draining it.
class BenchDaemon {
 public:
  BenchDaemon() : apps_(make_opts()) {
    char tmpl[] = "/tmp/perfq-bench-XXXXXX";
    dir_ = mkdtemp(tmpl);
    path_ = dir_ + "/d.sock";
    listen_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof(a.sun_path), "%s", path_.c_str());
    if (::bind(listen_.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        ::listen(listen_.get(), 8) != 0)
      std::abort();
    stop_fd_.reset(::eventfd(0, EFD_CLOEXEC));
    accept_ = std::thread([this] { accept_loop(); });
    collector_ = std::thread([this] {
      while (!stop_.load(std::memory_order_relaxed)) {
        const size_t n = apps_.drain([&](uint16_t, std::span<const perfq_record> r) {
          drained_.fetch_add(r.size(), std::memory_order_relaxed);
        });
        if (n == 0) std::this_thread::yield();
      }
    });
  }
  ~BenchDaemon() {
    stop_ = true;
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(stop_fd_.get(), &one, sizeof(one));
    accept_.join();
    collector_.join();
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());
  }
  const std::string& path() const { return path_; }

 private:
  static HostAppsOptions make_opts() {
    HostAppsOptions o;
    o.ring_records = kCapacity;
    o.recording = true;
    return o;
  }
  void accept_loop() {
    while (true) {
      pollfd p[2] = {{listen_.get(), POLLIN, 0}, {stop_fd_.get(), POLLIN, 0}};
      ::poll(p, 2, -1);
      if (p[1].revents) return;
      UniqueFd c(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!c.valid()) continue;
      std::string line;
      char ch;
      while (::recv(c.get(), &ch, 1, 0) == 1 && ch != '\n') line.push_back(ch);
      ucred peer{};
      socklen_t len = sizeof(peer);
      ::getsockopt(c.get(), SOL_SOCKET, SO_PEERCRED, &peer, &len);
      (void)apps_.adopt(std::move(c), nlohmann::json::parse(line, nullptr, false), peer);
    }
  }

  HostApps apps_;
  std::string dir_, path_;
  UniqueFd listen_, stop_fd_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> drained_{0};
  std::thread accept_, collector_;
};

// The same work as perfq_instant's store: a timestamped record.
void BM_bare_push(benchmark::State& state) {
  bare_ring_push(state, kCapacity, PERFQ_FLAGS(PERFQ_KIND_INSTANT, PERFQ_CLOCK_HOST),
                 [] { return monotonic_ns(); });
}
BENCHMARK(BM_bare_push);

void BM_bare_push_rdtsc(benchmark::State& state) {
  bare_ring_push(state, kCapacity, PERFQ_FLAGS(PERFQ_KIND_INSTANT, PERFQ_CLOCK_HOST),
                 [] { return static_cast<uint64_t>(__rdtsc()); });
}
BENCHMARK(BM_bare_push_rdtsc);

// Measure the steady state: the record clock's TSC map is calibrated in the
// first 100-200 ms of a process (clock_gettime until then).  Calibrates
// from this thread too (a connector may be doing it already), labels the
// run with the clock used.
void settle_host_clock(benchmark::State& state) {
  const uint64_t t0 = monotonic_ns();
  while (std::string(host_clock_source()) == "calibrating" &&
         monotonic_ns() - t0 < 3'000'000'000ull)
    std::this_thread::sleep_for(std::min(host_clock_update(), std::chrono::milliseconds(5)));
  state.SetLabel(std::string("clock ") + host_clock_source());
}

void BM_perfq_instant(benchmark::State& state) {
  BenchDaemon daemon;
  perfq_shutdown();
  if (perfq_init("perfq-bench", daemon.path().c_str()) != 0 || !perfq_wait_connected(5000)) {
    state.SkipWithError("no connection to the in-process daemon");
    return;
  }
  settle_host_clock(state);
  const uint32_t ev = perfq_event("bench", PERFQ_KIND_INSTANT);
  perfq_thread_init("bench");
  perfq_stats before{}, after{};
  perfq_get_stats(&before);
  uint64_t i = 0;
  for (auto _ : state) perfq_instant(ev, i++);
  perfq_get_stats(&after);
  state.SetLabel(std::string("clock ") + host_clock_source());  // still, at the end
  perfq_shutdown();
  state.SetItemsProcessed(static_cast<int64_t>(i));
  const double attempted = static_cast<double>(i);
  state.counters["full_pct"] = 100.0 * static_cast<double>(after.lost - before.lost) / attempted;
  state.counters["recorded_pct"] =
      100.0 * static_cast<double>(after.recorded - before.recorded) / attempted;
  state.counters["emitted"] = attempted;
}
BENCHMARK(BM_perfq_instant);

void BM_perfq_instant_nodaemon(benchmark::State& state) {
  perfq_shutdown();
  if (perfq_init("perfq-bench", "/nonexistent/perfq-bench.sock") != 0) {
    state.SkipWithError("perfq_init failed");
    return;
  }
  const uint32_t ev = perfq_event("bench", PERFQ_KIND_INSTANT);
  perfq_instant(ev, 0);  // the thread's one-time slow path
  uint64_t i = 0;
  for (auto _ : state) perfq_instant(ev, i++);
  perfq_shutdown();
  state.SetItemsProcessed(static_cast<int64_t>(i));
}
BENCHMARK(BM_perfq_instant_nodaemon);

void BM_category_off(benchmark::State& state) {
  const uint32_t ev = perfq_event("bench", PERFQ_KIND_INSTANT);
  struct perfq_category* off = perfq_category("bench-off");
  if (perfq_category_enable("bench-off", 0) != 0) {
    state.SkipWithError("perfq_category_enable failed");
    return;
  }
  uint64_t i = 0;
  for (auto _ : state) {
    if (perfq_category_enabled(off)) perfq_instant(ev, i);
    ++i;
  }
  state.SetItemsProcessed(static_cast<int64_t>(i));
}
BENCHMARK(BM_category_off);

void BM_clock(benchmark::State& state) {
  uint64_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(monotonic_ns());
    ++i;
  }
  state.SetItemsProcessed(static_cast<int64_t>(i));
}
BENCHMARK(BM_clock);

void BM_host_clock(benchmark::State& state) {
  settle_host_clock(state);
  // An application's connector thread renews the map (a map nobody renews
  // lapses after 3 s, and the clock is clock_gettime's): one here too.
  std::atomic<bool> stop{false};
  std::thread updater([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      const auto next = host_clock_update();
      if (next == std::chrono::milliseconds::max()) return;
      std::this_thread::sleep_for(std::min(next, std::chrono::milliseconds(50)));
    }
  });
  uint64_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(host_clock_ns());
    ++i;
  }
  stop = true;
  updater.join();
  state.SetItemsProcessed(static_cast<int64_t>(i));
  state.SetLabel(std::string("clock ") + host_clock_source());
}
BENCHMARK(BM_host_clock);

std::vector<bench::Figure> figures(const bench::Medians& m) {
  auto ns = [&](const char* k) { return bench::ns_per_item(m, k); };
  const char* unit = "ns/record";
  return {
      {"perfq_instant_ns", unit, "bare_push_ns", ns("BM_perfq_instant"), ns("BM_bare_push")},
      {"perfq_instant_nodaemon_ns", unit, "bare_push_ns", ns("BM_perfq_instant_nodaemon"),
       ns("BM_bare_push")},
      {"category_off_ns", unit, "perfq_instant_nodaemon_ns", ns("BM_category_off"),
       ns("BM_perfq_instant_nodaemon")},
      {"clock_ns", unit, "bare_push_ns", ns("BM_clock"), ns("BM_bare_push")},
      {"host_clock_ns", unit, "clock_ns", ns("BM_host_clock"), ns("BM_clock")},
      {"bare_push_rdtsc_ns", unit, "bare_push_ns", ns("BM_bare_push_rdtsc"), ns("BM_bare_push")},
  };
}

}  // namespace
}  // namespace perfq

int main(int argc, char** argv) {
  return perfq::bench::run_and_report(argc, argv, "perfq_host_bench", perfq::figures);
}
