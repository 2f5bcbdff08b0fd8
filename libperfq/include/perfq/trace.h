// The merged trace file: one writer (the daemon's merge/writer thread) and a
// streaming reader (perfqctl report/export, tests).
//
// A trace file is a 32-byte file header followed by append-only chunks, each
// with a 24-byte chunk header (type, length, CRC32C).  The exact layout is in
// docs/trace-format.md; the constants below mirror it.
//
//   [file header 32 B][chunk hdr 24 B | payload][chunk hdr | payload]...
//
// A crash loses at most the chunk being written: the reader stops at the
// first torn or corrupt chunk, reports its byte offset and the reason, and
// everything before it has already been delivered.  The reader holds one
// chunk in memory at a time (chunks are bounded by kTraceMaxChunkBytes), so
// reading takes constant memory whatever the file size.
//
// Threading: a TraceWriter or TraceReader is used by one thread at a time;
// different instances are independent.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "perfq/event_info.h"
#include "perfq/pci.h"
#include "perfq/perfq_abi.h"
#include "perfq/status.h"

namespace perfq {

// ---------------------------------------------------------------------------
// File-level constants

inline constexpr char kTraceMagic[8] = {'P', 'E', 'R', 'F', 'Q', 'T', 'R', 'C'};
// Version 1: records chunks follow one another in host-time order.
// Version 2: each records chunk is in host-time order, but chunks overlap;
// watermark chunks say how far the records are complete, and a reader
// merges the chunks behind them (what perfq-daemon writes: a record reaches
// the file within 100 ms, not once every input has passed its time).
// kTraceVersion is the newest this library reads and writes.
inline constexpr uint32_t kTraceVersionOrdered = 1;
inline constexpr uint32_t kTraceVersion = 2;
inline constexpr size_t kTraceFileHeaderSize = 32;
inline constexpr size_t kTraceChunkHeaderSize = 24;
inline constexpr uint32_t kTraceChunkMagic = 0x4b435150;  // "PQCK" little-endian
// Upper bound of a chunk payload, stored or decompressed.  A header claiming
// more is corrupt; this bounds the reader's memory.
inline constexpr uint32_t kTraceMaxChunkBytes = 16u << 20;
// A version 2 file's records a reader holds at most, waiting for a
// watermark (192 MiB); past it, it gives out the oldest half.
inline constexpr size_t kTraceMaxHeldRecords = size_t{4} << 20;

enum class ChunkType : uint16_t {
  kMetadata = 1,     // JSON text (TraceMetadata)
  kRecords = 2,      // TraceRecord[] in host-time order (within the chunk), 48 B each
  kSyncSamples = 3,  // TraceSyncSample[], 56 B each
  kClockModels = 4,  // TraceClockModel[], 64 B each
  kLoss = 5,         // TraceLoss[], 32 B each
  kEnd = 6,          // TraceEnd: the writer closed the file cleanly
  kWatermark = 7,    // s64 host ns: records in later chunks are no older (version 2)
};
const char* chunk_type_name(uint16_t type);

inline constexpr uint16_t kChunkFlagZstd = 1;     // payload is one zstd frame
inline constexpr uint16_t kChunkFlagColumns = 2;  // records chunk: its records in columns

// ---------------------------------------------------------------------------
// TraceMetadata

// kKernel: the host kernel's events (perfq-daemon's BPF collector, see
// daemon/bpf/perfq_kevent.h), one stream per CPU, host clock.
enum class TraceSourceKind : uint8_t { kHost = 0, kDevice = 1, kKernel = 2 };
const char* trace_source_kind_name(TraceSourceKind k);

// A thread of a host application: its stream (ring) and kernel thread id,
// so kernel events (by tid) line up with the thread's own records.
struct TraceThread {
  uint16_t stream = 0;
  uint32_t tid = 0;
  std::string name;
  bool operator==(const TraceThread&) const = default;
};

// How a source's records ended before the recording did: a device that
// went away (its mapping revoked, its region cut short), failed, or stopped
// answering (its collector's heartbeat stood still).  Records after time_ns
// are not in the trace; the source's other records are.
struct TraceSourceEnd {
  std::string state;    // "gone", "failed" or "silent"
  int64_t time_ns = 0;  // host time of the last sign of it (silent: the heartbeat's last move)
  std::string reason;   // the daemon's words, naming the device
  bool operator==(const TraceSourceEnd&) const = default;
};

// A source of records: one instrumented host application (stream = host
// thread) or one device (stream = device worker/queue).  `id` is the
// TraceRecord::source value; ids are unique within a trace.
struct TraceSource {
  uint16_t id = 0;
  TraceSourceKind kind = TraceSourceKind::kHost;
  std::string name;                     // application name or device name
  uint32_t pid = 0;                     // host application: its pid (0 if unknown)
  std::string pci_address;              // device: "0000:03:00.0" when known
  std::string link;                     // device: "Gen4 x8" when known (the current link)
  std::optional<PciDevice> pci;         // device: its PCI facts when it is on a PCI bus
  uint64_t clock_hz = 0;                // device: nominal rate of its clock D
  uint64_t timer_hz = 0;                // device: nominal rate of its timer register R (0: unknown)
  std::vector<EventInfo> events;        // the source's event dictionary
  std::vector<TraceThread> threads;     // host application: its threads so far
  std::optional<TraceSourceEnd> ended;  // its records ended early (see TraceSourceEnd)
  // The host it was recorded on: an index into TraceMetadata::hosts of a
  // trace merged from several hosts' (perfqctl merge); 0 otherwise.
  uint16_t host = 0;
  bool operator==(const TraceSource&) const = default;

