// The driver the figure-reporting benchmarks share: run the registered
// benchmarks (5 repetitions unless --benchmark_repetitions is given, medians
// only), then print a table of figures, each beside its baseline measured in
// the same run, and write it as JSON with --out=FILE (one object per figure:
// name, value, unit, baseline, baseline_name, ratio).
#pragma once

#include <benchmark/benchmark.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace perfq::bench {

// A figure and its baseline, both medians of the same run.
struct Figure {
  std::string name, unit, baseline_name;
  double value, baseline;
};

// The medians of every benchmark's items_per_second, by function name.
using Medians = std::map<std::string, double>;

// Keeps the median of every benchmark's items_per_second.
class MedianCollector : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const auto& r : runs) {
      if (r.error_occurred || r.run_type != Run::RT_Aggregate || r.aggregate_name != "median")
        continue;
      auto it = r.counters.find("items_per_second");
      if (it != r.counters.end()) items_per_s[r.run_name.function_name] = it->second.value;
    }
  }
  Medians items_per_s;
};

// ns per item of a benchmark (0 where it did not run).
inline double ns_per_item(const Medians& m, const char* name) {
  auto it = m.find(name);
  return it != m.end() && it->second > 0 ? 1e9 / it->second : 0.0;
}

// Runs the benchmarks, asks `figures` for the table and prints and writes it.
// `tool` names the program in its error messages.
inline int run_and_report(int argc, char** argv, const char* tool,
                          const std::function<std::vector<Figure>(const Medians&)>& figures) {
  std::string out;
  std::vector<char*> args;
  bool has_reps = false;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--out=", 0) == 0) {
      out = a.substr(6);
      continue;
    }
    if (a.rfind("--benchmark_repetitions", 0) == 0) has_reps = true;
    args.push_back(argv[i]);
  }
  std::string reps = "--benchmark_repetitions=5";
  std::string aggr = "--benchmark_report_aggregates_only=true";
  if (!has_reps) args.push_back(reps.data());
  args.push_back(aggr.data());
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 1;
  MedianCollector rep;
  benchmark::RunSpecifiedBenchmarks(&rep);
  benchmark::Shutdown();

  nlohmann::json j = nlohmann::json::array();
  std::printf("\n%-28s %14s %-10s %-24s %14s %8s\n", "figure (median)", "value", "unit", "baseline",
              "baseline", "ratio");
  for (const auto& f : figures(rep.items_per_s)) {
    const double ratio = f.baseline > 0 ? f.value / f.baseline : 0;
    std::printf("%-28s %14.3f %-10s %-24s %14.3f %8.2f\n", f.name.c_str(), f.value, f.unit.c_str(),
                f.baseline_name.c_str(), f.baseline, ratio);
    j.push_back({{"name", f.name},
                 {"value", f.value},
                 {"unit", f.unit},
                 {"baseline", f.baseline},
                 {"baseline_name", f.baseline_name},
                 {"ratio", ratio}});
  }
  if (!out.empty()) {
    std::ofstream o(out);
    o << j.dump(2) << "\n";
    if (!o) {
      std::fprintf(stderr, "%s: cannot write %s\n", tool, out.c_str());
      return 1;
    }
    std::printf("\nwrote %s\n", out.c_str());
  }
  return 0;
}

}  // namespace perfq::bench
