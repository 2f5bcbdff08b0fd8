// export_trace(): streaming exports of a trace file (see perfq/export.h).
#include "perfq/export.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <map>
#include <set>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "perfq/trace.h"
#include "analysis/job_roles.h"

namespace perfq {

Result<TraceExportFormat> parse_export_format(std::string_view name) {
  if (name == "perfetto") return TraceExportFormat::kPerfetto;
  if (name == "chrome-json") return TraceExportFormat::kChromeJson;
  if (name == "ctf") return TraceExportFormat::kCtf;
  if (name == "csv") return TraceExportFormat::kCsv;
  return Status(Errc::kInvalidArgument,
                fmt::format("unknown export format '{}' (perfetto, chrome-json, ctf, csv)", name));
}

const char* export_format_name(TraceExportFormat f) {
  switch (f) {
    case TraceExportFormat::kPerfetto: return "perfetto";
    case TraceExportFormat::kChromeJson: return "chrome-json";
    case TraceExportFormat::kCtf: return "ctf";
    case TraceExportFormat::kCsv: return "csv";
  }
  return "?";
}

namespace {

// A buffered output file whose every failure becomes a Status.
class OutFile {
 public:
  ~OutFile() {
    if (f_) std::fclose(f_);
  }
  Status open(const std::string& path) {
    path_ = path;
    f_ = std::fopen(path.c_str(), "wb");
    if (!f_) return Status::from_errno(path + ": open for writing");
    buf_.resize(1 << 20);
    std::setvbuf(f_, buf_.data(), _IOFBF, buf_.size());
    return Status::ok();
  }
  Status write(const void* p, size_t n) {
    if (n && std::fwrite(p, 1, n, f_) != n) return Status::from_errno(path_ + ": write");
    return Status::ok();
  }
  Status write(std::string_view s) { return write(s.data(), s.size()); }
  Status close() {
    if (!f_) return Status::ok();
    bool bad = std::fflush(f_) != 0 || std::ferror(f_);
    int err = errno;
    bool close_bad = std::fclose(f_) != 0;
    if (!bad && close_bad) err = errno;
    f_ = nullptr;
    if (bad || close_bad) return Status::from_errno(path_ + ": write", err);
    return Status::ok();
  }

 private:
  std::string path_;
  FILE* f_ = nullptr;
  std::vector<char> buf_;
};


// Names and job roles of events, looked up once per (source, event).
class Names {
 public:
  struct Info {
    std::string name;
    JobRole role = kNoRole;
  };
  void set_metadata(const TraceMetadata& m) {
    meta_ = m;
    cache_.clear();
    thread_of_tid_.clear();
    for (const auto& s : m.sources)
      for (const auto& t : s.threads) thread_of_tid_[t.tid] = {s.id, t.stream};
  }
  // The host application thread (source, stream) with kernel thread id tid.
  const std::pair<uint16_t, uint16_t>* thread_of_tid(uint32_t tid) const {
    auto it = thread_of_tid_.find(tid);
    return it == thread_of_tid_.end() ? nullptr : &it->second;
  }
  const TraceThread* thread(uint16_t source, uint16_t stream) const {
    const TraceSource* s = meta_.find_source(source);
    if (!s) return nullptr;
    for (const auto& t : s->threads)
      if (t.stream == stream) return &t;
    return nullptr;
  }
  bool is_kernel(uint16_t id) const {
    const TraceSource* s = meta_.find_source(id);
    return s && s->kind == TraceSourceKind::kKernel;
  }
  const TraceMetadata& metadata() const { return meta_; }
  const Info& event(uint16_t source, uint32_t ev) {
    auto [it, fresh] = cache_.try_emplace((uint64_t{source} << 32) | ev);
    if (fresh) {
      const TraceSource* s = meta_.find_source(source);
      const EventInfo* e = s ? s->find_event(ev) : nullptr;
      it->second.name = e ? e->name : fmt::format("event_{}", ev);
      it->second.role = job_role(it->second.name);
    }
    return it->second;
  }
  std::string source_name(uint16_t id) const {
    const TraceSource* s = meta_.find_source(id);
    return s ? s->name : fmt::format("source_{}", id);
  }
  bool is_device(uint16_t id) const {
    const TraceSource* s = meta_.find_source(id);
    return s && s->kind == TraceSourceKind::kDevice;
  }
  uint32_t pid(uint16_t id) const {
    const TraceSource* s = meta_.find_source(id);
    if (s && s->kind == TraceSourceKind::kHost && s->pid) return s->pid;
    return 1000000u + id;  // synthetic, out of the usual pid range
  }

