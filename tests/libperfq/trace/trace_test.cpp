// Tests of libperfq/trace.h: the trace file round trip, and a reader that
// survives a file cut at every byte of its last chunks or with any bit
// flipped: it stops with the offset and reason and returns every complete
// chunk before it.
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include <nlohmann/json.hpp>

#include "perfq/trace.h"
#include "sync/sync.h"
#include "trace/crc32c.h"
#include "trace/synth.h"

#include "test_util.h"

namespace perfq {
namespace {

constexpr uint64_t kManyRecords = kSanitized ? 200'000 : 2'000'000;

std::vector<uint8_t> slurp_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

void spit(const std::string& path, const uint8_t* data, size_t n) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n));
}

TraceMetadata test_metadata() {
  TraceMetadata m;
  m.describe_this_host();
  m.options["ring_capacity"] = "4096";
  m.options["sync_period_ms"] = "100";
  TraceSource app;
  app.id = 0;
  app.kind = TraceSourceKind::kHost;
  app.name = "app \"quoted\" \xce\xbb";
  app.pid = 1234;
  app.events = {{1, PERFQ_KIND_INSTANT, "job_submit"}, {2, PERFQ_KIND_INSTANT, "job_complete"}};
  TraceSource dev;
  dev.id = 7;
  dev.kind = TraceSourceKind::kDevice;
  dev.name = "accel0";
  dev.pci_address = "0000:03:00.0";
  dev.link = "Gen4 x8";
  dev.clock_hz = 250'000'000;
  dev.events = {{1, PERFQ_KIND_BEGIN, "job_start"}, {2, PERFQ_KIND_END, "job_end"}};
  m.sources = {app, dev};
  return m;
}

// Record i of a deterministic sequence that exercises every field and bit.
TraceRecord nth_record(uint64_t i) {
  uint64_t x = i * 0x9E3779B97F4A7C15ull;
  x ^= x >> 29;
  TraceRecord r;
  r.source = (i % 5 == 0) ? 7 : 0;
  r.rec.index = i / 3;
  r.rec.event = static_cast<uint32_t>(x & 0xffff) | (i % 97 == 0 ? 0x80000000u : 0);
  r.rec.stream = static_cast<uint16_t>(i % 13);
  r.rec.flags = PERFQ_FLAGS(1 + i % 5, r.source == 7 ? PERFQ_CLOCK_DEVICE : PERFQ_CLOCK_HOST);
  r.rec.time = 5'000'000'000ull + i * 37 + (x & 0xff);
  r.rec.arg = (i % 11 == 0) ? ~x : (x & 0xfffff);
  r.time_ns = static_cast<int64_t>(1'000'000'000 + i * 37) - (i % 1000 == 0 ? 2'000'000'000 : 0);
  if (r.source == 7) {  // a device: every conversion and claim, unbounded among them
    r.conv = static_cast<TraceConversion>(1 + i % 3);
    r.claim_ns = i % 7 == 0 ? kClaimUnbounded : static_cast<uint32_t>(x >> 32);
  }
  return r;
}

TraceSyncSample nth_sample(uint32_t k) {
  TraceSyncSample s;
  s.source = 7;
  s.round = k / 4;
  s.host = {1000u + k, 2000u + k, 1300u + k, 0};
  s.device = {3000u + k, ~uint64_t{k}, 3010u + k, 0};
  // Rounds hold more host samples than device ones: the last of each four
  // has no device side.
  if (k % 4 == 3) {
    s.device = {};
    s.absent = TraceSyncSample::kNoDevice;
  }
  return s;
}

// Checks everything read against the sequences the writer was given.
class Checker : public TraceVisitor {
 public:
  Status on_metadata(const TraceMetadata& m) override {
    metadata = m;
    ++metadata_chunks;
    return Status::ok();
  }
  Status on_records(std::span<const TraceRecord> recs) override {
    for (const auto& r : recs) {
      if (!(r == nth_record(records))) mismatches++;
      ++records;
    }
    return Status::ok();
  }
  Status on_sync_samples(std::span<const TraceSyncSample> s) override {
    for (const auto& x : s) {
      if (!(x == nth_sample(static_cast<uint32_t>(samples)))) mismatches++;
      ++samples;
    }
    return Status::ok();
  }
  Status on_clock_models(std::span<const TraceClockModel> m) override {
    models.insert(models.end(), m.begin(), m.end());
    return Status::ok();
  }
  Status on_losses(std::span<const TraceLoss> l) override {
    losses.insert(losses.end(), l.begin(), l.end());
    return Status::ok();
  }
  Status on_end(const TraceEnd& e) override {
    end = e;
    ++ends;
    return Status::ok();
  }
  TraceMetadata metadata;
  int metadata_chunks = 0;
  uint64_t records = 0;
  uint64_t samples = 0;
  uint64_t mismatches = 0;
  std::vector<TraceClockModel> models;
  std::vector<TraceLoss> losses;
  TraceEnd end;
  int ends = 0;
};

TraceClockModel test_model() {
  TraceClockModel c;
  c.source = 7;
  c.installed_ns = 123456789;
  c.model.device_ref = 0xfedcba9876543210ull;
  c.model.host_ref_ns = -42;
  c.model.rate_ppb = -12345;
  c.model.uncertainty_ns = 77;
  c.model.valid_from_device = 99;
  c.model.segment = 3;
  c.model.flags = PERFQ_SYNC_MODEL_VALID;
  return c;
}