  const EventInfo* find_event(uint32_t event) const;
};

struct TraceClockDomain {
  uint16_t id = 0;  // enum perfq_clock_domain
  std::string name;
  std::string description;
  bool operator==(const TraceClockDomain&) const = default;
};

// How the recording host's CLOCK_MONOTONIC stood against CLOCK_REALTIME at
// one moment: realtime was read between two monotonic reads bracket_ns apart
// (monotonic_ns is their midpoint), with the kernel's own word on realtime
// (adjtimex(2), as chrony or ptp4l left it).  The recorder writes one at the
// start, every few seconds and at the stop: what lines up traces of
// different hosts (perfqctl merge).
struct TraceHostClock {
  int64_t monotonic_ns = 0;
  int64_t realtime_ns = 0;
  int64_t bracket_ns = 0;
  bool synchronized = false;  // the kernel's realtime is disciplined (no STA_UNSYNC)
  int64_t esterror_ns = -1;   // adjtimex esterror: its estimated error (-1: unknown)
  int64_t maxerror_ns = -1;   // adjtimex maxerror: its maximum error (-1: unknown)
  int32_t status = 0;         // adjtimex status bits (STA_*)
  int32_t tai_offset_s = 0;   // TAI - UTC as the kernel knows it (0: not set)
  bool operator==(const TraceHostClock&) const = default;
};
// Reads this host's clocks now (the tightest of a few brackets).
TraceHostClock read_host_clock();

// One host of a trace merged from several (perfqctl merge): who it was, and
// how its times were put on the merged timeline (the first host's
// CLOCK_MONOTONIC): its CLOCK_MONOTONIC plus offset_ns, through both hosts'
// CLOCK_REALTIME.  uncertainty_ns bounds the error of that at the start (the
// two snapshot brackets, plus both kernels' estimated realtime error unless
// both recordings ran on one kernel, whose realtime is then one clock); -1:
// no bound (a host's realtime was not synchronized).
struct TraceHost {
  std::string name;  // host name, made unique within the trace
  std::string machine_id;
  std::string boot_id;
  std::string kernel;
  std::string file;  // the trace it came from
  int64_t offset_ns = 0;
  int64_t uncertainty_ns = 0;
  std::string alignment;  // how it was aligned, in words
  bool operator==(const TraceHost&) const = default;
};

struct TraceMetadata {
  std::string host_name;
  std::string machine_id;  // /etc/machine-id of the recording host
  std::string boot_id;     // its kernel's boot id (one per boot)
  std::string kernel;
  std::string cpu;
  std::string perfq_version;
  std::map<std::string, std::string> options;  // recording options
  std::vector<TraceSource> sources;
  std::vector<TraceClockDomain> clock_domains;
  // Snapshots of the host's clocks, in time order.  merge() appends those
  // of a later chunk (each chunk carries the new ones only).
  std::vector<TraceHostClock> host_clocks;
  // A merged trace's hosts (perfqctl merge), the first the reference; empty
  // for a trace of one host.
  std::vector<TraceHost> hosts;
  bool operator==(const TraceMetadata&) const = default;

