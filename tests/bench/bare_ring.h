// The near-physical limit of recording, the baseline of the host and the
// device record benchmarks: a bare SPSC ring store of a 32-byte record
// stamped by `stamp()`, with a consumer thread draining concurrently.
// Counters: full_pct (stores the full ring refused) and delivered_pct (the
// rest).
#pragma once

#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdint>
#include <thread>

#include "core/spsc_ring.h"

namespace perfq {

template <class Stamp>
void bare_ring_push(benchmark::State& state, uint64_t capacity, uint16_t flags, Stamp stamp) {
  HeapRing<perfq_record> ring(capacity);
  auto p = ring.producer();
  std::atomic<bool> stop{false};
  std::thread consumer([&, c = ring.consumer()]() mutable {
    while (!stop.load(std::memory_order_relaxed)) {
      auto s = c.peek(4096);
      if (s.empty()) {
        std::this_thread::yield();
        continue;
      }
      c.release(s.size());
    }
  });
  uint64_t i = 0, full = 0;
  for (auto _ : state) {
    const perfq_record r{i, 1, 0, flags, stamp(), i};
    if (p.try_push(r))
      ++i;
    else
      ++full;
  }
  stop = true;
  consumer.join();
  const double all = static_cast<double>(i + full);
  state.SetItemsProcessed(static_cast<int64_t>(i + full));
  state.counters["full_pct"] = 100.0 * static_cast<double>(full) / all;
  state.counters["delivered_pct"] = 100.0 * static_cast<double>(i) / all;
}

}  // namespace perfq
