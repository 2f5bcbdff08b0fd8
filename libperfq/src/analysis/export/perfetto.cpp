// Perfetto protobuf export, hand-encoded (field numbers as in
// tests/data/perfetto_trace.proto, which keeps Perfetto's own).
//
// Small by Perfetto's own means: each track that carries events is a packet
// sequence of its own whose defaults name the track and a sequence-scoped
// incremental clock, so an event packet holds a timestamp delta, the
// sequence id, its type and an interned name (interning per sequence, from
// a packet flagged SEQ_INCREMENTAL_STATE_CLEARED).  Descriptors, the clock
// snapshot and the counters of losses and sync sit on sequence 1 with
// absolute CLOCK_MONOTONIC timestamps (they arrive in file order, not in
// time order).
//
// Layout: a process per source (host applications by pid; each device by
// its name and PCI address; the kernel), a thread track per host thread
// (real tid and name) and a track per device stream or CPU, kernel events of
// an application thread on that thread's track, counter tracks for the
// sources' counters, losses per stream, and per device the sync's claimed
// bound and each round's residual; flows from submit to start to end to
// complete.
//
// With compression, the same packets go in batches of about 1 MiB, each
// deflated (zlib) into one packet's compressed_packets, which is how
// Perfetto's own DEFLATE compression writes them; trace_processor (and so
// the UI) inflates each and reads the packets inside in order.
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>

#include "analysis/export/export_internal.h"
#include "analysis/sync_residuals.h"
#include "perfq_kevent.h"

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
  void f64(uint32_t field, double v) {
    uint64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    fixed64(field, bits);
  }
  void bytes(uint32_t field, std::string_view s) {
    tag(field, 2);
    varint(s.size());
    b_.append(s);
  }
  void msg(uint32_t field, const Pb& m) { bytes(field, m.b_); }
  const std::string& str() const { return b_; }
  bool empty() const { return b_.empty(); }
  void clear() { b_.clear(); }

 private:
  std::string b_;
};

// Field numbers (perfetto/protos/perfetto/trace/...).
namespace pf {
constexpr uint32_t kTracePacket = 1;    // Trace.packet
constexpr uint32_t kClockSnapshot = 6;  // TracePacket
constexpr uint32_t kTimestamp = 8;
constexpr uint32_t kSeqId = 10;
constexpr uint32_t kTrackEvent = 11;
constexpr uint32_t kInternedData = 12;
constexpr uint32_t kSeqFlags = 13;
constexpr uint32_t kTimestampClockId = 58;
constexpr uint32_t kPacketDefaults = 59;
constexpr uint32_t kTrackDescriptor = 60;
constexpr uint32_t kCompressedPackets = 50;
constexpr uint32_t kCsClock = 1;  // ClockSnapshot
constexpr uint32_t kCsPrimary = 2;
constexpr uint32_t kClkId = 1;  // ClockSnapshot.Clock
constexpr uint32_t kClkTimestamp = 2;
constexpr uint32_t kClkIncremental = 3;
constexpr uint32_t kDefClockId = 58;  // TracePacketDefaults
constexpr uint32_t kDefTrackEvent = 11;
constexpr uint32_t kTedTrack = 11;     // TrackEventDefaults
constexpr uint32_t kIdEventNames = 2;  // InternedData
constexpr uint32_t kIdAnnotationNames = 3;
constexpr uint32_t kIidIid = 1;  // EventName, DebugAnnotationName
constexpr uint32_t kIidName = 2;
constexpr uint32_t kTdUuid = 1;  // TrackDescriptor
constexpr uint32_t kTdName = 2;
constexpr uint32_t kTdProcess = 3;
constexpr uint32_t kTdThread = 4;
constexpr uint32_t kTdParent = 5;
constexpr uint32_t kTdCounter = 8;
constexpr uint32_t kCdUnit = 3;  // CounterDescriptor
constexpr uint32_t kPdPid = 1;   // ProcessDescriptor
constexpr uint32_t kPdName = 6;
constexpr uint32_t kThPid = 1;  // ThreadDescriptor
constexpr uint32_t kThTid = 2;
constexpr uint32_t kThName = 5;
constexpr uint32_t kTeDebug = 4;  // TrackEvent
constexpr uint32_t kTeType = 9;
constexpr uint32_t kTeNameIid = 10;
constexpr uint32_t kTeTrack = 11;
constexpr uint32_t kTeCounter = 30;
constexpr uint32_t kTeDoubleCounter = 44;
constexpr uint32_t kTeFlow = 47;
constexpr uint32_t kTeTermFlow = 48;
constexpr uint32_t kDaNameIid = 1;  // DebugAnnotation
constexpr uint32_t kDaUint = 3;
constexpr uint32_t kDaInt = 4;
constexpr uint64_t kSliceBegin = 1, kSliceEnd = 2, kInstant = 3, kCounter = 4;
constexpr uint64_t kIncrementalStateCleared = 1;  // TracePacket.SequenceFlags
constexpr uint64_t kClockMonotonic = 3;           // BuiltinClock
constexpr uint64_t kClockBoottime = 6;
constexpr uint64_t kSeqClock = 64;   // the sequences' own incremental clock
constexpr uint64_t kUnitTimeNs = 1;  // CounterDescriptor.Unit
constexpr uint64_t kUnitCount = 2;
}  // namespace pf

