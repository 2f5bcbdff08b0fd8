// Perfetto protobuf export, hand-encoded (field numbers as in
// tests/data/perfetto_trace.proto).
#include "analysis/export/export_internal.h"

#include <set>

namespace perfq::export_detail {

namespace {

class Pb {
 public:
  void varint(uint64_t v) {
    while (v >= 0x80) {
      b_.push_back(static_cast<char>((v & 0x7f) | 0x80));
      v >>= 7;
    }
    b_.push_back(static_cast<char>(v));
  }
  void tag(uint32_t field, uint32_t wire) { varint((uint64_t{field} << 3) | wire); }
  void u64(uint32_t field, uint64_t v) {
    tag(field, 0);
    varint(v);
  }
  void i64(uint32_t field, int64_t v) { u64(field, static_cast<uint64_t>(v)); }
  void fixed64(uint32_t field, uint64_t v) {
    tag(field, 1);
    for (int i = 0; i < 8; ++i) b_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  void bytes(uint32_t field, std::string_view s) {
    tag(field, 2);
    varint(s.size());
    b_.append(s);
  }
  void msg(uint32_t field, const Pb& m) { bytes(field, m.b_); }
  const std::string& str() const { return b_; }
  void clear() { b_.clear(); }

 private:
  std::string b_;
};

// Field numbers (perfetto/protos/perfetto/trace/...).
namespace pf {
constexpr uint32_t kTracePacket = 1;  // Trace.packet
constexpr uint32_t kTimestamp = 8;    // TracePacket
constexpr uint32_t kSeqId = 10;
constexpr uint32_t kTrackEvent = 11;
constexpr uint32_t kSeqFlags = 13;
constexpr uint32_t kTrackDescriptor = 60;
constexpr uint32_t kTdUuid = 1;  // TrackDescriptor
constexpr uint32_t kTdName = 2;
constexpr uint32_t kTdProcess = 3;
constexpr uint32_t kTdThread = 4;
constexpr uint32_t kTdParent = 5;
constexpr uint32_t kTdCounter = 8;
constexpr uint32_t kPdPid = 1;  // ProcessDescriptor
constexpr uint32_t kPdName = 6;
constexpr uint32_t kThPid = 1;  // ThreadDescriptor
constexpr uint32_t kThTid = 2;
constexpr uint32_t kThName = 5;
constexpr uint32_t kTeDebug = 4;  // TrackEvent
constexpr uint32_t kTeType = 9;
constexpr uint32_t kTeTrack = 11;
constexpr uint32_t kTeName = 23;
constexpr uint32_t kTeCounter = 30;
constexpr uint32_t kTeFlow = 47;
constexpr uint32_t kTeTermFlow = 48;
constexpr uint32_t kDaUint = 3;  // DebugAnnotation
constexpr uint32_t kDaName = 10;
constexpr uint64_t kSliceBegin = 1, kSliceEnd = 2, kInstant = 3, kCounter = 4;
constexpr uint32_t kSeqIdValue = 1;
constexpr uint64_t kSeqIncrementalCleared = 1;
}  // namespace pf

class PerfettoExport : public TraceVisitor {
 public:
  explicit PerfettoExport(OutFile& out) : out_(out) {}

  Status on_metadata(const TraceMetadata& m) override {
    names_.set_metadata(m);
    buf_.clear();
    for (const auto& s : m.sources) {
      if (!procs_.insert(s.id).second) continue;
      Pb pd;
      pd.u64(pf::kPdPid, names_.pid(s.id));
      pd.bytes(pf::kPdName, std::string(trace_source_kind_name(s.kind)) + " " + s.name);
      Pb td;
      td.u64(pf::kTdUuid, process_uuid(s.id));
      td.msg(pf::kTdProcess, pd);
      descriptor(td);
    }
    return out_.write(buf_);
  }

  Status on_records(std::span<const TraceRecord> recs) override {
    buf_.clear();
    for (const auto& r : recs) record(r);
    return out_.write(buf_);
  }

 private:
  static uint64_t process_uuid(uint16_t s) { return (uint64_t{1} << 62) | s; }
  static uint64_t stream_uuid(uint16_t s, uint16_t st) {
    return (uint64_t{2} << 62) | (uint64_t{s} << 16) | st;
  }
  static uint64_t counter_uuid(uint16_t s, uint16_t st, uint32_t ev) {
    return (uint64_t{3} << 62) | (uint64_t{s} << 48) | (uint64_t{st} << 32) | ev;
  }
  static uint64_t flow_id(uint64_t corr) { return corr ^ 0x7065726671000000ull; }

  void packet(const Pb& body, uint32_t field, int64_t ts, bool with_ts) {
    pkt_.clear();
    if (with_ts) pkt_.u64(pf::kTimestamp, ts < 0 ? 0 : static_cast<uint64_t>(ts));
    pkt_.u64(pf::kSeqId, pf::kSeqIdValue);
    if (first_) {
      pkt_.u64(pf::kSeqFlags, pf::kSeqIncrementalCleared);
      first_ = false;
    }
    pkt_.msg(field, body);
    trace_.clear();
    trace_.msg(pf::kTracePacket, pkt_);
    buf_ += trace_.str();
  }
  void descriptor(const Pb& td) { packet(td, pf::kTrackDescriptor, 0, false); }