 private:
  TraceMetadata meta_;
  std::unordered_map<uint64_t, Info> cache_;
  std::unordered_map<uint32_t, std::pair<uint16_t, uint16_t>> thread_of_tid_;
};

std::string json_escape(std::string_view s) {
  std::string o;
  o.reserve(s.size() + 2);
  for (unsigned char c : s) {
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\r': o += "\\r"; break;
      case '\t': o += "\\t"; break;
      default:
        if (c < 0x20 || c >= 0x7f) {
          o += fmt::format("\\u{:04x}", c < 0x20 ? c : '?');
        } else {
          o += static_cast<char>(c);
        }
    }
  }
  return o;
}

// ---------------------------------------------------------------------------
// CSV

std::string csv_field(std::string_view s) {
  if (s.find_first_of(",\"\n\r") == std::string_view::npos) return std::string(s);
  std::string o = "\"";
  for (char c : s) {
    if (c == '"') o += '"';
    o += c;
  }
  return o + "\"";
}

class CsvExport : public TraceVisitor {
 public:
  explicit CsvExport(OutFile& out) : out_(out) {}
  Status start() {
    return out_.write("time_ns,source,stream,index,event,name,kind,raw_time,arg,claim_ns,converted_by\n");
  }
  Status on_metadata(const TraceMetadata& m) override {
    names_.set_metadata(m);
    return Status::ok();
  }
  Status on_records(std::span<const TraceRecord> recs) override {
    line_.clear();
    for (const auto& r : recs) {
      // claim_ns empty: no bound (unsynchronized).
      fmt::format_to(std::back_inserter(line_), "{},{},{},{},{},{},{},{},{},", r.time_ns,
                     csv_field(names_.source_name(r.source)), r.rec.stream, r.rec.index,
                     r.rec.event, csv_field(names_.event(r.source, r.rec.event).name),
                     record_kind_name(r.kind()), r.rec.time, r.rec.arg);
      if (r.claim_ns != kClaimUnbounded) fmt::format_to(std::back_inserter(line_), "{}", r.claim_ns);
      fmt::format_to(std::back_inserter(line_), ",{}\n", trace_conversion_name(r.conv));
    }
    return out_.write(line_);
  }

 private:
  OutFile& out_;
  Names names_;
  std::string line_;
};

// ---------------------------------------------------------------------------
// Chrome Trace Event Format

std::string us(int64_t ns) {
  // Exact decimal microseconds with ns precision.
  const char* sign = ns < 0 ? "-" : "";
  uint64_t a = ns < 0 ? uint64_t(0) - static_cast<uint64_t>(ns) : static_cast<uint64_t>(ns);
  return fmt::format("{}{}.{:03}", sign, a / 1000, a % 1000);
}

class ChromeExport : public TraceVisitor {
 public:
  explicit ChromeExport(OutFile& out) : out_(out) {}
  Status start() { return out_.write("{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n"); }
  Status finish() { return out_.write("\n]}\n"); }

  Status on_metadata(const TraceMetadata& m) override {
    names_.set_metadata(m);
    buf_.clear();
    for (const auto& s : m.sources) {
      if (!named_.insert(s.id).second) continue;
      emit(fmt::format("{{\"name\":\"process_name\",\"cat\":\"__metadata\",\"ph\":\"M\",\"ts\":0,"
                       "\"pid\":{},\"tid\":0,\"args\":{{\"name\":\"{}\"}}}}",
                       names_.pid(s.id),
                       json_escape(std::string(trace_source_kind_name(s.kind)) + " " + s.name)));
    }
    return out_.write(buf_);
  }

  Status on_records(std::span<const TraceRecord> recs) override {
    buf_.clear();
    for (const auto& r : recs) record(r);
    return out_.write(buf_);
  }

 private:
  void emit(const std::string& ev) {
    if (!first_) buf_ += ",\n";
    first_ = false;
    buf_ += ev;
  }

