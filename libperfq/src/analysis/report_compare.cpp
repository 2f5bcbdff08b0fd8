// report_compare_*(): two runs side by side (`perfqctl report A B`): every
// figure the two JSON reports share, with its change.
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/json_schema.h"
#include "perfq/report.h"

namespace perfq {

namespace {

using nlohmann::ordered_json;

// An element of an array by what names it (so that the same stream or
// event lines up in both runs whatever its position), else its index.
std::string element_key(const ordered_json& e, size_t i) {
  if (!e.is_object()) return std::to_string(i);
  std::string k;
  for (const char* f : {"source_name", "kind", "name", "stream", "parent", "child", "corr_id"}) {
    if (!e.contains(f)) continue;
    k += (k.empty() ? "" : "/") + (e[f].is_string() ? e[f].get<std::string>() : e[f].dump());
  }
  return k.empty() ? std::to_string(i) : k;
}

// Numeric leaves by path; big series (the timeline, histogram bins, the
// sources' PCI facts, the worst lists: outliers, not figures) left out.
void flatten(const ordered_json& j, const std::string& path, std::map<std::string, double>& out) {
  static const std::set<std::string> kSkip = {"timeline",
                                              "histograms",
                                              "sources",
                                              "worst",
                                              "segment_list",
                                              "first_ns",
                                              "last_ns",
                                              "recording_start_ns",
                                              "recording_stop_ns",
                                              "schema_version",
                                              "causality_violation_list"};
  if (j.is_number()) {
    out[path] = j.get<double>();
  } else if (j.is_object()) {
    for (const auto& [k, v] : j.items()) {
      if (kSkip.count(k) || k.ends_with("_at_ns") || k.ends_with("loss_ns")) continue;
      flatten(v, path.empty() ? k : path + "." + k, out);
    }
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i)
      flatten(j[i], path + "[" + element_key(j[i], i) + "]", out);
  }
}

struct Change {
  std::string figure;
  double a = 0, b = 0;
};

std::vector<Change> changes(const TraceReport& a, const TraceReport& b) {
  std::map<std::string, double> fa, fb;
  flatten(ordered_json::parse(report_to_json(a)), "", fa);
  flatten(ordered_json::parse(report_to_json(b)), "", fb);
  std::vector<Change> out;
  for (const auto& [k, va] : fa)
    if (auto it = fb.find(k); it != fb.end()) out.push_back({k, va, it->second});
  return out;
}

}  // namespace

std::string report_compare_json(const TraceReport& a, const TraceReport& b) {
  ordered_json j;
  j["schema_version"] = kJsonSchemaVersion;
  j["a"] = a.path;
  j["b"] = b.path;
  ordered_json list = ordered_json::array();
  for (const auto& c : changes(a, b)) {
    ordered_json o = {{"figure", c.figure}, {"a", c.a}, {"b", c.b}, {"change", c.b - c.a}};
    o["relative"] = c.a != 0 ? ordered_json((c.b - c.a) / std::fabs(c.a)) : ordered_json();
    list.push_back(o);
  }
  j["figures"] = list;
  return j.dump(2) + "\n";
}

std::string report_compare_text(const TraceReport& a, const TraceReport& b) {
  std::string out = fmt::format("A {}\nB {}\n{:<64} {:>16} {:>16} {:>10}\n", a.path, b.path,
                                "figure (the --json report's)", "A", "B", "change");
  for (const auto& c : changes(a, b)) {
    std::string rel = c.a != 0 ? fmt::format("{:+.1f}%", 100 * (c.b - c.a) / std::fabs(c.a))
                               : (c.b == 0 ? "" : "new");
    out += fmt::format("{:<64} {:>16.10g} {:>16.10g} {:>10}\n", c.figure, c.a, c.b,
                       c.a == c.b ? "=" : rel);
  }
  return out;
}

}  // namespace perfq
