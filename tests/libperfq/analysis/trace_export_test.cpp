// Tests of libperfq/export.h: each export checked by an independent reader
// (nlohmann-json, protoc --decode, babeltrace2) against the trace itself.
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "perfq/export.h"
#include "perfq_kevent.h"
#include "trace/synth.h"

#include "test_util.h"
#include "trace_build.h"

namespace perfq {
namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

void require_tool(const char* tool, const char* package) {
  if (sh(std::string("command -v ") + tool + " >/dev/null 2>&1") != 0) {
    FAIL(tool << " is not installed: install the Debian package " << package
              << " (scripts/deps.sh does)");
  }
}

// Every record of a trace, with its event name: the truth to compare with.
struct Expected {
  std::vector<TraceRecord> records;
  std::vector<std::string> names;
};

class Collect : public TraceVisitor {
 public:
  explicit Collect(Expected& e) : e_(e) {}
  Status on_metadata(const TraceMetadata& m) override {
    m_ = m;
    return Status::ok();
  }
  Status on_records(std::span<const TraceRecord> recs) override {
    for (const auto& r : recs) {
      e_.records.push_back(r);
      const TraceSource* s = m_.find_source(r.source);
      const EventInfo* ev = s ? s->find_event(r.rec.event) : nullptr;
      e_.names.push_back(ev ? ev->name : "?");
    }
    return Status::ok();
  }

