// The analysis behind `perfqctl report`: one streaming pass over a trace
// file (two with resync) that gathers what a person tuning a device wants
// first.  Memory grows only with the number of sources, streams, events and
// jobs in flight, never with the number of records.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "perfq/filter.h"
#include "perfq/progress.h"
#include "perfq/status.h"
#include "perfq/trace.h"

namespace perfq {

// Summary of a latency distribution, ns.
struct LatencyStats {
  uint64_t count = 0;
  int64_t min = 0;
  int64_t max = 0;
  double mean = 0;
  int64_t p50 = 0;
  int64_t p90 = 0;
  int64_t p99 = 0;
};

// One bin of a distribution on a log axis: [lo_ns, hi_ns).
struct ReportBin {
  int64_t lo_ns = 0;
  int64_t hi_ns = 0;
  uint64_t count = 0;
};

// A distribution for charts: its bins on a log axis (10 a decade) and the
// values at or below zero, which a log axis cannot show.
struct ReportHistogram {
  std::vector<ReportBin> bins;
  uint64_t at_most_zero = 0;
};

// Nearest-rank percentiles of signed ns values in bounded memory.  Exact
// while at most kExactValues distinct values were seen; after that a
// log-linear histogram with 9 significant bits per bucket: exact below
// 512 ns and within 0.2% above (bucket midpoints, clamped to the exact min
// and max).  Memory: at most ~15k buckets per sign, allocated sparsely.
class LatencyHistogram {
 public:
  static constexpr size_t kExactValues = 4096;
  void add(int64_t v);
  uint64_t count() const { return count_; }
  bool exact() const { return !bucketed_; }
  int64_t quantile(double q) const;  // q in [0, 1]
  LatencyStats summary() const;
  // Counts in bins of equal width on a log axis: per_decade bins per power
  // of ten, [10^(k/per_decade), 10^((k+1)/per_decade)) ns, from the bin of
  // the smallest positive value to that of the largest; values <= 0 are
  // counted apart (at_most_zero).  Exact while exact(); after that each
  // bucket counts in the bin of its midpoint (buckets are 0.4% wide, bins
  // 26% at 10 a decade).
  ReportHistogram log_bins(int per_decade) const;

