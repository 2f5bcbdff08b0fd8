// The daemon's merge stage: producers on real threads, a writer taking
// every record with the watermark, checked for order, completeness and
// bounded waiting, and what a reader of the file they make gets.
#include <atomic>
#include <catch2/catch.hpp>
#include <optional>
#include <thread>

#include "device/device_clock.h"
#include "merge.h"
#include "perfq/trace.h"
#include "test_util.h"

namespace perfqd {
namespace {

using perfq::TraceRecord;

int64_t now() { return static_cast<int64_t>(perfq::monotonic_ns()); }

TraceRecord rec(uint16_t source, uint64_t index, int64_t t) {
  TraceRecord r;
  r.source = source;
  r.rec.index = index;
  r.time_ns = t;
  return r;
}

// What the daemon's writer does with each take (writer_thread.cpp): its
// records, then the watermark, into a version 2 trace file; read back by
// the library's reader, which merges the takes behind the watermarks.  It
// also checks the watermark's promise as the takes come: no record taken
// after a watermark is below it.
class FileSink {
 public:
  FileSink() : path_(dir_.file("merge.trace")) {
    perfq::TraceWriterOptions o;
    o.watermarks = true;
    o.records_per_chunk = 1000;  // several chunks per take
    auto w = perfq::TraceWriter::open(path_, perfq::TraceMetadata{}, o);
    REQUIRE(w);
    w_.emplace(std::move(w.value()));
  }
  void add(std::vector<TraceRecord>& out, int64_t complete) {
    for (size_t i = 0; i < out.size(); ++i) {
      below_ += out[i].time_ns < complete_;
      unsorted_ += i > 0 && out[i].time_ns < out[i - 1].time_ns;
    }
    REQUIRE(w_->append_records(out));
    if (complete != INT64_MIN) {
      CHECK(complete >= complete_);  // never decreases
      complete_ = complete;
      REQUIRE(w_->append_watermark(complete));
    }
    out.clear();
  }
  uint64_t below_watermark() const { return below_; }
  uint64_t unsorted() const { return unsorted_; }  // within takes
  // The stop: everything still pending, then the checks of every take (in
  // order, none below a watermark written, none late, nothing left) and the
  // file read back.
  std::vector<TraceRecord> finish(Merger& m, perfq::TraceReadSummary* summary) {
    std::vector<TraceRecord> out;
    m.take_all(out);
    add(out, INT64_MIN);
    CHECK(below_watermark() == 0);
    CHECK(unsorted() == 0);
    CHECK(m.stats().late == 0);
    CHECK(m.stats().pending == 0);
    return read(summary);
  }
  // Closes the file and reads it: every record, as a reader gives them out.
  std::vector<TraceRecord> read(perfq::TraceReadSummary* summary = nullptr) {
    REQUIRE(w_->close());
    auto r = perfq::TraceReader::open(path_);
    REQUIRE(r);
    CHECK(r->version() == perfq::kTraceVersion);
    struct V : perfq::TraceVisitor {
      std::vector<TraceRecord> recs;
      perfq::Status on_records(std::span<const TraceRecord> rs) override {
        recs.insert(recs.end(), rs.begin(), rs.end());
        return perfq::Status::ok();
      }
    } v;
    REQUIRE(r->read(v));
    if (summary) *summary = r->summary();
    return v.recs;
  }