 private:
  Expected& e_;
  TraceMetadata m_;
};

Expected expected_of(const std::string& path) {
  Expected e;
  auto r = TraceReader::open(path);
  REQUIRE(r.is_ok());
  Collect c(e);
  REQUIRE(r->read(c).is_ok());
  return e;
}

// 50 jobs, 400 records over several chunks.
std::string make_trace(const TempDir& dir) {
  const std::string path = dir.file("in.pq");
  SynthTraceOptions o;
  o.jobs = 50;
  o.submit_to_start = {1'500, 2'500};
  TraceWriterOptions w;
  w.records_per_chunk = 64;
  w.compress = false;  // chunk sizes the cut test relies on
  REQUIRE(write_synthetic_trace(path, o, w).is_ok());
  return path;
}

TEST_CASE("export csv: a header and one row per record", "[export]") {
  TempDir dir("export");
  const std::string in = make_trace(dir);
  const Expected e = expected_of(in);
  REQUIRE(e.records.size() == 400);
  auto s = export_trace(in, TraceExportFormat::kCsv, dir.file("out.csv"));
  REQUIRE(s.is_ok());
  CHECK(s->records == 400);
  CHECK(s->stopped_early.empty());
  auto lines = lines_of(slurp(dir.file("out.csv")));
  REQUIRE(lines.size() == 401);
  CHECK(lines[0] ==
        "time_ns,source,stream,index,event,name,kind,raw_time,arg,claim_ns,converted_by");
  for (size_t i = 0; i < e.records.size(); ++i) {
    const TraceRecord& r = e.records[i];
    const std::string want =
        std::to_string(r.time_ns) + "," + (r.source == 0 ? "synth-app" : "synth-dev") + "," +
        std::to_string(r.rec.stream) + "," + std::to_string(r.rec.index) + "," +
        std::to_string(r.rec.event) + "," + e.names[i] + "," + record_kind_name(r.kind()) + "," +
        std::to_string(r.rec.time) + "," + std::to_string(r.rec.arg) + "," +
        (r.source == 0 ? "0,none" : "200,daemon");
    REQUIRE(lines[i + 1] == want);
  }
}

TEST_CASE("export chrome-json: parses, every event has the required fields", "[export]") {
  TempDir dir("export");
  const std::string in = make_trace(dir);
  const Expected e = expected_of(in);
  REQUIRE(export_trace(in, TraceExportFormat::kChromeJson, dir.file("out.json")).is_ok());
  auto j = nlohmann::json::parse(slurp(dir.file("out.json")));
  REQUIRE(j.contains("traceEvents"));
  std::map<std::string, int> ph;
  for (const auto& ev : j["traceEvents"]) {
    for (const char* f : {"name", "ph", "ts", "pid", "tid", "cat"}) {
      INFO(ev.dump() << " lacks " << f);
      REQUIRE(ev.contains(f));
    }
    REQUIRE(ev["ts"].is_number());
    const std::string p = ev["ph"];
    ++ph[p];
    if (p == "X") REQUIRE(ev.contains("dur"));
    if (p == "s" || p == "t" || p == "f") REQUIRE(ev.contains("id"));
    if (p == "C") REQUIRE(ev["args"].contains("value"));
  }
  CHECK(ph["B"] == 100);  // work + job_start
  CHECK(ph["E"] == 100);
  CHECK(ph["X"] == 100);  // job_submit + job_complete
  CHECK(ph["C"] == 100);  // queue_depth + dma_bytes
  CHECK(ph["s"] == 50);
  CHECK(ph["t"] == 100);
  CHECK(ph["f"] == 50);
  CHECK(ph["M"] == 2 + 2 + 3);  // processes, host threads, device queues
  // Microsecond timestamps with ns precision: find the first submit.
  for (size_t i = 0; i < e.records.size(); ++i) {
    if (e.names[i] != "job_submit") continue;
    bool found = false;
    for (const auto& ev : j["traceEvents"]) {
      if (ev["name"] == "job_submit") {
        CHECK(ev["ts"].get<double>() == Approx(static_cast<double>(e.records[i].time_ns) / 1000.0));
        found = true;
        break;
      }
    }
    CHECK(found);
    break;
  }
}

// The Perfetto export of trace `in`, decoded by protoc (text format).
std::string perfetto_decoded(const TempDir& dir, const std::string& in) {
  require_tool("protoc", "protobuf-compiler");
  REQUIRE(export_trace(in, TraceExportFormat::kPerfetto, dir.file("out.pftrace")).is_ok());
  const std::string cmd = std::string("protoc --proto_path=") + PERFQ_TEST_DATA_DIR +
                          " --decode=perfetto.protos.Trace perfetto_trace.proto < " +
                          dir.file("out.pftrace") + " > " + dir.file("decoded.txt") + " 2> " +
                          dir.file("protoc.err");
  INFO(slurp(dir.file("protoc.err")));
  REQUIRE(sh(cmd) == 0);
  return slurp(dir.file("decoded.txt"));
}

TEST_CASE("export perfetto: protoc decodes it with no unknown fields", "[export]") {
  TempDir dir("export");
  const std::string in = make_trace(dir);
  const std::string text = perfetto_decoded(dir, in);
  auto count = [&text](const std::string& what) {
    size_t n = 0;
    for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
    return n;
  };
  CHECK(count("track_event {") == 400);
  // 2 processes, 5 streams, counter tracks: queue_depth on 2 host threads,
  // dma_bytes on 3 device queues.
  CHECK(count("track_descriptor {") == 2 + 5 + 5);
  CHECK(count("type: TYPE_SLICE_BEGIN") == 100);
  CHECK(count("type: TYPE_SLICE_END") == 100);
  CHECK(count("type: TYPE_INSTANT") == 100);
  CHECK(count("type: TYPE_COUNTER") == 100);
  CHECK(count("flow_ids:") == 150 + 50);  // "terminating_flow_ids:" contains it too
  CHECK(count("terminating_flow_ids:") == 50);
  CHECK(count("name: \"job_submit\"") == 50);
  CHECK(count("process_name: \"device synth-dev\"") == 1);
  // protoc prints unknown fields as bare numbers: there must be none.
  static const std::regex unknown(R"(^\s*[0-9]+[:{ ])");
  for (const auto& l : lines_of(text)) {
    INFO(l);
    REQUIRE(!std::regex_search(l, unknown));
  }
}

// Kernel events (perfq-daemon --kernel-events) of an application thread go
// on that thread's track, which carries the thread's real tid and name;
// those of other threads on a track per CPU.
TEST_CASE("export perfetto: kernel events land on their thread's track", "[export]") {
  TempDir dir("export");
  const std::string in = dir.file("kev.pq");
  TraceMetadata meta;
  TraceSource app;
  app.id = 256;
  app.name = "app";
  app.pid = 4240;
  app.events = {{1, PERFQ_KIND_INSTANT, "job_submit"}};
  app.threads = {{0, 4242, "job-0"}};
  TraceSource kern;
  kern.id = PERFQ_KERNEL_SOURCE;
  kern.kind = TraceSourceKind::kKernel;
  kern.name = "kernel";
  kern.events = {{PERFQ_KEV_SCHED_OUT, PERFQ_KIND_INSTANT, "sched_switch_out"},
                 {PERFQ_KEV_SCHED_IN, PERFQ_KIND_INSTANT, "sched_switch_in"},
                 {PERFQ_KEV_SYSCALL_ENTER, PERFQ_KIND_INSTANT, "syscall_enter"}};
  meta.sources = {app, kern};
  TraceBuilder b;
  b.instant(256, 0, 1, 1000, 7);
  b.instant(PERFQ_KERNEL_SOURCE, 0, PERFQ_KEV_SCHED_OUT, 1500, 4242);
  b.instant(PERFQ_KERNEL_SOURCE, 1, PERFQ_KEV_SYSCALL_ENTER, 1800, uint64_t{39} << 32 | 999);
  b.instant(PERFQ_KERNEL_SOURCE, 1, PERFQ_KEV_SCHED_IN, 2500, 4242);
  b.write(in, meta);
  const std::string text = perfetto_decoded(dir, in);
  INFO(text);
  std::smatch m;
  static const std::regex thread_track(
      R"(uuid: (\d+)\s+thread \{\s+pid: 4240\s+tid: 4242\s+thread_name: "job-0")");
  REQUIRE(std::regex_search(text, m, thread_track));
  const std::string uuid = m[1];
  size_t on_thread = 0;
  const std::regex ev_track(R"(track_uuid: (\d+))");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), ev_track);
       it != std::sregex_iterator(); ++it)
    on_thread += (*it)[1] == uuid;
  CHECK(on_thread == 3);  // job_submit, sched_switch_out, sched_switch_in
  CHECK(text.find("name: \"cpu 1\"") != std::string::npos);  // tid 999's syscall
  CHECK(text.find("name: \"cpu 0\"") == std::string::npos);
}