TraceLoss test_loss() { return {0, 12, TraceLossReason::kHostRingFull, 1000, 1'500'000'000, 4321}; }

// Writes kManyRecords records in batches of 1000, plus samples, models and a loss.
void write_big(const std::string& path, bool compress, uint64_t n, bool columns = true) {
  TraceWriterOptions o;
  o.compress = compress;
  o.columns = columns;
  auto w = TraceWriter::open(path, test_metadata(), o);
  REQUIRE(w.is_ok());
  std::vector<TraceRecord> batch;
  std::vector<TraceSyncSample> samples;
  for (uint32_t k = 0; k < 100; ++k) samples.push_back(nth_sample(k));
  REQUIRE(w->append_sync_samples(samples).is_ok());
  REQUIRE(w->append_clock_model(test_model()).is_ok());
  for (uint64_t i = 0; i < n;) {
    batch.clear();
    for (int k = 0; k < 1000 && i < n; ++k, ++i) batch.push_back(nth_record(i));
    Status s = w->append_records(batch);
    REQUIRE(s.is_ok());
  }
  REQUIRE(w->append_loss(test_loss()).is_ok());
  REQUIRE(w->close().is_ok());
  CHECK(w->records_written() == n);
}

TEST_CASE("trace: a sync round keeps every sample of both sides", "[trace]") {
  SyncRound r;
  r.round = 17;
  for (uint64_t i = 0; i < 48; ++i) r.host.push_back({100 + i, 200 + i, 300 + i, 0});
  for (uint64_t i = 0; i < 16; ++i) r.device.push_back({400 + i, 500 + i, 600 + i, 0});
  SyncRound r2 = r;
  r2.round = 18;
  std::swap(r2.host, r2.device);  // and the other way round
  std::vector<TraceSyncSample> ss = trace_samples_of(3, r);
  auto more = trace_samples_of(3, r2);
  CHECK(ss.size() == 48);
  CHECK(ss[15].has_device());
  CHECK_FALSE(ss[16].has_device());
  CHECK(ss[47].has_host());
  CHECK_FALSE(more[47].has_host());
  ss.insert(ss.end(), more.begin(), more.end());

  TempDir dir("sync-samples");
  const std::string path = dir.file("t.pq");
  {
    auto w = TraceWriter::open(path, test_metadata(), {});
    REQUIRE(w.is_ok());
    REQUIRE(w->append_sync_samples(ss).is_ok());
    REQUIRE(w->close().is_ok());
  }
  struct Collect : TraceVisitor {
    std::vector<TraceSyncSample> got;
    Status on_sync_samples(std::span<const TraceSyncSample> s) override {
      got.insert(got.end(), s.begin(), s.end());
      return Status::ok();
    }
  } c;
  auto rd = TraceReader::open(path);
  REQUIRE(rd.is_ok());
  REQUIRE(rd->read(c).is_ok());
  REQUIRE(c.got == ss);
  const auto rounds = sync_rounds_of(c.got);
  REQUIRE(rounds.size() == 2);
  CHECK(rounds[0].round == 17);
  CHECK(rounds[0].host.size() == 48);
  CHECK(rounds[0].device.size() == 16);
  CHECK(rounds[1].host.size() == 16);
  CHECK(rounds[1].device.size() == 48);
  for (size_t i = 0; i < 48; ++i) CHECK(rounds[0].host[i].value == r.host[i].value);
  for (size_t i = 0; i < 16; ++i) CHECK(rounds[0].device[i].after == r.device[i].after);
}

TEST_CASE("crc32c: the standard check value", "[trace]") {
  CHECK(crc32c("123456789", 9) == 0xE3069283u);
  CHECK(crc32c("", 0) == 0u);
  // Extending in pieces equals one pass.
  const char* s = "the quick brown fox jumps over the lazy dog";
  uint32_t whole = crc32c(s, std::strlen(s));
  CHECK(crc32c_extend(crc32c(s, 10), s + 10, std::strlen(s) - 10) == whole);
}

// Offsets at which each chunk starts, from a clean read of `path`.
struct Layout {
  std::vector<uint64_t> chunk_starts;    // includes the end-of-file offset last
  std::vector<uint64_t> records_before;  // records in the chunks before chunk k
  std::vector<uint16_t> types, flags;    // chunk k's header fields
};

class LayoutVisitor : public TraceVisitor {
 public:
  Status on_records(std::span<const TraceRecord> r) override {
    records += r.size();
    return Status::ok();
  }
  uint64_t records = 0;
};

Layout layout_of(const std::vector<uint8_t>& bytes) {
  // Walk the chunk headers (the file is known good).
  Layout l;
  uint64_t off = kTraceFileHeaderSize;
  uint64_t recs = 0;
  while (off < bytes.size()) {
    l.chunk_starts.push_back(off);
    l.records_before.push_back(recs);
    uint16_t type, flags;
    uint32_t stored, count;
    std::memcpy(&type, &bytes[off + 4], 2);
    std::memcpy(&flags, &bytes[off + 6], 2);
    std::memcpy(&stored, &bytes[off + 8], 4);
    l.types.push_back(type);
    l.flags.push_back(flags);
    std::memcpy(&count, &bytes[off + 16], 4);
    if (type == static_cast<uint16_t>(ChunkType::kRecords)) recs += count;
    off += kTraceChunkHeaderSize + stored;
  }
  l.chunk_starts.push_back(off);
  l.records_before.push_back(recs);
  return l;
}

// A chunk's checksum made right again after a test changed its header or
// payload, so that only the change is wrong.  h: its header, whole chunk
// in memory.
void reseal_chunk(uint8_t* h) {
  uint32_t stored;
  std::memcpy(&stored, h + 8, 4);
  const uint32_t crc = crc32c_extend(crc32c(h, 20), h + kTraceChunkHeaderSize, stored);
  std::memcpy(h + 20, &crc, 4);
}

TEST_CASE("trace: round trip of millions of records, every field equal", "[trace]") {
  const bool compress = GENERATE(false, true);
  const bool columns = GENERATE(true, false);  // records chunks in columns, or as rows
  TempDir dir("trace");
  const std::string path = dir.file("big.pq");
  write_big(path, compress, kManyRecords, columns);
  // Each records chunk says how its records lie (and is compressed or not).
  const Layout l = layout_of(slurp_bytes(path));
  size_t records_chunks = 0;
  for (size_t k = 0; k + 1 < l.chunk_starts.size(); ++k) {
    if (l.types[k] == static_cast<uint16_t>(ChunkType::kRecords)) {
      ++records_chunks;
      CHECK(((l.flags[k] & kChunkFlagColumns) != 0) == columns);
      CHECK(((l.flags[k] & kChunkFlagZstd) != 0) == compress);
    } else {
      CHECK((l.flags[k] & kChunkFlagColumns) == 0);
    }
  }
  const size_t per_chunk = TraceWriterOptions{}.records_per_chunk;
  CHECK(records_chunks == (kManyRecords + per_chunk - 1) / per_chunk);

  auto r = TraceReader::open(path);
  REQUIRE(r.is_ok());
  CHECK(r->version() == kTraceVersionOrdered);  // appended in time order: version 1
  Checker c;
  Status s = r->read(c);
  INFO(s.message());
  REQUIRE(s.is_ok());
  CHECK(c.records == kManyRecords);
  CHECK(c.samples == 100);
  CHECK(c.mismatches == 0);
  CHECK(c.metadata == test_metadata());
  CHECK(c.metadata_chunks == 1);
  REQUIRE(c.models.size() == 1);
  CHECK(c.models[0] == test_model());
  REQUIRE(c.losses.size() == 1);
  CHECK(c.losses[0] == test_loss());
  CHECK(c.ends == 1);
  CHECK(c.end.records == kManyRecords);
  CHECK(r->summary().clean_end);
  CHECK(r->summary().records == kManyRecords);
  const auto size = std::filesystem::file_size(path);
  CHECK(r->summary().bytes == size);
  if (!compress) {
    CHECK(size > kManyRecords * 48);
  } else {
    CHECK(size < kManyRecords * 48);  // this sequence compresses
  }

  // A second read() rewinds and gives the same.
  Checker again;
  REQUIRE(r->read(again).is_ok());
  CHECK(again.records == kManyRecords);
}

// start_ns and stop_ns give a recording's duration in the report, the filter
// and the merge: a value that is not a whole number in full is no interval,
// never the digits it starts with.
TEST_CASE("trace: a recording option is a whole number in full or none", "[trace]") {
  TraceMetadata m;
  m.options = {
      {"start_ns", "1700000000123456789"}, {"stop_ns", "-42"}, {"cut", "12abc"}, {"empty", ""},
      {"huge", "99999999999999999999"},    {"space", " 7"},    {"frac", "1.5"}};
  CHECK(m.option_int("start_ns") == 1700000000123456789);
  CHECK(m.option_int("stop_ns") == -42);
  CHECK_FALSE(m.option_int("absent"));
  for (const char* bad : {"cut", "empty", "huge", "frac"}) {
    INFO(bad);
    CHECK_FALSE(m.option_int(bad));
  }
  // strtoll's leading white space: the daemon never writes it; accepted as before.
  CHECK(m.option_int("space") == 7);
}

TEST_CASE("trace: later metadata adds sources, and open refuses what is not a trace", "[trace]") {
  TempDir dir("trace");
  const std::string path = dir.file("meta.pq");
  TraceMetadata m = test_metadata();
  {
    auto w = TraceWriter::open(path, m);
    REQUIRE(w.is_ok());
    std::vector<TraceRecord> one = {nth_record(0)};
    REQUIRE(w->append_records(one).is_ok());
    TraceMetadata more;
    TraceSource late;
    late.id = 9;
    late.name = "late-app";
    late.events = {{5, PERFQ_KIND_COUNTER, "bytes"}};
    more.sources = {late};
    REQUIRE(w->append_metadata(more).is_ok());
    REQUIRE(w->close().is_ok());
    REQUIRE(w->close().is_ok());  // idempotent
    CHECK(!w->append_records(one).is_ok());
  }
  auto r = TraceReader::open(path);
  REQUIRE(r.is_ok());
  Checker c;
  REQUIRE(r->read(c).is_ok());
  CHECK(c.metadata_chunks == 2);
  CHECK(c.records == 1);
  REQUIRE(c.metadata.sources.size() == 3);
  REQUIRE(c.metadata.find_source(9) != nullptr);
  CHECK(c.metadata.find_source(9)->events[0].name == "bytes");
  CHECK(c.metadata.find_source(7)->pci_address == "0000:03:00.0");

  SECTION("not a trace") {
    const std::string junk = dir.file("junk");
    spit(junk, reinterpret_cast<const uint8_t*>("hello, this is not a perfq trace at all"), 39);
    auto bad = TraceReader::open(junk);
    REQUIRE(!bad.is_ok());
    CHECK(bad.status().code() == Errc::kCorrupt);
    CHECK_THAT(bad.status().message(),
               Catch::Contains("byte offset 0") && Catch::Contains("magic"));
  }
  SECTION("missing file") {
    auto bad = TraceReader::open(dir.file("nope.pq"));
    REQUIRE(!bad.is_ok());
    CHECK(bad.status().code() == Errc::kNotFound);
    CHECK_THAT(bad.status().message(), Catch::Contains("nope.pq"));
  }
}

// A device on the bus: Gen5 capable, trained at Gen4 x16, bound to perfq.
PciDevice sample_pci() {
  PciDevice d;
  d.address = "0000:03:00.0";
  d.bus = 3;
  d.vendor_id = 0x10de;
  d.device_id = 0x2330;
  d.device_class = 0x0302;
  d.subsystem_vendor_id = 0x10de;
  d.subsystem_id = 0x16c1;
  d.vendor_name = "NVIDIA Corporation";
  d.device_name = "GH100[H100 SXM5 80GB]";
  d.class_name = "3D controller";
  d.driver = "perfq";
  d.numa_node = 1;
  d.iommu_group = 12;
  d.config_readable = true;
  PcieInfo p;
  p.version = 2;
  p.link_max = PciLink{32000, 16};
  p.link_current = PciLink{16000, 16};
  p.max_payload_supported = 512;
  p.max_payload = 256;
  p.max_read_request = 512;
  d.pcie = p;
  return d;
}

TEST_CASE("trace: a device that ended early says when and why, later metadata adds it", "[trace]") {
  TraceMetadata m = test_metadata();
  TraceMetadata later;
  later.sources.push_back(m.sources[1]);
  later.sources.back().ended =
      TraceSourceEnd{"silent", 123456789, "shm:/x: the device stopped answering"};
  const std::string text = trace_metadata_to_json(later);
  auto back = trace_metadata_from_json(text);
  REQUIRE(back.is_ok());
  CHECK(back.value() == later);
  CHECK(nlohmann::json::parse(text)["sources"][0]["ended"]["state"] == "silent");
  // The reader merges it into the source as first described; the others
  // have no "ended" at all.
  m.merge(back.value());
  REQUIRE(m.sources[1].ended.has_value());
  CHECK(m.sources[1].ended->time_ns == 123456789);
  CHECK_FALSE(m.sources[0].ended.has_value());
  CHECK_FALSE(nlohmann::json::parse(trace_metadata_to_json(test_metadata()))["sources"][1].contains(
      "ended"));
}

TEST_CASE("trace: a device's PCI facts in the metadata, and traces without them", "[trace][pci]") {
  TraceMetadata m = test_metadata();
  m.sources[1].pci = sample_pci();
  TraceSource conventional;  // a device with no PCIe capability
  conventional.id = 8;
  conventional.kind = TraceSourceKind::kDevice;
  conventional.name = "ivshmem";
  conventional.pci = sample_pci();
  conventional.pci->pcie.reset();
  m.sources.push_back(conventional);

  const std::string text = trace_metadata_to_json(m);
  auto back = trace_metadata_from_json(text);
  REQUIRE(back.is_ok());
  CHECK(back.value() == m);
  auto j = nlohmann::json::parse(text);
  CHECK(j["sources"][0].contains("pci") == false);  // a host application
  CHECK(j["sources"][1]["pci"]["pcie"]["link_current"]["speed_gt_s"] == 16.0);
  CHECK(j["sources"][1]["pci"]["pcie"]["trained_below_max"] == true);
  CHECK(j["sources"][2]["pci"]["pcie"].is_null());

  SECTION("metadata written before PCI facts existed reads as before") {
    for (auto& js : j["sources"]) js.erase("pci");
    auto old = trace_metadata_from_json(j.dump());
    REQUIRE(old.is_ok());
    CHECK_FALSE(old->sources[1].pci);
    CHECK(old->sources[1].pci_address == "0000:03:00.0");
    CHECK(old->sources[1].link == "Gen4 x8");
    // The example of docs/trace-format.md, as version 1 first wrote it.
    auto doc = trace_metadata_from_json(
        R"({"host_name": "h", "kernel": "Linux 6.1.0 x86_64", "cpu": "c", "perfq_version": "0.1.0",
            "options": {}, "sources": [{"id": 1, "kind": "device", "name": "accel0", "pid": 0,
            "pci_address": "0000:03:00.0", "link": "Gen4 x8", "clock_hz": 250000000,
            "events": []}], "clock_domains": []})");
    REQUIRE(doc.is_ok());
    CHECK_FALSE(doc->sources[0].pci);
  }
  SECTION("a malformed pci object is an error naming the source") {
    j["sources"][1]["pci"]["vendor_id"] = 4318;
    auto bad = trace_metadata_from_json(j.dump());
    REQUIRE_FALSE(bad.is_ok());
    CHECK_THAT(bad.status().message(), Catch::Contains("source 7") && Catch::Contains("vendor_id"));
  }
  SECTION("through a trace file") {
    TempDir dir("tracepci");
    const std::string path = dir.file("pci.pq");
    {
      auto w = TraceWriter::open(path, m);
      REQUIRE(w.is_ok());
      REQUIRE(w->close().is_ok());
    }
    auto r = TraceReader::open(path);
    REQUIRE(r.is_ok());
    Checker c;
    REQUIRE(r->read(c).is_ok());
    CHECK(c.metadata == m);
  }
}

TEST_CASE("trace: a full disk is an error, not silence", "[trace]") {
  if (access("/dev/full", W_OK) != 0) FAIL("/dev/full is needed for this test");
  auto w = TraceWriter::open("/dev/full", test_metadata());
  REQUIRE(!w.is_ok());
  CHECK(w.status().code() == Errc::kIo);
  CHECK_THAT(w.status().message(), Catch::Contains("/dev/full") && Catch::Contains("space"));
}

TEST_CASE("trace: cut at every byte of the last chunks, the reader stops there", "[trace]") {
  const bool compress = GENERATE(false, true);
  TempDir dir("trace");
  const std::string path = dir.file("cut.pq");
  {
    TraceWriterOptions o;
    o.compress = compress;
    o.records_per_chunk = 40;
    auto w = TraceWriter::open(path, test_metadata(), o);
    REQUIRE(w.is_ok());
    std::vector<TraceRecord> recs;
    for (uint64_t i = 0; i < 200; ++i) recs.push_back(nth_record(i));
    REQUIRE(w->append_records(recs).is_ok());
    REQUIRE(w->append_loss(test_loss()).is_ok());
    REQUIRE(w->close().is_ok());
  }
  const std::vector<uint8_t> bytes = slurp_bytes(path);
  const Layout l = layout_of(bytes);
  // metadata, 5 record chunks, loss, end
  REQUIRE(l.chunk_starts.size() == 9);
  const size_t nchunks = l.chunk_starts.size() - 1;
  const std::string cut = dir.file("cut-copy.pq");

  // From the full size down to the start of the last three record chunks,
  // truncating one copy a byte at a time (in a sanitizer tree every chunk
  // boundary and every fifth byte: the fuzzers cut at random there too).
  const uint64_t from = l.chunk_starts[nchunks - 5];
  uint64_t checked = 0, skipped = 0;
  spit(cut, bytes.data(), bytes.size());
  for (uint64_t len = bytes.size(); len >= from; --len) {
    // The chunk containing the cut, or none if the cut is on a boundary.
    size_t k = 0;
    while (k + 1 < l.chunk_starts.size() && l.chunk_starts[k + 1] <= len) ++k;
    const bool boundary = l.chunk_starts[k] == len;
    if (kSanitized && !boundary && len % 5 != 0) {
      ++skipped;
      continue;
    }
    REQUIRE(truncate(cut.c_str(), static_cast<off_t>(len)) == 0);
    auto r = TraceReader::open(cut);
    REQUIRE(r.is_ok());
    LayoutVisitor v;
    Status s = r->read(v);
    INFO("cut at " << len << ": " << s.message());
    if (boundary) {
      REQUIRE(s.is_ok());
      REQUIRE(r->summary().chunks == k);
      REQUIRE(v.records == l.records_before[k]);
    } else {
      REQUIRE(s.code() == Errc::kCorrupt);
      REQUIRE(r->error_offset() == l.chunk_starts[k]);
      REQUIRE(r->summary().chunks == k);
      REQUIRE(r->summary().bytes == l.chunk_starts[k]);
      REQUIRE(v.records == l.records_before[k]);
      REQUIRE(s.message().find("byte offset " + std::to_string(l.chunk_starts[k])) !=
              std::string::npos);
      REQUIRE(s.message().find("torn") != std::string::npos);
    }
    ++checked;
  }
  CHECK(checked + skipped == bytes.size() - from + 1);
  CHECK(checked * 5 >= bytes.size() - from);

  // Cut inside the file header: open() refuses.
  for (uint64_t len = kTraceFileHeaderSize; len-- > 0;) {
    REQUIRE(truncate(cut.c_str(), static_cast<off_t>(len)) == 0);
    auto r = TraceReader::open(cut);
    REQUIRE(!r.is_ok());
    REQUIRE(r.status().code() == Errc::kCorrupt);
    REQUIRE_THAT(r.status().message(), Catch::Contains("byte offset 0"));
  }
}

// A version 2 file, as perfq-daemon writes it: every 100 ns of time, one
// stretch in time order of what three inputs delivered (the second 250 ns
// late, the third 700 ns), then a watermark 700 ns behind: chunks overlap.
// The reader gives the records out merged, each by the watermark after
// which nothing older can come (a loss report after each watermark is the
// checkpoint), and a file cut anywhere gives out in order what its whole
// chunks hold.  A record appended below a watermark comes out, counted.
TEST_CASE("trace: version 2 chunks overlap, and the reader merges them behind the watermarks",
          "[trace]") {
  const bool compress = GENERATE(false, true);
  TempDir dir("trace-v2");
  const std::string path = dir.file("v2.pq");
  constexpr int64_t kStep = 100;
  const int64_t delays[3] = {0, 250, 700};
  std::vector<TraceRecord> all;
  {
    TraceWriterOptions o;
    o.compress = compress;
    o.records_per_chunk = 7;
    o.watermarks = true;
    auto w = TraceWriter::open(path, test_metadata(), o);
    REQUIRE(w.is_ok());
    uint64_t n = 0;
    // (Every cut below reads the file again: fewer stretches where that is
    // slow.)
    const int64_t stretches = kSanitized ? 20 : 60;
    for (int64_t k = 0; k < stretches; ++k) {
      std::vector<TraceRecord> take;
      for (int in = 0; in < 3; ++in)
        for (int64_t t = k * kStep - delays[in]; t < (k + 1) * kStep - delays[in]; t += 9 + in) {
          TraceRecord r = nth_record(n++);
          r.source = static_cast<uint16_t>(in);
          r.time_ns = t;
          take.push_back(r);
        }
      std::stable_sort(take.begin(), take.end(), [](const TraceRecord& a, const TraceRecord& b) {
        return a.time_ns < b.time_ns;
      });
      REQUIRE(w->append_records(take).is_ok());
      all.insert(all.end(), take.begin(), take.end());
      const int64_t mark = (k + 1) * kStep - 700;
      REQUIRE(w->append_watermark(mark).is_ok());
      TraceLoss checkpoint = test_loss();
      checkpoint.time_ns = mark;
      REQUIRE(w->append_loss(checkpoint).is_ok());
    }
    REQUIRE(w->close().is_ok());
  }
  CHECK(TraceReader::open(path)->version() == kTraceVersion);
  std::stable_sort(all.begin(), all.end(), [](const TraceRecord& a, const TraceRecord& b) {
    return a.time_ns < b.time_ns;
  });

  struct Merged : TraceVisitor {
    std::vector<TraceRecord> got;
    uint64_t early = 0;  // checkpoints that found a record below them still held
    const std::vector<TraceRecord>* all = nullptr;
    Status on_records(std::span<const TraceRecord> r) override {
      got.insert(got.end(), r.begin(), r.end());
      return Status::ok();
    }
    Status on_losses(std::span<const TraceLoss> l) override {
      for (const auto& x : l) {
        // Every record older than the watermark written so far is out.
        uint64_t older_out = 0, older_written = 0;
        for (const auto& r : got) older_out += r.time_ns < x.time_ns;
        for (const auto& r : *all) older_written += r.time_ns < x.time_ns;
        // (all holds every record; those older than a watermark were all
        // written before it)
        early += older_out != older_written;
      }
      return Status::ok();
    }
  };
  auto in_order = [](const std::vector<TraceRecord>& v) {
    for (size_t i = 1; i < v.size(); ++i)
      if (v[i].time_ns < v[i - 1].time_ns) return false;
    return true;
  };
  {
    auto r = TraceReader::open(path);
    Merged v;
    v.all = &all;
    REQUIRE(r->read(v).is_ok());
    CHECK(r->summary().clean_end);
    CHECK(r->summary().out_of_order == 0);
    CHECK(v.early == 0);
    REQUIRE(v.got.size() == all.size());
    CHECK(v.got == all);  // the same records, the same order (ties in file order)
  }

  // Cut at every chunk boundary and inside each chunk: what the whole
  // chunks before the cut hold, in order.
  const std::vector<uint8_t> bytes = slurp_bytes(path);
  const Layout l = layout_of(bytes);
  const std::string cut = dir.file("cut.pq");
  for (size_t k = 1; k < l.chunk_starts.size(); ++k) {
    for (const uint64_t len : {l.chunk_starts[k], l.chunk_starts[k] - 1}) {
      spit(cut, bytes.data(), len);
      auto r = TraceReader::open(cut);
      REQUIRE(r.is_ok());
      Merged v;
      v.all = &all;
      const Status s = r->read(v);
      INFO("cut at " << len << ": " << s.message());
      CHECK((s.is_ok() || s.code() == Errc::kCorrupt));
      const size_t whole = len == l.chunk_starts[k] ? k : k - 1;
      CHECK(v.got.size() == l.records_before[whole]);
      CHECK(in_order(v.got));
      CHECK(r->summary().out_of_order == 0);
    }
  }

  // A record appended below a watermark already written: out, counted.
  {
    TraceWriterOptions o;
    o.watermarks = true;
    const std::string late = dir.file("late.pq");
    auto w = TraceWriter::open(late, test_metadata(), o);
    REQUIRE(w.is_ok());
    std::vector<TraceRecord> a{nth_record(0), nth_record(1)};
    a[0].time_ns = 100;
    a[1].time_ns = 300;
    REQUIRE(w->append_records(a).is_ok());
    REQUIRE(w->append_watermark(200).is_ok());
    std::vector<TraceRecord> b{nth_record(2)};
    b[0].time_ns = 150;  // below 200
    REQUIRE(w->append_records(b).is_ok());
    REQUIRE(w->close().is_ok());
    auto r = TraceReader::open(late);
    Merged v;
    v.all = &a;
    REQUIRE(r->read(v).is_ok());
    REQUIRE(v.got.size() == 3);
    CHECK(v.got[0].time_ns == 100);
    CHECK(v.got[1].time_ns == 150);
    CHECK(v.got[2].time_ns == 300);
    // 150 came after 100 was out but before 300: in order after all; one
    // below a record already out is counted.
    CHECK(r->summary().out_of_order == 0);
  }
  // A watermark in a version 1 file is refused by the writer.
  {
    auto w = TraceWriter::open(dir.file("v1.pq"), test_metadata(), {});
    REQUIRE(w.is_ok());
    CHECK(w->append_watermark(5).code() == Errc::kInvalidArgument);
  }
}

// A file whose every chunk is sound but whose structure is not: the reader
// names each fault with its offset, skips what it cannot trust and reads on.
TEST_CASE("trace: a file's structure is checked, not only its chunks", "[trace]") {
  TempDir dir("trace");
  auto write = [&](const std::string& name, uint64_t first, uint64_t n) {
    TraceWriterOptions o;
    o.compress = false;
    o.records_per_chunk = 40;
    auto w = TraceWriter::open(dir.file(name), test_metadata(), o);
    REQUIRE(w.is_ok());
    std::vector<TraceRecord> recs;
    for (uint64_t i = first; i < first + n; ++i) recs.push_back(nth_record(i));
    REQUIRE(w->append_records(recs).is_ok());
    REQUIRE(w->close().is_ok());
    return slurp_bytes(dir.file(name));
  };
  // metadata, three records chunks of 40, end
  const std::vector<uint8_t> good = write("good.pq", 0, 120);
  const Layout l = layout_of(good);
  REQUIRE(l.chunk_starts.size() == 6);
  auto chunk = [&](size_t k) {
    return std::vector<uint8_t>(good.begin() + static_cast<long>(l.chunk_starts[k]),
                                good.begin() + static_cast<long>(l.chunk_starts[k + 1]));
  };
  // Header and chunks, in this order.
  auto file = [&](const std::string& name, const std::vector<std::vector<uint8_t>>& chunks) {
    std::vector<uint8_t> b(good.begin(), good.begin() + kTraceFileHeaderSize);
    for (const auto& c : chunks) b.insert(b.end(), c.begin(), c.end());
    spit(dir.file(name), b.data(), b.size());
    return dir.file(name);
  };
  struct Read {
    Status status;
    TraceReadSummary summary;
    Checker seen;
  };
  auto read = [](const std::string& path) {
    Read r;
    auto reader = TraceReader::open(path);
    REQUIRE(reader.is_ok());
    r.status = reader->read(r.seen);
    r.summary = reader->summary();
    for (const auto& p : r.summary.problems) UNSCOPED_INFO(p.message);
    return r;
  };
  auto at = [](const TraceProblem& p, uint64_t off) {
    return p.offset == off &&
           p.message.find("byte offset " + std::to_string(off) + ":") != std::string::npos;
  };

  SECTION("a sound file: no problem, a clean end") {
    Read r = read(dir.file("good.pq"));
    REQUIRE(r.status.is_ok());
    CHECK(r.summary.problems.empty());
    CHECK(r.summary.clean_end);
    CHECK(r.seen.records == 120);
  }
  SECTION("an end chunk in the middle: named, and what follows is read") {
    // Another writer's records 120..159 after this file's end.
    const std::vector<uint8_t> more = write("more.pq", 120, 40);
    const Layout m = layout_of(more);
    const std::vector<uint8_t> tail(more.begin() + static_cast<long>(m.chunk_starts[1]),
                                    more.begin() + static_cast<long>(m.chunk_starts[2]));
    Read r = read(file("mid-end.pq", {chunk(0), chunk(1), chunk(2), chunk(3), chunk(4), tail}));
    REQUIRE(r.status.is_ok());
    REQUIRE(r.summary.problems.size() == 1);
    CHECK(at(r.summary.problems[0], l.chunk_starts[4]));
    CHECK_THAT(r.summary.problems[0].message, Catch::Contains("end chunk in the middle"));
    CHECK_FALSE(r.summary.clean_end);
    CHECK(r.seen.records == 160);
    CHECK(r.seen.mismatches == 0);
  }
  SECTION("an end chunk that counts records the file does not hold") {
    std::vector<uint8_t> end = chunk(4);
    const uint64_t claimed = 999'999;
    std::memcpy(&end[kTraceChunkHeaderSize], &claimed, 8);  // TraceEnd::records
    reseal_chunk(end.data());
    Read r = read(file("end-lies.pq", {chunk(0), chunk(1), chunk(2), chunk(3), end}));
    REQUIRE(r.status.is_ok());
    REQUIRE(r.summary.problems.size() == 1);
    CHECK(at(r.summary.problems[0], l.chunk_starts[4]));
    CHECK_THAT(r.summary.problems[0].message, Catch::Contains("999999 records"));
    CHECK_THAT(r.summary.problems[0].message, Catch::Contains("holds 120 records"));
    CHECK_FALSE(r.summary.clean_end);
    CHECK(r.seen.records == 120);
  }
  SECTION("a records chunk twice: the copy is named and skipped") {
    Read r = read(file("dup.pq", {chunk(0), chunk(1), chunk(2), chunk(2), chunk(3), chunk(4)}));
    REQUIRE(r.status.is_ok());
    const uint64_t copy_at = l.chunk_starts[3];  // where the copy sits
    REQUIRE(r.summary.problems.size() == 2);     // the copy, then the end's chunk count
    CHECK(at(r.summary.problems[0], copy_at));
    CHECK_THAT(r.summary.problems[0].message,
               Catch::Contains("repeats the records chunk at byte offset " +
                               std::to_string(l.chunk_starts[2])));
    CHECK_THAT(r.summary.problems[1].message, Catch::Contains("in 5 chunks"));
    CHECK(r.seen.records == 120);  // each once, in order
    CHECK(r.summary.records == 120);
    CHECK(r.seen.mismatches == 0);
    CHECK_FALSE(r.summary.clean_end);
  }
  SECTION("no metadata chunk: named at the first chunk") {
    Read r = read(file("nometa.pq", {chunk(1), chunk(2), chunk(3), chunk(4)}));
    REQUIRE(r.status.is_ok());
    REQUIRE(r.summary.problems.size() == 2);  // no metadata, then the end's chunk count
    CHECK(at(r.summary.problems[0], kTraceFileHeaderSize));
    CHECK_THAT(r.summary.problems[0].message, Catch::Contains("not metadata"));
    CHECK(r.seen.metadata_chunks == 0);
    CHECK(r.seen.records == 120);
    CHECK_FALSE(r.summary.clean_end);
  }
  SECTION("garbage after a clean end: not a clean end") {
    std::vector<uint8_t> junk(kTraceChunkHeaderSize + 8, 0x5a);
    Read r = read(file("junk.pq", {chunk(0), chunk(1), chunk(2), chunk(3), chunk(4), junk}));
    CHECK(r.status.code() == Errc::kCorrupt);
    CHECK_FALSE(r.summary.clean_end);
  }
}

TEST_CASE("trace: any flipped bit is caught at its chunk", "[trace]") {
  const bool compress = GENERATE(false, true);
  TempDir dir("trace");
  const std::string path = dir.file("flip.pq");
  {
    TraceWriterOptions o;
    o.compress = compress;
    o.records_per_chunk = 30;
    auto w = TraceWriter::open(path, test_metadata(), o);
    REQUIRE(w.is_ok());
    std::vector<TraceRecord> recs;
    for (uint64_t i = 0; i < 90; ++i) recs.push_back(nth_record(i));
    REQUIRE(w->append_records(recs).is_ok());
    std::vector<TraceSyncSample> samples = {nth_sample(0), nth_sample(1)};
    REQUIRE(w->append_sync_samples(samples).is_ok());
    REQUIRE(w->close().is_ok());
  }
  const std::vector<uint8_t> bytes = slurp_bytes(path);
  const Layout l = layout_of(bytes);
  const std::string bad = dir.file("flipped.pq");
  spit(bad, bytes.data(), bytes.size());
  const int fd = ::open(bad.c_str(), O_WRONLY);
  REQUIRE(fd >= 0);
  auto poke = [fd](uint64_t off, uint8_t v) {
    return pwrite(fd, &v, 1, static_cast<off_t>(off)) == 1;
  };
  // Every bit of the file header and of every chunk header; one bit of
  // every payload byte (of every fifth in a sanitizer tree).
  auto in_header = [&](uint64_t off) {
    if (off < kTraceFileHeaderSize) return true;
    for (uint64_t start : l.chunk_starts) {
      if (off >= start && off < start + kTraceChunkHeaderSize) return true;
    }
    return false;
  };
  uint64_t flips = 0;
  for (uint64_t off = 0; off < bytes.size(); ++off) {
    const bool all_bits = in_header(off);
    if (kSanitized && !all_bits && off % 5 != 0) continue;
    for (int bit = 0; bit < 8; ++bit) {
      if (!all_bits && bit != static_cast<int>(off % 8)) continue;
      REQUIRE(poke(off, bytes[off] ^ static_cast<uint8_t>(1u << bit)));
      ++flips;
      INFO("bit " << bit << " of byte " << off);
      auto r = TraceReader::open(bad);
      if (off < kTraceFileHeaderSize) {
        REQUIRE(poke(off, bytes[off]));
        REQUIRE(!r.is_ok());
        REQUIRE(r.status().code() == Errc::kCorrupt);
        continue;
      }
      REQUIRE(r.is_ok());
      LayoutVisitor v;
      Status s = r->read(v);
      size_t k = 0;
      while (k + 1 < l.chunk_starts.size() && l.chunk_starts[k + 1] <= off) ++k;
      INFO(s.message());
      REQUIRE(s.code() == Errc::kCorrupt);
      REQUIRE(r->error_offset() == l.chunk_starts[k]);
      REQUIRE(v.records == l.records_before[k]);
      REQUIRE_THAT(s.message(),
                   Catch::Contains("byte offset " + std::to_string(l.chunk_starts[k])));
      REQUIRE(poke(off, bytes[off]));
    }
  }
  ::close(fd);
  CHECK(flips > bytes.size() / (kSanitized ? 5 : 1));
}

TEST_CASE("trace: the columns flag only on records chunks of whole records", "[trace]") {
  TempDir dir("trace");
  const std::string path = dir.file("cols.pq");
  {
    TraceWriterOptions o;
    o.compress = false;
    auto w = TraceWriter::open(path, test_metadata(), o);
    REQUIRE(w.is_ok());
    std::vector<TraceRecord> recs = {nth_record(0), nth_record(1), nth_record(2)};
    REQUIRE(w->append_records(recs).is_ok());
    REQUIRE(w->close().is_ok());
  }
  const std::vector<uint8_t> good = slurp_bytes(path);
  const Layout l = layout_of(good);
  REQUIRE(l.chunk_starts.size() == 4);  // metadata, records, end, end of file
  // Rewrites chunk k's flags and raw length.
  auto with_flags = [&](size_t k, uint16_t flags, uint32_t raw_len) {
    std::vector<uint8_t> b = good;
    uint8_t* h = b.data() + l.chunk_starts[k];
    std::memcpy(h + 6, &flags, 2);
    std::memcpy(h + 12, &raw_len, 4);
    reseal_chunk(h);
    spit(path, b.data(), b.size());
    auto r = TraceReader::open(path);
    REQUIRE(r.is_ok());
    LayoutVisitor v;
    Status s = r->read(v);
    return std::pair{s, r->error_offset()};
  };
  uint32_t meta_len;
  std::memcpy(&meta_len, good.data() + l.chunk_starts[0] + 12, 4);
  auto [meta, meta_at] = with_flags(0, kChunkFlagColumns, meta_len);
  CHECK(meta.code() == Errc::kCorrupt);
  CHECK(meta_at == l.chunk_starts[0]);
  CHECK_THAT(meta.message(),
             Catch::Contains("records in columns") && Catch::Contains("metadata chunk"));
  auto [part, part_at] = with_flags(1, kChunkFlagColumns, 3 * 48 - 1);
  CHECK(part.code() == Errc::kCorrupt);
  CHECK(part_at == l.chunk_starts[1]);
  CHECK_THAT(part.message(), Catch::Contains("records chunk of 143 bytes"));
  auto [unknown, unknown_at] = with_flags(1, 4, 3 * 48);
  CHECK(unknown.code() == Errc::kCorrupt);
  CHECK(unknown_at == l.chunk_starts[1]);
  CHECK_THAT(unknown.message(), Catch::Contains("unknown flags 0x0004"));
}

TEST_CASE("trace: a garbage tail and absurd lengths are refused without big allocations",
          "[trace]") {
  TempDir dir("trace");
  const std::string path = dir.file("tail.pq");
  {
    auto w = TraceWriter::open(path, test_metadata());
    REQUIRE(w.is_ok());
    std::vector<TraceRecord> recs = {nth_record(0), nth_record(1)};
    REQUIRE(w->append_records(recs).is_ok());
    REQUIRE(w->flush().is_ok());
    REQUIRE(w->close().is_ok());
  }
  std::vector<uint8_t> bytes = slurp_bytes(path);
  const uint64_t good = bytes.size();
  // A chunk header that claims 4 GiB.
  uint8_t h[kTraceChunkHeaderSize] = {};
  uint32_t magic = kTraceChunkMagic, huge = 0xffffffffu;
  uint16_t type = static_cast<uint16_t>(ChunkType::kRecords);
  std::memcpy(h, &magic, 4);
  std::memcpy(h + 4, &type, 2);
  std::memcpy(h + 8, &huge, 4);
  std::memcpy(h + 12, &huge, 4);
  bytes.insert(bytes.end(), h, h + sizeof h);
  spit(path, bytes.data(), bytes.size());
  auto r = TraceReader::open(path);
  REQUIRE(r.is_ok());
  LayoutVisitor v;
  Status s = r->read(v);
  CHECK(s.code() == Errc::kCorrupt);
  CHECK(r->error_offset() == good);
  CHECK_THAT(s.message(), Catch::Contains("exceeds"));
  CHECK(v.records == 2);
  // The END chunk came before the garbage: it did not end the file.
  CHECK_FALSE(r->summary().clean_end);
}

}  // namespace
}  // namespace perfq

