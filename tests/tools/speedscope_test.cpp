// perfqctl export --format chrome-json, loaded into speedscope (a viewer
// nobody here wrote, from npm: the test installs it into the build tree)
// in headless Chromium.  Speedscope insists on what the Trace Event Format
// says: a B and its E have one name (and, for it, the same args), slices
// nest; anything else it reports on the console ("Tried to end ...") or
// throws.  The test fails on any console warning or error and requires the
// profile to be shown.
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "perfq/export.h"
#include "trace/synth.h"

#include "test_util.h"

namespace perfq {
namespace {

constexpr const char* kSpeedscope = "speedscope@1.25.0";

// Speedscope's release folder, installed with npm into the build tree when
// missing.
std::string speedscope_release() {
  const std::string prefix = std::string(PERFQ_TEST_TOOLS_DIR) + "/speedscope";
  const std::string release = prefix + "/node_modules/speedscope/dist/release";
  if (std::filesystem::exists(release + "/index.html")) return release;
  if (sh("command -v npm >/dev/null 2>&1") != 0)
    FAIL("npm is not installed: install the Debian package npm (scripts/deps.sh does)");
  const std::string log = std::string(PERFQ_TEST_TOOLS_DIR) + "/speedscope-npm.log";
  std::filesystem::create_directories(prefix);
  const int rc = sh("npm install --no-audit --no-fund --prefix " + prefix + " " + kSpeedscope +
                    " > " + log + " 2>&1");
  INFO("npm install " << kSpeedscope << " failed (the registry must be reachable):\n"
                      << slurp(log));
  REQUIRE(rc == 0);
  REQUIRE(std::filesystem::exists(release + "/index.html"));
  return release;
}

// First in speedscope's <head>: every console warning and error and every
// uncaught error of the page, kept in <pre id="probe"> as they come.
constexpr const char* kSpeedscopeProbe = R"js(<script>
(function () {
  const seen = [];
  const show = () => {
    let pre = document.getElementById('probe');
    if (!pre && document.body) {
      pre = document.createElement('pre');
      pre.id = 'probe';
      document.body.append(pre);
    }
    if (pre) pre.textContent = JSON.stringify(seen);
  };
  const keep = (what) => { seen.push(String(what)); show(); };
  for (const level of ['error', 'warn']) {
    const orig = console[level];
    console[level] = (...a) => { keep(level + ': ' + a.join(' ')); orig.apply(console, a); };
  }
  window.addEventListener('error', (e) => keep('error: ' + e.message));
  window.addEventListener('unhandledrejection', (e) => keep('rejection: ' + e.reason));
  document.addEventListener('DOMContentLoaded', show);
})();
</script>)js";

}  // namespace

TEST_CASE("export chrome-json: speedscope in chromium loads it with no console error",
          "[export][speedscope]") {
  if (sh("command -v chromium >/dev/null 2>&1") != 0)
    FAIL("chromium is not installed: install the Debian package chromium (scripts/deps.sh does)");
  const std::string release = speedscope_release();
  TempDir dir("speedscope");
  const std::string www = dir.file("www");
  std::filesystem::copy(release, www, std::filesystem::copy_options::recursive);
  {
    std::string index = slurp(www + "/index.html");
    const size_t head = index.find("<head>");
    REQUIRE(head != std::string::npos);
    index.insert(head + 6, kSpeedscopeProbe);
    std::ofstream(www + "/index.html") << index;
  }
  // Jobs (a host submit and complete, a device start/end slice), host work
  // slices, counters, a loss: the synthetic trace's mix.
  SynthTraceOptions o;
  o.jobs = 400;
  o.lost_record_count = 3;
  const std::string in = dir.file("in.pq");
  REQUIRE(write_synthetic_trace(in, o).is_ok());
  REQUIRE(export_trace(in, TraceExportFormat::kChromeJson, www + "/trace.json").is_ok());

  // A local server (speedscope fetches the profile), on a port of its
  // choice: the interpreter itself (not a wrapper such as a pyenv shim, which
  // would outlive the kill at the end of the test).
  REQUIRE(sh("python3 -c 'import sys; print(sys.executable)' > " + dir.file("python")) == 0);
  std::string python = slurp(dir.file("python"));
  python.erase(python.find_last_not_of("\n") + 1);
  Child server({python, "-u", "-m", "http.server", "--bind", "127.0.0.1", "--directory", www, "0"});
  REQUIRE(server.started());
  static const std::regex port_re(R"(port ([0-9]+))");
  std::smatch m;
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!std::regex_search(out = server.out(), m, port_re)) {
    INFO("python3 -m http.server: " << server.err());
    REQUIRE(server.running());
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const std::string base = "http://127.0.0.1:" + m[1].str();
  REQUIRE(
      sh("chromium --headless --no-sandbox --disable-gpu --user-data-dir=" + dir.file("profile") +
         " --enable-logging=stderr --v=0 --virtual-time-budget=30000 --dump-dom '" + base +
         "/index.html#profileURL=" + base + "/trace.json' > " + dir.file("dom.html") + " 2> " +
         dir.file("chromium.err")) == 0);
  const std::string dom = slurp(dir.file("dom.html"));
  std::string console;
  {
    std::istringstream log(slurp(dir.file("chromium.err")));
    for (std::string l; std::getline(log, l);)
      if (l.find("CONSOLE") != std::string::npos) console += l + "\n";
  }
  INFO("chromium's console log:\n" << console);
  // Speedscope imported it: its title names the profile.
  CHECK(dom.find("<title>trace.json - speedscope</title>") != std::string::npos);
  CHECK(console.find("Importing as Trace Event Format profile") != std::string::npos);
  CHECK(console.find("Tried to") == std::string::npos);
  CHECK(console.find("Uncaught") == std::string::npos);
  static const std::regex probe_re(R"re(<pre id="probe">([^<]*)</pre>)re");
  REQUIRE(std::regex_search(dom, m, probe_re));
  CHECK(unescape_html(m[1]) == "[]");
}

}  // namespace perfq
