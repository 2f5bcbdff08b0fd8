// Device-side benchmarks, each beside a baseline measured in the same run:
//
//   BM_device_record   DeviceQueue::record() (SimClock timestamp, the
//                      worker's own queue), a DeviceCollector thread moving
//                      the queue into a region's shared ring and a host
//                      DeviceDrain thread emptying that ring concurrently.
//                      Counter delivered_pct: records that reached the
//                      shared ring, of those the worker emitted.
//   BM_bare_push_rdtsc the near-physical limit: a bare SPSC ring store of a
//                      record stamped with rdtsc, a consumer thread draining.
//   BM_drain           one thread, DeviceDrain::poll() from a full region
//                      ring into the vector that feeds the merge (every
//                      record validated and accounted).
//   BM_bare_copy       memcpy of the same records, the drain's limit.
//
// scripts/bench.py runs this with --benchmark_repetitions and reads the
// medians from --benchmark_out (JSON).
#include <benchmark/benchmark.h>
#include <x86intrin.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include "bare_ring.h"
#include "core/region.h"
#include "core/spsc_ring.h"
#include "device/device.h"
#include "device/device_clock.h"
#include "host/drain.h"

namespace perfq {
namespace {

constexpr uint64_t kQueue = 1u << 16;
constexpr uint64_t kRing = 1u << 18;

// A region in process memory (the device and the host are threads here).
class HeapRegion {
 public:
  HeapRegion() {
    RegionGeometry g;
    g.ring_capacity = kRing;
    auto h = layout_region(g);
    if (!h) std::abort();
    len_ = h->region_size;
    mem_ = std::aligned_alloc(PERFQ_PAGE_SIZE, len_);
    std::memset(mem_, 0, len_);
    auto r = Region::format(mem_, len_, g);
    if (!r) std::abort();
    region_.emplace(std::move(r.value()));
  }
  ~HeapRegion() {
    region_.reset();
    std::free(mem_);
  }
  const Region& get() const { return *region_; }

 private:
  void* mem_ = nullptr;
  uint64_t len_ = 0;
  std::optional<Region> region_;
};

void BM_bare_push_rdtsc(benchmark::State& state) {
  bare_ring_push(state, kQueue, PERFQ_FLAGS(PERFQ_KIND_INSTANT, PERFQ_CLOCK_DEVICE),
                 [] { return static_cast<uint64_t>(__rdtsc()); });
}
BENCHMARK(BM_bare_push_rdtsc);

void BM_device_record(benchmark::State& state) {
  HeapRegion region;
  SimClock clock({});
  DeviceQueue stream(0, kQueue, clock);
  std::atomic<bool> stop_collector{false}, stop_drain{false};
  std::atomic<uint64_t> drained{0};
  std::thread host([&] {
    DeviceDrain drain(region.get());
    std::vector<perfq_record> out;
    out.reserve(4096);
    for (;;) {
      out.clear();
      auto n = drain.poll(out, 4096);
      if (!n) std::abort();
      drained.fetch_add(out.size(), std::memory_order_relaxed);
      if (*n == 0) {
        if (stop_drain.load(std::memory_order_relaxed)) break;
        std::this_thread::yield();
      }
    }
  });
  CollectorOptions opts;
  opts.mode_b = false;
  DeviceCollector collector(region.get(), {&stream}, clock, opts);
  std::thread dev([&] { collector.run(stop_collector); });
  uint64_t i = 0;
  for (auto _ : state) stream.record(1, PERFQ_KIND_INSTANT, i++);
  stop_collector = true;
  dev.join();
  stop_drain = true;
  host.join();
  state.SetItemsProcessed(static_cast<int64_t>(i));
  const double emitted = static_cast<double>(stream.emitted());
  state.counters["delivered_pct"] =
      100.0 * static_cast<double>(collector.delivery()[0].delivered) / emitted;
  state.counters["emitted"] = emitted;
}
BENCHMARK(BM_device_record);

void BM_drain(benchmark::State& state) {
  HeapRegion region;
  auto p = region.get().device_producer();
  DeviceDrain drain(region.get());
  std::vector<perfq_record> out;
  out.reserve(4096);
  uint64_t index = 0;
  for (auto _ : state) {
    state.PauseTiming();
    auto w = p.reserve(kRing);
    for (size_t k = 0; k < w.size(); ++k)
      w[k] = perfq_record{index + k, 1, 0, PERFQ_FLAGS(PERFQ_KIND_INSTANT, PERFQ_CLOCK_DEVICE),
                          index + k, k};
    index += w.size();
    p.commit(w.size());
    state.ResumeTiming();
    for (;;) {
      out.clear();
      auto n = drain.poll(out, 4096);
      if (!n || *n == 0) break;
      benchmark::DoNotOptimize(out.data());
    }
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kRing));
}
BENCHMARK(BM_drain);

void BM_bare_copy(benchmark::State& state) {
  std::vector<perfq_record> src(kRing), dst(4096);
  for (uint64_t i = 0; i < kRing; ++i)
    src[i] = perfq_record{i, 1, 0, PERFQ_FLAGS(PERFQ_KIND_INSTANT, PERFQ_CLOCK_DEVICE), i, i};
  for (auto _ : state) {
    for (uint64_t pos = 0; pos < kRing; pos += 4096) {
      std::memcpy(dst.data(), src.data() + pos, 4096 * sizeof(perfq_record));
      benchmark::DoNotOptimize(dst.data());
      benchmark::ClobberMemory();
    }
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kRing));
}
BENCHMARK(BM_bare_copy);

}  // namespace
}  // namespace perfq

BENCHMARK_MAIN();