namespace perfq {
namespace {

// The compression figure behind TraceWriterOptions::compress (hidden: run
// with `perfq_tests "[.trace-bench]"`).  Median of 5 runs, a synthetic
// 125k-job trace (1M records) of the shape perfq records.
TEST_CASE("trace: bytes per record and write cost, with and without zstd", "[.trace-bench]") {
  TempDir dir("trace");
  for (int level : {0, 1, 3}) {
    const bool compress = level > 0;
    std::vector<double> ns_per_record;
    std::vector<double> read_ns;
    double bytes_per_record = 0;
    for (int run = 0; run < 5; ++run) {
      const std::string path = dir.file("bench.pq");
      SynthTraceOptions o;
      o.jobs = 125'000;
      o.period_ns = 7'919;
      o.submit_to_start = {1'200, 1'750, 2'300, 3'100, 9'000};
      o.start_to_end = {10'000, 12'345, 15'001};
      TraceWriterOptions w;
      w.compress = compress;
      w.zstd_level = level;
      const auto t0 = std::chrono::steady_clock::now();
      auto n = write_synthetic_trace(path, o, w);
      const auto t1 = std::chrono::steady_clock::now();
      REQUIRE(n.is_ok());
      ns_per_record.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() /
                              static_cast<double>(n.value()));
      bytes_per_record =
          static_cast<double>(std::filesystem::file_size(path)) / static_cast<double>(n.value());
      auto r = TraceReader::open(path);
      REQUIRE(r.is_ok());
      LayoutVisitor v;
      const auto t2 = std::chrono::steady_clock::now();
      REQUIRE(r->read(v).is_ok());
      const auto t3 = std::chrono::steady_clock::now();
      read_ns.push_back(std::chrono::duration<double, std::nano>(t3 - t2).count() /
                        static_cast<double>(n.value()));
    }
    std::sort(ns_per_record.begin(), ns_per_record.end());
    std::sort(read_ns.begin(), read_ns.end());
    // Write time includes generating and sorting the synthetic records (the
    // same work in both modes): the difference is the cost of zstd.
    std::printf(
        "trace-bench: zstd_level=%d bytes_per_record=%.2f generate_and_write_ns_per_record="
        "%.1f read_ns_per_record=%.1f (medians of 5)\n",
        level, bytes_per_record, ns_per_record[2], read_ns[2]);
  }
}

}  // namespace
}  // namespace perfq