  const TraceSource* find_source(uint16_t id) const;
  // A recording option that is a whole decimal number (start_ns, stop_ns):
  // nullopt when absent, or not such a number in full.
  std::optional<int64_t> option_int(const std::string& key) const;
  // How outputs name a source: its name, and in a trace of several hosts
  // "HOST:NAME" (every report and export names sources through this).
  std::string source_label(const TraceSource& s) const;
  // Fills host_name, kernel (uname), cpu (/proc/cpuinfo model name),
  // perfq_version and the standard clock domains.  Leaves sources alone.
  void describe_this_host();
  // Adds or replaces sources (by id) and clock domains, and takes the
  // non-empty host fields and options of `later`.
  void merge(const TraceMetadata& later);
};

std::string trace_metadata_to_json(const TraceMetadata& m);
// The JSON objects the metadata writes for a host and a source's early end
// (the report's --json shows them as they are).
nlohmann::json trace_host_to_json(const TraceHost& h);
nlohmann::json trace_source_end_to_json(const TraceSourceEnd& e);
Result<TraceMetadata> trace_metadata_from_json(const std::string& text);

// ---------------------------------------------------------------------------
// Items stored in chunks

// How a record's host time came about (TraceRecord::conv).
enum class TraceConversion : uint8_t {
  kNone = 0,    // the source's own host time (host records; traces before claims)
  kModel = 1,   // the daemon's clock model converted the device time
  kDevice = 2,  // the device converted it (sync mode B)
  kForced = 3,  // without a round after it: the record waited the longest a record
                // may (2 s) for a model that vouches for its time, or the
                // recording ended first; converted with the model there was
                // (mode B: the device's time), the claim what that model
                // claims there, however loose, if no clock step came since
};
const char* trace_conversion_name(TraceConversion c);
// TraceRecord::claim_ns when the converting model bounds nothing there:
// the time is unsynchronized.
inline constexpr uint32_t kClaimUnbounded = UINT32_MAX;
// A claim in ns as stored: rounded up, saturated at kClaimUnbounded
// (anything over 4.29 s, or not finite, bounds nothing).
uint32_t stored_claim(double claim_ns);

// One record in the merged trace: the source, the 32-byte record as the
// source wrote it (rec.time is the raw source time, in the clock domain of
// rec.flags) and the converted host time, with the bound its conversion
// claims.
struct TraceRecord {
  uint16_t source = 0;
  TraceConversion conv = TraceConversion::kNone;
  // |time_ns - the true host time| <= claim_ns, as the converting model
  // claims it (0 with kNone: the source's own clock; kClaimUnbounded: no
  // bound, unsynchronized).  In source's padding: 48 bytes in all.
  uint32_t claim_ns = 0;
  perfq_record rec{};
  int64_t time_ns = 0;  // host CLOCK_MONOTONIC ns (converted for devices)

