// Tests of libperfq/export.h: each export checked by an independent reader
// (nlohmann-json, protoc --decode, babeltrace2) against the trace itself.
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "perfq/export.h"
#include "perfq/filter.h"
#include "perfq/perfq.h"
#include "perfq/report.h"
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
        "time_ns,source,stream,index,event,name,kind,raw_time,arg,claim_ns,converted_by,source_id");
  for (size_t i = 0; i < e.records.size(); ++i) {
    const TraceRecord& r = e.records[i];
    const std::string want =
        std::to_string(r.time_ns) + "," + (r.source == 0 ? "synth-app" : "synth-dev") + "," +
        std::to_string(r.rec.stream) + "," + std::to_string(r.rec.index) + "," +
        std::to_string(r.rec.event) + "," + e.names[i] + "," + record_kind_name(r.kind()) + "," +
        std::to_string(r.rec.time) + "," + std::to_string(r.rec.arg) + "," +
        (r.source == 0 ? "0,none" : "200,daemon") + "," + std::to_string(r.source);
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
  // Slices nest and an E has its B's name; 64-bit values are strings.
  std::map<std::pair<int64_t, int64_t>, std::vector<std::string>> open;
  for (const auto& ev : j["traceEvents"]) {
    auto& stack = open[{ev["pid"].get<int64_t>(), ev["tid"].get<int64_t>()}];
    if (ev["ph"] == "B") stack.push_back(ev["name"]);
    if (ev["ph"] == "E") {
      INFO(ev.dump());
      REQUIRE(!stack.empty());
      CHECK(ev["name"] == stack.back());
      stack.pop_back();
    }
    if (ev.contains("args") && ev["args"].contains("arg")) CHECK(ev["args"]["arg"].is_string());
  }
  for (const auto& [thread, stack] : open) CHECK(stack.empty());
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

// protoc's text format as a tree: each message its scalar fields (in order)
// and its sub-messages.
struct PbNode {
  std::vector<std::pair<std::string, std::string>> values;
  std::vector<std::pair<std::string, PbNode>> children;
  const std::string* value(const std::string& k) const {
    for (const auto& [key, v] : values)
      if (key == k) return &v;
    return nullptr;
  }
  uint64_t u64(const std::string& k, uint64_t dflt = 0) const {
    const std::string* v = value(k);
    return v ? std::stoull(*v) : dflt;
  }
  const PbNode* child(const std::string& k) const {
    for (const auto& [key, c] : children)
      if (key == k) return &c;
    return nullptr;
  }
};

PbNode parse_text_format(const std::string& text) {
  PbNode root;
  std::vector<PbNode*> stack{&root};
  for (const std::string& raw : lines_of(text)) {
    std::string l = raw.substr(
        raw.find_first_not_of(' ') == std::string::npos ? raw.size() : raw.find_first_not_of(' '));
    if (l.empty()) continue;
    if (l == "}") {
      REQUIRE(stack.size() > 1);
      stack.pop_back();
    } else if (l.back() == '{') {
      auto& c = stack.back()->children.emplace_back(l.substr(0, l.size() - 2), PbNode{});
      stack.push_back(&c.second);
    } else {
      const size_t colon = l.find(": ");
      REQUIRE(colon != std::string::npos);
      std::string v = l.substr(colon + 2);
      if (v.size() >= 2 && v.front() == '"') v = v.substr(1, v.size() - 2);
      stack.back()->values.emplace_back(l.substr(0, colon), v);
    }
  }
  REQUIRE(stack.size() == 1);
  return root;
}

// A track event as Perfetto's rules make it: the sequence's interned names
// resolved, its default track applied, its incremental clock replayed to
// CLOCK_MONOTONIC ns.  Fails the test on anything those rules reject: an
// iid not interned on the sequence before or in its packet, a delta on a
// sequence with no incremental clock, an event on a track never described.
struct PfEvent {
  uint64_t seq = 0;
  uint64_t track = 0;
  uint64_t ts = 0;
  std::string type;
  std::string name;
  std::map<std::string, std::string> args;
  const PbNode* te = nullptr;
};
struct PfTrace {
  PbNode root;
  std::vector<PfEvent> events;
  std::map<uint64_t, const PbNode*> tracks;  // uuid -> descriptor
  std::vector<const PbNode*> snapshots;      // clock snapshots of sequence 1
};

PfTrace replay(const std::string& text) {
  PfTrace t;
  t.root = parse_text_format(text);
  struct SeqState {
    std::map<uint64_t, std::string> names, annotations;
    uint64_t default_track = 0, clock = 0;
    bool incremental = false;
    uint64_t last = 0;
  };
  std::map<uint64_t, SeqState> seqs;
  for (const auto& [key, pkt] : t.root.children) {
    REQUIRE(key == "packet");
    const uint64_t seq = pkt.u64("trusted_packet_sequence_id");
    REQUIRE(seq != 0);
    SeqState& st = seqs[seq];
    if (pkt.value("sequence_flags")) {
      REQUIRE(*pkt.value("sequence_flags") == "1");  // SEQ_INCREMENTAL_STATE_CLEARED
      st = SeqState{};
    }
    if (const PbNode* d = pkt.child("trace_packet_defaults")) {
      st.clock = d->u64("timestamp_clock_id");
      if (const PbNode* ted = d->child("track_event_defaults"))
        st.default_track = ted->u64("track_uuid");
    }
    if (const PbNode* id = pkt.child("interned_data")) {
      for (const auto& [k, e] : id->children) {
        auto& table = k == "event_names" ? st.names : st.annotations;
        REQUIRE((k == "event_names" || k == "debug_annotation_names"));
        table[e.u64("iid")] = *e.value("name");
      }
    }
    if (const PbNode* cs = pkt.child("clock_snapshot")) {
      uint64_t mono = 0;
      for (const auto& [k, c] : cs->children) {
        if (c.u64("clock_id") == 3) mono = c.u64("timestamp");
        if (c.u64("clock_id") == 64) {
          // The sequence's clock, at MONOTONIC's value in the same snapshot.
          REQUIRE(c.value("is_incremental"));
          st.incremental = true;
          st.last = c.u64("timestamp");
          REQUIRE(st.last == mono);
        }
      }
      if (seq == 1) t.snapshots.push_back(cs);
      continue;
    }
    if (const PbNode* td = pkt.child("track_descriptor")) {
      t.tracks[td->u64("uuid")] = td;
      continue;
    }
    const PbNode* te = pkt.child("track_event");
    REQUIRE(te != nullptr);
    PfEvent ev;
    ev.seq = seq;
    ev.te = te;
    const uint64_t clock =
        pkt.value("timestamp_clock_id") ? pkt.u64("timestamp_clock_id") : st.clock;
    if (clock == 64) {
      REQUIRE(st.incremental);
      st.last += pkt.u64("timestamp");
      ev.ts = st.last;
    } else {
      REQUIRE(clock == 3);  // CLOCK_MONOTONIC, absolute
      ev.ts = pkt.u64("timestamp");
    }
    ev.track = te->value("track_uuid") ? te->u64("track_uuid") : st.default_track;
    REQUIRE(t.tracks.count(ev.track) == 1);
    ev.type = *te->value("type");
    if (te->value("name_iid")) {
      INFO("name_iid " << *te->value("name_iid") << " on sequence " << seq);
      REQUIRE(st.names.count(te->u64("name_iid")) == 1);
      ev.name = st.names[te->u64("name_iid")];
    }
    for (const auto& [k, da] : te->children) {
      if (k != "debug_annotations") continue;
      REQUIRE(st.annotations.count(da.u64("name_iid")) == 1);
      const std::string* v =
          da.value("uint_value") ? da.value("uint_value") : da.value("int_value");
      REQUIRE(v != nullptr);
      ev.args[st.annotations[da.u64("name_iid")]] = *v;
    }
    t.events.push_back(ev);
  }
  return t;
}

TEST_CASE("export perfetto: Perfetto's rules give back every record, its time and name",
          "[export]") {
  TempDir dir("export");
  const std::string in = make_trace(dir);
  const Expected e = expected_of(in);
  const std::string text = perfetto_decoded(dir, in);
  // protoc prints unknown fields as bare numbers: there must be none.
  static const std::regex unknown(R"(^\s*[0-9]+[:{ ])");
  for (const auto& l : lines_of(text)) {
    INFO(l);
    REQUIRE(!std::regex_search(l, unknown));
  }
  const PfTrace t = replay(text);
  // The record events, in order per track, against the records.
  std::map<uint64_t, std::vector<const PfEvent*>> by_track;
  size_t counters = 0;
  for (const auto& ev : t.events) {
    if (ev.type == "TYPE_COUNTER") {
      ++counters;
      continue;
    }
    by_track[ev.track].push_back(&ev);
  }
  std::map<uint64_t, size_t> next;
  size_t matched = 0, flows = 0, terminating = 0;
  for (size_t i = 0; i < e.records.size(); ++i) {
    const TraceRecord& r = e.records[i];
    if (r.kind() == PERFQ_KIND_COUNTER) continue;
    // The record's track: the one whose next event has its time.
    bool found = false;
    for (auto& [track, list] : by_track) {
      size_t& n = next[track];
      if (n >= list.size() || list[n]->ts != static_cast<uint64_t>(r.time_ns)) continue;
      const PfEvent& ev = *list[n];
      const char* want = r.kind() == PERFQ_KIND_BEGIN ? "TYPE_SLICE_BEGIN"
                         : r.kind() == PERFQ_KIND_END ? "TYPE_SLICE_END"
                                                      : "TYPE_INSTANT";
      if (ev.type != want) continue;
      if (r.kind() != PERFQ_KIND_END && ev.name != e.names[i]) continue;
      ++n;
      found = true;
      flows += ev.te->value("flow_ids") != nullptr;
      terminating += ev.te->value("terminating_flow_ids") != nullptr;
      if (e.names[i] == "job_submit" || e.names[i] == "job_start") {
        // 64-bit ids as they are (a varint, not a double).
        CHECK(ev.args.at("corr_id") == std::to_string(r.rec.arg));
      }
      break;
    }
    INFO("record " << i << " " << e.names[i] << " at " << r.time_ns);
    REQUIRE(found);
    ++matched;
  }
  CHECK(matched == 300);
  CHECK(counters >= 100);  // queue_depth, dma_bytes; sync bound and residuals
  // Submit and start carry the job's flow; an end that closes its start's
  // slice does not (the flow steps through that slice already: on both,
  // Perfetto would draw an arrow from the slice to itself); complete ends it.
  CHECK(flows == 100);
  CHECK(terminating == 50);
  for (const auto& ev : t.events)
    if (ev.type == "TYPE_SLICE_END") CHECK(ev.te->value("flow_ids") == nullptr);
  // A process per source: the device by its name and where it is.
  std::set<std::string> processes;
  for (const auto& [uuid, td] : t.tracks)
    if (const PbNode* pd = td->child("process")) processes.insert(*pd->value("process_name"));
  CHECK(processes.count("device synth-dev (0000:03:00.0)") == 1);
  CHECK(processes.count("synth-app") == 1);
  CHECK(processes.size() == 2);  // only sources with records
  // Counter tracks of the device's sync.
  std::set<std::string> counter_names;
  for (const auto& [uuid, td] : t.tracks)
    if (td->child("counter")) counter_names.insert(*td->value("name"));
  CHECK(counter_names.count("sync: claimed bound (ns)") == 1);
  CHECK(counter_names.count("sync: round residual (ns)") == 1);
  REQUIRE(t.snapshots.size() == 1);
}

// 20 000 synthetic jobs with work slices and counters: a trace whose
// Perfetto export is some megabytes.
std::string jobs_trace(const TempDir& dir) {
  const std::string in = dir.file("big.pq");
  SynthTraceOptions o;
  o.jobs = 20'000;
  o.work_pairs = true;
  REQUIRE(write_synthetic_trace(in, o).is_ok());
  return in;
}

TEST_CASE("export perfetto: small, with interned names and timestamp deltas", "[export]") {
  TempDir dir("export");
  const std::string in = jobs_trace(dir);
  auto s = export_trace(in, TraceExportFormat::kPerfetto, dir.file("out.pftrace"));
  REQUIRE(s.is_ok());
  const auto bytes = std::filesystem::file_size(dir.file("out.pftrace"));
  const double per_event = static_cast<double>(bytes) / static_cast<double>(s->records);
  INFO(bytes << " bytes for " << s->records << " records");
  // Each job: a submit and a start with its id and a flow, an end and a
  // complete with their flow, a work slice, two counters.  Spelled out
  // (names and two annotations per event, absolute times) it was 60-odd
  // bytes an event.
  CHECK(per_event < 24);
  const std::string text = slurp(dir.file("out.pftrace"));
  size_t job_submit = 0;
  for (size_t p = text.find("job_submit"); p != std::string::npos;
       p = text.find("job_submit", p + 1))
    ++job_submit;
  CHECK(job_submit <= 8);  // once per sequence, not once per event
}

// A job whose device start lies within its clock bound of its submit (the
// true order unknown) gets a mark on the device's track.
TEST_CASE("export perfetto: a mark where the clock bound could invert a job's order", "[export]") {
  TempDir dir("export");
  const std::string in = dir.file("close.pq");
  SynthTraceOptions o;
  o.jobs = 50;
  o.submit_to_start = {100, 5'000};  // the device's times claim +-200 ns
  REQUIRE(write_synthetic_trace(in, o).is_ok());
  const PfTrace t = replay(perfetto_decoded(dir, in));
  std::map<uint64_t, uint64_t> start_of;  // corr_id -> time of its job_start
  for (const auto& ev : t.events)
    if (ev.name == "job_start") start_of[std::stoull(ev.args.at("corr_id"))] = ev.ts;
  size_t marks = 0;
  for (const auto& ev : t.events) {
    if (ev.name != "order within the clock bound") continue;
    ++marks;
    CHECK(ev.args.at("bound_ns") == "200");
    CHECK(start_of.at(std::stoull(ev.args.at("corr_id"))) == ev.ts);
  }
  CHECK(marks == 25);
}

// A trace's sources for kernel events: application 256 (pid 4240, thread
// 0 = tid 4242 "job-0", event 1 job_submit) and the kernel with `events`,
// recorded on `kernel` (uname's line: the exports name syscalls by it).
TraceMetadata app_and_kernel(const std::string& kernel, std::vector<EventInfo> events) {
  TraceMetadata meta;
  meta.kernel = kernel;
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
  kern.events = std::move(events);
  meta.sources = {app, kern};
  return meta;
}

// A host thread (tid known from the trace) gets its kernel events: switches
// as off-CPU slices on its "thread state" track, syscalls as slices named by
// the syscall on its own track; another thread's events stay on its CPU's.
TEST_CASE("export perfetto: kernel events land on their thread's tracks", "[export]") {
  TempDir dir("export");
  const std::string in = dir.file("kev.pq");
  TraceMetadata meta = app_and_kernel(
      "Linux 6.1.0 x86_64", {{PERFQ_KEV_SCHED_OUT, PERFQ_KIND_INSTANT, "sched_switch_out"},
                             {PERFQ_KEV_SCHED_IN, PERFQ_KIND_INSTANT, "sched_switch_in"},
                             {PERFQ_KEV_SYSCALL_ENTER, PERFQ_KIND_INSTANT, "syscall_enter"},
                             {PERFQ_KEV_SYSCALL_EXIT, PERFQ_KIND_INSTANT, "syscall_exit"}});
  TraceSource gone;  // an application that exited before the recording: no records
  gone.id = 257;
  gone.name = "gone";
  gone.pid = 4100;
  meta.sources.push_back(gone);
  TraceBuilder b;
  b.instant(256, 0, 1, 1000, 7);
  b.instant(PERFQ_KERNEL_SOURCE, 0, PERFQ_KEV_SYSCALL_ENTER, 1200, uint64_t{230} << 32 | 4242);
  b.instant(PERFQ_KERNEL_SOURCE, 0, PERFQ_KEV_SCHED_OUT, 1500, uint64_t{1} << 32 | 4242);
  b.instant(PERFQ_KERNEL_SOURCE, 1, PERFQ_KEV_SYSCALL_ENTER, 1800, uint64_t{39} << 32 | 999);
  b.instant(PERFQ_KERNEL_SOURCE, 1, PERFQ_KEV_SCHED_IN, 2500, 4242);
  b.instant(PERFQ_KERNEL_SOURCE, 1, PERFQ_KEV_SYSCALL_EXIT, 2600, 4242);
  b.write(in, meta);
  const std::string text = perfetto_decoded(dir, in);
  INFO(text);
  const PfTrace t = replay(text);
  uint64_t thread = 0, state = 0, cpu1 = 0;
  for (const auto& [uuid, td] : t.tracks) {
    if (const PbNode* th = td->child("thread")) {
      if (th->u64("tid") == 4242 && th->u64("pid") == 4240 && *th->value("thread_name") == "job-0")
        thread = uuid;
    }
  }
  REQUIRE(thread != 0);
  for (const auto& [uuid, td] : t.tracks) {
    if (td->u64("parent_uuid") == thread && *td->value("name") == "thread state") state = uuid;
    if (td->value("name") && *td->value("name") == "cpu 1") cpu1 = uuid;
    CHECK((!td->value("name") || *td->value("name") != "cpu 0"));
  }
  REQUIRE(state != 0);
  REQUIRE(cpu1 != 0);
  for (const auto& [uuid, td] : t.tracks)
    if (const PbNode* pd = td->child("process")) CHECK(*pd->value("process_name") != "gone");
  std::vector<std::string> on_thread, on_state, on_cpu1;
  for (const auto& ev : t.events) {
    const std::string d = std::to_string(ev.ts) + " " + ev.type + " " + ev.name;
    if (ev.track == thread) on_thread.push_back(d);
    if (ev.track == state) on_state.push_back(d);
    if (ev.track == cpu1) on_cpu1.push_back(d + " tid=" + ev.args.at("tid"));
  }
  CHECK(on_thread == std::vector<std::string>{"1000 TYPE_INSTANT job_submit",
                                              "1200 TYPE_SLICE_BEGIN clock_nanosleep",
                                              "2600 TYPE_SLICE_END "});
  CHECK(on_state ==
        std::vector<std::string>{"1500 TYPE_SLICE_BEGIN sleeping", "2500 TYPE_SLICE_END "});
  CHECK(on_cpu1 == std::vector<std::string>{"1800 TYPE_INSTANT syscall_enter tid=999"});
}

// A probed function's return on Linux 6.11 and later (x86-64): the
// trampoline enters the uretprobe syscall (335), the uretprobe fires inside
// it, then the syscall exits.  The function's slice ends at the uretprobe;
// the trampoline's syscall and its exit are not drawn (drawn, its exit came
// after the slice it was inside had ended: an instant "syscall_exit" for
// every call).  Another syscall's exit after a lost one is drawn as before.
TEST_CASE("export perfetto: a uretprobe's trampoline syscall does not break its thread's slices",
          "[export]") {
  TempDir dir("export");
  const std::string in = dir.file("uret.pq");
  const TraceMetadata meta = app_and_kernel(
      "Linux 6.12.0 x86_64", {{PERFQ_KEV_SYSCALL_ENTER, PERFQ_KIND_INSTANT, "syscall_enter"},
                              {PERFQ_KEV_SYSCALL_EXIT, PERFQ_KIND_INSTANT, "syscall_exit"},
                              {PERFQ_KEV_UPROBE_BASE, PERFQ_KIND_INSTANT, "uprobe:submit"},
                              {PERFQ_KEV_UPROBE_BASE + 1, PERFQ_KIND_INSTANT, "uretprobe:submit"}});
  TraceBuilder b;
  const uint64_t tid = 4242;
  b.instant(256, 0, 1, 1000, 7);
  for (int64_t t0 : {2000, 3000}) {
    b.instant(PERFQ_KERNEL_SOURCE, 0, PERFQ_KEV_UPROBE_BASE, t0, tid);
    b.instant(PERFQ_KERNEL_SOURCE, 0, PERFQ_KEV_SYSCALL_ENTER, t0 + 100, uint64_t{1} << 32 | tid);
    b.instant(PERFQ_KERNEL_SOURCE, 0, PERFQ_KEV_SYSCALL_EXIT, t0 + 200, uint64_t{8} << 32 | tid);
    b.instant(PERFQ_KERNEL_SOURCE, 0, PERFQ_KEV_SYSCALL_ENTER, t0 + 300, uint64_t{335} << 32 | tid);
    b.instant(PERFQ_KERNEL_SOURCE, 0, PERFQ_KEV_UPROBE_BASE + 1, t0 + 310, tid);
    b.instant(PERFQ_KERNEL_SOURCE, 0, PERFQ_KEV_SYSCALL_EXIT, t0 + 320, uint64_t{1} << 32 | tid);
  }
  // A uretprobe syscall whose exit was lost: the next syscall's exit shows.
  b.instant(PERFQ_KERNEL_SOURCE, 0, PERFQ_KEV_SYSCALL_ENTER, 4000, uint64_t{335} << 32 | tid);
  b.instant(PERFQ_KERNEL_SOURCE, 0, PERFQ_KEV_SYSCALL_ENTER, 4100, uint64_t{39} << 32 | tid);
  b.instant(PERFQ_KERNEL_SOURCE, 0, PERFQ_KEV_SYSCALL_EXIT, 4200, uint64_t{5} << 32 | tid);
  b.write(in, meta);
  const PfTrace t = replay(perfetto_decoded(dir, in));
  std::vector<std::string> on_thread;
  for (const auto& ev : t.events)
    if (ev.name != "job_submit" && ev.type != "TYPE_COUNTER")
      on_thread.push_back(std::to_string(ev.ts) + " " + ev.type + " " + ev.name);
  CHECK(on_thread ==
        std::vector<std::string>{"2000 TYPE_SLICE_BEGIN submit", "2100 TYPE_SLICE_BEGIN write",
                                 "2200 TYPE_SLICE_END ", "2310 TYPE_SLICE_END ",
                                 "3000 TYPE_SLICE_BEGIN submit", "3100 TYPE_SLICE_BEGIN write",
                                 "3200 TYPE_SLICE_END ", "3310 TYPE_SLICE_END ",
                                 "4100 TYPE_SLICE_BEGIN getpid", "4200 TYPE_SLICE_END "});
}

// --compress: the same packets, in zlib-compressed batches that inflate
// (zlib, as trace_processor inflates them) to exactly the uncompressed
// export's bytes.
TEST_CASE("export perfetto: compressed, the same packets at a fraction of the size", "[export]") {
  TempDir dir("export");
  const std::string in = jobs_trace(dir);
  auto plain = export_trace(in, TraceExportFormat::kPerfetto, dir.file("plain.pftrace"));
  REQUIRE(plain.is_ok());
  TraceExportOptions opt;
  opt.compress = true;
  auto packed = export_trace(in, TraceExportFormat::kPerfetto, dir.file("z.pftrace"), opt);
  REQUIRE(packed.is_ok());
  CHECK(packed->records == plain->records);
  const std::string want = slurp(dir.file("plain.pftrace"));
  const std::string z = slurp(dir.file("z.pftrace"));
  // Trace { packet { compressed_packets: zlib(packets) } ... }
  auto varint = [&](size_t& i) {
    uint64_t v = 0;
    for (int sh = 0; i < z.size(); sh += 7) {
      const auto c = static_cast<uint8_t>(z[i++]);
      v |= uint64_t{c & 0x7fu} << sh;
      if (c < 0x80) return v;
    }
    FAIL("varint past the end");
    return v;
  };
  std::string got;
  size_t batches = 0;
  for (size_t i = 0; i < z.size();) {
    REQUIRE(z[i++] == 0x0a);  // Trace.packet
    const size_t len = varint(i);
    const size_t end = i + len;
    REQUIRE(end <= z.size());
    REQUIRE(varint(i) == (50 << 3 | 2));  // only compressed_packets
    const size_t n = varint(i);
    REQUIRE(i + n == end);
    std::vector<Bytef> out(4 << 20);
    uLongf out_len = out.size();
    REQUIRE(uncompress(out.data(), &out_len, reinterpret_cast<const Bytef*>(z.data() + i), n) ==
            Z_OK);
    got.append(reinterpret_cast<const char*>(out.data()), out_len);
    i = end;
    ++batches;
  }
  CHECK(batches >= 2);  // about 1 MiB of packets each
  CHECK(got == want);
  INFO(want.size() << " bytes plain, " << z.size() << " compressed, " << plain->records
                   << " records");
  CHECK(z.size() * 3 < want.size());
  // And protoc reads it as a Trace of Perfetto's fields.
  require_tool("protoc", "protobuf-compiler");
  REQUIRE(sh("protoc --proto_path=" + std::string(PERFQ_TEST_DATA_DIR) +
             " --decode=perfetto.protos.Trace perfetto_trace.proto < " + dir.file("z.pftrace") +
             " > " + dir.file("z.txt")) == 0);
  CHECK(slurp(dir.file("z.txt")).find("compressed_packets") != std::string::npos);
  // Only perfetto compresses.
  auto csv = export_trace(in, TraceExportFormat::kCsv, dir.file("x.csv"), opt);
  REQUIRE(!csv.is_ok());
  CHECK_THAT(csv.status().message(), Catch::Contains("csv"));
}

TEST_CASE(
    "export: an event of two numbers (perfq_event2) shows both under their names, one named number "
    "under its name",
    "[export]") {
  TempDir dir("export");
  const std::string in = dir.file("two.pq");
  TraceMetadata meta;
  TraceSource app;
  app.id = 256;
  app.name = "app";
  app.pid = 4240;
  app.events = {{1, PERFQ_KIND_INSTANT, "copy", {"bytes", "queue"}},
                {2, PERFQ_KIND_INSTANT, "plain"},
                {3, PERFQ_KIND_INSTANT, "dma", {"bytes"}}};
  app.threads = {{0, 4242, "main"}};
  meta.sources = {app};
  TraceBuilder b;
  b.instant(256, 0, 1, 1000, PERFQ_ARG2(4096, 3));
  b.instant(256, 0, 2, 2000, PERFQ_ARG2(4096, 3));
  b.instant(256, 0, 3, 3000, PERFQ_ARG2(4096, 3));
  b.write(in, meta);

  // The dictionary keeps the names through the trace file.
  struct Meta : TraceVisitor {
    TraceMetadata m;
    Status on_metadata(const TraceMetadata& md) override {
      m = md;
      return Status::ok();
    }
    Status on_records(std::span<const TraceRecord>) override { return Status::ok(); }
  } meta_read;
  auto r = TraceReader::open(in);
  REQUIRE(r.is_ok());
  REQUIRE(r->read(meta_read).is_ok());
  REQUIRE(meta_read.m.sources.size() == 1);
  CHECK(meta_read.m.sources[0].events == app.events);

  REQUIRE(export_trace(in, TraceExportFormat::kChromeJson, dir.file("out.json")).is_ok());
  const auto j = nlohmann::json::parse(slurp(dir.file("out.json")));
  std::map<std::string, nlohmann::json> args;
  for (const auto& ev : j["traceEvents"])
    if (ev.contains("args") && ev["cat"] == "perfq") args[ev["name"]] = ev["args"];
  INFO(j.dump());
  CHECK(args["copy"]["bytes"] == 4096);
  CHECK(args["copy"]["queue"] == 3);
  CHECK_FALSE(args["copy"].contains("arg"));
  CHECK(args["plain"]["arg"] == std::to_string(PERFQ_ARG2(4096, 3)));  // one number
  // One number with a name (perfq_event_arg): under that name.
  CHECK(args["dma"]["bytes"] == std::to_string(PERFQ_ARG2(4096, 3)));
  CHECK_FALSE(args["dma"].contains("arg"));

  const PfTrace t = replay(perfetto_decoded(dir, in));
  std::map<std::string, std::map<std::string, std::string>> pf;
  for (const auto& ev : t.events) pf[ev.name] = ev.args;
  CHECK(pf["copy"] == std::map<std::string, std::string>{{"bytes", "4096"}, {"queue", "3"}});
  CHECK(pf["plain"] ==
        std::map<std::string, std::string>{{"arg", std::to_string(PERFQ_ARG2(4096, 3))}});
  CHECK(pf["dma"] ==
        std::map<std::string, std::string>{{"bytes", std::to_string(PERFQ_ARG2(4096, 3))}});
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

namespace perfq {

// Part of a trace (perfq/filter.h): what an export and the report keep.
TEST_CASE("filter: --from/--to, --source, --stream and --event keep only their part",
          "[export][report][filter]") {
  TempDir dir("filter");
  const std::string in = make_trace(dir);  // 50 jobs, 100 us apart from 1 s
  const Expected e = expected_of(in);
  SECTION("a source and an event, in the CSV") {
    TraceFilter f;
    f.sources = {"synth-dev"};
    f.events = {"job_start"};
    REQUIRE(export_trace(in, TraceExportFormat::kCsv, dir.file("f.csv"), f).is_ok());
    const auto lines = lines_of(slurp(dir.file("f.csv")));
    REQUIRE(lines.size() == 1 + 50);
    for (size_t i = 1; i < lines.size(); ++i) {
      INFO(lines[i]);
      CHECK(lines[i].find(",synth-dev,") != std::string::npos);
      CHECK(lines[i].find(",job_start,begin,") != std::string::npos);
    }
  }
  SECTION("a stream, by id, in the report") {
    TraceReportOptions o;
    o.filter.sources = {"1"};
    o.filter.streams = {2};
    auto r = analyze_trace(in, o);
    REQUIRE(r.is_ok());
    size_t want = 0;
    for (const auto& rec : e.records) want += rec.source == 1 && rec.rec.stream == 2;
    CHECK(r->records_device == want);
    CHECK(r->records_host == 0);
    CHECK(r->index_gaps_counted);
  }
  SECTION("a time window, relative and absolute") {
    auto first = e.records.front().time_ns;
    for (const char* from : {"0.001", "absolute"}) {
      TraceReportOptions o;
      const int64_t a = first + 1'000'000, b = first + 2'000'000;
      if (std::string(from) == "absolute") {
        o.filter.from = parse_trace_time(std::to_string(a) + "ns").value();
        o.filter.to = parse_trace_time(std::to_string(b) + "ns").value();
      } else {
        o.filter.from = parse_trace_time("0.001").value();
        o.filter.to = parse_trace_time("0.002").value();
      }
      auto r = analyze_trace(in, o);
      REQUIRE(r.is_ok());
      size_t want = 0;
      for (const auto& rec : e.records) want += rec.time_ns >= a && rec.time_ns <= b;
      INFO(from);
      CHECK(r->records_host + r->records_device == want);
      CHECK(r->first_ns >= a);
      CHECK(r->last_ns <= b);
    }
  }
  SECTION("an event filter does not count index gaps as losses") {
    TraceReportOptions o;
    o.filter.events = {"job_end"};
    auto r = analyze_trace(in, o);
    REQUIRE(r.is_ok());
    CHECK(r->lost_device == 0);
    CHECK(!r->index_gaps_counted);
  }
  SECTION("a bad time says what is wrong") {
    auto t = parse_trace_time("soon");
    REQUIRE(!t.is_ok());
    CHECK_THAT(t.status().message(), Catch::Contains("bad time 'soon'"));
    CHECK(parse_trace_time("12ns").value().absolute);
    CHECK(parse_trace_time("1.5").value().seconds == 1.5);
  }
}

}  // namespace perfq