 private:
  perfq::TempDir dir_{"merge"};
  std::string path_;
  std::optional<perfq::TraceWriter> w_;
  int64_t complete_ = INT64_MIN;
  uint64_t below_ = 0;
  uint64_t unsorted_ = 0;
};

TEST_CASE("merge: producers on threads, one ordered and complete output", "[merge][daemon]") {
  const int producers = GENERATE(1, 3, 6);
  constexpr uint64_t kPer = perfq::kSanitized ? 20000 : 200000;
  MergeOptions o;
  o.max_delay_ns = 5'000'000'000;  // only the bounds release records here
  o.stream_timeout_ns = 5'000'000'000;
  Merger m(o);
  std::vector<Merger::Input*> inputs;
  const int64_t t0 = now();
  for (int p = 0; p < producers; ++p) inputs.push_back(m.add_input("p" + std::to_string(p), t0));
  std::atomic<int> done{0};
  std::vector<std::thread> threads;
  for (int p = 0; p < producers; ++p)
    threads.emplace_back([&, p] {
      std::vector<TraceRecord> batch;
      for (uint64_t i = 0; i < kPer; ++i) {
        // Each producer's own times rise; producers interleave arbitrarily.
        batch.push_back(rec(static_cast<uint16_t>(p), i, now()));
        if (batch.size() == 64 || i + 1 == kPer) {
          const int64_t bound = batch.back().time_ns;
          m.push(inputs[static_cast<size_t>(p)], batch, bound);
        }
      }
      m.close(inputs[static_cast<size_t>(p)]);
      ++done;
    });
  FileSink sink;
  std::vector<TraceRecord> out;
  uint64_t takes = 0;
  while (done.load() < producers) {
    int64_t complete = INT64_MIN;
    m.take(out, 1'000'000, 5000, &complete);
    sink.add(out, complete);
    ++takes;
  }
  for (auto& t : threads) t.join();
  perfq::TraceReadSummary summary;
  const auto recs = sink.finish(m, &summary);
  std::vector<uint64_t> next(static_cast<size_t>(producers), 0);
  uint64_t disorder = 0, gaps = 0;
  for (size_t i = 0; i < recs.size(); ++i) {
    if (i > 0 && recs[i].time_ns < recs[i - 1].time_ns) ++disorder;
    if (recs[i].rec.index != next[recs[i].source]++) ++gaps;
  }
  INFO(takes << " takes");
  CHECK(recs.size() == kPer * static_cast<uint64_t>(producers));
  CHECK(disorder == 0);
  CHECK(summary.out_of_order == 0);
  CHECK(gaps == 0);
}

TEST_CASE("merge: batches whose streams interleave across batches come out in order",
          "[merge][daemon]") {
  // A device's batch holds each of its streams' newest records, each stream
  // in order, but the streams are not in step: stream 1 lags stream 0, so
  // every batch starts before the end of the one before.
  MergeOptions o;
  o.max_delay_ns = 60'000'000'000;
  o.stream_timeout_ns = 60'000'000'000;
  Merger m(o);
  const int64_t t0 = now();
  auto* dev = m.add_input("dev", t0 - 10000);  // below the lagging stream's first
  constexpr uint64_t kBatches = 400, kPer = 300, kLag = 700;
  uint64_t pushed = 0;
  std::vector<TraceRecord> out;
  FileSink sink;
  int64_t complete = INT64_MIN;
  for (uint64_t b = 0; b < kBatches; ++b) {
    std::vector<TraceRecord> batch;
    for (uint64_t i = 0; i < kPer; ++i) {
      const uint64_t k = b * kPer + i;
      batch.push_back(rec(0, k, t0 + static_cast<int64_t>(k) * 10));
    }
    for (uint64_t i = 0; i < kPer; ++i) {
      const uint64_t k = b * kPer + i;
      // Stream 1 lags by kLag records; every 7th shares stream 0's time.
      const int64_t t = t0 + static_cast<int64_t>(k) * 10 - static_cast<int64_t>(kLag) * 10 +
                        (k % 7 == 0 ? 0 : 3);
      batch.push_back(rec(1, k, t));
    }
    pushed += batch.size();
    // The bound trails the lagging stream.
    m.push(dev, batch, t0 + static_cast<int64_t>((b + 1) * kPer - kLag) * 10 - 100);
    if (b % 16 == 0) {  // in pieces
      m.take(out, 0, 777, &complete);
      sink.add(out, complete);
    }
  }
  m.close(dev);
  while (m.take(out, 0, 1000, &complete) == 1000) sink.add(out, complete);
  sink.add(out, complete);
  perfq::TraceReadSummary summary;
  const auto recs = sink.finish(m, &summary);
  REQUIRE(recs.size() == pushed);
  uint64_t disorder = 0, stream_disorder = 0;
  uint64_t next[2] = {0, 0};
  for (size_t i = 0; i < recs.size(); ++i) {
    if (i > 0 && recs[i].time_ns < recs[i - 1].time_ns) ++disorder;
    if (recs[i].rec.index != next[recs[i].source]++) ++stream_disorder;
  }
  CHECK(disorder == 0);
  CHECK(stream_disorder == 0);
  CHECK(summary.out_of_order == 0);
}

TEST_CASE("merge: a take cut short by its maximum goes on at once with the rest",
          "[merge][daemon]") {
  Merger m;
  const int64_t t0 = now();
  auto* in = m.add_input("in", t0);
  std::vector<TraceRecord> batch;
  for (uint64_t i = 0; i < 2500; ++i)
    batch.push_back(rec(0, i, t0 - 1'000'000 + static_cast<int64_t>(i)));
  m.push(in, batch, t0);
  std::vector<TraceRecord> out;
  int64_t complete = INT64_MIN;
  CHECK(m.take(out, 0, 1000, &complete) == 1000);
  // Complete only up to the oldest record left pending.
  CHECK(complete == t0 - 1'000'000 + 1000);
  // Nothing new came, but the last take was capped: no wait for the rest.
  const int64_t w0 = now();
  CHECK(m.take(out, 10'000'000'000, 1000) == 1000);
  CHECK(m.take(out, 10'000'000'000, 1000, &complete) == 500);
  CHECK(complete == t0);  // the input's bound, nothing pending
  CHECK(now() - w0 < 5'000'000'000);
  REQUIRE(out.size() == 2500);
  for (size_t i = 0; i < out.size(); ++i) CHECK(out[i].rec.index == i);
  CHECK(m.stats().pending == 0);
}

TEST_CASE("merge: a silent input stops holding the watermark after its timeout",
          "[merge][daemon]") {
  MergeOptions o;
  o.max_delay_ns = 60'000'000'000;
  o.stream_timeout_ns = 50'000'000;
  Merger m(o);
  const int64_t t0 = now();
  auto* live = m.add_input("live", t0);
  m.add_input("stalled", t0);  // never sends anything
  std::vector<TraceRecord> batch{rec(0, 0, t0 + 1000)};
  m.push(live, batch, t0 + 2000);
  std::vector<TraceRecord> out;
  // The record is taken at once, but within the timeout the stalled input
  // holds the watermark at its bound...
  int64_t complete = INT64_MIN;
  m.take(out, 0, SIZE_MAX, &complete);
  REQUIRE(out.size() == 1);
  CHECK(out[0].time_ns == t0 + 1000);
  if (now() - t0 < 40'000'000) CHECK(complete == t0);
  // ...after it, the watermark follows the live input.
  const int64_t deadline = now() + 5'000'000'000;
  while (complete < t0 + 2000 && now() < deadline) {
    m.advance(live, now());
    m.take(out, 5'000'000, SIZE_MAX, &complete);
  }
  CHECK(complete >= t0 + 2000);
  CHECK(now() - t0 >= 50'000'000);
}

TEST_CASE("merge: a suspended input does not hold the watermark, and holds it again once resumed",
          "[merge][daemon]") {
  MergeOptions o;
  o.max_delay_ns = 60'000'000'000;
  o.stream_timeout_ns = 60'000'000'000;
  Merger m(o);
  const int64_t t0 = now();
  auto* dev = m.add_input("device", t0);
  auto* host = m.add_input("host", t0 - 1'000'000'000);  // far behind, as a sleeping collector
  std::vector<TraceRecord> batch{rec(1, 0, t0 + 1000), rec(1, 1, t0 + 3000)};
  m.push(dev, batch, t0 + 5000);
  std::vector<TraceRecord> out;
  FileSink sink;
  int64_t complete = INT64_MIN;
  m.take(out, 0, SIZE_MAX, &complete);
  CHECK(out.size() == 2);
  CHECK(complete == t0 - 1'000'000'000);  // the host input holds the watermark
  sink.add(out, complete);
  m.suspend(host);
  m.take(out, 0, SIZE_MAX, &complete);
  CHECK(complete == t0 + 5000);  // the device's bound alone
  sink.add(out, complete);
  // Resumed with a bound between the device's next records: it holds the
  // watermark there again, and its own record lands in order among them.
  m.resume(host, t0 + 6000);
  std::vector<TraceRecord> more{rec(1, 2, t0 + 5500), rec(1, 3, t0 + 7000)};
  m.push(dev, more, t0 + 9000);
  m.take(out, 0, SIZE_MAX, &complete);
  CHECK(complete == t0 + 6000);
  sink.add(out, complete);
  std::vector<TraceRecord> h{rec(0, 0, t0 + 6500)};
  m.push(host, h, t0 + 8000);
  m.take(out, 0, SIZE_MAX, &complete);
  CHECK(complete == t0 + 8000);
  sink.add(out, complete);
  CHECK(m.stats().late == 0);
  CHECK(sink.below_watermark() == 0);
  CHECK(sink.unsorted() == 0);
  const auto recs = sink.read();
  REQUIRE(recs.size() == 5);
  for (size_t i = 1; i < recs.size(); ++i) CHECK(recs[i - 1].time_ns <= recs[i].time_ns);
  CHECK(recs[3].time_ns == t0 + 6500);
}

TEST_CASE("merge: an idle writer's long wait ends at once when it is woken", "[merge][daemon]") {
  MergeOptions o;
  o.idle_wait_ns = 60'000'000'000;  // nothing pending: the writer would wait a minute
  Merger m(o);
  m.add_input("quiet", now());
  std::atomic<bool> returned{false};
  std::thread writer([&] {
    std::vector<TraceRecord> out;
    m.take(out, 50'000'000);
    returned = true;
  });
  const int64_t t0 = now();
  m.wake_writer();  // before or during its wait: it must not sleep through it
  writer.join();
  CHECK(returned);
  CHECK(now() - t0 < 30'000'000'000);
}

// A record pushed while the writer waits with nothing pending (its long idle
// wait) is taken within the writer's max wait, not the idle wait's rest:
// what a crash may lose is bounded by the max wait at any rate.
TEST_CASE("merge: a record pushed during an idle wait is taken within the max wait",
          "[merge][daemon]") {
  MergeOptions o;
  o.idle_wait_ns = 60'000'000'000;
  Merger m(o);
  auto* in = m.add_input("in", now());
  std::atomic<int64_t> returned_at{0};
  std::vector<TraceRecord> out;
  std::thread writer([&] {
    m.take(out, 50'000'000);  // nothing pending: the idle wait
    returned_at = now();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // well into it
  const int64_t pushed_at = now();
  std::vector<TraceRecord> batch{rec(0, 0, pushed_at)};
  m.push(in, batch, pushed_at);
  writer.join();
  REQUIRE(out.size() == 1);
  // 50 ms after the push, and the thread's wake; not 60 s.
  CHECK(returned_at - pushed_at < 10'000'000'000);
}

TEST_CASE("merge: the watermark never lags more than the maximum delay", "[merge][daemon]") {
  MergeOptions o;
  o.max_delay_ns = 30'000'000;
  o.stream_timeout_ns = 60'000'000'000;
  Merger m(o);
  const int64_t t0 = now();
  auto* slow = m.add_input("slow", t0 - 1'000'000'000);  // its bound is far behind
  std::vector<TraceRecord> batch{rec(0, 0, t0)};
  m.push(slow, batch, t0 - 1'000'000'000);
  std::vector<TraceRecord> out;
  int64_t complete = INT64_MIN;
  const int64_t deadline = now() + 5'000'000'000;
  while (complete <= t0 && now() < deadline) m.take(out, 5'000'000, SIZE_MAX, &complete);
  REQUIRE(out.size() == 1);
  CHECK(complete > t0);  // the present less the max delay, past the slow input's bound
  CHECK(now() - t0 >= 30'000'000);
  // A record older than the watermark taken is still taken, and counted late.
  std::vector<TraceRecord> late{rec(0, 1, t0 - 500'000'000)};
  m.push(slow, late, t0);
  out.clear();
  m.take(out, 0);
  CHECK(out.size() == 1);
  CHECK(m.stats().late == 1);
}

// Status says which input holds the watermark back (a device that is slow
// to deliver, say), and none once the max_delay does.
TEST_CASE("merge: the stats name the input that holds the watermark", "[merge][daemon]") {
  MergeOptions o;
  o.max_delay_ns = 60'000'000'000;
  o.stream_timeout_ns = 60'000'000'000;
  Merger m(o);
  const int64_t t0 = now();
  auto* a = m.add_input("dev-a", t0 - 1'000'000);
  auto* b = m.add_input("dev-b", t0 - 2'000'000);
  CHECK(m.stats().held_by == "dev-b");
  CHECK(m.stats().watermark == t0 - 2'000'000);
  m.advance(b, t0);
  CHECK(m.stats().held_by == "dev-a");
  m.close(a);
  CHECK(m.stats().held_by == "dev-b");
  m.suspend(b);  // nothing holds it: the present
  CHECK(m.stats().held_by.empty());
  CHECK(m.stats().watermark >= t0);
}

// A drain that is behind reads several in-order streams from one ring: what
// is still in the ring is no older than the least of the streams' newest
// times read, less the ring's latency between streams.  Checked against a
// ring filled as a device's collector fills it, read in full batches of
// several sizes: no record still to be read is below a bound already given
// (it would be late), and the bound keeps up.
TEST_CASE(
    "merge: a reader behind a ring of interleaved streams promises no record it has yet to read",
    "[merge][daemon]") {
  // Each collector pass (every kPass ns) moves 1 to 7 records of each of 6
  // streams, in time order: what streams 0-4 wrote during that pass, and
  // what stream 5 wrote 10 passes earlier (its queue holds a backlog: the
  // collector moves a limited batch of it per pass).  A record then trails
  // one read before it by less than 2 passes (the grace), or belongs to a
  // stream read before at least up to the pass before it (a lagging one).
  // Every read spans a whole pass (21 to 27 records), as a drain's batch
  // spans many of a device collector's passes: it sees every stream.
  constexpr int64_t kPass = 100;
  const int64_t grace = 2 * kPass;
  struct R {
    uint16_t stream;
    int64_t t;
  };
  std::vector<R> ring;
  for (int64_t pass = 0; pass < 200; ++pass)
    for (uint16_t s = 0; s < 6; ++s) {
      const int64_t k = 1 + (pass + s) % 7;
      const int64_t from = (s == 5 ? pass - 10 : pass) * kPass;
      for (int64_t i = 0; i < k; ++i) ring.push_back({s, from + i * (kPass / k) + s});
    }
  const int64_t now = 200 * kPass + 5 * grace;
  perfqd::StreamFrontier f;
  for (size_t batch : {size_t{60}, size_t{100}, size_t{333}}) {
    INFO("batch " << batch);
    int64_t promised = INT64_MIN;
    for (size_t at = 0; at < ring.size(); at += batch) {
      f.clear();
      const size_t end = std::min(ring.size(), at + batch);
      for (size_t i = at; i < end; ++i) f.note(ring[i].stream, ring[i].t);
      const int64_t b = f.bound(now, grace);
      CHECK(b != INT64_MIN);
      promised = std::max(promised, b);
      for (size_t i = end; i < ring.size(); ++i)
        if (ring[i].t < promised)
          FAIL("record at " << ring[i].t << " of stream " << ring[i].stream
                            << " is below the bound " << promised);
    }
    // The bound keeps up with the slowest stream.
    CHECK(promised >= ring.back().t - 2 * grace);
  }
  // Never past now less the grace, and nothing noted promises nothing.
  f.clear();
  f.note(3, now + 5'000);
  CHECK(f.bound(now, grace) == now - grace);
  f.clear();
  CHECK(f.bound(now, grace) == INT64_MIN);
  // Too many streams in one read: no bound (and no unbounded search).
  for (uint16_t s = 0; s <= perfqd::StreamFrontier::kMaxStreams; ++s) f.note(s, 100);
  CHECK(f.bound(now, grace) == INT64_MIN);
  f.clear();
  f.note(1, 100);
  CHECK(f.bound(now, grace) == 100 - grace);
}

}  // namespace
}  // namespace perfqd