  uint64_t raw_time() const { return rec.time; }
  uint16_t kind() const { return static_cast<uint16_t>(PERFQ_FLAGS_KIND(rec.flags)); }
  uint16_t domain() const { return static_cast<uint16_t>(PERFQ_FLAGS_DOMAIN(rec.flags)); }
};
bool operator==(const TraceRecord& a, const TraceRecord& b);
static_assert(sizeof(TraceRecord) == 48, "the merge holds millions of these");

// One sync exchange of a device: the host's bracket (H1, R2, H2) and the
// device's (R1 before, D, R1 after).  reserved fields are not stored.  A
// round may hold more samples of one side than of the other (the device
// samples every few host reads): the side a sample lacks is flagged.
struct TraceSyncSample {
  static constexpr uint16_t kNoHost = 1, kNoDevice = 2;
  uint16_t source = 0;  // the device
  uint32_t round = 0;
  perfq_clock_sample host{};
  perfq_clock_sample device{};
  uint16_t absent = 0;  // kNoHost | kNoDevice (0 in traces written before)

  bool has_host() const { return (absent & kNoHost) == 0; }
  bool has_device() const { return (absent & kNoDevice) == 0; }
};
bool operator==(const TraceSyncSample& a, const TraceSyncSample& b);

// A sync round's samples as the trace stores them (every sample of both
// sides, paired by position) and back, grouped by round in trace order.
// SyncRound is sync/sync.h's.
struct SyncRound;
std::vector<TraceSyncSample> trace_samples_of(uint16_t source, const SyncRound& round);
std::vector<SyncRound> sync_rounds_of(std::span<const TraceSyncSample> samples);

// A clock model the daemon used for a device from `model.valid_from_device`.
// seq and reserved fields are not stored.
struct TraceClockModel {
  uint16_t source = 0;
  int64_t installed_ns = 0;  // host time the daemon started using it
  perfq_sync_model model{};
};
bool operator==(const TraceClockModel& a, const TraceClockModel& b);

// ---- The one sign convention (docs/sync.md "How the clocks stand") ------------
//
// Every output that states how a device clock stands against the host
// (status, the stop summary, report, trace exports, man pages) takes it
// from clock_standing() (the sync code's) and words it with standing_text():
//   device_ahead_ns  D - H at the model's reference, D read as ns at its
//                    nominal rate: > 0, the device clock reads ahead of
//                    the host (devsim --clock-offset-ns has this sign);
//   device_fast_ppm  how fast D runs against its nominal rate, measured in
//                    host time: > 0, the device clock gains on the host
//                    (devsim --clock-drift-ppm has this sign).
// The JSON keys are these names.  Each clock's u64 reading is taken as a
// signed 64-bit value (as time_diff() reads differences), so an offset of
// either sign reads as itself.
struct ClockStanding {
  double device_ahead_ns = 0;
  double device_fast_ppm = 0;
  double bound_ns = 0;  // the model's claimed uncertainty at its reference
  // Beyond kPlausibleDriftPpm: no real oscillator is that far off; a
  // device clock or timer rate that is not what the device declares is.
  bool rate_implausible = false;
};
constexpr double kPlausibleDriftPpm = 1000;
// "device clock 2.570 s ahead of the host, running 40.001 ppm fast", and
// for an implausible rate "... (no real clock is that far off: is the
// device's declared clock or timer rate right?)".
std::string standing_text(const ClockStanding& s);

// Records a stream lost that cannot show up in the records themselves
// (e.g. pushes refused by a full host ring that never got an index).
enum class TraceLossReason : uint32_t {
  kUnknown = 0,
  kHostRingFull = 1,
  kDeviceQueueFull = 2,
  kSharedQueueFull = 3,
  kInvalidRecord = 4,
  kKernelBufferFull = 5
};
struct TraceLoss {
  uint16_t source = 0;
  uint16_t stream = 0;
  TraceLossReason reason = TraceLossReason::kUnknown;
  uint64_t count = 0;       // records lost since the previous report
  int64_t time_ns = 0;      // host time the loss was observed
  uint64_t last_index = 0;  // last index seen on the stream before it (0 if none)
  bool operator==(const TraceLoss&) const = default;
};

struct TraceEnd {
  uint64_t records = 0;  // records written in the whole file
  uint64_t chunks = 0;   // chunks before this one
  bool operator==(const TraceEnd&) const = default;
};

// ---------------------------------------------------------------------------
// Writer

struct TraceWriterOptions {
  // zstd on record chunks, each kept compressed only when smaller.  On by
  // default: in the trace-bench test (1M synthetic records, medians of 5) a
  // record takes 48 B raw and, in columns, 3.0 B at level 1 (2.2 B at
  // level 3), for about 9 ns more per record in the writer thread (as
  // rows: 10.9 B for about 100 ns more).
  bool compress = true;
  int zstd_level = 1;
  size_t records_per_chunk = 16384;  // 768 KiB of records per chunk
  bool sync_on_flush = false;        // fdatasync after each flush()
  // An existing file at the path is truncated and replaced; false: it is
  // left alone and open() fails with Errc::kExists (O_EXCL, decided as the
  // file is created, so no other writer slips in between).
  bool replace = true;
  // Records may be appended out of time order across flushes (each flush's
  // records in order), with append_watermark() saying how far they are
  // complete: a version 2 file, whose reader merges its chunks.  Off: the
  // caller appends every record in time order (a version 1 file).
  bool watermarks = false;
  // Records chunks in columns (kChunkFlagColumns, docs/trace-format.md):
  // zstd then compresses field after field, the times and indexes as
  // differences (a devsim recording: 47 instead of 160 ns a record in the
  // writer; the trace-bench recording: 3.0 instead of 10.9 B); false:
  // rows, as perfq wrote before (a reader from before refuses columns by
  // their flag, "unknown flags").
  bool columns = true;
};

// Appends to a new trace file.  Records are buffered and written as one chunk
// when records_per_chunk are pending or on flush()/close(); samples, models
// and losses are written as their own chunk at once (they are rare).  Every
// failed write (full disk...) is returned as a Status; after one the writer
// refuses further appends.  Call from one thread.
class TraceWriter {
 public:
  static Result<TraceWriter> open(const std::string& path, const TraceMetadata& metadata,
                                  TraceWriterOptions options = {});
  TraceWriter(TraceWriter&&) noexcept;
  TraceWriter& operator=(TraceWriter&&) noexcept;
  ~TraceWriter();  // closes if still open; errors are lost, call close()