  void ensure_stream(uint16_t s, uint16_t st) {
    if (!streams_.insert((uint32_t{s} << 16) | st).second) return;
    if (procs_.insert(s).second) {  // records of a source missing from metadata
      Pb pd;
      pd.u64(pf::kPdPid, names_.pid(s));
      pd.bytes(pf::kPdName, names_.source_name(s));
      Pb td;
      td.u64(pf::kTdUuid, process_uuid(s));
      td.msg(pf::kTdProcess, pd);
      descriptor(td);
    }
    Pb td;
    td.u64(pf::kTdUuid, stream_uuid(s, st));
    if (names_.is_device(s) || names_.is_kernel(s)) {
      td.u64(pf::kTdParent, process_uuid(s));
      td.bytes(pf::kTdName,
               names_.is_device(s) ? fmt::format("queue {}", st) : fmt::format("cpu {}", st));
    } else {
      // Host threads: their kernel tid and name when the trace has them
      // (then kernel events of the thread land on its track); otherwise a
      // synthetic tid keeps streams apart across processes.
      Pb th;
      const TraceThread* t = names_.thread(s, st);
      th.u64(pf::kThPid, names_.pid(s));
      th.u64(pf::kThTid, t && t->tid ? t->tid : names_.pid(s) * 100000ull % 0x7fffffff + st);
      th.bytes(pf::kThName, t && !t->name.empty() ? t->name : fmt::format("thread {}", st));
      td.msg(pf::kTdThread, th);
    }
    descriptor(td);
  }

  void record(const TraceRecord& r) {
    uint16_t s = r.source;
    uint16_t st = r.rec.stream;
    const auto& ev = names_.event(s, r.rec.event);
    if (names_.is_kernel(s)) {
      // A kernel event of an application thread goes on that thread's track.
      if (const auto* th = names_.thread_of_tid(static_cast<uint32_t>(r.rec.arg))) {
        s = th->first;
        st = th->second;
      }
    }
    ensure_stream(s, st);
    Pb te;
    switch (r.kind()) {
      case PERFQ_KIND_BEGIN:
        te.u64(pf::kTeType, pf::kSliceBegin);
        break;
      case PERFQ_KIND_END:
        te.u64(pf::kTeType, pf::kSliceEnd);
        break;
      case PERFQ_KIND_COUNTER: {
        uint64_t cu = counter_uuid(s, st, r.rec.event);
        if (counters_.insert(cu).second) {
          Pb td;
          td.u64(pf::kTdUuid, cu);
          td.u64(pf::kTdParent, process_uuid(s));
          td.bytes(pf::kTdName, ev.name);
          td.msg(pf::kTdCounter, Pb{});
          descriptor(td);
        }
        te.u64(pf::kTeType, pf::kCounter);
        te.u64(pf::kTeTrack, cu);
        te.i64(pf::kTeCounter, static_cast<int64_t>(r.rec.arg));
        packet(te, pf::kTrackEvent, r.time_ns, true);
        return;
      }
      default:
        te.u64(pf::kTeType, pf::kInstant);
        break;
    }
    te.u64(pf::kTeTrack, stream_uuid(s, st));
    if (r.kind() != PERFQ_KIND_END) {
      te.bytes(pf::kTeName, r.kind() == PERFQ_KIND_LOST ? std::string("lost") : ev.name);
    }
    Pb da;
    da.bytes(pf::kDaName, r.kind() == PERFQ_KIND_LOST ? "count" : "arg");
    da.u64(pf::kDaUint, r.rec.arg);
    te.msg(pf::kTeDebug, da);
    da.clear();
    da.bytes(pf::kDaName, "index");
    da.u64(pf::kDaUint, r.rec.index);
    te.msg(pf::kTeDebug, da);
    if (ev.role == kSubmit || ev.role == kStart || ev.role == kEnd) {
      te.fixed64(pf::kTeFlow, flow_id(r.rec.arg));
    } else if (ev.role == kComplete) {
      te.fixed64(pf::kTeTermFlow, flow_id(r.rec.arg));
    }
    packet(te, pf::kTrackEvent, r.time_ns, true);
  }

  OutFile& out_;
  Names names_;
  std::string buf_;
  Pb pkt_;
  Pb trace_;
  bool first_ = true;
  std::set<uint16_t> procs_;
  std::set<uint32_t> streams_;
  std::set<uint64_t> counters_;
};

}  // namespace

Status export_perfetto(OutFile& file, const std::string& out, const ReadTrace& read) {
  if (Status s = file.open(out); !s.is_ok()) return s;
  PerfettoExport v(file);
  return read(v);
}

}  // namespace perfq::export_detail