 private:
  void add_bucketed(int64_t v, uint64_t n);
  std::map<int64_t, uint64_t> exact_;  // value -> count, until bucketed_
  bool bucketed_ = false;
  std::map<uint32_t, uint64_t> pos_;  // bucket -> count, values >= 0
  std::map<uint32_t, uint64_t> neg_;  // bucket of -v -> count, values < 0
  uint64_t count_ = 0;
  int64_t min_ = 0;
  int64_t max_ = 0;
  long double sum_ = 0;
};

struct TraceReportOptions {
  // Recompute the host time of every device-clock record with the offline
  // whole-recording model of each device (needs a second pass): the sync code's
  // fit_offline_rounds (piecewise: steps start segments), the one offline
  // estimator, with the device's nominal clock and timer rates from the
  // metadata.  A device whose rounds cannot be fitted keeps its online
  // times, and TraceReport::resync_notes says so.
  bool resync = false;
  // Only part of the trace (perfq/filter.h).  With an event filter the
  // other events' records are not seen, so index gaps are not counted as
  // losses (TraceReport::index_gaps_counted).
  TraceFilter filter;
  TraceProgress progress;  // called after each chunk when set
};

struct ReportStream {
  uint16_t source = 0;
  uint16_t stream = 0;
  uint64_t records = 0;
  // Losses.  reported: LOST-record args plus loss chunks; gaps: records
  // missing from the index sequence.  lost = max(reported, gaps), as both
  // may describe the same drops.
  uint64_t reported_lost = 0;
  uint64_t gap_lost = 0;
  uint64_t lost = 0;
  uint64_t loss_events = 0;   // LOST records, loss reports and gaps seen
  int64_t first_loss_ns = 0;  // host time of the first and last loss
  int64_t last_loss_ns = 0;
  uint64_t first_loss_index = 0;  // index at (or just after) the first loss
};

// The bounds a device's recorded times carry (TraceRecord::claim_ns), as
// the daemon converted them (with --resync too: the offline fit's bound is
// ReportSync::worst_uncertainty_ns).
struct ReportClaims {
  uint64_t records = 0;            // records with a converted time (claim or not)
  uint64_t by_daemon = 0;          // TraceConversion::kModel
  uint64_t by_device = 0;          // kDevice (mode B)
  uint64_t forced = 0;             // kForced: converted after the longest wait
  uint64_t unbounded = 0;          // without a bound (kClaimUnbounded): unsynchronized
  int64_t unbounded_first_ns = 0;  // host times of the first and last of them
  int64_t unbounded_last_ns = 0;
  uint64_t unclaimed = 0;  // device times with no claim stored (older traces)
  LatencyStats claim_ns;   // over the bounded claims
};

// One segment of a device's clock model (split at clock steps and rate
// breaks), from the host time its first stored model puts its start at.
struct ReportSegment {
  uint32_t segment = 0;
  int64_t from_ns = 0;  // host time (INT64_MIN: the recording's start)
  uint64_t models = 0;
  uint64_t worst_model_ns = 0;  // the largest uncertainty of its models
  uint64_t records = 0;         // device records whose converted time falls in it
  uint64_t worst_claim_ns = 0;  // their largest bounded claim
  uint64_t unbounded = 0;       // of them, without a bound
};

// How a device's clock stands against the host's, in the one sign
// convention of ClockStanding (perfq/trace.h): from the last clock model
// of the recording, or from the offline fit with --resync.
struct ReportSync {
  uint16_t source = 0;
  std::string name;
  bool synchronized = false;  // a valid model exists (else standing is zero)
  ClockStanding standing;
  uint64_t uncertainty_ns = 0;              // that model's claimed bound, rounded up
  uint64_t worst_uncertainty_ns = 0;        // the largest claim of any model of the recording
  uint64_t samples = 0;                     // sync samples stored for the device
  uint64_t models = 0;                      // clock models stored for the device
  uint64_t segments = 0;                    // distinct segments among them
  bool resynced = false;                    // figures are from the offline fit
  ReportClaims claims;                      // what the recorded times claim
  std::vector<ReportSegment> segment_list;  // in host-time order
};

// A counter's values (its records' args), with the host times of its
// smallest and largest (the first of each), to find them on the timeline.
struct ReportValues {
  uint64_t min = 0;
  uint64_t max = 0;
  double mean = 0;
  int64_t min_at_ns = 0;
  int64_t max_at_ns = 0;
};

// What an event whose arg is a byte count (EventInfo::bytes(): declared
// when it was registered) moved.  A call is a BEGIN or INSTANT record of it:
// a range's bytes are its BEGIN's arg (its END's is not counted).
struct ReportThroughput {
  uint64_t calls = 0;
  double bytes = 0;  // summed over the calls (exact below 2^53)
  uint64_t min_bytes = 0;
  uint64_t max_bytes = 0;
  int64_t max_at_ns = 0;  // host time of the (first) largest call
  double bytes_per_call = 0;
  double bytes_per_s = 0;  // bytes over the recording's duration
  // Ranges: the bytes of the ranges that closed, over their summed
  // durations: the rate while a transfer is in progress.
  uint64_t ranges = 0;
  double range_bytes = 0;
  double range_ns = 0;
  double in_range_bytes_per_s = 0;  // 0 without closed ranges of nonzero length
  // The PCIe link its share is of (each direction): a device event's own
  // device's, a host event's the one device of its host with link figures.
  // link_source 0 and no shares when there is no such link (none known, or
  // several devices: which one the bytes crossed is not recorded).
  uint16_t link_source = 0;
  uint32_t links_known = 0;  // devices with link figures it could be (0, 1 or several)
  std::string link;          // "Gen4 x8"
  double link_bytes_per_s = 0;
  double link_share = 0;           // bytes_per_s / link_bytes_per_s
  double in_range_link_share = 0;  // in_range_bytes_per_s / link_bytes_per_s
};

struct ReportEvent {
  uint16_t source = 0;
  uint32_t event = 0;
  std::string name;
  uint16_t kind = 0;
  uint64_t count = 0;
  double rate_per_s = 0;
  ReportValues values;                         // PERFQ_KIND_COUNTER only
  std::optional<ReportThroughput> throughput;  // events whose arg is a byte count
};

// Durations of begin/end pairs: an END closes the innermost open BEGIN of
// its (source, stream); named after the BEGIN's event.
struct ReportPair {
  uint16_t source = 0;
  std::string name;
  LatencyStats duration;
  int64_t max_at_ns = 0;  // host time the longest (the first of them) began
};

// A range inside another on the same stream (a copy inside an iteration):
// how much of the enclosing ranges' time it takes, as `nsys stats` gives a
// percentage of time.  share = child_ns / parent_ns, where child_ns is the
// time of the child ranges that closed inside an open parent of that name
// and parent_ns the time of every parent range of that name.
struct ReportNested {
  uint16_t source = 0;
  std::string parent;
  std::string child;
  uint64_t count = 0;  // child ranges inside a parent
  double child_ns = 0;
  double parent_ns = 0;
  double share = 0;
};

// Where the trace has scheduler events (perfqctl start --kernel-events
// sched): per complete job, how long the thread that recorded job_submit
// was switched out between the job's submit and complete.
struct ReportOffCpuJob {
  uint64_t corr_id = 0;
  uint32_t tid = 0;
  int64_t off_cpu_ns = 0;
  int64_t latency_ns = 0;  // submit to complete
};
struct ReportOffCpu {
  bool available = false;     // the trace has sched events and thread ids
  uint64_t jobs = 0;          // complete jobs whose submitting thread is known
  uint64_t jobs_off_cpu = 0;  // of those, jobs during which it was off-CPU
  LatencyStats off_cpu;       // over the jobs_off_cpu jobs
  // Switch-ins the kernel did not deliver: a thread was seen running (its
  // record, syscall or uprobe) while switched out; it is taken to have run
  // from its last wakeup.
  uint64_t inferred_switch_ins = 0;
  // Of those, the ones an application record revealed: a record of a thread
  // while it was switched out (0 when the timeline lines up).
  uint64_t records_while_off = 0;
  std::vector<ReportOffCpuJob> worst;  // the longest off-CPU times, longest first
};

// A complete job with its four host times (device times converted).
struct ReportJob {
  uint64_t corr_id = 0;
  int64_t submit_ns = 0;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  int64_t complete_ns = 0;
  int64_t latency_ns() const { return complete_ns - submit_ns; }
};
inline constexpr size_t kWorstJobs = 10;

struct ReportJobs {
  uint64_t count = 0;       // jobs with all four of submit/start/end/complete
  uint64_t incomplete = 0;  // correlation ids seen without all four
  LatencyStats submit_to_start;
  LatencyStats start_to_end;
  LatencyStats end_to_complete;
  // The same three distributions binned on a log axis.
  ReportHistogram submit_to_start_bins;
  ReportHistogram start_to_end_bins;
  ReportHistogram end_to_complete_bins;
  std::vector<ReportJob> worst;  // the kWorstJobs longest submit-to-complete, longest first
  ReportOffCpu off_cpu;
};

// The recording over time, on one axis: bins of bin_ns from start_ns (the
// recording's start where the trace states it, else its first record; an
// earlier time counts in the first bin).  The width doubles (pairs of bins
// merge) whenever the bins would exceed kTimelineMaxBins, so memory stays
// bounded whatever the length.
inline constexpr size_t kTimelineMaxBins = 512;
struct TimelineStream {
  uint16_t source = 0;
  uint16_t stream = 0;
  std::vector<uint64_t> records;  // records per bin
  std::vector<uint64_t> lost;     // losses noted per bin (LOST args, loss reports, index gaps)
};
struct TimelineSync {
  uint16_t source = 0;
  std::vector<uint64_t> rounds;  // sync rounds per bin (by the host time of their samples)
  std::vector<uint64_t> failed;  // of them, rounds that gave no observation
  // Per bin, the largest |residual| of a round against the clock model in
  // force when it was read (observed host time minus the model's, ns), and
  // the largest bound a stored model claimed.  NaN: none in the bin.
  std::vector<double> worst_residual_ns;
  std::vector<double> claimed_bound_ns;
};
struct ReportTimeline {
  int64_t start_ns = 0;
  int64_t bin_ns = 0;
  size_t bins = 0;
  std::vector<TimelineStream> streams;
  std::vector<TimelineSync> sync;
};

// A job proven out of causal order: its four host times, what each claims
// (0 for a host time, kClaimUnbounded for none) and how it was converted,
// and the step that broke the order (0: submit > start, 1: start > end,
// 2: end > complete) by how much beyond the two claims.
struct ReportViolation {
  uint64_t corr_id = 0;
  int64_t t[4] = {};
  uint32_t claim[4] = {};
  TraceConversion conv[4] = {};
  int step = 0;
  int64_t beyond_ns = 0;
};
inline constexpr size_t kViolationsListed = 10;

struct TraceReport {
  std::string path;
  TraceMetadata metadata;
  uint64_t chunks = 0;
  bool clean_end = false;
  // Non-empty when the trace ended at a torn or corrupt chunk: the reader's
  // message (with the byte offset); the report covers everything before it.
  std::string stopped_early;
  uint64_t stop_offset = 0;
  // Faults of the file's structure the reader read past (TraceProblem).
  std::vector<TraceProblem> problems;

