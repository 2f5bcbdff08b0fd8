// The LTTng-UST baseline: one tracepoint per iteration from the worker
// thread, the cost the perfq host and device record figures are compared
// with.  scripts/bench.py runs it inside a private lttng-sessiond with an
// active session (the tracepoint is enabled and its events are written to
// a temporary trace); without a session the tracepoint is a not-taken
// branch and the figure means nothing.
//
//   BM_lttng_tracepoint  counter emitted: tracepoints hit in the timed loop.
// --count-file=FILE: write the number of tracepoints hit in the whole run
// (calibration runs included), which the driver compares with what the
// session recorded.
#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdio>
#include <string>
#include <vector>

#include "lttng_tp.h"

namespace {

std::atomic<uint64_t> g_total{0};

void BM_lttng_tracepoint(benchmark::State& state) {
  uint64_t i = 0;
  for (auto _ : state) {
    tracepoint(perfq_bench, instant, 1, 0, i);
    ++i;
  }
  g_total.fetch_add(i, std::memory_order_relaxed);
  state.SetItemsProcessed(static_cast<int64_t>(i));
  state.counters["emitted"] = static_cast<double>(i);
}
BENCHMARK(BM_lttng_tracepoint);

}  // namespace

int main(int argc, char** argv) {
  std::string count_file;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--count-file=", 0) == 0)
      count_file = a.substr(13);
    else
      args.push_back(argv[i]);
  }
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (!count_file.empty()) {
    FILE* f = std::fopen(count_file.c_str(), "w");
    if (!f) return 1;
    std::fprintf(f, "%llu\n", static_cast<unsigned long long>(g_total.load()));
    std::fclose(f);
  }
  return 0;
}