constexpr uint32_t kMainSeq = 1;

// The option of a recording that perfq-daemon writes as an integer.
std::optional<int64_t> option_i64(const TraceMetadata& m, const char* key) {
  auto it = m.options.find(key);
  if (it == m.options.end()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(it->second.c_str(), &end, 10);
  if (errno || end == it->second.c_str() || *end) return std::nullopt;
  return v;
}

class PerfettoExport : public TraceVisitor {
 public:
  PerfettoExport(OutFile& out, bool compress) : out_(out), compress_(compress) {}

  // What a compressed export still holds goes out as its last batch.
  Status finish() { return compress_ ? deflate_pending() : Status::ok(); }

  Status on_metadata(const TraceMetadata& m) override {
    names_.set_metadata(m);
    if (!snapshot_done_) clock_snapshot(m);
    // Processes are described with their first record or counter: an
    // application that exited long before the recording has no track.
    return put();
  }

  Status on_records(std::span<const TraceRecord> recs) override {
    for (const auto& r : recs) record(r);
    return put();
  }

  Status on_clock_models(std::span<const TraceClockModel> ms) override {
    for (const auto& m : ms) {
      residuals_.on_model(m);
      Pb te;
      te.u64(pf::kTeType, pf::kCounter);
      te.u64(pf::kTeTrack, sync_counter(m.source, kBound));
      te.i64(pf::kTeCounter, static_cast<int64_t>(m.model.uncertainty_ns));
      main_packet(te, pf::kTrackEvent, m.installed_ns);
    }
    return put();
  }

  Status on_sync_samples(std::span<const TraceSyncSample> s) override {
    for (const auto& rr : residuals_.rounds(s, names_.metadata())) {
      Pb te;
      te.u64(pf::kTeType, pf::kCounter);
      if (rr.failed) {
        te.u64(pf::kTeTrack, sync_counter(rr.source, kFailed));
        te.i64(pf::kTeCounter, static_cast<int64_t>(++failed_rounds_[rr.source]));
      } else if (rr.residual_ns) {
        te.u64(pf::kTeTrack, sync_counter(rr.source, kResidual));
        te.f64(pf::kTeDoubleCounter, *rr.residual_ns);
      } else {
        continue;
      }
      main_packet(te, pf::kTrackEvent, rr.time_ns);
    }
    return put();
  }

  Status on_losses(std::span<const TraceLoss> ls) override {
    for (const auto& l : ls) lost(l.source, l.stream, l.time_ns, l.count);
    return put();
  }

 private:
  // Per track sequence: its id, clock and interned names.
  struct Seq {
    uint32_t id = 0;
    bool started = false;
    uint64_t last_ts = 0;
    std::set<uint64_t> names;        // event name iids interned on it
    std::set<uint64_t> annotations;  // annotation name iids interned on it
  };

  uint64_t new_uuid() { return next_uuid_++; }

  // The packets in buf_ to the file; compressed, once they make a batch.
  Status put() {
    if (compress_) return buf_.size() >= kBatchBytes ? deflate_pending() : Status::ok();
    Status s = out_.write(buf_);
    buf_.clear();
    return s;
  }
  static constexpr size_t kBatchBytes = size_t{1} << 20;
  // The batch as one packet of compressed_packets: a zlib stream of the
  // packets as a Trace message encodes them (tag, length, packet).
  Status deflate_pending() {
    if (buf_.empty()) return Status::ok();
    uLongf n = compressBound(static_cast<uLong>(buf_.size()));
    deflated_.resize(n);
    const int rc = compress2(reinterpret_cast<Bytef*>(deflated_.data()), &n,
                             reinterpret_cast<const Bytef*>(buf_.data()),
                             static_cast<uLong>(buf_.size()), Z_BEST_SPEED);
    if (rc != Z_OK) return Status(Errc::kIo, fmt::format("zlib compress2 failed ({})", rc));
    buf_.clear();
    pkt_.clear();
    pkt_.bytes(pf::kCompressedPackets, std::string_view(deflated_.data(), n));
    trace_.clear();
    trace_.msg(pf::kTracePacket, pkt_);
    return out_.write(trace_.str());
  }

  void emit(const Pb& pkt) {
    trace_.clear();
    trace_.msg(pf::kTracePacket, pkt);
    buf_ += trace_.str();
  }

  // A packet of sequence 1 at an absolute CLOCK_MONOTONIC time.
  void main_packet(const Pb& body, uint32_t field, int64_t ts) {
    pkt_.clear();
    pkt_.u64(pf::kTimestamp, ts < 0 ? 0 : static_cast<uint64_t>(ts));
    pkt_.u64(pf::kTimestampClockId, pf::kClockMonotonic);
    pkt_.u64(pf::kSeqId, kMainSeq);
    pkt_.msg(field, body);
    emit(pkt_);
  }
  void descriptor(const Pb& td) {
    pkt_.clear();
    pkt_.u64(pf::kSeqId, kMainSeq);
    pkt_.msg(pf::kTrackDescriptor, td);
    emit(pkt_);
  }

  // CLOCK_MONOTONIC and CLOCK_BOOTTIME as the recording host read them
  // together (perfq-daemon stores the pair), so that perfq's times line up
  // with other Perfetto traces of the machine.  A trace without the pair
  // gets MONOTONIC as its trace clock and nothing claimed about BOOTTIME.
  void clock_snapshot(const TraceMetadata& m) {
    snapshot_done_ = true;
    const auto mono = option_i64(m, "clock_monotonic_ns");
    const auto boot = option_i64(m, "clock_boottime_ns");
    Pb cs;
    Pb clk;
    if (mono && boot) {
      clk.u64(pf::kClkId, pf::kClockMonotonic);
      clk.u64(pf::kClkTimestamp, static_cast<uint64_t>(*mono));
      cs.msg(pf::kCsClock, clk);
      clk.clear();
      clk.u64(pf::kClkId, pf::kClockBoottime);
      clk.u64(pf::kClkTimestamp, static_cast<uint64_t>(*boot));
      cs.msg(pf::kCsClock, clk);
    } else {
      clk.u64(pf::kClkId, pf::kClockMonotonic);
      clk.u64(pf::kClkTimestamp, 0);
      cs.msg(pf::kCsClock, clk);
      cs.u64(pf::kCsPrimary, pf::kClockMonotonic);
    }
    pkt_.clear();
    pkt_.u64(pf::kTimestamp, mono && boot ? static_cast<uint64_t>(*boot) : 0);
    pkt_.u64(pf::kSeqId, kMainSeq);
    pkt_.msg(pf::kClockSnapshot, cs);
    emit(pkt_);
  }

  // A source's process: host applications by pid and name; a device named
  // by its name and PCI address (or its region, without one); the kernel.
  uint64_t process(uint16_t id) {
    auto [it, fresh] = procs_.try_emplace(id, 0);
    if (!fresh) return it->second;
    it->second = new_uuid();
    const TraceSource* s = names_.metadata().find_source(id);
    std::string name = names_.source_name(id);
    if (s && s->kind == TraceSourceKind::kDevice) {
      name = fmt::format("device {} ({})", names_.source_name(id),
                         s->pci_address.empty() ? region_of(id) : s->pci_address);
    } else if (s && s->kind == TraceSourceKind::kKernel) {
      name = names_.source_name(id);  // "kernel", or "HOST:kernel"
    }
    Pb pd;
    pd.u64(pf::kPdPid, names_.pid(id));
    pd.bytes(pf::kPdName, name);
    Pb td;
    td.u64(pf::kTdUuid, it->second);
    td.msg(pf::kTdProcess, pd);
    descriptor(td);
    return it->second;
  }

  // Where a device without a PCI address was reached: the recording's
  // "devices" option lists them (shm:PATH, /dev/perfqN) in the order of
  // their sources; where the counts disagree, nothing is claimed.
  std::string region_of(uint16_t id) const {
    const TraceMetadata& m = names_.metadata();
    std::vector<uint16_t> devices;
    for (const auto& s : m.sources)
      if (s.kind == TraceSourceKind::kDevice) devices.push_back(s.id);
    std::sort(devices.begin(), devices.end());
    std::vector<std::string> specs;
    if (auto it = m.options.find("devices"); it != m.options.end() && !it->second.empty()) {
      std::string rest = it->second;
      for (size_t comma; (comma = rest.find(',')) != std::string::npos; rest.erase(0, comma + 1))
        specs.push_back(rest.substr(0, comma));
      specs.push_back(rest);
    }
    const auto pos = std::find(devices.begin(), devices.end(), id);
    if (specs.size() != devices.size() || pos == devices.end()) return "no PCI address";
    return specs[static_cast<size_t>(pos - devices.begin())];
  }

  // The track of a stream (and its sequence).
  // What a track has open, innermost last: a slice of the source's own
  // (BEGIN), a syscall, or uprobe i.  An END closes only its own kind.
  enum Open : uint32_t { kOpenApp = 0, kOpenSyscall = 1, kOpenUprobe = 2 };
  struct Track {
    uint64_t uuid = 0;
    Seq seq;
    std::vector<uint32_t> open;
    bool state_open = false;   // a thread-state track: a state slice is open
    bool hidden_exit = false;  // the next syscall exit is the uretprobe syscall's
  };
  static constexpr size_t kMaxOpen = 256;
  Track& stream_track(uint16_t s, uint16_t st) {
    auto [it, fresh] = streams_.try_emplace((uint32_t{s} << 16) | st);
    Track& t = it->second;
    if (!fresh) return t;
    const uint64_t parent = process(s);
    t.uuid = new_uuid();
    t.seq.id = next_seq_++;
    Pb td;
    td.u64(pf::kTdUuid, t.uuid);
    if (names_.is_device(s) || names_.is_kernel(s)) {
      td.u64(pf::kTdParent, parent);
      td.bytes(pf::kTdName,
               names_.is_device(s) ? fmt::format("stream {}", st) : fmt::format("cpu {}", st));
    } else {
      // Host threads: their kernel tid and name where the trace has them
      // (then kernel events of the thread land on its track); otherwise a
      // synthetic tid keeps streams apart across processes.
      Pb th;
      const TraceThread* tt = names_.thread(s, st);
      th.u64(pf::kThPid, names_.pid(s));
      th.u64(pf::kThTid, tt && tt->tid ? names_.host_id(s, tt->tid)
                                       : names_.pid(s) * 100000ull % 0x7fffffff + st);
      th.bytes(pf::kThName, tt && !tt->name.empty() ? tt->name : fmt::format("thread {}", st));
      td.msg(pf::kTdThread, th);
    }
    descriptor(td);
    return t;
  }

  // A host thread's scheduler states (off-CPU slices: runnable when
  // preempted, sleeping otherwise), on a track of their own under the
  // thread's, so that they never interleave with its syscall and app slices.
  Track& state_track(uint16_t s, uint16_t st) {
    const uint64_t parent = stream_track(s, st).uuid;
    auto [it, fresh] = state_tracks_.try_emplace((uint32_t{s} << 16) | st);
    Track& t = it->second;
    if (!fresh) return t;
    t.uuid = new_uuid();
    t.seq.id = next_seq_++;
    Pb td;
    td.u64(pf::kTdUuid, t.uuid);
    td.u64(pf::kTdParent, parent);
    td.bytes(pf::kTdName, "thread state");
    descriptor(td);
    return t;
  }

  uint64_t counter_track(uint64_t key, uint64_t parent, const std::string& name, uint64_t unit) {
    auto [it, fresh] = counters_.try_emplace(key, 0);
    if (!fresh) return it->second;
    it->second = new_uuid();
    Pb cd;
    if (unit) cd.u64(pf::kCdUnit, unit);
    Pb td;
    td.u64(pf::kTdUuid, it->second);
    td.u64(pf::kTdParent, parent);
    td.bytes(pf::kTdName, name);
    td.msg(pf::kTdCounter, cd);
    descriptor(td);
    return it->second;
  }
  // A device's sync counters, on its process.
  enum SyncCounter : uint8_t { kBound, kResidual, kFailed };
  uint64_t sync_counter(uint16_t source, SyncCounter which) {
    static constexpr const char* kName[] = {"sync: claimed bound (ns)", "sync: round residual (ns)",
                                            "sync: failed rounds"};
    static constexpr uint64_t kUnit[] = {pf::kUnitTimeNs, pf::kUnitTimeNs, pf::kUnitCount};
    return counter_track((uint64_t{4} << 60) | (uint64_t{source} << 8) | which, process(source),
                         kName[which], kUnit[which]);
  }

  // Losses of a stream, as a running total on its counter track.
  void lost(uint16_t s, uint16_t st, int64_t t, uint64_t n) {
    const uint32_t key = (uint32_t{s} << 16) | st;
    const uint64_t track = counter_track((uint64_t{5} << 60) | key, process(s),
                                         fmt::format("lost (stream {})", st), pf::kUnitCount);
    Pb te;
    te.u64(pf::kTeType, pf::kCounter);
    te.u64(pf::kTeTrack, track);
    te.i64(pf::kTeCounter, static_cast<int64_t>(lost_[key] += n));
    main_packet(te, pf::kTrackEvent, t);
  }

  // A packet on a track's sequence: the first one clears the sequence's
  // state and sets its defaults and clock; later ones carry a delta.
  void seq_packet(Track& tr, int64_t ts_signed, const Pb& interned, const Pb& te) {
    Seq& q = tr.seq;
    const uint64_t ts = ts_signed < 0 ? 0 : static_cast<uint64_t>(ts_signed);
    if (!q.started) {
      Pb ted;
      ted.u64(pf::kTedTrack, tr.uuid);
      Pb def;
      def.u64(pf::kDefClockId, pf::kSeqClock);
      def.msg(pf::kDefTrackEvent, ted);
      // The sequence's clock starts at ts, which is CLOCK_MONOTONIC's ts.
      Pb cs, clk;
      clk.u64(pf::kClkId, pf::kClockMonotonic);
      clk.u64(pf::kClkTimestamp, ts);
      cs.msg(pf::kCsClock, clk);
      clk.clear();
      clk.u64(pf::kClkId, pf::kSeqClock);
      clk.u64(pf::kClkTimestamp, ts);
      clk.u64(pf::kClkIncremental, 1);
      cs.msg(pf::kCsClock, clk);
      pkt_.clear();
      pkt_.u64(pf::kTimestamp, ts);
      pkt_.u64(pf::kTimestampClockId, pf::kClockMonotonic);
      pkt_.u64(pf::kSeqId, q.id);
      pkt_.u64(pf::kSeqFlags, pf::kIncrementalStateCleared);
      pkt_.msg(pf::kPacketDefaults, def);
      pkt_.msg(pf::kClockSnapshot, cs);
      emit(pkt_);
      q.started = true;
      q.last_ts = ts;
    }
    pkt_.clear();
    if (ts >= q.last_ts) {
      pkt_.u64(pf::kTimestamp, ts - q.last_ts);
      q.last_ts = ts;
    } else {
      // Earlier than the sequence's last (a device time converted out of
      // order): absolute, on CLOCK_MONOTONIC, leaving the delta clock as is.
      pkt_.u64(pf::kTimestamp, ts);
      pkt_.u64(pf::kTimestampClockId, pf::kClockMonotonic);
    }
    pkt_.u64(pf::kSeqId, q.id);
    pkt_.msg(pf::kTrackEvent, te);
    if (!interned.empty()) pkt_.msg(pf::kInternedData, interned);
    emit(pkt_);
  }

  // Interning ids are the same on every sequence (one per name); each
  // sequence gets the entry with its first use.
  uint64_t name_iid(Seq& q, const std::string& name, Pb& interned) {
    auto [it, fresh] = name_iids_.try_emplace(name, name_iids_.size() + 1);
    if (q.names.insert(it->second).second) {
      Pb en;
      en.u64(pf::kIidIid, it->second);
      en.bytes(pf::kIidName, name);
      interned.msg(pf::kIdEventNames, en);
    }
    return it->second;
  }
  uint64_t annotation_iid(Seq& q, const char* name, Pb& interned) {
    auto [it, fresh] = annotation_iids_.try_emplace(name, annotation_iids_.size() + 1);
    if (q.annotations.insert(it->second).second) {
      Pb en;
      en.u64(pf::kIidIid, it->second);
      en.bytes(pf::kIidName, name);
      interned.msg(pf::kIdAnnotationNames, en);
    }
    return it->second;
  }
  void annotate_uint(Seq& q, Pb& te, Pb& interned, const char* name, uint64_t v) {
    Pb da;
    da.u64(pf::kDaNameIid, annotation_iid(q, name, interned));
    da.u64(pf::kDaUint, v);
    te.msg(pf::kTeDebug, da);
  }

  void record(const TraceRecord& r) {
    uint16_t s = r.source;
    uint16_t st = r.rec.stream;
    const auto& ev = names_.event(s, r.rec.event);
    if (names_.is_kernel(s)) {
      // A kernel event of an application thread goes on that thread's
      // tracks, as slices; those of other threads on their CPU's track.
      if (const auto* th = names_.thread_of_tid(r.source, static_cast<uint32_t>(r.rec.arg))) {
        kernel_on_thread(r, ev.name, th->first, th->second);
        return;
      }
    }
    if (r.kind() == PERFQ_KIND_COUNTER) {
      counter(r, s, st, ev.name);
      return;
    }
    Track& tr = stream_track(s, st);
    Pb te, interned;
    uint64_t type = pf::kInstant;
    std::string name = r.kind() == PERFQ_KIND_LOST ? std::string("lost") : ev.name;
    if (r.kind() == PERFQ_KIND_BEGIN) {
      type = pf::kSliceBegin;
      if (tr.open.size() < kMaxOpen) tr.open.push_back(kOpenApp);
    } else if (r.kind() == PERFQ_KIND_END) {
      if (tr.open.empty() || close_above(tr, kOpenApp, r.time_ns)) {
        type = pf::kSliceEnd;
        if (!tr.open.empty()) tr.open.pop_back();
      } else {
        name += " (end of nothing open)";
      }
    }
    te.u64(pf::kTeType, type);
    if (type != pf::kSliceEnd) te.u64(pf::kTeNameIid, name_iid(tr.seq, name, interned));
    if (names_.is_kernel(r.source)) {
      // arg = value << 32 | tid, on a CPU's track.
      annotate_uint(tr.seq, te, interned, "tid", r.rec.arg & 0xffffffffu);
      if (r.rec.arg >> 32) annotate_uint(tr.seq, te, interned, "value", r.rec.arg >> 32);
    } else if (r.kind() == PERFQ_KIND_LOST) {
      annotate_uint(tr.seq, te, interned, "count", r.rec.arg);
    } else if (ev.role == kSubmit || ev.role == kStart) {
      // A job's id where its chain and its device slice begin; the flow
      // leads from there to the rest.
      annotate_uint(tr.seq, te, interned, "corr_id", r.rec.arg);
    } else if (ev.role == kNoRole && ev.two_args()) {
      annotate_uint(tr.seq, te, interned, ev.arg_hi.c_str(), r.rec.arg >> 32);
      annotate_uint(tr.seq, te, interned, ev.arg_lo.c_str(), r.rec.arg & 0xffffffffu);
    } else if (ev.role == kNoRole && r.rec.arg) {
      annotate_uint(tr.seq, te, interned, ev.arg_name.c_str(), r.rec.arg);
    }
    // A job's end that closes the slice its start began carries no flow:
    // the flow already steps through that slice (on both, Perfetto would
    // draw an arrow from the slice to itself).
    if (ev.role == kStart && type == pf::kSliceBegin) jobs_[r.rec.arg].start_slice = true;
    const auto job = jobs_.find(r.rec.arg);
    const bool ends_start_slice =
        ev.role == kEnd && type == pf::kSliceEnd && job != jobs_.end() && job->second.start_slice;
    if (ev.role == kSubmit || ev.role == kStart || (ev.role == kEnd && !ends_start_slice)) {
      te.fixed64(pf::kTeFlow, flow_id(r.rec.arg));
    } else if (ev.role == kComplete) {
      te.fixed64(pf::kTeTermFlow, flow_id(r.rec.arg));
    }
    seq_packet(tr, r.time_ns, interned, te);
    if (ev.role != kNoRole) order_mark(r, ev.role, tr);
    if (r.kind() == PERFQ_KIND_LOST) lost(r.source, r.rec.stream, r.time_ns, r.rec.arg);
    gap(r);
  }

  // Where a job's device time, within the bound its conversion claims (or
  // with none), could lie on the other side of its host neighbour (start
  // before submit, end after complete), an instant says so beside the
  // event: the flow's order there is not known.
  void order_mark(const TraceRecord& r, JobRole role, Track& tr) {
    JobTimes& j = jobs_[r.rec.arg];
    const bool unbounded = r.claim_ns == kClaimUnbounded;
    const int64_t claim = unbounded ? 0 : r.claim_ns;
    bool uncertain = false;
    switch (role) {
      case kSubmit:
        j.submit = r.time_ns;
        j.have_submit = true;
        return;
      case kStart:
        uncertain = j.have_submit && (unbounded || r.time_ns - claim <= j.submit);
        break;
      case kEnd:
        j.end = r.time_ns;
        j.end_claim = r.claim_ns;
        j.have_end = true;
        return;
      case kComplete:
        uncertain = j.have_end && (j.end_claim == kClaimUnbounded ||
                                   j.end + static_cast<int64_t>(j.end_claim) >= r.time_ns);
        jobs_.erase(r.rec.arg);
        break;
      default:
        return;
    }
    if (!uncertain) return;
    const uint32_t bound = role == kStart ? r.claim_ns : j.end_claim;
    Pb te, interned;
    te.u64(pf::kTeType, pf::kInstant);
    te.u64(pf::kTeNameIid,
           name_iid(tr.seq,
                    bound == kClaimUnbounded ? "order unknown: device time unsynchronized"
                                             : "order within the clock bound",
                    interned));
    if (bound != kClaimUnbounded) annotate_uint(tr.seq, te, interned, "bound_ns", bound);
    annotate_uint(tr.seq, te, interned, "corr_id", r.rec.arg);
    seq_packet(tr, r.time_ns, interned, te);
  }

  // A kernel event of an application thread (arg = value << 32 | tid):
  // syscalls and uprobes become slices on the thread's track (named by the
  // syscall, by the probed function), switches and wakeups the slices and
  // instants of its state track.
  void kernel_on_thread(const TraceRecord& r, const std::string& name, uint16_t s, uint16_t st) {
    const uint32_t ev = r.rec.event;
    const uint64_t value = r.rec.arg >> 32;
    Pb te, interned;
    if (ev == PERFQ_KEV_SCHED_OUT || ev == PERFQ_KEV_SCHED_IN || ev == PERFQ_KEV_SCHED_WAKEUP) {
      Track& tr = state_track(s, st);
      if (ev == PERFQ_KEV_SCHED_WAKEUP) {
        te.u64(pf::kTeType, pf::kInstant);
        te.u64(pf::kTeNameIid, name_iid(tr.seq, "wakeup", interned));
        annotate_uint(tr.seq, te, interned, "cpu", value);
        seq_packet(tr, r.time_ns, interned, te);
        return;
      }
      if (tr.state_open) {  // a switch-in, or a switch-out the kernel did not pair
        te.u64(pf::kTeType, pf::kSliceEnd);
        seq_packet(tr, r.time_ns, interned, te);
        tr.state_open = false;
        te.clear();
      }
      if (ev == PERFQ_KEV_SCHED_OUT) {
        te.u64(pf::kTeType, pf::kSliceBegin);
        te.u64(pf::kTeNameIid, name_iid(tr.seq, off_cpu_state(value), interned));
        seq_packet(tr, r.time_ns, interned, te);
        tr.state_open = true;
      }
      return;
    }
    Track& tr = stream_track(s, st);
    const bool is_uprobe = ev >= PERFQ_KEV_UPROBE_BASE;
    const bool entry =
        is_uprobe ? (ev - PERFQ_KEV_UPROBE_BASE) % 2 == 0 : ev == PERFQ_KEV_SYSCALL_ENTER;
    const uint32_t kind = is_uprobe ? kOpenUprobe + (ev - PERFQ_KEV_UPROBE_BASE) / 2 : kOpenSyscall;
    if (!is_uprobe && ev != PERFQ_KEV_SYSCALL_ENTER && ev != PERFQ_KEV_SYSCALL_EXIT) {
      te.u64(pf::kTeType, pf::kInstant);  // a kernel event this export does not know
      te.u64(pf::kTeNameIid, name_iid(tr.seq, name, interned));
      if (value) annotate_uint(tr.seq, te, interned, "value", value);
      seq_packet(tr, r.time_ns, interned, te);
      return;
    }
    if (!is_uprobe && uretprobe_syscall(ev, value)) {
      // The uretprobe trampoline's syscall: how the kernel delivers the
      // uretprobe that follows, inside it (so that its exit would come after
      // the function's slice ended).  The uretprobe ends the function's
      // slice; neither the syscall nor its exit, the thread's next, is drawn.
      tr.hidden_exit = true;
      return;
    }
    if (!is_uprobe && !entry && tr.hidden_exit) {
      tr.hidden_exit = false;
      return;
    }
    if (!is_uprobe) tr.hidden_exit = false;  // (an entry: that exit was lost)
    if (entry) {
      te.u64(pf::kTeType, pf::kSliceBegin);
      te.u64(pf::kTeNameIid,
             name_iid(tr.seq, is_uprobe ? uprobe_name(name) : syscall_name(value), interned));
      if (is_uprobe && value) annotate_uint(tr.seq, te, interned, "arg", value);
      if (tr.open.size() < kMaxOpen) tr.open.push_back(kind);
    } else if (close_above(tr, kind, r.time_ns)) {
      te.u64(pf::kTeType, pf::kSliceEnd);
      tr.open.pop_back();
    } else {
      // Its entry came before the recording (or was lost): an instant.
      te.u64(pf::kTeType, pf::kInstant);
      te.u64(pf::kTeNameIid, name_iid(tr.seq, name, interned));
    }
    if (!entry && value) {
      Pb da;
      da.u64(pf::kDaNameIid, annotation_iid(tr.seq, "ret", interned));
      da.i64(pf::kDaInt, static_cast<int32_t>(static_cast<uint32_t>(value)));
      te.msg(pf::kTeDebug, da);
    }
    seq_packet(tr, r.time_ns, interned, te);
  }

  // Before an END of `kind`: the slices opened inside the innermost open
  // one of that kind end here too (the kernel does not always report in
  // nesting order: a uretprobe can come before the exit of the syscall it
  // made), so the track stays well nested.  False when none is open.
  bool close_above(Track& tr, uint32_t kind, int64_t t) {
    auto it = std::find(tr.open.rbegin(), tr.open.rend(), kind);
    if (it == tr.open.rend()) return false;
    const size_t above = static_cast<size_t>(it - tr.open.rbegin());
    for (size_t i = 0; i < above; ++i) {
      Pb te;
      te.u64(pf::kTeType, pf::kSliceEnd);
      seq_packet(tr, t, Pb{}, te);
      tr.open.pop_back();
    }
    return true;
  }

  // sched_switch_out's prev_state: 0 the thread was preempted (runnable),
  // else it went to sleep (TASK_INTERRUPTIBLE 1, TASK_UNINTERRUPTIBLE 2).
  // (TASK_REPORT bits; higher flags such as TASK_FREEZABLE ignored).
  static std::string off_cpu_state(uint64_t state) {
    if (state == 0) return "runnable (preempted)";
    if (state & 0x1) return "sleeping";
    if (state & 0x2) return "sleeping (uninterruptible)";
    if (state & 0x80) return "exiting";
    return fmt::format("off CPU (state {})", state);
  }
  // "uprobe:f" -> "f"
  static std::string uprobe_name(const std::string& name) {
    const size_t colon = name.find(':');
    return colon == std::string::npos ? name : name.substr(colon + 1);
  }
  // The syscall's name where the trace was recorded on x86-64 (its kernel
  // line says so) and the number is in this build's table (or one of the
  // numbers kernels added after the headers it was built with), else its
  // number.  x86-64 never reuses a number.
  std::string syscall_name(uint64_t nr) const {
    static const std::map<uint64_t, std::string_view> kX86_64 = {
#include "syscall_names_x86_64.inc"
    };
    static const std::map<uint64_t, std::string_view> kNewer = {
        {335, "uretprobe"},  // 6.11
        {451, "cachestat"},  // 6.5
        {452, "fchmodat2"},
        {453, "map_shadow_stack"},  // 6.6
        {454, "futex_wake"},
        {455, "futex_wait"},
        {456, "futex_requeue"},  // 6.7
        {457, "statmount"},
        {458, "listmount"},
        {459, "lsm_get_self_attr"},  // 6.8
        {460, "lsm_set_self_attr"},
        {461, "lsm_list_modules"},  // 6.8
        {462, "mseal"},             // 6.10
    };
    if (x86_64()) {
      if (auto it = kX86_64.find(nr); it != kX86_64.end()) return std::string(it->second);
      if (auto it = kNewer.find(nr); it != kNewer.end()) return std::string(it->second);
    }
    return fmt::format("syscall {}", nr);
  }
  bool x86_64() const { return names_.metadata().kernel.find("x86_64") != std::string::npos; }
  // The x86-64 uretprobe syscall (335, Linux 6.11 and later), which the
  // trampoline a uretprobe puts at a probed function's return enters.
  bool uretprobe_syscall(uint32_t ev, uint64_t nr) const {
    return ev == PERFQ_KEV_SYSCALL_ENTER && nr == 335 && x86_64();
  }

  // Index gaps are losses too (the counter of the stream).
  void gap(const TraceRecord& r) {
    const uint32_t key = (uint32_t{r.source} << 16) | r.rec.stream;
    auto [it, fresh] = last_index_.try_emplace(key, r.rec.index);
    if (!fresh && r.rec.index > it->second + 1)
      lost(r.source, r.rec.stream, r.time_ns, r.rec.index - it->second - 1);
    if (r.rec.index > it->second) it->second = r.rec.index;
  }

  void counter(const TraceRecord& r, uint16_t s, uint16_t st, const std::string& name) {
    const uint64_t key =
        (uint64_t{3} << 60) | (uint64_t{s} << 48) | (uint64_t{st} << 32) | r.rec.event;
    const uint64_t track =
        counter_track(key, process(s), fmt::format("{} (stream {})", name, st), 0);
    Track& tr = stream_track(s, st);
    Pb te;
    te.u64(pf::kTeType, pf::kCounter);
    te.u64(pf::kTeTrack, track);
    te.i64(pf::kTeCounter, static_cast<int64_t>(r.rec.arg));
    seq_packet(tr, r.time_ns, Pb{}, te);
    gap(r);
  }

  static uint64_t flow_id(uint64_t corr) { return corr ^ 0x7065726671000000ull; }

  OutFile& out_;
  Names names_;
  std::string buf_;  // whole packets not yet written (compressed: the batch)
  Pb pkt_;
  Pb trace_;
  const bool compress_;
  std::string deflated_;  // a batch compressed
  bool snapshot_done_ = false;
  uint64_t next_uuid_ = 1;
  uint32_t next_seq_ = kMainSeq + 1;
  std::map<uint16_t, uint64_t> procs_;
  std::map<uint32_t, Track> streams_;
  std::map<uint32_t, Track> state_tracks_;
  std::map<uint64_t, uint64_t> counters_;
  std::map<std::string, uint64_t> name_iids_;
  std::map<std::string, uint64_t> annotation_iids_;
  std::map<uint32_t, uint64_t> lost_;
  std::map<uint32_t, uint64_t> last_index_;
  std::map<uint16_t, uint64_t> failed_rounds_;
  // Jobs in flight: the times their order marks compare.
  struct JobTimes {
    int64_t submit = 0, end = 0;
    uint32_t end_claim = 0;
    bool have_submit = false, have_end = false;
    bool start_slice = false;  // its start began a slice on the device's track
  };
  std::unordered_map<uint64_t, JobTimes> jobs_;
  analysis::SyncResiduals residuals_;
};

}  // namespace

Status export_perfetto(OutFile& file, const std::string& out, const ReadTrace& read,
                       bool compress) {
  if (Status s = file.open(out); !s.is_ok()) return s;
  PerfettoExport v(file, compress);
  if (Status s = read(v); !s.is_ok()) return s;
  return v.finish();
}

}  // namespace perfq::export_detail