  void record(const TraceRecord& r) {
    const uint32_t pid = names_.pid(r.source);
    const uint32_t tid = r.rec.stream;
    if (threads_.insert((uint32_t{r.source} << 16) | tid).second) {
      emit(fmt::format("{{\"name\":\"thread_name\",\"cat\":\"__metadata\",\"ph\":\"M\",\"ts\":0,"
                       "\"pid\":{},\"tid\":{},\"args\":{{\"name\":\"{} {}\"}}}}",
                       pid, tid, names_.is_device(r.source) ? "queue" : "thread", tid));
    }
    const auto& ev = names_.event(r.source, r.rec.event);
    const std::string name = json_escape(ev.name);
    const std::string ts = us(r.time_ns);
    const std::string common =
        fmt::format("\"cat\":\"perfq\",\"ts\":{},\"pid\":{},\"tid\":{}", ts, pid, tid);
    const std::string args = fmt::format("\"args\":{{\"index\":{},\"arg\":{},\"raw_time\":{}}}",
                                         r.rec.index, r.rec.arg, r.rec.time);
    switch (r.kind()) {
      case PERFQ_KIND_BEGIN:
        emit(fmt::format("{{\"name\":\"{}\",\"ph\":\"B\",{},{}}}", name, common, args));
        break;
      case PERFQ_KIND_END:
        emit(fmt::format("{{\"name\":\"{}\",\"ph\":\"E\",{},{}}}", name, common, args));
        break;
      case PERFQ_KIND_COUNTER:
        emit(fmt::format("{{\"name\":\"{}\",\"ph\":\"C\",{},\"args\":{{\"value\":{}}}}}", name,
                         common, r.rec.arg));
        break;
      case PERFQ_KIND_LOST:
        emit(fmt::format("{{\"name\":\"lost\",\"ph\":\"i\",\"s\":\"t\",{},\"args\":{{\"count\":{},"
                         "\"index\":{}}}}}",
                         common, r.rec.arg, r.rec.index));
        break;
      default:
        if (ev.role == kSubmit || ev.role == kComplete) {
          // A zero-length complete event: a slice the job flow can bind to.
          emit(fmt::format("{{\"name\":\"{}\",\"ph\":\"X\",\"dur\":0,{},{}}}", name, common, args));
        } else {
          emit(fmt::format("{{\"name\":\"{}\",\"ph\":\"i\",\"s\":\"t\",{},{}}}", name, common, args));
        }
        break;
    }
    if (ev.role != kNoRole) {
      static constexpr const char* kPh[] = {"s", "t", "t", "f"};
      // Ids as strings: JSON numbers above 2^53 lose bits in JavaScript viewers.
      emit(fmt::format("{{\"name\":\"job\",\"ph\":\"{}\",\"id\":\"{:#x}\",{}{}}}", kPh[ev.role], r.rec.arg,
                       common, ev.role == kSubmit ? "" : ",\"bp\":\"e\""));
    }
  }

  OutFile& out_;
  Names names_;
  std::string buf_;
  bool first_ = true;
  std::set<uint16_t> named_;
  std::set<uint32_t> threads_;
};

// ---------------------------------------------------------------------------
// Perfetto protobuf, hand-encoded.

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
constexpr uint32_t kTracePacket = 1;          // Trace.packet
constexpr uint32_t kTimestamp = 8;            // TracePacket
constexpr uint32_t kSeqId = 10;
constexpr uint32_t kTrackEvent = 11;
constexpr uint32_t kSeqFlags = 13;
constexpr uint32_t kTrackDescriptor = 60;
constexpr uint32_t kTdUuid = 1;               // TrackDescriptor
constexpr uint32_t kTdName = 2;
constexpr uint32_t kTdProcess = 3;
constexpr uint32_t kTdThread = 4;
constexpr uint32_t kTdParent = 5;
constexpr uint32_t kTdCounter = 8;
constexpr uint32_t kPdPid = 1;                // ProcessDescriptor
constexpr uint32_t kPdName = 6;
constexpr uint32_t kThPid = 1;                // ThreadDescriptor
constexpr uint32_t kThTid = 2;
constexpr uint32_t kThName = 5;
constexpr uint32_t kTeDebug = 4;              // TrackEvent
constexpr uint32_t kTeType = 9;
constexpr uint32_t kTeTrack = 11;
constexpr uint32_t kTeName = 23;
constexpr uint32_t kTeCounter = 30;
constexpr uint32_t kTeFlow = 47;
constexpr uint32_t kTeTermFlow = 48;
constexpr uint32_t kDaUint = 3;               // DebugAnnotation
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
      td.bytes(pf::kTdName, names_.is_device(s) ? fmt::format("queue {}", st) : fmt::format("cpu {}", st));
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
      case PERFQ_KIND_BEGIN: te.u64(pf::kTeType, pf::kSliceBegin); break;
      case PERFQ_KIND_END: te.u64(pf::kTeType, pf::kSliceEnd); break;
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
      default: te.u64(pf::kTeType, pf::kInstant); break;
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

// ---------------------------------------------------------------------------
// CTF 1.8

constexpr uint32_t kCtfMagic = 0xC1FC1FC1;
constexpr size_t kCtfPacketHeader = 8 + 32;  // packet header + context
constexpr size_t kCtfEventSize = 12 + 41;    // event header + payload
constexpr size_t kCtfPacketBytes = 64 * 1024;

std::string tsdl_escape(std::string_view s) {
  std::string o;
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7f) {
      o += '_';
    } else {
      o += static_cast<char>(c);
    }
  }
  return o;
}

