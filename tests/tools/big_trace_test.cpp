// Big traces stream: perfqctl report, report --html and every export of a
// synthetic trace of PERFQ_BIG_RECORDS records (default 100 M) stay within
// 256 MiB of RSS.  Hidden from make test (writing 100 M records takes
// minutes and gigabytes): run with
//   build/bin/perfq_tests '[big]'
// (PERFQ_BIG_RECORDS=10000000 for a quicker look; the trace is written
// under PERFQ_BIG_DIR, default /var/tmp).
#include <sys/resource.h>
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "trace/synth.h"

#include "test_util.h"

namespace perfq {
namespace {

// Runs a shell command; the largest RSS of its children, in KiB.
long max_rss_kib_of(const std::string& cmd, int& rc) {
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  rusage ru{};
  REQUIRE(wait4(pid, &status, 0, &ru) == pid);
  rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return ru.ru_maxrss;
}

}  // namespace

TEST_CASE("big trace: report and exports of 100 M records within 256 MiB of RSS", "[.][big]") {
  const char* n_env = std::getenv("PERFQ_BIG_RECORDS");
  const uint64_t records = n_env ? std::strtoull(n_env, nullptr, 10) : 100'000'000;
  const char* dir_env = std::getenv("PERFQ_BIG_DIR");
  const std::string path = std::string(dir_env ? dir_env : "/var/tmp") + "/perfq-big-" +
                           std::to_string(getpid()) + ".pq";
  struct Remove {
    std::string p;
    ~Remove() { std::filesystem::remove(p); }
  } remove{path};
  SynthTraceOptions o;
  o.jobs = records / 8;  // submit, start, end, complete, a work pair, two counters
  o.period_ns = 10'000;
  const auto t0 = std::chrono::steady_clock::now();
  auto written = write_synthetic_trace(path, o);
  REQUIRE(written.is_ok());
  WARN(written.value()
       << " records, " << std::filesystem::file_size(path) / 1e6 << " MB, written in "
       << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s");
  const std::string ctl = PERFQCTL_PATH;
  for (const std::string& args :
       {"report " + path + " --json", "report " + path + " --html /dev/null",
        "export " + path + " -f perfetto -o /dev/null",
        "export " + path + " -f chrome-json -o /dev/null",
        "export " + path + " -f csv -o /dev/null"}) {
    int rc = -1;
    const auto t = std::chrono::steady_clock::now();
    const long kib = max_rss_kib_of(ctl + " " + args + " > /dev/null", rc);
    WARN("perfqctl " << args << ": max RSS " << kib / 1024 << " MiB, "
                     << std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count()
                     << " s");
    CHECK(rc == 0);
    CHECK(kib < 256 * 1024);
  }
}

}  // namespace perfq
