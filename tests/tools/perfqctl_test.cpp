// Tests of the perfqctl binary as a real process: report and export, exit
// codes (0 ok, 1 failure, 2 usage) and one-line errors naming file and offset.
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "trace/synth.h"

#ifndef PERFQCTL_PATH
#error "PERFQCTL_PATH must name the perfqctl binary"
#endif

#include "test_util.h"

namespace perfq {
namespace {

struct Run {
  int rc = -1;
  std::string out;
  std::string err;
};

// Runs perfqctl with `args` (shell words), capturing stdout and stderr.
Run perfqctl(const TempDir& dir, const std::string& args) {
  const std::string cmd = std::string(PERFQCTL_PATH) + " " + args + " > " + dir.file("stdout") +
                          " 2> " + dir.file("stderr");
  int rc = std::system(cmd.c_str());
  Run r;
  r.rc = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  r.out = slurp(dir.file("stdout"));
  r.err = slurp(dir.file("stderr"));
  return r;
}

size_t count_lines(const std::string& s) {
  size_t n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

std::string make_trace(const TempDir& dir) {
  const std::string path = dir.file("t.pq");
  SynthTraceOptions o;
  o.jobs = 40;
  o.submit_to_start = {3'000};
  o.start_to_end = {8'000};
  o.end_to_complete = {2'000};
  TraceWriterOptions w;
  w.records_per_chunk = 50;
  w.compress = false;  // chunk sizes the cuts below rely on
  REQUIRE(write_synthetic_trace(path, o, w).is_ok());
  return path;
}

TEST_CASE("perfqctl report --json prints the documented figures", "[perfqctl][report]") {
  TempDir dir("ctl");
  const std::string trace = make_trace(dir);
  Run r = perfqctl(dir, "report " + trace + " --json");
  INFO(r.err);
  REQUIRE(r.rc == 0);
  CHECK(r.err.empty());
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["records"]["host"] == 200);
  CHECK(j["records"]["device"] == 120);
  CHECK(j["lost"]["host"] == 0);
  CHECK(j["lost"]["device"] == 0);
  CHECK(j["sync"]["device_ahead_ns"] == -5'000'000'000.0);
  CHECK(j["sync"]["device_fast_ppm"] == 0.0);
  CHECK(j["sync"]["uncertainty_ns"] == 200);
  CHECK(j["jobs"]["count"] == 40);
  CHECK(j["jobs"]["submit_to_start_ns"]["p50"] == 3000);
  CHECK(j["jobs"]["submit_to_start_ns"]["p99"] == 3000);
  CHECK(j["jobs"]["start_to_end_ns"]["p50"] == 8000);
  CHECK(j["jobs"]["end_to_complete_ns"]["p99"] == 2000);
  CHECK(j["causality_violations"] == 0);

  Run text = perfqctl(dir, "report " + trace);
  REQUIRE(text.rc == 0);
  CHECK_THAT(text.out, Catch::Contains("jobs          40 complete"));

  Run resync = perfqctl(dir, "report --resync --json " + trace);
  REQUIRE(resync.rc == 0);
  CHECK(nlohmann::json::parse(resync.out)["sync"]["resynced"] == true);
}

TEST_CASE("perfqctl export writes every format", "[perfqctl][export]") {
  TempDir dir("ctl");
  const std::string trace = make_trace(dir);
  for (const char* f : {"csv", "chrome-json", "perfetto", "ctf"}) {
    const std::string out = dir.file(std::string("out.") + f);
    Run r = perfqctl(dir, "export " + trace + " --format " + f + " -o " + out);
    INFO(f << ": " << r.err);
    REQUIRE(r.rc == 0);
    CHECK(std::filesystem::exists(out));
  }
  CHECK(count_lines(slurp(dir.file("out.csv"))) == 321);
  CHECK(std::filesystem::exists(dir.file("out.ctf/metadata")));
}

// --compress: perfetto only; another format is refused by name and nothing
// is written.
TEST_CASE("perfqctl export --compress", "[perfqctl][export]") {
  TempDir dir("ctl");
  const std::string trace = make_trace(dir);
  Run plain = perfqctl(dir, "export " + trace + " -f perfetto -o " + dir.file("p.pftrace"));
  REQUIRE(plain.rc == 0);
  Run z = perfqctl(dir, "export " + trace + " -f perfetto --compress -o " + dir.file("z.pftrace"));
  INFO(z.err);
  REQUIRE(z.rc == 0);
  CHECK(std::filesystem::file_size(dir.file("z.pftrace")) <
        std::filesystem::file_size(dir.file("p.pftrace")));
  Run bad = perfqctl(dir, "export " + trace + " -f csv --compress -o " + dir.file("x.csv"));
  CHECK(bad.rc == 2);
  CHECK_THAT(bad.err, Catch::Contains("--compress is for -f perfetto, not csv"));
  CHECK_FALSE(std::filesystem::exists(dir.file("x.csv")));
}

// Two runs side by side: each figure of both with its change.
TEST_CASE("perfqctl report A B: the two runs' figures side by side", "[perfqctl][report]") {
  TempDir dir("ctl");
  SynthTraceOptions o;
  o.jobs = 20;
  o.submit_to_start = {2'000};
  REQUIRE(write_synthetic_trace(dir.file("a.pq"), o).is_ok());
  o.jobs = 30;
  o.submit_to_start = {5'000};
  REQUIRE(write_synthetic_trace(dir.file("b.pq"), o).is_ok());
  Run r = perfqctl(dir, "report " + dir.file("a.pq") + " " + dir.file("b.pq") + " --json");
  INFO(r.err);
  REQUIRE(r.rc == 0);
  const auto j = nlohmann::json::parse(r.out);
  std::map<std::string, nlohmann::json> fig;
  for (const auto& f : j["figures"]) fig[f["figure"]] = f;
  REQUIRE(fig.count("jobs.submit_to_start_ns.p50") == 1);
  CHECK(fig["jobs.submit_to_start_ns.p50"]["a"] == 2000);
  CHECK(fig["jobs.submit_to_start_ns.p50"]["b"] == 5000);
  CHECK(fig["jobs.submit_to_start_ns.p50"]["change"] == 3000);
  CHECK(fig["jobs.submit_to_start_ns.p50"]["relative"].get<double>() == Approx(1.5));
  CHECK(fig["jobs.count"]["a"] == 20);
  CHECK(fig["jobs.count"]["b"] == 30);
  // Events line up by source and name.
  CHECK(fig.count("events[synth-app/instant/job_submit].count") == 1);
  Run text = perfqctl(dir, "report " + dir.file("a.pq") + " " + dir.file("b.pq"));
  REQUIRE(text.rc == 0);
  CHECK_THAT(text.out, Catch::Contains("jobs.submit_to_start_ns.p50"));
  CHECK_THAT(text.out, Catch::Contains("+150.0%"));
  Run html = perfqctl(
      dir, "report " + dir.file("a.pq") + " " + dir.file("b.pq") + " --html " + dir.file("x.html"));
  CHECK(html.rc == 2);
  CHECK_THAT(html.err, Catch::Contains("--html takes one trace"));
}

// The progress bar: on a terminal (script(1) gives perfqctl a pty) once the
// work has run PERFQ_PROGRESS_AFTER_MS (0 here, so that a small trace
// shows it); never when stderr is not a terminal.
TEST_CASE("perfqctl report/export: a progress bar on a terminal, nothing otherwise",
          "[perfqctl][progress]") {
  TempDir dir("ctl");
  const std::string trace = make_trace(dir);
  if (sh("command -v script >/dev/null 2>&1") != 0)
    FAIL("script(1) is not installed: it is in the Debian package bsdutils");
  for (const std::string& cmd :
       {"export " + trace + " -f chrome-json -o " + dir.file("o.json"), "report " + trace}) {
    INFO(cmd);
    REQUIRE(sh("PERFQ_PROGRESS_AFTER_MS=0 script -qec '" + std::string(PERFQCTL_PATH) + " " + cmd +
               " >/dev/null' /dev/null > " + dir.file("tty.out")) == 0);
    const std::string tty = slurp(dir.file("tty.out"));
    INFO(tty);
    CHECK(tty.find("records") != std::string::npos);
    CHECK(tty.find("M/s") != std::string::npos);
    CHECK(tty.find("left") != std::string::npos);
    CHECK(tty.find("100%") != std::string::npos);
    // Not a terminal: nothing on stderr.
    Run r = perfqctl(dir, cmd);
    REQUIRE(r.rc == 0);
    CHECK(r.err.empty());
  }
}

TEST_CASE("perfqctl devices --pci-dump: the table of an lspci -xxx dump, no daemon",
          "[perfqctl][pci]") {
  TempDir dir("ctl");
  const std::string dump = std::string(PERFQ_TEST_FIXTURES_DIR) + "/pci-dump.txt";
  Run r = perfqctl(dir, "devices --pci-dump " + dump);
  INFO(r.err);
  REQUIRE(r.rc == 0);
  CHECK(r.err.empty());
  CHECK_THAT(r.out, Catch::Contains("ADDRESS") && Catch::Contains("MAX LINK"));
  // A row per device: address, IDs, links now and max, ceiling, sizes, name.
  CHECK_THAT(
      r.out,
      Catch::Matches(
          "[\\s\\S]*0000:06:00\\.0 +144d:a80a +- +- +- +Gen3 x4 +Gen4 x4 +3\\.94 +256/256 +512 +"
          "Samsung Electronics Co Ltd NVMe SSD Controller PM9A1/PM9A3/980PRO\n[\\s\\S]*"));
  CHECK_THAT(r.out,
             Catch::Matches(
                 "[\\s\\S]*0000:05:00\\.0 +10de:2330 .* Gen5 x16 +Gen5 x16 +63\\.02 [\\s\\S]*"));
  CHECK_THAT(r.out,
             Catch::Matches("[\\s\\S]*0000:08:00\\.0 +1af4:1110 +- +- +- +PCI +- +- [\\s\\S]*"));
  CHECK_THAT(r.out,
             Catch::Matches("[\\s\\S]*0001:0a:00\\.0 +7fff:0001 .* down +Gen3 x4 [\\s\\S]*"));
  CHECK_THAT(r.out, Catch::Matches("[\\s\\S]*0000:0b:00\\.0 +8086:0b60 .* unknown [\\s\\S]*"));
  // The two links trained below their capability get a note each.
  CHECK_THAT(r.out, Catch::Contains("note: 0000:06:00.0 link Gen3 x4 (8 GT/s, 3.94 GB/s) of max "
                                    "Gen4 x4 (16 GT/s, 7.88 GB/s): trained below its capability"));
  CHECK_THAT(r.out,
             Catch::Contains("note: 0000:07:00.0 link Gen4 x8 (16 GT/s, 15.75 GB/s) of max "
                             "Gen4 x16 (16 GT/s, 31.51 GB/s): trained below its capability"));
  CHECK(count_lines(r.out) == 1 + 1 + 13 + 2);

  Run j = perfqctl(dir, "devices --pci-dump " + dump + " --json");
  REQUIRE(j.rc == 0);
  auto doc = nlohmann::json::parse(j.out);
  CHECK(doc["ok"] == true);
  REQUIRE(doc["pci_devices"].size() == 13);
  CHECK(doc["pci_devices"][0]["address"] == "0000:00:03.0");

  Run missing = perfqctl(dir, "devices --pci-dump " + dir.file("nope.txt"));
  CHECK(missing.rc == 1);
  CHECK(count_lines(missing.err) == 1);
  CHECK_THAT(missing.err, Catch::Contains(dir.file("nope.txt")));
  std::ofstream(dir.file("bad.txt")) << "00:01.0 x\n00: 86 80 zz\n";
  Run bad = perfqctl(dir, "devices --pci-dump " + dir.file("bad.txt"));
  CHECK(bad.rc == 1);
  CHECK(count_lines(bad.err) == 1);
  CHECK_THAT(bad.err, Catch::Contains(dir.file("bad.txt")) && Catch::Contains("Malformed"));
}

TEST_CASE("perfqctl: usage errors exit 2, failures exit 1 with one line", "[perfqctl]") {
  TempDir dir("ctl");
  const std::string trace = make_trace(dir);

  Run none = perfqctl(dir, "");
  CHECK(none.rc == 2);
  Run bogus = perfqctl(dir, "frobnicate");
  CHECK(bogus.rc == 2);
  Run nofile = perfqctl(dir, "report");
  CHECK(nofile.rc == 2);
  Run badfmt = perfqctl(dir, "export " + trace + " --format svg -o x");
  CHECK(badfmt.rc == 2);
  Run noout = perfqctl(dir, "export " + trace + " --format csv");
  CHECK(noout.rc == 2);
  CHECK(perfqctl(dir, "--help").rc == 0);

  Run missing = perfqctl(dir, "report " + dir.file("missing.pq"));
  CHECK(missing.rc == 1);
  CHECK(count_lines(missing.err) == 1);
  CHECK_THAT(missing.err, Catch::Contains("missing.pq"));

  // Cut inside the last record chunk: the report still prints, exit 1, and
  // stderr names the file and the byte offset of the torn chunk.
  const auto size = std::filesystem::file_size(trace);
  std::filesystem::resize_file(trace, size - 500);
  Run torn = perfqctl(dir, "report --json " + trace);
  CHECK(torn.rc == 1);
  CHECK(count_lines(torn.err) == 1);
  CHECK_THAT(torn.err, Catch::Contains(trace) && Catch::Contains("byte offset"));
  auto j = nlohmann::json::parse(torn.out);
  CHECK(j["complete"] == false);
  CHECK(j["records"]["host"].get<int>() + j["records"]["device"].get<int>() == 300);

  Run torn_export = perfqctl(dir, "export " + trace + " --format csv -o " + dir.file("t.csv"));
  CHECK(torn_export.rc == 1);
  CHECK(count_lines(torn_export.err) == 1);
  CHECK_THAT(torn_export.err, Catch::Contains("byte offset"));
  CHECK(count_lines(slurp(dir.file("t.csv"))) == 301);
}

TEST_CASE("perfqctl report/export: a trace whose structure is damaged exits 1 and says where",
          "[perfqctl]") {
  TempDir dir("ctl");
  const std::string trace = make_trace(dir);
  // The first records chunk appended after the end chunk: an end in the middle, and a repeated
  // records chunk.
  std::string bytes = slurp(trace);
  auto chunk_len = [&](uint64_t off) {
    uint32_t stored = 0;
    std::memcpy(&stored, bytes.data() + off + 8, 4);
    return kTraceChunkHeaderSize + stored;
  };
  auto chunk_type = [&](uint64_t off) {
    uint16_t type = 0;
    std::memcpy(&type, bytes.data() + off + 4, 2);
    return type;
  };
  uint64_t first = kTraceFileHeaderSize;
  while (chunk_type(first) != static_cast<uint16_t>(ChunkType::kRecords)) {
    first += chunk_len(first);
    REQUIRE(first < bytes.size());
  }
  const std::string copy = bytes.substr(first, chunk_len(first));
  const uint64_t copy_at = bytes.size();
  {
    std::ofstream f(trace, std::ios::binary | std::ios::app);
    f << copy;
  }
  Run r = perfqctl(dir, "report --json " + trace);
  INFO(r.err);
  CHECK(r.rc == 1);
  CHECK(count_lines(r.err) == 2);
  CHECK_THAT(r.err, Catch::Contains("trace damaged") && Catch::Contains("end chunk in the middle"));
  CHECK_THAT(r.err, Catch::Contains("byte offset " + std::to_string(copy_at) + ":") &&
                        Catch::Contains("repeats the records chunk at byte offset " +
                                        std::to_string(first)));
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["complete"] == false);
  CHECK(j["clean_end"] == false);
  CHECK(j["problems"].size() == 2);
  // Nothing counted twice.
  CHECK(j["records"]["host"].get<int>() + j["records"]["device"].get<int>() == 320);

  Run text = perfqctl(dir, "report " + trace);
  CHECK(text.rc == 1);
  CHECK_THAT(text.out, Catch::Contains("WARNING: trace damaged"));

  Run ex = perfqctl(dir, "export " + trace + " --format csv -o " + dir.file("t.csv"));
  CHECK(ex.rc == 1);
  CHECK_THAT(ex.err, Catch::Contains("repeats the records chunk"));
  CHECK(count_lines(slurp(dir.file("t.csv"))) == 321);
}

}  // namespace
}  // namespace perfq
