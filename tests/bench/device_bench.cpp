// Device-side benchmarks, each beside a baseline measured in the same run:
//
//   BM_device_record   the device SDK's record call (perfq_dev_record_at()
//                      into the worker's own queue, stamped with a counter:
//                      rdtsc, as firmware reads its cycle counter), an SDK
//                      collector thread (DeviceCollector) moving the queue
//                      into a region's shared ring and a host DeviceDrain
//                      thread emptying that ring concurrently.  Counter
//                      delivered_pct: records that reached the shared ring,
//                      of those the worker emitted.
//   BM_device_record_1M  the same paced at 1 M records/s for one second
//                      (a worker's steady load): delivered_pct must be 100.
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

#include <algorithm>
#include <atomic>
#include <chrono>
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

// The device, its collector and a host drain, as threads over one region.
class DevicePipeline {
 public:
  DevicePipeline() : stream_(0, kQueue, clock_) {
    host_ = std::thread([this] {
      DeviceDrain drain(region_.get());
      std::vector<perfq_record> out;
      out.reserve(4096);
      for (;;) {
        out.clear();
        auto n = drain.poll(out, 4096);
        if (!n) std::abort();
        if (*n == 0) {
          if (stop_drain_.load(std::memory_order_relaxed)) break;
          std::this_thread::yield();
        }
      }
    });
    CollectorOptions opts;
    opts.mode_b = false;
    collector_.emplace(region_.get(), std::vector<DeviceQueue*>{&stream_}, clock_, opts);
    dev_ = std::thread([this] { collector_->run(stop_collector_); });
  }
  // The SDK's queue itself: the record call a firmware worker makes.
  perfq_dev_queue* queue() { return stream_.sdk(); }
  void finish(benchmark::State& state) {
    stop_collector_ = true;
    dev_.join();
    stop_drain_ = true;
    host_.join();
    const double emitted = static_cast<double>(stream_.emitted());
    state.SetItemsProcessed(static_cast<int64_t>(emitted));
    state.counters["delivered_pct"] =
        100.0 * static_cast<double>(collector_->delivery()[0].delivered) / emitted;
    state.counters["emitted"] = emitted;
  }

 private:
  HeapRegion region_;
  SimClock clock_{{}};  // the collector's device_now only
  DeviceQueue stream_;
  std::optional<DeviceCollector> collector_;
  std::atomic<bool> stop_collector_{false}, stop_drain_{false};
  std::thread host_, dev_;
};

void BM_device_record(benchmark::State& state) {
  DevicePipeline p;
  perfq_dev_queue* q = p.queue();
  uint64_t i = 0;
  for (auto _ : state)
    perfq_dev_record_at(q, 1, PERFQ_KIND_INSTANT, static_cast<uint64_t>(__rdtsc()), i++);
  p.finish(state);
}
BENCHMARK(BM_device_record);

void BM_device_record_1M(benchmark::State& state) {
  DevicePipeline p;
  perfq_dev_queue* q = p.queue();
  for (auto _ : state) {
    // 1 M records/s for 1 s, in bursts of 100 every 100 us.
    const uint64_t start = monotonic_ns();
    uint64_t i = 0;
    while (i < 1'000'000) {
      const uint64_t due = std::min<uint64_t>((monotonic_ns() - start) / 1000 + 1, 1'000'000);
      for (; i < due; ++i)
        perfq_dev_record_at(q, 1, PERFQ_KIND_INSTANT, static_cast<uint64_t>(__rdtsc()), i);
      if (i < 1'000'000) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  p.finish(state);
}
BENCHMARK(BM_device_record_1M)->Iterations(1)->Unit(benchmark::kMillisecond);

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