  // Adds sources registered after open (another metadata chunk).
  Status append_metadata(const TraceMetadata& more);
  Status append_records(std::span<const TraceRecord> records);
  Status append_sync_samples(std::span<const TraceSyncSample> samples);
  Status append_clock_model(const TraceClockModel& model);
  Status append_loss(const TraceLoss& loss);
  // (options.watermarks) Every record appended after this has a time_ns of
  // at least `host_ns`, and the records appended before it are complete up
  // to there: a reader may give out, in time order, every record older than
  // it.  Flushes pending records first (a chunk must not span two stretches
  // appended in time order each); only increasing values are written.
  Status append_watermark(int64_t host_ns);
  Status flush();  // writes pending records as a chunk
  Status close();  // flush, END chunk, fsync, close

  uint64_t records_written() const;
  uint64_t bytes_written() const;  // file size so far
  uint64_t chunks_written() const;

 private:
  struct Impl;
  explicit TraceWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------------------
// Reader

// Receives the content of a trace in file order, its records in host-time
// order: a version 2 file's records chunks overlap, and the reader holds
// their records until a watermark chunk (or the file's end, its END chunk or
// the first corrupt chunk) says none older can follow, then gives them out
// merged.  A record that a writer appended below a watermark it had written
// (late) comes out of order, as it was written.  Spans are valid only during
// the call.  A non-ok return stops the reading and is returned by read().
class TraceVisitor {
 public:
  virtual ~TraceVisitor() = default;
  // After every metadata chunk, with all metadata merged so far.
  virtual Status on_metadata(const TraceMetadata&) { return Status::ok(); }
  virtual Status on_records(std::span<const TraceRecord>) { return Status::ok(); }
  virtual Status on_sync_samples(std::span<const TraceSyncSample>) { return Status::ok(); }
  virtual Status on_clock_models(std::span<const TraceClockModel>) { return Status::ok(); }
  virtual Status on_losses(std::span<const TraceLoss>) { return Status::ok(); }
  virtual Status on_end(const TraceEnd&) { return Status::ok(); }
};

// A fault in the file's structure that every chunk's own checks pass: the
// reader says it and reads on (what it could not trust was skipped).
struct TraceProblem {
  uint64_t offset = 0;  // byte offset of the chunk it is about
  std::string message;  // "PATH: byte offset N: chunk K (type): reason"
};

// What a read() got through.
struct TraceReadSummary {
  uint64_t chunks = 0;   // complete chunks read
  uint64_t records = 0;  // records delivered (a duplicated chunk's are not)
  // Records given out after a newer one had been: in a version 2 file,
  // appended below a watermark already written, or beyond what the reader
  // holds; in a version 1 file, any (its writer appended them so).
  uint64_t out_of_order = 0;
  uint64_t bytes = 0;  // offset just past the last complete chunk
  // The last chunk is an END chunk whose counts match what came before it
  // (the writer closed the file, and nothing was added or lost since).
  bool clean_end = false;
  uint64_t unknown_chunks = 0;  // valid chunks of a type this reader skips
  // Structure faults: no metadata chunk first, an END chunk followed by more
  // chunks or whose counts disagree with the file, a records chunk that
  // repeats an earlier one (skipped).  Each is also a reason clean_end is
  // false.
  std::vector<TraceProblem> problems;
};

// Reads a trace file chunk by chunk.  read() returns ok when the file ends
// at a chunk boundary; at a torn or corrupt chunk it returns kCorrupt with
// "PATH: byte offset N: chunk K (type): reason" after delivering every chunk
// before it; error_offset() is that N.  A fault of the file's structure
// (TraceReadSummary::problems) does not stop it.  Never reads past a chunk it
// did not validate, never allocates more than kTraceMaxChunkBytes twice
// (and, for a version 2 file, kTraceMaxHeldRecords records held).
class TraceReader {
 public:
  static Result<TraceReader> open(const std::string& path);
  TraceReader(TraceReader&&) noexcept;
  TraceReader& operator=(TraceReader&&) noexcept;
  ~TraceReader();