TEST_CASE("export ctf: babeltrace2 reads every event with its name and time", "[export]") {
  require_tool("babeltrace2", "babeltrace2");
  TempDir dir("export");
  const std::string in = make_trace(dir);
  const Expected e = expected_of(in);
  const std::string out = dir.file("ctf");
  auto s = export_trace(in, TraceExportFormat::kCtf, out);
  REQUIRE(s.is_ok());
  CHECK(std::filesystem::exists(out + "/metadata"));
  const std::string cmd = "babeltrace2 --clock-cycles " + out + " > " + dir.file("bt.txt") +
                          " 2> " + dir.file("bt.err");
  const int rc = sh(cmd);
  INFO(slurp(dir.file("bt.err")));
  REQUIRE(rc == 0);
  const auto lines = lines_of(slurp(dir.file("bt.txt")));
  REQUIRE(lines.size() == e.records.size());
  // "[1000000000] (+?.?????????) HOST job_submit: { ... }"
  static const std::regex line_re(R"(^\[(\d+)\] \([^)]*\) (?:\S+ )?([A-Za-z0-9_]+): )");
  for (size_t i = 0; i < lines.size(); ++i) {
    std::smatch m;
    INFO(lines[i]);
    REQUIRE(std::regex_search(lines[i], m, line_re));
    REQUIRE(std::stoll(m[1].str()) == e.records[i].time_ns);
    REQUIRE(m[2].str() == e.names[i]);
    REQUIRE(lines[i].find("index = " + std::to_string(e.records[i].rec.index)) !=
            std::string::npos);
  }
  std::smatch first, last;
  REQUIRE(std::regex_search(lines.front(), first, line_re));
  REQUIRE(std::regex_search(lines.back(), last, line_re));
  CHECK(std::stoll(first[1].str()) == e.records.front().time_ns);
  CHECK(std::stoll(last[1].str()) == e.records.back().time_ns);
}

TEST_CASE("export: a damaged input exports what came before and says where", "[export]") {
  TempDir dir("export");
  const std::string in = make_trace(dir);
  std::filesystem::resize_file(in, std::filesystem::file_size(in) - 100);
  auto s = export_trace(in, TraceExportFormat::kCsv, dir.file("out.csv"));
  REQUIRE(s.is_ok());
  CHECK(!s->stopped_early.empty());
  CHECK_THAT(s->stopped_early, Catch::Contains("byte offset " + std::to_string(s->stop_offset)));
  CHECK(s->records == 384);  // 6 full chunks of 64; the 16 of the last are torn
  CHECK(lines_of(slurp(dir.file("out.csv"))).size() == 385);

  CHECK(!parse_export_format("svg").is_ok());
  auto bad = export_trace(dir.file("missing.pq"), TraceExportFormat::kCsv, dir.file("x.csv"));
  REQUIRE(!bad.is_ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("missing.pq"));
  auto unwritable = export_trace(in, TraceExportFormat::kCsv, dir.file("no/such/dir/x.csv"));
  REQUIRE(!unwritable.is_ok());
  CHECK_THAT(unwritable.status().message(), Catch::Contains("x.csv"));
}

}  // namespace
}  // namespace perfq
