// Ring benchmarks, each beside a baseline measured in the same run.
//
//   producer: ring_push_ns (try_push, a consumer thread draining
//             concurrently) and ring_batch_push_ns (reserve/commit of 64)
//             against bare_store_ns (a 32-byte store into a preallocated
//             array);
//   consumer: ring_drain_records_per_s (peek/copy/release in batches of
//             256) against bare_copy_records_per_s (memcpy of the same
//             records from a plain array).
//
// Every figure is the median of the repetitions.  The table is printed at
// the end and written as JSON (--out FILE): one object per figure with
// name, value, unit, baseline and ratio.
#include <benchmark/benchmark.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench_main.h"
#include "core/spsc_ring.h"

namespace perfq {
namespace {

constexpr uint64_t kCapacity = 1u << 16;
constexpr size_t kBatch = 256;

perfq_record make_record(uint64_t i) {
  return perfq_record{i, 1, 0, PERFQ_FLAGS(PERFQ_KIND_INSTANT, PERFQ_CLOCK_HOST), i, i};
}

void BM_bare_store(benchmark::State& state) {
  std::vector<perfq_record> slots(kCapacity);
  uint64_t i = 0;
  for (auto _ : state) {
    slots[i & (kCapacity - 1)] = make_record(i);
    benchmark::ClobberMemory();
    ++i;
  }
  state.SetItemsProcessed(static_cast<int64_t>(i));
}
BENCHMARK(BM_bare_store);

// A consumer thread draining the ring in batches until destroyed.
class DrainingConsumer {
 public:
  explicit DrainingConsumer(HeapRing<perfq_record>& ring)
      : thread_([this, c = ring.consumer()]() mutable {
          while (!stop_.load(std::memory_order_relaxed)) {
            auto s = c.peek(kBatch);
            if (s.empty()) {
              std::this_thread::yield();
              continue;
            }
            c.release(s.size());
          }
        }) {}
  ~DrainingConsumer() {
    stop_ = true;
    thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// The producer's cost with a real consumer draining on another thread.
void BM_ring_push(benchmark::State& state) {
  HeapRing<perfq_record> ring(kCapacity);
  auto p = ring.producer();
  DrainingConsumer consumer(ring);
  uint64_t i = 0, full = 0;
  for (auto _ : state) {
    if (p.try_push(make_record(i)))
      ++i;
    else
      ++full;
  }
  state.SetItemsProcessed(static_cast<int64_t>(i + full));
  state.counters["full_pct"] = 100.0 * static_cast<double>(full) / static_cast<double>(i + full);
}
BENCHMARK(BM_ring_push);

void BM_ring_batch_push(benchmark::State& state) {
  HeapRing<perfq_record> ring(kCapacity);
  auto p = ring.producer();
  DrainingConsumer consumer(ring);
  uint64_t i = 0;
  for (auto _ : state) {
    auto w = p.reserve(64);
    for (size_t k = 0; k < w.size(); ++k) w[k] = make_record(i + k);
    p.commit(w.size());
    i += w.size();
  }
  state.SetItemsProcessed(static_cast<int64_t>(i));
}
BENCHMARK(BM_ring_batch_push);

void BM_bare_copy(benchmark::State& state) {
  std::vector<perfq_record> src(kCapacity), dst(kBatch);
  for (uint64_t i = 0; i < kCapacity; ++i) src[i] = make_record(i);
  for (auto _ : state) {
    for (uint64_t pos = 0; pos < kCapacity; pos += kBatch) {
      std::memcpy(dst.data(), src.data() + pos, kBatch * sizeof(perfq_record));
      benchmark::DoNotOptimize(dst.data());
      benchmark::ClobberMemory();
    }
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kCapacity));
}
BENCHMARK(BM_bare_copy);

void BM_ring_drain(benchmark::State& state) {
  HeapRing<perfq_record> ring(kCapacity);
  auto p = ring.producer();
  auto c = ring.consumer();
  std::vector<perfq_record> dst(kBatch);
  for (auto _ : state) {
    state.PauseTiming();
    auto w = p.reserve(kCapacity);
    for (size_t k = 0; k < w.size(); ++k) w[k] = make_record(k);
    p.commit(w.size());
    state.ResumeTiming();
    for (;;) {
      auto s = c.peek(kBatch);
      if (s.empty()) break;
      s.copy_to(dst.data(), s.size());
      benchmark::DoNotOptimize(dst.data());
      benchmark::ClobberMemory();
      c.release(s.size());
    }
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kCapacity));
}
BENCHMARK(BM_ring_drain);

std::vector<bench::Figure> figures(const bench::Medians& m) {
  auto ns = [&](const char* k) { return bench::ns_per_item(m, k); };
  auto per_s = [&](const char* k) { return m.count(k) ? m.at(k) : 0.0; };
  return {
      {"ring_push_ns", "ns/record", "bare_store_ns", ns("BM_ring_push"), ns("BM_bare_store")},
      {"ring_batch_push_ns", "ns/record", "bare_store_ns", ns("BM_ring_batch_push"),
       ns("BM_bare_store")},
      {"ring_drain_records_per_s", "records/s", "bare_copy_records_per_s", per_s("BM_ring_drain"),
       per_s("BM_bare_copy")},
  };
}

}  // namespace
}  // namespace perfq

int main(int argc, char** argv) {
  return perfq::bench::run_and_report(argc, argv, "perfq_bench", perfq::figures);
}
