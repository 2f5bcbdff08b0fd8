// Tests of libperfq/report.h: every figure of the report against traces
// with known, constructed timings (trace/synth.h).
#include <stdlib.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "perfq/report.h"
#include "perfq_kevent.h"
#include "trace/synth.h"

#include "test_util.h"
#include "trace_build.h"

namespace perfq {
namespace {

const ReportEvent* find_event(const TraceReport& r, const std::string& name) {
  for (const auto& e : r.events) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

const ReportPair* find_pair(const TraceReport& r, const std::string& name) {
  for (const auto& p : r.pairs) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

// This host and one device, "dev0" (source 1, 1 GHz), with one event: tick.
TraceMetadata one_device_metadata() {
  TraceMetadata meta;
  meta.describe_this_host();
  TraceSource dev;
  dev.id = 1;
  dev.kind = TraceSourceKind::kDevice;
  dev.name = "dev0";
  dev.clock_hz = 1'000'000'000;
  dev.events = {{1, PERFQ_KIND_INSTANT, "tick"}};
  meta.sources = {dev};
  return meta;
}

TEST_CASE("latency histogram: exact while small, within 0.2% when bucketed", "[report]") {
  LatencyHistogram h;
  for (int64_t v = 1; v <= 100; ++v) h.add(v * 10);
  CHECK(h.exact());
  auto d = h.summary();
  CHECK(d.count == 100);
  CHECK(d.min == 10);
  CHECK(d.max == 1000);
  CHECK(d.p50 == 500);
  CHECK(d.p90 == 900);
  CHECK(d.p99 == 990);
  CHECK(d.mean == Approx(505));

  LatencyHistogram big;
  for (int64_t v = 1; v <= 100000; ++v) big.add(v * 1000 - 50000000);  // crosses zero
  CHECK(!big.exact());
  auto b = big.summary();
  CHECK(b.min == 1000 - 50000000);
  CHECK(b.max == 100000000 - 50000000);
  CHECK(static_cast<double>(b.p50) == Approx(0.0).margin(50000000 * 0.002 + 1000));
  CHECK(static_cast<double>(b.p90) == Approx(40000000).epsilon(0.002));
  CHECK(static_cast<double>(b.p99) == Approx(49000000).epsilon(0.002));
}

TEST_CASE("report: figures of a trace with known timings", "[report]") {
  TempDir dir("report");
  const std::string path = dir.file("known.pq");
  SynthTraceOptions o;
  o.jobs = 100;
  o.period_ns = 100'000;
  o.submit_to_start = {1'000, 2'000, 3'000, 4'000};  // 25 each
  o.start_to_end = {10'000, 20'000};                 // 50 each
  // The last: a causality violation, beyond the device times' 200 ns claims.
  o.end_to_complete = {500, 700, 900, -1000};
  o.device_offset_ns = 7'000'000'000;
  auto written = write_synthetic_trace(path, o);
  REQUIRE(written.is_ok());
  // Per job: work begin/end, submit, queue_depth, start, dma_bytes, end, complete.
  REQUIRE(written.value() == 800);

  auto rr = analyze_trace(path);
  REQUIRE(rr.is_ok());
  const TraceReport& r = rr.value();
  CHECK(r.stopped_early.empty());
  CHECK(r.clean_end);
  CHECK(r.records_host == 500);
  CHECK(r.records_device == 300);
  CHECK(r.lost_host == 0);
  CHECK(r.lost_device == 0);
  // First record: the first work begin (submit - 600); last: the last complete.
  CHECK(r.first_ns == o.start_ns - 600);
  const int64_t last_submit = o.start_ns + 99 * o.period_ns;
  // Job 99: 4000, 20000, then complete 100 ns before its end: the end is last.
  CHECK(r.last_ns == last_submit + 4'000 + 20'000);
  CHECK(r.duration_ns == r.last_ns - r.first_ns);

  // Streams: host 0/1 get 50 jobs x 5 records; device 0/1/2 get 34/33/33 jobs x 3.
  REQUIRE(r.streams.size() == 5);
  CHECK(r.streams[0].records == 250);
  CHECK(r.streams[2].source == 1);
  CHECK(r.streams[2].records == 102);
  CHECK(r.streams[3].records == 99);

  const ReportEvent* submit = find_event(r, "job_submit");
  REQUIRE(submit != nullptr);
  CHECK(submit->count == 100);
  CHECK(submit->rate_per_s == Approx(100.0 / (static_cast<double>(r.duration_ns) / 1e9)));
  REQUIRE(find_event(r, "dma_bytes") != nullptr);
  CHECK(find_event(r, "dma_bytes")->kind == PERFQ_KIND_COUNTER);

  const ReportPair* work = find_pair(r, "work");
  REQUIRE(work != nullptr);
  CHECK(work->duration.count == 100);
  CHECK(work->duration.min == 500);
  CHECK(work->duration.max == 500);
  const ReportPair* dev = find_pair(r, "job_start");
  REQUIRE(dev != nullptr);
  CHECK(dev->duration.p50 == 10'000);
  CHECK(dev->duration.p99 == 20'000);
  CHECK(r.unmatched_ends == 0);

  CHECK(r.jobs.count == 100);
  CHECK(r.jobs.incomplete == 0);
  CHECK(r.jobs.submit_to_start.min == 1'000);
  CHECK(r.jobs.submit_to_start.p50 == 2'000);
  CHECK(r.jobs.submit_to_start.p90 == 4'000);
  CHECK(r.jobs.submit_to_start.p99 == 4'000);
  CHECK(r.jobs.submit_to_start.max == 4'000);
  CHECK(r.jobs.start_to_end.p50 == 10'000);
  CHECK(r.jobs.start_to_end.p99 == 20'000);
  CHECK(r.jobs.end_to_complete.min == -1000);
  CHECK(r.jobs.end_to_complete.p50 == 500);
  CHECK(r.jobs.end_to_complete.p99 == 900);
  CHECK(r.causality_violations == 25);
  CHECK(r.causality_within_bounds == 0);
  // The first ten, each with its times, claims and conversions: job 3's end
  // is 1000 ns after its complete, 800 beyond the end's 200 ns claim.
  REQUIRE(r.violation_list.size() == kViolationsListed);
  const ReportViolation& v = r.violation_list[0];
  CHECK(v.corr_id == 1003);
  CHECK(v.step == 2);
  CHECK(v.beyond_ns == 800);
  CHECK(v.t[2] - v.t[3] == 1000);
  CHECK(v.claim[2] == 200);
  CHECK(v.claim[3] == 0);
  CHECK(v.conv[2] == TraceConversion::kModel);
  CHECK(v.conv[3] == TraceConversion::kNone);
  CHECK(r.violation_list[9].corr_id == 1039);

  REQUIRE(r.sync.size() == 1);
  CHECK(r.sync[0].name == "synth-dev");
  // The synthetic device clock reads 7 s behind the host's, at its rate.
  CHECK(r.sync[0].synchronized);
  CHECK(r.sync[0].standing.device_ahead_ns == -7'000'000'000.0);
  CHECK(r.sync[0].standing.device_fast_ppm == 0.0);
  CHECK(r.sync[0].worst_uncertainty_ns == 200);
  CHECK(r.sync[0].uncertainty_ns == 200);
  CHECK(r.sync[0].samples == 16);
  CHECK(r.sync[0].models == 1);
  CHECK(r.sync[0].segments == 1);
  CHECK(!r.sync[0].resynced);

  SECTION("the JSON has the documented fields") {
    auto j = nlohmann::json::parse(report_to_json(r));
    CHECK(j["records"]["host"] == 500);
    CHECK(j["records"]["device"] == 300);
    CHECK(j["lost"]["host"] == 0);
    CHECK(j["lost"]["device"] == 0);
    CHECK(j["sync"]["device_ahead_ns"] == -7'000'000'000.0);
    CHECK(j["sync"]["device_fast_ppm"] == 0.0);
    CHECK(j["sync"]["standing"] == "device clock 7.000 s behind the host, running 0.000 ppm fast");
    CHECK(j["sync"]["uncertainty_ns"] == 200);
    CHECK(j["jobs"]["count"] == 100);
    CHECK(j["jobs"]["submit_to_start_ns"]["p50"] == 2000);
    CHECK(j["jobs"]["submit_to_start_ns"]["p99"] == 4000);
    CHECK(j["jobs"]["start_to_end_ns"]["p50"] == 10000);
    CHECK(j["jobs"]["start_to_end_ns"]["p99"] == 20000);
    CHECK(j["jobs"]["end_to_complete_ns"]["p50"] == 500);
    CHECK(j["jobs"]["end_to_complete_ns"]["p99"] == 900);
    CHECK(j["causality_violations"] == 25);
    const auto& v0 = j["causality_violation_list"][0];
    CHECK(v0["corr_id"] == 1003);
    CHECK(v0["step"] == "end > complete");
    CHECK(v0["beyond_ns"] == 800);
    CHECK(v0["end"]["claim_ns"] == 200);
    CHECK(v0["end"]["converted_by"] == "daemon");
    CHECK(v0["complete"]["converted_by"] == "none");
    CHECK(j["duration_ns"] == r.duration_ns);
    CHECK(j["complete"] == true);
  }
  SECTION("the text names every section") {
    std::string t = report_to_text(r);
    for (const char* s : {"duration", "records", "lost", "sync", "events", "durations", "jobs",
                          "submit->start", "causality violations  25",
                          "job 0x3eb: end > complete by 800 ns beyond the claims: submit "}) {
      CHECK_THAT(t, Catch::Contains(s));
    }
  }
}

TEST_CASE("report: each device's PCI facts and the ceiling of its link", "[report][pci]") {
  TempDir dir("reportpci");
  const std::string path = dir.file("pci.pq");
  SynthTraceOptions o;
  o.jobs = 10;
  PciDevice d;
  d.address = "0000:03:00.0";
  d.bus = 3;
  d.vendor_id = 0x144d;
  d.device_id = 0xa80a;
  d.vendor_name = "Samsung Electronics Co Ltd";
  d.device_name = "NVMe SSD Controller PM9A1/PM9A3/980PRO";
  d.driver = "perfq";
  d.numa_node = 0;
  d.config_readable = true;
  PcieInfo p;
  p.link_max = PciLink{16000, 4};
  p.link_current = PciLink{8000, 4};
  p.max_payload = 256;
  p.max_payload_supported = 512;
  p.max_read_request = 512;
  d.pcie = p;

  SECTION("trained below its capability") {
    o.device_pci = d;
    REQUIRE(write_synthetic_trace(path, o).is_ok());
    auto r = analyze_trace(path);
    REQUIRE(r.is_ok());
    const std::string t = report_to_text(r.value());
    CHECK_THAT(t,
               Catch::Contains("synth-dev                0000:03:00.0  Samsung Electronics Co Ltd "
                               "NVMe SSD Controller PM9A1/PM9A3/980PRO [144d:a80a]  driver perfq  "
                               "numa node 0"));
    CHECK_THAT(t, Catch::Contains("link Gen3 x4 (8 GT/s, 3.94 GB/s) of max Gen4 x4 (16 GT/s, "
                                  "7.88 GB/s): trained below its capability"));
    CHECK_THAT(t, Catch::Contains("max payload 256 B (supports 512 B), max read request 512 B"));
    auto j = nlohmann::json::parse(report_to_json(r.value()));
    const auto& src = j["sources"][1];
    CHECK(src["pci_address"] == "0000:03:00.0");
    CHECK(src["link"] == "Gen3 x4");
    CHECK(src["pci"]["pcie"]["link_current"]["ceiling_bytes_per_s"].get<double>() ==
          Approx(3.938461538e9));
    CHECK(src["pci"]["pcie"]["link_max"]["ceiling_bytes_per_s"].get<double>() ==
          Approx(7.876923077e9));
    CHECK(src["pci"]["pcie"]["trained_below_max"] == true);
    CHECK_FALSE(j["sources"][0].contains("pci"));
  }
  SECTION("at its maximum") {
    d.pcie->link_current = d.pcie->link_max;
    o.device_pci = d;
    REQUIRE(write_synthetic_trace(path, o).is_ok());
    const std::string t = report_to_text(analyze_trace(path).value());
    CHECK_THAT(t, Catch::Contains("link Gen4 x4 (16 GT/s, 7.88 GB/s), its maximum"));
    CHECK_THAT(t, !Catch::Contains("trained below"));
  }
  SECTION("conventional PCI") {
    d.pcie.reset();
    o.device_pci = d;
    REQUIRE(write_synthetic_trace(path, o).is_ok());
    const std::string t = report_to_text(analyze_trace(path).value());
    CHECK_THAT(t, Catch::Contains("no PCIe capability (conventional PCI): no link figures"));
    auto j = nlohmann::json::parse(report_to_json(analyze_trace(path).value()));
    CHECK(j["sources"][1]["pci"]["pcie"].is_null());
  }
  SECTION("no PCI facts: no pci section") {
    REQUIRE(write_synthetic_trace(path, o).is_ok());
    const std::string t = report_to_text(analyze_trace(path).value());
    CHECK_THAT(t, !Catch::Contains("\npci\n"));
  }
}

TEST_CASE("report: --resync replaces a wrong online model with the offline fit", "[report]") {
  TempDir dir("report");
  const std::string path = dir.file("resync.pq");
  SynthTraceOptions o;
  o.jobs = 60;
  o.submit_to_start = {2'000};
  o.start_to_end = {10'000};
  o.end_to_complete = {1'000};
  o.device_offset_ns = 3'000'000'000;
  o.model_error_ns = -2'500;  // the daemon's model put device events 2.5 us early
  REQUIRE(write_synthetic_trace(path, o).is_ok());

  auto online = analyze_trace(path);
  REQUIRE(online.is_ok());
  CHECK(online->jobs.count == 60);
  CHECK(online->jobs.submit_to_start.p50 == -500);
  CHECK(online->jobs.end_to_complete.p50 == 3'500);
  CHECK(online->causality_violations == 60);
  CHECK(online->sync[0].standing.device_ahead_ns == -(3'000'000'000.0 - 2'500));

  TraceReportOptions opt;
  opt.resync = true;
  auto offline = analyze_trace(path, opt);
  REQUIRE(offline.is_ok());
  CHECK(offline->jobs.count == 60);
  CHECK(offline->jobs.submit_to_start.p50 == 2'000);
  CHECK(offline->jobs.start_to_end.p50 == 10'000);
  CHECK(offline->jobs.end_to_complete.p50 == 1'000);
  CHECK(offline->causality_violations == 0);
  REQUIRE(offline->sync.size() == 1);
  CHECK(offline->sync[0].resynced);
  CHECK(offline->sync[0].standing.device_ahead_ns == Approx(-3'000'000'000.0).margin(1));
  CHECK(std::fabs(offline->sync[0].standing.device_fast_ppm) < 1e-3);
  // The sync module's estimate: positive, within half the 400 ns bracket.
  CHECK(offline->sync[0].uncertainty_ns > 0);
  CHECK(offline->sync[0].uncertainty_ns <= 200);
}

// Each recorded device time carries its claim (TraceRecord::claim_ns): the
// report gives them per device and per segment, so a recording whose first
// seconds were loose says so beside its tight end.
TEST_CASE("report: the claims of the recorded device times, per device and segment", "[report]") {
  TempDir dir("report");
  const std::string path = dir.file("claims.pq");
  auto w = TraceWriter::open(path, one_device_metadata());
  REQUIRE(w.is_ok());
  // Segment 0 from the start, segment 1 from host time 2 s (a step of the
  // device clock by +1 s: D = H - 1 s before, D = H after).
  auto model = [](uint32_t seg, uint64_t dref, int64_t href, uint64_t unc) {
    TraceClockModel m;
    m.source = 1;
    m.installed_ns = href;
    m.model.device_ref = dref;
    m.model.host_ref_ns = href;
    m.model.uncertainty_ns = unc;
    m.model.valid_from_device = dref;
    m.model.segment = seg;
    m.model.flags = PERFQ_SYNC_MODEL_VALID;
    return m;
  };
  REQUIRE(w->append_clock_model(model(0, 0, 1'000'000'000, 40'000)).is_ok());
  REQUIRE(w->append_clock_model(model(0, 500'000'000, 1'500'000'000, 90)).is_ok());
  REQUIRE(w->append_clock_model(model(1, 2'000'000'000, 2'000'000'000, 120)).is_ok());
  std::vector<TraceRecord> recs;
  for (int i = 0; i < 300; ++i) {
    TraceRecord r;
    r.source = 1;
    r.rec.index = static_cast<uint64_t>(i);
    r.rec.event = 1;
    r.rec.flags = PERFQ_FLAGS(PERFQ_KIND_INSTANT, PERFQ_CLOCK_DEVICE);
    r.time_ns = 1'000'000'000 + int64_t{i} * 10'000'000;  // 1 s .. 3.99 s
    r.rec.time = static_cast<uint64_t>(r.time_ns - (r.time_ns < 2'000'000'000 ? 1'000'000'000 : 0));
    if (i < 10) {
      r.conv = TraceConversion::kForced;  // waited, then the loose first model
      r.claim_ns = i < 5 ? kClaimUnbounded : 35'000;
    } else {
      r.conv = TraceConversion::kModel;
      r.claim_ns = i < 100 ? 95 : 130;
    }
    recs.push_back(r);
  }
  REQUIRE(w->append_records(recs).is_ok());
  REQUIRE(w->close().is_ok());

  auto rep = analyze_trace(path);
  REQUIRE(rep.is_ok());
  REQUIRE(rep->sync.size() == 1);
  const ReportSync& d = rep->sync[0];
  CHECK(d.claims.records == 300);
  CHECK(d.claims.by_daemon == 290);
  CHECK(d.claims.forced == 10);
  CHECK(d.claims.unbounded == 5);
  CHECK(d.claims.claim_ns.count == 295);
  CHECK(d.claims.claim_ns.max == 35'000);
  CHECK(d.claims.claim_ns.p50 == 130);
  REQUIRE(d.segment_list.size() == 2);
  CHECK(d.segment_list[0].segment == 0);
  CHECK(d.segment_list[0].from_ns == INT64_MIN);
  CHECK(d.segment_list[0].models == 2);
  CHECK(d.segment_list[0].worst_model_ns == 40'000);
  CHECK(d.segment_list[0].records == 100);
  CHECK(d.segment_list[0].worst_claim_ns == 35'000);
  CHECK(d.segment_list[0].unbounded == 5);
  CHECK(d.segment_list[1].segment == 1);
  CHECK(d.segment_list[1].from_ns == 2'000'000'000);
  CHECK(d.segment_list[1].records == 200);
  CHECK(d.segment_list[1].worst_claim_ns == 130);
  CHECK(d.segment_list[1].unbounded == 0);

  const auto j = nlohmann::json::parse(report_to_json(*rep));
  const auto& c = j["sync"]["devices"][0]["claims"];
  CHECK(c["unbounded"] == 5);
  CHECK(d.claims.unbounded_first_ns == 1'000'000'000);  // records 0-4, 10 ms apart
  CHECK(d.claims.unbounded_last_ns == 1'040'000'000);
  CHECK(c["unbounded_first_ns"] == 1'000'000'000);
  CHECK(c["unbounded_last_ns"] == 1'040'000'000);
  CHECK(c["worst_ns"] == 35'000);
  CHECK(j["sync"]["devices"][0]["segment_list"].size() == 2);
  const std::string text = report_to_text(*rep);
  INFO(text);
  CHECK(text.find("UNSYNCHRONIZED: 5 records have no bound") != std::string::npos);
  CHECK(text.find("from 1000000000 to 1040000000") != std::string::npos);
  CHECK(text.find("segment 1 from 2000000000: 200 records, worst claim +-130 ns") !=
        std::string::npos);
}

TEST_CASE("report: losses by LOST records, loss chunks and index gaps", "[report]") {
  TempDir dir("report");
  const std::string path = dir.file("loss.pq");
  SynthTraceOptions o;
  o.jobs = 90;
  o.drop_every = 10;        // device stream 0: indexes 9, 19, ... dropped
  o.lost_record_count = 7;  // host stream 1
  o.loss_chunk_count = 5;   // host stream 0
  REQUIRE(write_synthetic_trace(path, o).is_ok());
  auto r = analyze_trace(path);
  REQUIRE(r.is_ok());
  // Device stream 0: 30 jobs x 3 records = indexes 0..89, 9 of them dropped
  // (9, 19, ..., 89); the last one is not seen as a gap (nothing follows it).
  CHECK(r->lost_device == 8);
  CHECK(r->lost_host == 12);
  bool saw_dev = false;
  for (const auto& s : r->streams) {
    if (s.source == 1 && s.stream == 0) {
      saw_dev = true;
      CHECK(s.gap_lost == 8);
      CHECK(s.loss_events == 8);
      CHECK(s.first_loss_index == 10);
      CHECK(s.first_loss_ns > o.start_ns);
      CHECK(s.last_loss_ns > s.first_loss_ns);
    }
    if (s.source == 0 && s.stream == 1) {
      CHECK(s.reported_lost == 7);
      CHECK(s.lost == 7);
      CHECK(s.first_loss_ns == o.start_ns + 50);
    }
    if (s.source == 0 && s.stream == 0) CHECK(s.reported_lost == 5);
  }
  CHECK(saw_dev);
  // Jobs that lost their start or end are incomplete, not violations.
  CHECK(r->jobs.count + r->jobs.incomplete == 90);
  CHECK(r->jobs.incomplete > 0);
  CHECK(r->causality_violations == 0);
  auto j = nlohmann::json::parse(report_to_json(r.value()));
  CHECK(j["lost"]["device"] == 8);
  CHECK(j["lost"]["host"] == 12);
  CHECK(j["lost"]["streams"].size() == 3);
}

// A LOST record is a count of records lost, not a record: the soak's
// report had each of them among its records (296 507 681 device records of
// 296 507 677 delivered, one more per LOST record of the trace).
TEST_CASE("report: a LOST record counts its losses, not itself as a record", "[report]") {
  TempDir dir("report");
  SynthTraceOptions o;
  o.jobs = 30;
  REQUIRE(write_synthetic_trace(dir.file("plain.pq"), o).is_ok());
  o.lost_record_count = 7;  // one LOST record on host stream 1
  REQUIRE(write_synthetic_trace(dir.file("lost.pq"), o).is_ok());
  auto plain = analyze_trace(dir.file("plain.pq"));
  auto lost = analyze_trace(dir.file("lost.pq"));
  REQUIRE(plain.is_ok());
  REQUIRE(lost.is_ok());
  CHECK(lost->records_host == plain->records_host);
  CHECK(lost->records_device == plain->records_device);
  CHECK(lost->lost_host == plain->lost_host + 7);
  const auto stream_of = [](const auto& r, uint16_t source, uint16_t stream) {
    for (const auto& s : r.streams)
      if (s.source == source && s.stream == stream) return s;
    return std::decay_t<decltype(r.streams.front())>{};
  };
  CHECK(stream_of(*lost, 0, 1).records == stream_of(*plain, 0, 1).records);
  CHECK(stream_of(*lost, 0, 1).reported_lost == 7);
  for (const auto& e : lost->events) CHECK(e.kind != PERFQ_KIND_LOST);
  const auto j = nlohmann::json::parse(report_to_json(lost.value()));
  const auto jp = nlohmann::json::parse(report_to_json(plain.value()));
  CHECK(j["records"]["total"] == jp["records"]["total"]);
}

// Two records of a device stream whose converted times came out of index
// order (a clock step: the soak saw it) leave a gap that the later record
// fills.  Nothing was lost: no loss, and no "lost 0 ... in 1 events" line.
TEST_CASE("report: records sorted out of index order are late, not lost", "[report]") {
  TempDir dir("report");
  const std::string path = dir.file("late.pq");
  auto w = TraceWriter::open(path, one_device_metadata());
  REQUIRE(w.is_ok());
  std::vector<TraceRecord> recs;
  for (int i = 0; i < 20; ++i) {
    TraceRecord r;
    r.source = 1;
    r.rec.index = static_cast<uint64_t>(i == 10 ? 11 : i == 11 ? 10 : i);
    r.rec.event = 1;
    r.rec.flags = PERFQ_FLAGS(PERFQ_KIND_INSTANT, PERFQ_CLOCK_DEVICE);
    r.time_ns = 1'000'000'000 + int64_t{i} * 1'000'000;
    r.rec.time = static_cast<uint64_t>(r.time_ns);
    r.conv = TraceConversion::kModel;
    r.claim_ns = 100;
    recs.push_back(r);
  }
  REQUIRE(w->append_records(recs).is_ok());
  REQUIRE(w->close().is_ok());
  auto rep = analyze_trace(path);
  REQUIRE(rep.is_ok());
  CHECK(rep->lost_device == 0);
  REQUIRE(rep->streams.size() == 1);
  CHECK(rep->streams[0].gap_lost == 0);
  CHECK(rep->streams[0].loss_events == 0);
  const std::string text = report_to_text(*rep);
  INFO(text);
  CHECK(text.find(" events, first at ") == std::string::npos);
}

// Kernel sched events (source "kernel", arg = value << 32 | tid) and an
// application whose stream 0 is tid 4242: per job, the time its submitting
// thread spent switched out between submit and complete.  Also read back:
// the kernel source kind and the threads of the metadata.
TEST_CASE("report: per job, how long the submitting thread was off-CPU", "[report]") {
  TempDir dir("report");
  const std::string path = dir.file("offcpu.pq");
  TraceMetadata meta;
  TraceSource app;
  app.id = 256;
  app.name = "app";
  app.pid = 4240;
  app.events = {{1, PERFQ_KIND_INSTANT, "job_submit"}, {2, PERFQ_KIND_INSTANT, "job_complete"}};
  app.threads = {{0, 4242, "job-0"}, {1, 4243, "job-1"}};
  TraceSource dev;
  dev.id = 1;
  dev.kind = TraceSourceKind::kDevice;
  dev.name = "accel";
  dev.events = {{1, PERFQ_KIND_INSTANT, "job_start"}, {2, PERFQ_KIND_INSTANT, "job_end"}};
  TraceSource kern;
  kern.id = PERFQ_KERNEL_SOURCE;
  kern.kind = TraceSourceKind::kKernel;
  kern.name = "kernel";
  kern.events = {{PERFQ_KEV_SCHED_OUT, PERFQ_KIND_INSTANT, "sched_switch_out"},
                 {PERFQ_KEV_SCHED_IN, PERFQ_KIND_INSTANT, "sched_switch_in"},
                 {PERFQ_KEV_SCHED_WAKEUP, PERFQ_KIND_INSTANT, "sched_wakeup"}};
  meta.sources = {app, dev, kern};
  TraceBuilder b;
  auto add = [&](uint16_t source, uint16_t stream, uint32_t event, int64_t t, uint64_t arg) {
    b.instant(source, stream, event, t, arg);
  };
  auto sched = [&](uint32_t ev, int64_t t, uint32_t tid) {
    add(PERFQ_KERNEL_SOURCE, 0, ev, t, tid);
  };
  // Job 7 on tid 4242: submit 1000, complete 5000; out 1500..2500 and
  // 3000..3200, and out again at 4100, woken at 4300, with no switch-in
  // delivered: its job_complete at 5000 shows it running, from its wakeup
  // on (200 ns more).
  add(256, 0, 1, 1000, 7);
  sched(PERFQ_KEV_SCHED_OUT, 1500, 4242);
  add(1, 0, 1, 1600, 7);
  add(1, 0, 2, 2000, 7);
  sched(PERFQ_KEV_SCHED_IN, 2500, 4242);
  sched(PERFQ_KEV_SCHED_OUT, 3000, 4242);
  sched(PERFQ_KEV_SCHED_OUT, 3000, 4243);  // another thread: not counted
  sched(PERFQ_KEV_SCHED_IN, 3200, 4242);
  sched(PERFQ_KEV_SCHED_OUT, 4100, 4242);
  sched(PERFQ_KEV_SCHED_WAKEUP, 4300, 4242);
  add(256, 0, 2, 5000, 7);
  sched(PERFQ_KEV_SCHED_IN, 6000, 4242);  // not switched out: nothing to end
  // Job 8 on tid 4242 (8000..9000): never switched out.
  add(256, 0, 1, 8000, 8);
  add(1, 0, 1, 8100, 8);
  add(1, 0, 2, 8200, 8);
  add(256, 0, 2, 9000, 8);
  b.write(path, meta);
  auto r = analyze_trace(path);
  REQUIRE(r.is_ok());
  const TraceSource* k = r->metadata.find_source(PERFQ_KERNEL_SOURCE);
  REQUIRE(k);
  CHECK(k->kind == TraceSourceKind::kKernel);
  REQUIRE(r->metadata.find_source(256));
  CHECK(r->metadata.find_source(256)->threads == app.threads);
  CHECK(r->jobs.count == 2);
  const ReportOffCpu& oc = r->jobs.off_cpu;
  CHECK(oc.available);
  CHECK(oc.jobs == 2);
  CHECK(oc.jobs_off_cpu == 1);
  CHECK(oc.inferred_switch_ins == 1);
  CHECK(oc.records_while_off == 1);  // the job_complete at 5000
  REQUIRE(oc.worst.size() == 1);
  CHECK(oc.worst[0].corr_id == 7);
  CHECK(oc.worst[0].tid == 4242);
  CHECK(oc.worst[0].off_cpu_ns == 1000 + 200 + 200);
  CHECK(oc.worst[0].latency_ns == 4000);
  auto j = nlohmann::json::parse(report_to_json(r.value()));
  CHECK(j["off_cpu"]["jobs_off_cpu"] == 1);
  CHECK(j["off_cpu"]["worst"][0]["off_cpu_ns"] == 1400);
  CHECK(report_to_text(r.value()).find("off-CPU during 1 of 2 jobs") != std::string::npos);
}

TEST_CASE("report: a torn trace is reported with what came before", "[report]") {
  TempDir dir("report");
  const std::string path = dir.file("torn.pq");
  SynthTraceOptions o;
  o.jobs = 200;
  TraceWriterOptions w;
  w.records_per_chunk = 100;
  w.compress = false;
  REQUIRE(write_synthetic_trace(path, o, w).is_ok());
  const auto size = std::filesystem::file_size(path);
  std::filesystem::resize_file(path, size - 3000);
  auto r = analyze_trace(path);
  REQUIRE(r.is_ok());
  CHECK(!r->stopped_early.empty());
  CHECK_THAT(r->stopped_early, Catch::Contains("byte offset " + std::to_string(r->stop_offset)));
  CHECK(r->records_host + r->records_device > 0);
  CHECK(r->records_host + r->records_device < 1600);
  CHECK((r->records_host + r->records_device) % 100 == 0);
  auto j = nlohmann::json::parse(report_to_json(r.value()));
  CHECK(j["complete"] == false);
  CHECK(j["stopped_early"]["offset"] == r->stop_offset);
}

}  // namespace
TEST_CASE("report: an order reversed within the sync bounds is not a violation", "[report]") {
  TempDir dir("report");
  const std::string path = dir.file("within.pq");
  SynthTraceOptions o;
  o.jobs = 40;
  o.end_to_complete = {-150};  // the device's end 150 ns after the host's complete: claim 200
  REQUIRE(write_synthetic_trace(path, o).is_ok());
  auto r = analyze_trace(path);
  REQUIRE(r.is_ok());
  CHECK(r->jobs.count == 40);
  CHECK(r->causality_violations == 0);
  CHECK(r->causality_within_bounds == 40);
  CHECK_THAT(report_to_text(*r),
             Catch::Contains("causality violations  0 (40 more out of order within their sync "
                             "bounds)"));
}

}  // namespace perfq

namespace perfq {

// Counters get their values' min, mean and max, each extreme with the host
// time of its first occurrence.
TEST_CASE("report: a counter's min, mean and max, and when", "[report]") {
  TempDir dir("counters");
  const std::string path = dir.file("c.pq");
  SynthTraceOptions o;
  o.jobs = 80;  // queue_depth = i % 8 at submit + 1 ns; dma_bytes = 4096
  REQUIRE(write_synthetic_trace(path, o).is_ok());
  auto r = analyze_trace(path);
  REQUIRE(r.is_ok());
  bool seen = false;
  for (const auto& e : r->events) {
    if (e.name != "queue_depth") continue;
    seen = true;
    CHECK(e.count == 80);
    CHECK(e.values.min == 0);
    CHECK(e.values.max == 7);
    CHECK(e.values.mean == Approx(3.5));
    CHECK(e.values.min_at_ns == o.start_ns + 1);
    CHECK(e.values.max_at_ns == o.start_ns + 7 * o.period_ns + 1);
  }
  CHECK(seen);
  const auto j = nlohmann::json::parse(report_to_json(r.value()));
  bool in_json = false;
  for (const auto& e : j["events"])
    if (e["name"] == "dma_bytes") {
      in_json = true;
      CHECK(e["values"]["min"] == 4096);
      CHECK(e["values"]["max"] == 4096);
    }
  CHECK(in_json);
}

}  // namespace perfq

namespace perfq {

// Nested ranges: an iteration of 1000 ns holding a copy of 250 ns and a
// kernel of 500 ns: the copy is 25% of the iteration's time, the kernel 50%.
TEST_CASE("report: a range's share of the range around it", "[report]") {
  TempDir dir("nested");
  const std::string path = dir.file("n.pq");
  TraceMetadata meta;
  TraceSource app;
  app.id = 0;
  app.name = "app";
  app.events = {{1, PERFQ_KIND_BEGIN, "iteration"}, {2, PERFQ_KIND_END, "iteration_end"},
                {3, PERFQ_KIND_BEGIN, "copy"},      {4, PERFQ_KIND_END, "copy_end"},
                {5, PERFQ_KIND_BEGIN, "kernel"},    {6, PERFQ_KIND_END, "kernel_end"}};
  meta.sources = {app};
  std::vector<TraceRecord> recs;
  uint64_t index = 0;
  auto add = [&](uint32_t ev, uint16_t kind, int64_t t) {
    TraceRecord r;
    r.rec.index = index++;
    r.rec.event = ev;
    r.rec.flags = PERFQ_FLAGS(kind, PERFQ_CLOCK_HOST);
    r.rec.time = static_cast<uint64_t>(t);
    r.time_ns = t;
    recs.push_back(r);
  };
  for (int64_t i = 0; i < 10; ++i) {
    const int64_t t = 1'000'000 + i * 2'000;
    add(1, PERFQ_KIND_BEGIN, t);
    add(3, PERFQ_KIND_BEGIN, t + 100);
    add(4, PERFQ_KIND_END, t + 350);
    add(5, PERFQ_KIND_BEGIN, t + 400);
    add(6, PERFQ_KIND_END, t + 900);
    add(2, PERFQ_KIND_END, t + 1000);
  }
  auto w = TraceWriter::open(path, meta);
  REQUIRE(w.is_ok());
  REQUIRE(w->append_records(recs).is_ok());
  REQUIRE(w->close().is_ok());
  auto r = analyze_trace(path);
  REQUIRE(r.is_ok());
  std::map<std::string, const ReportNested*> by_child;
  for (const auto& n : r->nested) by_child[n.child] = &n;
  REQUIRE(by_child.size() == 2);
  CHECK(by_child.at("copy")->parent == "iteration");
  CHECK(by_child.at("copy")->count == 10);
  CHECK(by_child.at("copy")->share == Approx(0.25));
  CHECK(by_child.at("kernel")->share == Approx(0.5));
  CHECK_THAT(report_to_text(r.value()),
             Catch::Contains("copy inside iteration: 25.0% of its time"));
  // Every range's longest, with when it began (all alike: the first).
  for (const auto& p : r->pairs)
    if (p.name == "iteration") CHECK(p.max_at_ns == 1'000'000);
}

}  // namespace perfq

namespace perfq {

namespace {

// A trace of one host application and devices, built record by record.
struct ByteTrace {
  TraceMetadata meta;
  std::vector<TraceRecord> recs;
  std::map<uint32_t, uint64_t> index;  // source << 16 | stream -> next index
  void add(uint16_t source, uint32_t ev, uint16_t kind, int64_t t, uint64_t arg) {
    TraceRecord r;
    r.source = source;
    r.rec.index = index[uint32_t{source} << 16]++;
    r.rec.event = ev;
    r.rec.arg = arg;
    r.time_ns = t;
    const TraceSource* s = meta.find_source(source);
    if (s && s->kind == TraceSourceKind::kDevice) {
      r.rec.flags = PERFQ_FLAGS(kind, PERFQ_CLOCK_DEVICE);
      r.rec.time = static_cast<uint64_t>(t);
      r.conv = TraceConversion::kModel;
      r.claim_ns = 100;
    } else {
      r.rec.flags = PERFQ_FLAGS(kind, PERFQ_CLOCK_HOST);
      r.rec.time = static_cast<uint64_t>(t);
    }
    recs.push_back(r);
  }
  Result<TraceReport> analyze(const std::string& path) {
    std::stable_sort(recs.begin(), recs.end(), [](const TraceRecord& a, const TraceRecord& b) {
      return a.time_ns < b.time_ns;
    });
    auto w = TraceWriter::open(path, meta);
    if (!w) return w.status();
    if (Status s = w->append_records(recs); !s) return s;
    if (Status s = w->close(); !s) return s;
    return analyze_trace(path);
  }
};

TraceSource device_with_link(uint16_t id, const std::string& name, std::optional<PciLink> link) {
  TraceSource d;
  d.id = id;
  d.kind = TraceSourceKind::kDevice;
  d.name = name;
  d.clock_hz = 1'000'000'000;
  d.events = {{1, PERFQ_KIND_INSTANT, "dma", {"bytes"}}};
  if (link) {
    PciDevice p;
    p.address = "0000:0" + std::to_string(id) + ":00.0";
    p.bus = static_cast<uint8_t>(id);
    p.config_readable = true;
    PcieInfo e;
    e.link_max = link;
    e.link_current = link;
    p.pcie = e;
    d.pci = p;
    d.pci_address = p.address;
    d.link = pci_link_name(*link);
  }
  return d;
}

const ReportEvent* find_event(const TraceReport& r, uint16_t source, const std::string& name) {
  for (const auto& e : r.events)
    if (e.source == source && e.name == name) return &e;
  return nullptr;
}

}  // namespace

// Byte counts declared at registration: a range's bytes are its begin's
// arg (its end's is not counted), an instant's its own, half of a
// two-number arg where that half is named "bytes"; the rates are over the
// recording's stated interval (1 ms) and within the ranges, and the share is
// of the PCIe link of the device (the host's: of its one device with link
// figures).
TEST_CASE("report: throughput of the events whose arg is a byte count", "[report][pci]") {
  TempDir dir("bytes");
  ByteTrace b;
  b.meta.options["start_ns"] = "1000000";
  b.meta.options["stop_ns"] = "2000000";
  TraceSource app;
  app.id = 0;
  app.name = "app";
  app.events = {{1, PERFQ_KIND_BEGIN, "copy", {"bytes"}},
                {2, PERFQ_KIND_END, "copy_end"},
                {3, PERFQ_KIND_INSTANT, "send", {"queue", "bytes"}},
                {4, PERFQ_KIND_INSTANT, "recv", {"bytes", "queue"}},
                {5, PERFQ_KIND_INSTANT, "tick"},
                {6, PERFQ_KIND_INSTANT, "named", {"count"}}};
  const PciLink gen4x8{16000, 8};
  b.meta.sources = {app, device_with_link(1, "dev", gen4x8)};
  for (int64_t i = 0; i < 10; ++i) {
    const int64_t t = 1'100'000 + i * 50'000;
    b.add(0, 1, PERFQ_KIND_BEGIN, t, 4096 * static_cast<uint64_t>(i + 1));
    b.add(0, 2, PERFQ_KIND_END, t + 1'000, 999'999'999);   // not counted
    b.add(0, 5, PERFQ_KIND_INSTANT, t + 2'000, 1u << 30);  // not a byte count
    b.add(0, 6, PERFQ_KIND_INSTANT, t + 2'500, 1u << 30);  // named, but not bytes
  }
  for (int64_t i = 0; i < 5; ++i) {
    b.add(0, 3, PERFQ_KIND_INSTANT, 1'200'000 + i * 1'000, uint64_t{7} << 32 | 1000);
    b.add(0, 4, PERFQ_KIND_INSTANT, 1'200'500 + i * 1'000, uint64_t{3000} << 32 | 9);
  }
  for (int64_t i = 0; i < 4; ++i) b.add(1, 1, PERFQ_KIND_INSTANT, 1'300'000 + i * 10, 1u << 20);

  SECTION("one device: the host's events are its link's too") {
    auto r = b.analyze(dir.file("b.pq"));
    REQUIRE(r.is_ok());
    const double ceiling = gen4x8.ceiling_bytes_per_s();
    const ReportEvent* copy = find_event(*r, 0, "copy");
    REQUIRE(copy);
    REQUIRE(copy->throughput);
    const ReportThroughput& t = *copy->throughput;
    CHECK(t.calls == 10);
    CHECK(t.bytes == 4096.0 * 55);
    CHECK(t.min_bytes == 4096);
    CHECK(t.max_bytes == 40960);
    CHECK(t.max_at_ns == 1'100'000 + 9 * 50'000);
    CHECK(t.bytes_per_call == Approx(4096.0 * 5.5));
    CHECK(t.bytes_per_s == Approx(4096.0 * 55 / 1e-3));
    CHECK(t.ranges == 10);
    CHECK(t.range_ns == 10'000);
    CHECK(t.in_range_bytes_per_s == Approx(4096.0 * 55 / 10e-6));
    CHECK(t.link_source == 1);
    CHECK(t.link == "Gen4 x8");
    CHECK(t.link_bytes_per_s == Approx(ceiling));
    CHECK(t.link_share == Approx(4096.0 * 55 / 1e-3 / ceiling));
    CHECK(t.in_range_link_share == Approx(4096.0 * 55 / 10e-6 / ceiling));

    const ReportEvent* send = find_event(*r, 0, "send");
    REQUIRE((send && send->throughput));
    CHECK(send->throughput->bytes == 5000);  // the lower half
    CHECK(send->throughput->ranges == 0);
    CHECK(send->throughput->in_range_bytes_per_s == 0);
    const ReportEvent* recv = find_event(*r, 0, "recv");
    REQUIRE((recv && recv->throughput));
    CHECK(recv->throughput->bytes == 15000);  // the upper half
    for (const char* plain : {"tick", "named"}) {
      const ReportEvent* e = find_event(*r, 0, plain);
      REQUIRE(e);
      CHECK_FALSE(e->throughput);
    }
    const ReportEvent* dma = find_event(*r, 1, "dma");
    REQUIRE((dma && dma->throughput));
    CHECK(dma->throughput->bytes == 4.0 * (1 << 20));
    CHECK(dma->throughput->link_source == 1);
    CHECK(dma->throughput->link_share == Approx(4.0 * (1 << 20) / 1e-3 / ceiling));

    const std::string text = report_to_text(*r);
    INFO(text);
    CHECK_THAT(text, Catch::Contains("throughput (events whose arg is a byte count)"));
    CHECK_THAT(text, Catch::Contains("copy                     225.280 kB in 10 calls, 22.528 kB a "
                                     "call (min 4096, max 40960 at 1550000)"));
    CHECK_THAT(text, Catch::Contains("225.280 MB/s over the recording (1.43% of the link), "
                                     "22.528 GB/s within its 10 ranges (143.00%)"));
    CHECK_THAT(text, Catch::Contains("link: dev Gen4 x8, 15.754 GB/s each direction"));
    // 143 %: said, not shown as if it were possible.
    CHECK_THAT(text, Catch::Contains("above the link's ceiling: these bytes did not all cross it"));
    const auto j = nlohmann::json::parse(report_to_json(*r));
    bool in_json = false;
    for (const auto& e : j["events"]) {
      if (e["name"] != "copy") {
        CHECK((e.contains("throughput") ==
               (e["name"] == "send" || e["name"] == "recv" || e["name"] == "dma")));
        continue;
      }
      in_json = true;
      CHECK(e["throughput"]["bytes"] == 225280);
      CHECK(e["throughput"]["calls"] == 10);
      CHECK(e["throughput"]["link"]["source_name"] == "dev");
      CHECK(e["throughput"]["link"]["ceiling_bytes_per_s"].get<double>() == Approx(ceiling));
    }
    CHECK(in_json);
  }
  SECTION("two devices with links: a host event's link is not known, a device's is its own") {
    b.meta.sources.push_back(device_with_link(2, "dev2", PciLink{8000, 4}));
    b.add(2, 1, PERFQ_KIND_INSTANT, 1'400'000, 1000);
    auto r = b.analyze(dir.file("b2.pq"));
    REQUIRE(r.is_ok());
    const ReportEvent* copy = find_event(*r, 0, "copy");
    REQUIRE((copy && copy->throughput));
    CHECK(copy->throughput->link_source == 0);
    CHECK(copy->throughput->link_share == 0);
    const ReportEvent* dma2 = find_event(*r, 2, "dma");
    REQUIRE((dma2 && dma2->throughput));
    CHECK(dma2->throughput->link == "Gen3 x4");
    CHECK(dma2->throughput->link_share ==
          Approx(1000 / 1e-3 / PciLink{8000, 4}.ceiling_bytes_per_s()));
    const std::string text = report_to_text(*r);
    CHECK(copy->throughput->links_known == 2);
    CHECK_THAT(text, Catch::Contains("link: not known (2 devices of its host have link figures; "
                                     "the record does not say which link the bytes crossed)"));
    const auto j = nlohmann::json::parse(report_to_json(*r));
    for (const auto& e : j["events"])
      if (e["name"] == "copy") CHECK(e["throughput"]["link"].is_null());
  }
  SECTION("a device without link figures") {
    b.meta.sources[1] = device_with_link(1, "dev", std::nullopt);
    auto r = b.analyze(dir.file("b3.pq"));
    REQUIRE(r.is_ok());
    const ReportEvent* dma = find_event(*r, 1, "dma");
    REQUIRE((dma && dma->throughput));
    CHECK(dma->throughput->link_source == 0);
    const std::string text = report_to_text(*r);
    CHECK_THAT(text, Catch::Contains("link: not known (the device has no PCIe link figures)"));
    CHECK_THAT(text, Catch::Contains("link: not known (no device of its host has PCIe link "
                                     "figures)"));
  }
}

}  // namespace perfq