  uint32_t version() const;
  const std::string& path() const;

  // Reads from just after the file header to the end.  May be called again
  // (it rewinds).
  Status read(TraceVisitor& visitor);
  const TraceReadSummary& summary() const;
  uint64_t error_offset() const;  // meaningful after read() returned kCorrupt

 private:
  struct Impl;
  explicit TraceReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------------------
// Merging traces of several hosts (perfqctl merge)

struct TraceMergeOptions {
  bool replace = false;  // an existing output is replaced (else refused)
};
struct TraceMergeSummary {
  uint64_t records = 0;
  std::vector<TraceHost> hosts;       // as the merged trace's metadata states them
  std::vector<std::string> warnings;  // inputs that ended early or had structure faults
};
// One trace of every input on the first input's timeline (its host's
// CLOCK_MONOTONIC): each other host's times are put there through both
// hosts' CLOCK_REALTIME, from the clock snapshots each trace carries
// (TraceHostClock, interpolated between them), and its sources get ids of
// their own (TraceSource::host names the host).  Reads each input twice,
// holding a few chunks of each at a time, whatever their size.  Fails for an
// input without clock snapshots (written before perfq recorded them) or one
// that cannot be read at all; an input that ends early is merged up to there
// (a warning says so).
Result<TraceMergeSummary> merge_traces(const std::vector<std::string>& inputs,
                                       const std::string& output,
                                       const TraceMergeOptions& options = {});

const char* record_kind_name(uint16_t kind);  // "begin", "end", ... "invalid"

}  // namespace perfq