class CtfExport : public TraceVisitor {
 public:
  CtfExport(OutFile& stream, std::string dir) : out_(stream), dir_(std::move(dir)) {}

  Status on_metadata(const TraceMetadata& m) override {
    names_.set_metadata(m);
    return Status::ok();
  }

  Status on_records(std::span<const TraceRecord> recs) override {
    for (const auto& r : recs) {
      uint64_t key = (uint64_t{r.source} << 32) | r.rec.event;
      auto [it, fresh] = classes_.try_emplace(key, static_cast<uint32_t>(classes_.size()));
      if (fresh) order_.push_back(key);
      if (packet_.empty()) begin_packet();
      uint64_t ts = r.time_ns < 0 ? 0 : static_cast<uint64_t>(r.time_ns);
      ts = std::max(ts, last_ts_);  // CTF clocks never go back within a stream
      last_ts_ = ts;
      if (packet_.size() == kCtfPacketHeader) packet_begin_ts_ = ts;
      packet_end_ts_ = ts;
      put32(it->second);
      put64(ts);
      put16(r.source);
      put16(r.rec.stream);
      put32(r.rec.event);
      put64(r.rec.index);
      packet_.push_back(static_cast<char>(r.kind()));
      put64(r.rec.time);
      put64(r.rec.arg);
      put64(static_cast<uint64_t>(r.time_ns));
      if (packet_.size() + kCtfEventSize > kCtfPacketBytes) {
        if (Status s = end_packet(); !s.is_ok()) return s;
      }
    }
    return Status::ok();
  }

  Status finish() {
    if (!packet_.empty()) {
      if (Status s = end_packet(); !s.is_ok()) return s;
    }
    OutFile meta;
    if (Status s = meta.open(dir_ + "/metadata"); !s.is_ok()) return s;
    if (Status s = meta.write(metadata_text()); !s.is_ok()) return s;
    return meta.close();
  }

 private:
  void put16(uint16_t v) { packet_.append(reinterpret_cast<const char*>(&v), 2); }
  void put32(uint32_t v) { packet_.append(reinterpret_cast<const char*>(&v), 4); }
  void put64(uint64_t v) { packet_.append(reinterpret_cast<const char*>(&v), 8); }

  void begin_packet() { packet_.assign(kCtfPacketHeader, '\0'); }

  Status end_packet() {
    const uint64_t bits = packet_.size() * 8;
    char* p = packet_.data();
    auto set64 = [p](size_t off, uint64_t v) { std::memcpy(p + off, &v, 8); };
    const uint32_t magic = kCtfMagic, sid = 0;
    std::memcpy(p, &magic, 4);
    std::memcpy(p + 4, &sid, 4);
    set64(8, packet_begin_ts_);
    set64(16, packet_end_ts_);
    set64(24, bits);  // content_size
    set64(32, bits);  // packet_size: no padding
    Status s = out_.write(packet_);
    packet_.clear();
    return s;
  }