  int64_t first_ns = 0;  // host times of the first and last record
  int64_t last_ns = 0;
  // The recording's: from the recorder's start to its stop where the trace
  // states them (metadata options start_ns and stop_ns), else first to last
  // record.  Event rates are per this duration.
  int64_t duration_ns = 0;
  bool duration_of_recording = false;
  int64_t recording_start_ns = 0;
  int64_t recording_stop_ns = 0;
  uint64_t records_host = 0;
  uint64_t records_device = 0;
  uint64_t lost_host = 0;
  uint64_t lost_device = 0;
  bool index_gaps_counted = true;  // false under an event filter
  uint64_t unmatched_ends = 0;     // END with no open BEGIN on its stream
  std::vector<ReportStream> streams;
  std::vector<ReportSync> sync;
  std::vector<std::string> resync_notes;  // devices --resync could not fit
  std::vector<ReportEvent> events;
  std::vector<ReportPair> pairs;
  std::vector<ReportNested> nested;
  ReportJobs jobs;
  // Complete jobs not submit <= start <= end <= complete by more than the
  // times' claims (the sync bounds) allow: a proven violation.
  uint64_t causality_violations = 0;
  std::vector<ReportViolation> violation_list;  // the first kViolationsListed of them
  // Out of that order, but within the claims (or with a time that has no
  // claim): what the clocks' uncertainty allows, not proof of a bug.
  uint64_t causality_within_bounds = 0;
  ReportTimeline timeline;
};

// Analyses the trace at `path`.  Fails only when the file cannot be opened
// or read at all; a torn tail is reported in TraceReport::stopped_early.
Result<TraceReport> analyze_trace(const std::string& path, const TraceReportOptions& options = {});

std::string report_to_json(const TraceReport& r);  // the `--json` document, pretty-printed
std::string report_to_text(const TraceReport& r);  // for people
// One self-contained HTML page (`perfqctl report --html`): the JSON document
// of report_to_json() inlined and drawn by Chart.js, whose source (the
// library's UMD build, chart.min.js) is `chartjs` and is inlined too, so the
// page fetches nothing when it is opened.
std::string report_to_html(const TraceReport& r, std::string_view chartjs);
// Two runs side by side (`perfqctl report A B`): every figure of the JSON
// report that both have (streams and events matched by name), A, B and the
// change (absolute and relative).
std::string report_compare_text(const TraceReport& a, const TraceReport& b);
std::string report_compare_json(const TraceReport& a, const TraceReport& b);

}  // namespace perfq
