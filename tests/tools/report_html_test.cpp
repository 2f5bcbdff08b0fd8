// perfqctl report --html, checked as a person would look at it: in a real
// browser (Debian's chromium, headless).  The page must load with no error
// on the console, draw every chart (a canvas with painted pixels), and show
// the numbers of `perfqctl report --json` for the same trace.  A screenshot
// of the page is kept in the build tree (test-artefacts/report.png).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "trace/synth.h"

#include "test_util.h"

namespace perfq {
namespace {

void require_chromium() {
  if (sh("command -v chromium >/dev/null 2>&1") != 0)
    FAIL("chromium is not installed: install the Debian package chromium (scripts/deps.sh does)");
}

// What the page says about itself once loaded, gathered by a probe the test
// puts first in <head>: every error and console.error/warn, and per canvas
// how many of its pixels are painted.
constexpr const char* kReportProbe = R"js(<script>
window.__probe = {errors: []};
window.addEventListener('error', (e) => __probe.errors.push('error: ' + e.message));
for (const level of ['error', 'warn']) {
  const orig = console[level];
  console[level] = (...a) => { __probe.errors.push(level + ': ' + a.join(' ')); orig(...a); };
}
window.addEventListener('load', () => {
  __probe.canvases = [];
  for (const c of document.querySelectorAll('canvas')) {
    const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    let painted = 0;
    for (let i = 3; i < d.length; i += 4) painted += d[i] !== 0;
    __probe.canvases.push({chart: c.getAttribute('data-chart'), width: c.width, height: c.height, painted});
  }
  const pre = document.createElement('pre');
  pre.id = 'probe';
  pre.textContent = JSON.stringify(__probe);
  document.body.append(pre);
});
</script>)js";

// The JSON value at a dotted path ("jobs.worst.0.corr_id").
const nlohmann::json* at_path(const nlohmann::json& j, const std::string& path) {
  const nlohmann::json* v = &j;
  std::stringstream ss(path);
  for (std::string part; std::getline(ss, part, '.');) {
    if (v->is_array()) {
      const size_t i = std::stoul(part);
      if (i >= v->size()) return nullptr;
      v = &(*v)[i];
    } else if (v->is_object() && v->contains(part)) {
      v = &(*v)[part];
    } else {
      return nullptr;
    }
  }
  return v;
}

// "B", "kB", "MB", "GB", "TB" (decimal), alone or per second.
std::optional<double> bytes_unit(std::string unit) {
  if (unit.ends_with("/s")) unit.resize(unit.size() - 2);
  static const std::pair<const char*, double> kUnits[] = {
      {"B", 1}, {"kB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}};
  for (const auto& [u, f] : kUnits)
    if (unit == u) return f;
  return std::nullopt;
}

// A figure as shown ("12.346 µs", "1,234", "25.000 ppm", "3.938 GB/s") in
// the JSON's unit, with the half-unit of its last digit it may be off by.
struct Shown {
  double value = 0;
  double tolerance = 0;
};
std::optional<Shown> parse_shown(std::string text) {
  std::erase(text, ',');
  static const std::regex number(R"(^(-?[0-9]+(?:\.([0-9]+))?)(?: (.*))?$)");
  std::smatch m;
  if (!std::regex_match(text, m, number)) return std::nullopt;
  const double v = std::stod(m[1]);
  const double half = 0.5 * std::pow(10.0, -static_cast<double>(m[2].length()));
  const std::string unit = m[3];
  double scale = 1;
  if (unit.empty() || unit == "ns" || unit == "ppm" || unit == "/s") {
    scale = 1;
  } else if (unit == "\xc2\xb5s") {
    scale = 1e3;
  } else if (unit == "ms") {
    scale = 1e6;
  } else if (unit == "s") {
    scale = 1e9;
  } else if (unit == "%") {
    scale = 0.01;
  } else if (unit == "GB/s") {
    scale = 1e9;
  } else if (const auto b = bytes_unit(unit)) {
    scale = *b;
  } else {
    return std::nullopt;
  }
  return Shown{v * scale, half * scale};
}

}  // namespace

TEST_CASE("report --html: chromium draws every chart, no console error, the JSON's numbers",
          "[report][html]") {
  require_chromium();
  TempDir dir("html");
  const std::string trace = dir.file("in.pq");
  SynthTraceOptions o;
  o.jobs = 2000;
  o.submit_to_start = {1'500, 2'500, 40'000, 3'100};
  o.start_to_end = {9'000, 11'000, 250'000};
  // The last: a job whose end comes 1 us after its complete, beyond its
  // claims (a listed causality violation).
  o.end_to_complete = {800, 1'200, 1'900, 95'000, -1'000};
  o.drop_every = 97;
  o.lost_record_count = 5;
  PciDevice d;
  d.address = "0000:03:00.0";
  d.bus = 3;
  d.config_readable = true;
  PcieInfo p;
  p.link_max = PciLink{16000, 8};
  p.link_current = PciLink{16000, 8};
  d.pcie = p;
  o.device_pci = d;
  o.transfer_bytes = {65'536, 4'096, 1'048'576};
  REQUIRE(write_synthetic_trace(trace, o).is_ok());

  const std::string page = dir.file("report.html");
  const std::string json_path = dir.file("report.json");
  REQUIRE(sh(std::string(PERFQCTL_PATH) + " report " + trace + " --json > " + json_path) == 0);
  REQUIRE(sh(std::string(PERFQCTL_PATH) + " report " + trace + " --html " + page) == 0);
  const auto json = nlohmann::json::parse(slurp(json_path));
  const std::string html = slurp(page);
  // Self-contained: no URL it would fetch.
  CHECK(html.find("src=\"http") == std::string::npos);
  CHECK(html.find("href=\"http") == std::string::npos);

  // The probe goes first in <head>, so it sees every error of the page.
  std::string probed = html;
  const size_t head = probed.find("<head>");
  REQUIRE(head != std::string::npos);
  probed.insert(head + 6, kReportProbe);
  { std::ofstream(dir.file("probe.html")) << probed; }
  const std::string chromium =
      "chromium --headless --no-sandbox --disable-gpu --user-data-dir=" + dir.file("profile") +
      " --enable-logging=stderr --v=0 --virtual-time-budget=20000 ";
  REQUIRE(sh(chromium + "--dump-dom file://" + dir.file("probe.html") + " > " +
             dir.file("dom.html") + " 2> " + dir.file("chromium.err")) == 0);
  const std::string dom = slurp(dir.file("dom.html"));
  // Chromium logs the page's console (CONSOLE) and uncaught exceptions
  // itself too; the rest of its log is about the machine (no D-Bus here).
  std::string console;
  {
    std::istringstream in(slurp(dir.file("chromium.err")));
    for (std::string l; std::getline(in, l);)
      if (l.find("CONSOLE") != std::string::npos || l.find("Uncaught") != std::string::npos)
        console += l + "\n";
  }
  INFO("chromium's console log:\n" << console);
  CHECK(console.find("Uncaught") == std::string::npos);
  CHECK(console.find(":ERROR:CONSOLE") == std::string::npos);

  std::smatch m;
  static const std::regex probe_re(R"re(<pre id="probe">([^<]*)</pre>)re");
  REQUIRE(std::regex_search(dom, m, probe_re));
  const auto probe = nlohmann::json::parse(unescape_html(m[1]));
  INFO("probe: " << probe.dump());
  CHECK(probe["errors"].empty());
  static const std::regex charts_re(R"re(data-charts="([0-9]+)")re");
  REQUIRE(std::regex_search(dom, m, charts_re));
  const size_t charts = std::stoul(m[1]);
  // The breakdown, three distributions, records and losses over time, the
  // device's sync, the throughput of the byte-count events.
  CHECK(charts == 8);
  REQUIRE(probe["canvases"].size() == charts);
  for (const auto& c : probe["canvases"]) {
    INFO(c.dump());
    CHECK(c["width"].get<int>() > 100);
    CHECK(c["height"].get<int>() > 100);
    CHECK(c["painted"].get<int>() > 2000);
  }

  // Every figure shown against the JSON report.
  static const std::regex fig_re(R"re(<span data-json="([^"]+)">([^<]*)</span>)re");
  size_t checked = 0;
  std::set<std::string> paths;
  for (auto it = std::sregex_iterator(dom.begin(), dom.end(), fig_re); it != std::sregex_iterator();
       ++it) {
    const std::string path = (*it)[1];
    const std::string text = unescape_html((*it)[2]);
    INFO(path << " shows '" << text << "'");
    const nlohmann::json* v = at_path(json, path);
    REQUIRE(v != nullptr);
    paths.insert(path);
    ++checked;
    if (v->is_string()) {
      const std::string want = v->get<std::string>();
      CHECK(text == (want.empty() ? "\u2014" : want));  // an em dash for nothing
      continue;
    }
    if (v->is_number_unsigned() && path.ends_with("corr_id")) {
      CHECK(text == std::to_string(v->get<uint64_t>()));  // all 64 bits, not a double's
      continue;
    }
    double want = 0;
    if (v->is_array()) {  // a timeline series, shown as its sum
      for (const auto& x : *v) want += x.get<double>();
    } else {
      REQUIRE(v->is_number());
      want = v->get<double>();
    }
    const auto shown = parse_shown(text);
    REQUIRE(shown);
    // Times shown from the start of the timeline ("0.123456789 s") are
    // absolute in the JSON.
    if ((path.starts_with("jobs.worst.") && !path.ends_with("latency_ns")) ||
        path.ends_with("_at_ns") || path.ends_with(".time_ns"))
      want -= json["timeline"]["start_ns"].get<double>();
    CHECK(std::fabs(shown->value - want) <= shown->tolerance + 1e-9 * std::fabs(want));
  }
  CHECK(checked > 60);
  for (const char* must :
       {"records.total", "lost.device", "duration_ns", "jobs.count", "jobs.submit_to_start_ns.p50",
        "jobs.start_to_end_ns.p99", "jobs.end_to_complete_ns.max", "jobs.worst.0.corr_id",
        "jobs.worst.0.submit_ns", "sync.devices.0.uncertainty_ns", "sync.devices.0.device_ahead_ns",
        "sources.1.pci.pcie.link_current.ceiling_bytes_per_s", "timeline.sync.0.rounds",
        "causality_violation_list.0.beyond_ns", "causality_violation_list.0.end.time_ns"}) {
    INFO(must);
    CHECK(paths.count(must) == 1);
  }
  // Both byte-count events, with their link's share (the host's through the
  // trace's one device).
  size_t shares = 0, in_range = 0;
  for (const auto& p : paths) {
    shares += p.starts_with("events.") && p.ends_with(".throughput.link.share");
    in_range += p.starts_with("events.") && p.ends_with(".throughput.in_range_bytes_per_s");
  }
  CHECK(shares == 2);
  CHECK(in_range == 1);  // the host's h2d_copy ranges; the device's are instants

  // The screenshot, kept for people to look at.
  const std::string shots = std::string(PERFQ_TEST_ARTEFACT_DIR);
  std::filesystem::create_directories(shots);
  const std::string png = shots + "/report.png";
  std::filesystem::remove(png);
  REQUIRE(sh(chromium + "--hide-scrollbars --window-size=1200,5200 --screenshot=" + png +
             " file://" + page + " 2> " + dir.file("shot.err")) == 0);
  const std::string shot = slurp(png);
  REQUIRE(shot.size() > 50'000);
  CHECK(shot.compare(0, 8, "\x89PNG\r\n\x1a\n") == 0);
}

}  // namespace perfq