  std::string metadata_text() {
    const TraceMetadata& m = names_.metadata();
    std::string t;
    t += "/* CTF 1.8 */\n\n";
    t += "typealias integer { size = 8; align = 8; signed = false; } := uint8_t;\n";
    t += "typealias integer { size = 16; align = 8; signed = false; } := uint16_t;\n";
    t += "typealias integer { size = 32; align = 8; signed = false; } := uint32_t;\n";
    t += "typealias integer { size = 64; align = 8; signed = false; } := uint64_t;\n";
    t += "typealias integer { size = 64; align = 8; signed = true; } := int64_t;\n\n";
    t += "trace {\n\tmajor = 1;\n\tminor = 8;\n\tbyte_order = le;\n"
         "\tpacket.header := struct {\n\t\tuint32_t magic;\n\t\tuint32_t stream_id;\n\t};\n};\n\n";
    t += fmt::format("env {{\n\thostname = \"{}\";\n\tdomain = \"perfq\";\n\ttracer_name = "
                     "\"perfq\";\n\tperfq_version = \"{}\";\n}};\n\n",
                     tsdl_escape(m.host_name), tsdl_escape(m.perfq_version));
    t += "clock {\n\tname = monotonic;\n\tdescription = \"host CLOCK_MONOTONIC (device times "
         "converted by the sync model)\";\n\tfreq = 1000000000;\n\tprecision = 1;\n"
         "\toffset_s = 0;\n\toffset = 0;\n\tabsolute = false;\n};\n\n";
    t += "typealias integer { size = 64; align = 8; signed = false; map = clock.monotonic.value; "
         "} := uint64_clock_monotonic_t;\n\n";
    t += "stream {\n\tid = 0;\n\tpacket.context := struct {\n"
         "\t\tuint64_clock_monotonic_t timestamp_begin;\n"
         "\t\tuint64_clock_monotonic_t timestamp_end;\n\t\tuint64_t content_size;\n"
         "\t\tuint64_t packet_size;\n\t};\n\tevent.header := struct {\n\t\tuint32_t id;\n"
         "\t\tuint64_clock_monotonic_t timestamp;\n\t};\n};\n\n";
    for (uint64_t key : order_) {
      auto source = static_cast<uint16_t>(key >> 32);
      auto ev = static_cast<uint32_t>(key & 0xffffffff);
      t += fmt::format(
          "event {{\n\tname = \"{}\";\n\tid = {};\n\tstream_id = 0;\n\tfields := struct {{\n"
          "\t\tuint16_t source_id;\n\t\tuint16_t perfq_stream;\n\t\tuint32_t event_id;\n\t\tuint64_t index;\n"
          "\t\tuint8_t kind;\n\t\tuint64_t raw_time;\n\t\tuint64_t arg;\n\t\tint64_t time_ns;\n"
          "\t}};\n}};\n\n",
          tsdl_escape(names_.event(source, ev).name), classes_.at(key));
    }
    return t;
  }

  OutFile& out_;
  std::string dir_;
  Names names_;
  std::string packet_;
  uint64_t packet_begin_ts_ = 0;
  uint64_t packet_end_ts_ = 0;
  uint64_t last_ts_ = 0;
  std::map<uint64_t, uint32_t> classes_;  // (source, event) -> CTF event id
  std::vector<uint64_t> order_;
};

}  // namespace

Result<TraceExportSummary> export_trace(const std::string& in, TraceExportFormat format,
                                   const std::string& out) {
  auto reader = TraceReader::open(in);
  if (!reader.is_ok()) return reader.status();
  TraceExportSummary sum;
  OutFile file;
  Status s;
  auto run = [&](TraceVisitor& v) -> Status {
    Status r = reader->read(v);
    sum.records = reader->summary().records;
    if (!r.is_ok() && r.code() == Errc::kCorrupt) {
      sum.stopped_early = r.message();
      sum.stop_offset = reader->error_offset();
      return Status::ok();
    }
    return r;
  };
  switch (format) {
    case TraceExportFormat::kCsv: {
      if (s = file.open(out); !s.is_ok()) return s;
      CsvExport v(file);
      if (s = v.start(); !s.is_ok()) return s;
      if (s = run(v); !s.is_ok()) return s;
      break;
    }
    case TraceExportFormat::kChromeJson: {
      if (s = file.open(out); !s.is_ok()) return s;
      ChromeExport v(file);
      if (s = v.start(); !s.is_ok()) return s;
      if (s = run(v); !s.is_ok()) return s;
      if (s = v.finish(); !s.is_ok()) return s;
      break;
    }
    case TraceExportFormat::kPerfetto: {
      if (s = file.open(out); !s.is_ok()) return s;
      PerfettoExport v(file);
      if (s = run(v); !s.is_ok()) return s;
      break;
    }
    case TraceExportFormat::kCtf: {
      if (::mkdir(out.c_str(), 0755) != 0 && errno != EEXIST) {
        return Status::from_errno(out + ": create directory");
      }
      struct stat st;
      if (::stat(out.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
        return Status(Errc::kInvalidArgument, out + ": not a directory");
      }
      if (s = file.open(out + "/stream_0"); !s.is_ok()) return s;
      CtfExport v(file, out);
      if (s = run(v); !s.is_ok()) return s;
      if (s = v.finish(); !s.is_ok()) return s;
      break;
    }
  }
  if (s = file.close(); !s.is_ok()) return s;
  return sum;
}

}  // namespace perfq
