// analyze_trace(): the streaming analysis behind `perfqctl report` (one
// pass of the Analyzer visitor; with --resync a first pass collects the
// sync samples for the offline fit).
#include "perfq/report.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_map>

#include <fmt/format.h>

#include "analysis/job_roles.h"
#include "analysis/sync_residuals.h"
#include "analysis/timeline.h"
#include "perfq_kevent.h"
#include "sync/sync.h"

namespace perfq {

// ---------------------------------------------------------------------------
// The analysis visitor

namespace {

uint32_t stream_key(uint16_t source, uint16_t stream) { return (uint32_t{source} << 16) | stream; }
uint64_t event_key(uint16_t source, uint32_t event) { return (uint64_t{source} << 32) | event; }

// Where losses were seen: loss reports arrive in file order (a loss chunk
// written at the stop may come before records of earlier times), so first
// and last are by time.
struct LossesSeen {
  uint64_t events = 0;
  int64_t first_ns = 0;
  uint64_t first_index = 0;
  int64_t last_ns = 0;
  void note(int64_t t, uint64_t index) { add({1, t, index, t}); }
  void add(const LossesSeen& o) {
    if (o.events == 0) return;
    if (events == 0 || o.first_ns < first_ns) {
      first_ns = o.first_ns;
      first_index = o.first_index;
    }
    if (events == 0 || o.last_ns > last_ns) last_ns = o.last_ns;
    events += o.events;
  }
};

struct StreamState {
  ReportStream stat;
  LossesSeen reported;  // LOST records and loss reports
  LossesSeen gaps;      // index gaps (losses only if they are not filled later)
  bool seen = false;
  uint64_t last_index = 0;
  struct Open {
    uint32_t event = 0;
    int64_t t = 0;
    uint64_t bytes = 0;  // its byte count, for an event whose arg is one
  };
  std::vector<Open> open;  // BEGINs not yet ended, innermost last
};

// An event's byte counts as they come (ReportThroughput).
struct BytesState {
  uint64_t calls = 0;
  long double bytes = 0;  // 64 bits of mantissa: exact to 2^64
  uint64_t min = 0, max = 0;
  int64_t max_at_ns = 0;
  uint64_t ranges = 0;
  long double range_bytes = 0;
  long double range_ns = 0;
};

struct Job {
  int64_t t[4] = {};
  // What each time vouches for: 0 for a host time (the clock itself),
  // the conversion's claim for a device time, kClaimUnbounded for none.
  uint32_t claim[4] = {};
  TraceConversion conv[4] = {};
  uint8_t mask = 0;
  uint32_t tid = 0;           // the submitting thread, 0 if unknown
  int64_t off_at_submit = 0;  // its off-CPU total at the submit
};

// A thread's time off the CPU so far, from its sched_switch out/in events
// (in time order).  Before its first event it is taken to be running.
struct ThreadSched {
  int64_t off_total = 0;
  int64_t off_since = -1;  // switched out at, -1 while running
  int64_t woken_at = -1;   // its last wakeup while switched out
  int64_t off_at(int64_t t) const {
    return off_total + (off_since >= 0 && t > off_since ? t - off_since : 0);
  }
};
constexpr size_t kWorstOffCpu = 10;

using analysis::rates_of;

// How --resync converts one device's times: the sync module's piecewise
// offline model, and its summary for the sync line.
struct Resync {
  ClockModel summary;
  double worst_ns = 0;  // the largest claim of any of its knots
  std::shared_ptr<const PiecewiseModel> piecewise;
};

class Analyzer : public TraceVisitor {
 public:
  Analyzer(TraceReport& r, const std::map<uint16_t, Resync>* resync, bool count_gaps)
      : r_(r), resync_(resync), count_gaps_(count_gaps) {
    r_.index_gaps_counted = count_gaps;
  }

  Status on_metadata(const TraceMetadata& m) override {
    r_.metadata = m;
    evinfo_.clear();  // a later chunk may redefine a source's dictionary
    tid_of_.clear();
    sched_ = false;
    for (const auto& s : m.sources) {
      for (const auto& th : s.threads) tid_of_[stream_key(s.id, th.stream)] = th.tid;
      if (s.kind == TraceSourceKind::kKernel && s.id == PERFQ_KERNEL_SOURCE &&
          s.find_event(PERFQ_KEV_SCHED_OUT))
        sched_ = true;
    }
    r_.jobs.off_cpu.available = r_.jobs.off_cpu.available || (sched_ && !tid_of_.empty());
    if (auto it = m.options.find("start_ns"); it != m.options.end()) {
      char* end = nullptr;
      errno = 0;
      const long long v = std::strtoll(it->second.c_str(), &end, 10);
      if (!errno && end != it->second.c_str() && !*end) timeline_.start_at(v);
    }
    return Status::ok();
  }

  Status on_records(std::span<const TraceRecord> recs) override {
    for (const TraceRecord& in : recs) {
      int64_t t = in.time_ns;
      if (resync_ && in.domain() == PERFQ_CLOCK_DEVICE) {
        auto it = resync_->find(in.source);
        // Where a backward clock step made device times repeat, the
        // segment is the one that puts the record nearest its recorded
        // time (seconds apart against microseconds of model error).
        if (it != resync_->end())
          t = static_cast<int64_t>(
              it->second.piecewise->to_host_near(in.rec.time, static_cast<uint64_t>(in.time_ns)));
      }
      record(in, t);
    }
    return Status::ok();
  }

  Status on_sync_samples(std::span<const TraceSyncSample> s) override {
    for (const auto& x : s) ++sync_[x.source].samples;
    for (const auto& rr : residuals_.rounds(s, r_.metadata))
      timeline_.add_round(rr.source, rr.time_ns, rr.failed, rr.residual_ns);
    return Status::ok();
  }

  Status on_clock_models(std::span<const TraceClockModel> ms) override {
    for (const auto& m : ms) {
      auto& d = sync_[m.source];
      ++d.models;
      // Stated at the end, with the source's rates (clock_standing()).
      if (auto cm = ClockModel::from_abi(m.model); cm && cm->valid) {
        last_model_[m.source] = *cm;
        timeline_.add_model(m.source, m.installed_ns, m.model.uncertainty_ns);
        d.worst_uncertainty_ns = std::max(d.worst_uncertainty_ns, m.model.uncertainty_ns);
        segment_model(m, *cm);
      }
      segments_[m.source].insert(m.model.segment);
      residuals_.on_model(m);
    }
    return Status::ok();
  }

  Status on_losses(std::span<const TraceLoss> ls) override {
    for (const auto& l : ls) {
      StreamState& st = stream(l.source, l.stream);
      st.stat.reported_lost += l.count;
      st.reported.note(l.time_ns, l.last_index + 1);
      timeline_.add_lost(l.source, l.stream, l.time_ns, l.count);
    }
    return Status::ok();
  }

  void finish(const TraceReportOptions& opt) {
    if (have_time_) {
      r_.first_ns = first_;
      r_.last_ns = last_;
      r_.duration_ns = last_ - first_;
    }
    recording_interval();
    finish_streams();
    const double secs = static_cast<double>(r_.duration_ns) / 1e9;
    for (auto& [key, e] : events_) {
      e.rate_per_s = secs > 0 ? static_cast<double>(e.count) / secs : 0;
      if (auto b = bytes_.find(key); b != bytes_.end())
        e.throughput = throughput(e, b->second, secs);
      r_.events.push_back(e);
    }
    for (auto& [key, h] : pairs_) {
      r_.pairs.push_back({key.first, key.second, h.summary(), longest_[key].second});
    }
    for (auto& [key, n] : nested_) {
      const auto& [source, parent, child] = key;
      n.source = source;
      n.parent = parent;
      n.child = child;
      if (auto p = pairs_.find({source, parent}); p != pairs_.end()) {
        const LatencyStats d = p->second.summary();
        n.parent_ns = d.mean * static_cast<double>(d.count);
      }
      n.share = n.parent_ns > 0 ? n.child_ns / n.parent_ns : 0;
      r_.nested.push_back(n);
    }
    finish_sync(opt);
    finish_jobs();
    r_.timeline = timeline_.finish();
  }

 private:
  // A recorder that states its interval (start_ns, stop_ns: host times)
  // gives the duration and rates of the recording, not of its records.
  void recording_interval() {
    const auto start = r_.metadata.option_int("start_ns"), stop = r_.metadata.option_int("stop_ns");
    if (start && stop && *stop >= *start) {
      r_.recording_start_ns = *start;
      r_.recording_stop_ns = *stop;
      r_.duration_ns = *stop - *start;
      r_.duration_of_recording = true;
    }
  }

  void finish_streams() {
    for (auto& [key, st] : streams_) {
      st.stat.lost = std::max(st.stat.reported_lost, st.stat.gap_lost);
      // Gaps that records sorted late filled were no losses (a stream's
      // times converted out of order: around a clock step, say).
      LossesSeen seen = st.reported;
      if (st.stat.gap_lost > 0) seen.add(st.gaps);
      st.stat.loss_events = seen.events;
      st.stat.first_loss_ns = seen.first_ns;
      st.stat.first_loss_index = seen.first_index;
      st.stat.last_loss_ns = seen.last_ns;
      if (is_device(st.stat.source)) {
        r_.lost_device += st.stat.lost;
      } else {
        r_.lost_host += st.stat.lost;
      }
      r_.streams.push_back(st.stat);
    }
  }

  // A sync line per device: its last stored model's standing (or, with
  // --resync, the offline model's), and the claims of its times.
  void finish_sync(const TraceReportOptions& opt) {
    for (const auto& s : r_.metadata.sources) {
      if (s.kind == TraceSourceKind::kDevice) sync_[s.id];  // every device gets a line
    }
    for (auto& [src, d] : sync_) {
      d.source = src;
      const TraceSource* si = r_.metadata.find_source(src);
      d.name = si ? si->name : fmt::format("source {}", src);
      d.segments = segments_[src].size();
      const ClockRates rates = rates_of(si);
      if (auto lm = last_model_.find(src); lm != last_model_.end()) {
        d.standing = clock_standing(lm->second, rates);
        d.synchronized = true;
      }
      if (opt.resync && resync_) {
        auto it = resync_->find(src);
        if (it != resync_->end()) {
          d.standing = clock_standing(it->second.summary, rates);
          d.worst_uncertainty_ns = static_cast<uint64_t>(std::ceil(it->second.worst_ns));
          d.synchronized = true;
          d.resynced = true;
        }
      }
      d.uncertainty_ns = static_cast<uint64_t>(std::ceil(d.standing.bound_ns));
      if (auto c = claims_.find(src); c != claims_.end()) {
        d.claims = c->second.totals;
        d.claims.claim_ns = c->second.hist.summary();
        d.segment_list = c->second.segments;
      }
      r_.sync.push_back(d);
    }
  }

  void finish_jobs() {
    r_.jobs.count = job_count_;
    r_.jobs.incomplete = jobs_.size();
    r_.jobs.submit_to_start = lat_[0].summary();
    r_.jobs.start_to_end = lat_[1].summary();
    r_.jobs.end_to_complete = lat_[2].summary();
    r_.jobs.off_cpu.off_cpu = off_cpu_.summary();
    std::sort(worst_.begin(), worst_.end(), [](const ReportOffCpuJob& a, const ReportOffCpuJob& b) {
      return a.off_cpu_ns > b.off_cpu_ns;
    });
    r_.jobs.off_cpu.worst = worst_;
    r_.jobs.submit_to_start_bins = lat_[0].log_bins(10);
    r_.jobs.start_to_end_bins = lat_[1].log_bins(10);
    r_.jobs.end_to_complete_bins = lat_[2].log_bins(10);
    std::sort(worst_jobs_.begin(), worst_jobs_.end(), [](const ReportJob& a, const ReportJob& b) {
      return a.latency_ns() > b.latency_ns();
    });
    r_.jobs.worst = worst_jobs_;
  }

  bool is_device(uint16_t source) const {
    const TraceSource* s = r_.metadata.find_source(source);
    return s && s->kind == TraceSourceKind::kDevice;
  }

  StreamState& stream(uint16_t source, uint16_t stream) {
    StreamState& st = streams_[stream_key(source, stream)];
    st.stat.source = source;
    st.stat.stream = stream;
    return st;
  }

  // Event info, cached per (source, event).
  struct EvInfo {
    std::string name;
    JobRole role = kNoRole;
    EventInfo::Bytes bytes = EventInfo::Bytes::kNone;
  };
  const EvInfo& info(uint16_t source, uint32_t event) {
    auto [it, fresh] = evinfo_.try_emplace(event_key(source, event));
    if (fresh) {
      const TraceSource* s = r_.metadata.find_source(source);
      const EventInfo* e = s ? s->find_event(event) : nullptr;
      it->second.name = e ? e->name : fmt::format("event_{}", event);
      it->second.role = job_role(it->second.name);
      if (e) it->second.bytes = e->bytes();
    }
    return it->second;
  }

  void record(const TraceRecord& in, int64_t t) {
    const perfq_record& rec = in.rec;
    if (!have_time_) {
      first_ = last_ = t;
      have_time_ = true;
    }
    first_ = std::min(first_, t);
    last_ = std::max(last_, t);
    if (in.kind() == PERFQ_KIND_LOST) {
      // A count of records lost, not a record: neither in the record counts
      // nor an event of its own, and its index (the stream's next) is no
      // record's (the next record shows the gap it reports).
      StreamState& st = stream(in.source, rec.stream);
      st.stat.reported_lost += rec.arg;
      st.reported.note(t, rec.index);
      timeline_.add_lost(in.source, rec.stream, t, rec.arg);
      return;
    }
    if (is_device(in.source)) {
      ++r_.records_device;
      claim(in);
    } else {
      ++r_.records_host;
    }
    StreamState& st = stream(in.source, rec.stream);
    ++st.stat.records;
    timeline_.add_records(in.source, rec.stream, t, 1);
    if (count_gaps_ && st.seen && rec.index > st.last_index + 1) {
      st.stat.gap_lost += rec.index - st.last_index - 1;
      st.gaps.note(t, rec.index);
      timeline_.add_lost(in.source, rec.stream, t, rec.index - st.last_index - 1);
    } else if (st.seen && rec.index < st.last_index && st.stat.gap_lost > 0) {
      // A record that sorted after a later one of its stream (two device
      // times a model change converted out of order) fills the gap it
      // left: it was late, not lost.
      --st.stat.gap_lost;
    }
    if (!st.seen || rec.index > st.last_index) st.last_index = rec.index;
    st.seen = true;

    const EvInfo& ev = info(in.source, rec.event);
    const JobRole role = ev.role;  // `ev` may move when info() inserts below
    const EventInfo::Bytes bytes_in = ev.bytes;
    uint64_t bytes = 0;
    auto [eit, fresh] = events_.try_emplace(event_key(in.source, rec.event));
    if (fresh) {
      eit->second.source = in.source;
      eit->second.event = rec.event;
      eit->second.name = ev.name;
      eit->second.kind = in.kind();
    }
    ++eit->second.count;
    if (in.kind() == PERFQ_KIND_COUNTER) counter_value(eit->second, rec.arg, t);
    if (bytes_in != EventInfo::Bytes::kNone &&
        (in.kind() == PERFQ_KIND_BEGIN || in.kind() == PERFQ_KIND_INSTANT)) {
      bytes = EventInfo::bytes_of(bytes_in, rec.arg);
      byte_call(bytes_[event_key(in.source, rec.event)], bytes, t);
    }

    switch (in.kind()) {
      case PERFQ_KIND_BEGIN:
        if (st.open.size() < 1024) st.open.push_back({rec.event, t, bytes});
        break;
      case PERFQ_KIND_END:
        if (st.open.empty()) {
          ++r_.unmatched_ends;
        } else {
          const auto [bev, bt, bbytes] = st.open.back();
          st.open.pop_back();
          if (info(in.source, bev).bytes != EventInfo::Bytes::kNone && t >= bt) {
            BytesState& b = bytes_[event_key(in.source, bev)];
            ++b.ranges;
            b.range_bytes += bbytes;
            b.range_ns += static_cast<long double>(t - bt);
          }
          const std::string& child = info(in.source, bev).name;
          pairs_[{in.source, child}].add(t - bt);
          auto [longest, first] = longest_.try_emplace({in.source, child}, t - bt, bt);
          if (!first && t - bt > longest->second.first) longest->second = {t - bt, bt};
          if (!st.open.empty()) {
            auto& n = nested_[{in.source, info(in.source, st.open.back().event).name, child}];
            ++n.count;
            n.child_ns += static_cast<double>(t - bt);
          }
        }
        break;
      default:
        break;
    }
    if (sched_) sched_event(in, t);
    if (role != kNoRole)
      job(role, rec.arg, t, in.conv == TraceConversion::kNone ? 0 : in.claim_ns, in.conv, in.source,
          rec.stream);
  }

  // A device record's claim, in its device's totals and in the segment its
  // recorded time falls in (the newest that starts at or before it).
  void claim(const TraceRecord& in) {
    if (in.conv == TraceConversion::kNone && in.domain() != PERFQ_CLOCK_DEVICE) return;
    ClaimState& c = claims_[in.source];
    ++c.totals.records;
    const bool bounded = in.conv != TraceConversion::kNone && in.claim_ns != kClaimUnbounded;
    switch (in.conv) {
      case TraceConversion::kNone:
        ++c.totals.unclaimed;
        break;
      case TraceConversion::kModel:
        ++c.totals.by_daemon;
        break;
      case TraceConversion::kDevice:
        ++c.totals.by_device;
        break;
      case TraceConversion::kForced:
        ++c.totals.forced;
        break;
      default:
        ++c.totals.unclaimed;
        break;
    }
    if (in.conv != TraceConversion::kNone && in.claim_ns == kClaimUnbounded) {
      ReportClaims& t = c.totals;
      if (t.unbounded == 0 || in.time_ns < t.unbounded_first_ns) t.unbounded_first_ns = in.time_ns;
      if (t.unbounded == 0 || in.time_ns > t.unbounded_last_ns) t.unbounded_last_ns = in.time_ns;
      ++t.unbounded;
    }
    if (bounded) c.hist.add(in.claim_ns);
    auto& segs = c.segments;
    if (segs.empty()) return;
    auto it = std::upper_bound(segs.begin(), segs.end(), in.time_ns,
                               [](int64_t t, const ReportSegment& s) { return t < s.from_ns; });
    ReportSegment& sg = it == segs.begin() ? segs.front() : *(it - 1);
    ++sg.records;
    if (bounded) sg.worst_claim_ns = std::max<uint64_t>(sg.worst_claim_ns, in.claim_ns);
    if (in.conv != TraceConversion::kNone && in.claim_ns == kClaimUnbounded) ++sg.unbounded;
  }

  // A stored model in its segment's entry (segments by the host time their
  // first model starts them at; the first from the recording's start).
  void segment_model(const TraceClockModel& m, const ClockModel& cm) {
    auto& segs = claims_[m.source].segments;
    auto it = std::find_if(segs.begin(), segs.end(),
                           [&](const ReportSegment& s) { return s.segment == m.model.segment; });
    if (it == segs.end()) {
      ReportSegment s;
      s.segment = m.model.segment;
      s.from_ns = segs.empty() ? INT64_MIN : static_cast<int64_t>(cm.to_host(cm.valid_from_device));
      if (!segs.empty()) s.from_ns = std::max(s.from_ns, segs.back().from_ns);
      segs.push_back(s);
      it = segs.end() - 1;
    }
    ++it->models;
    it->worst_model_ns = std::max<uint64_t>(it->worst_model_ns, m.model.uncertainty_ns);
  }

  // Scheduler state of the threads, from their switch events; any sign of
  // life of a thread (its own record, syscall or uprobe) also ends a time
  // off the CPU: a switch-in the kernel did not deliver.  It is then taken
  // to have run from its last wakeup (an off-CPU time that is a lower bound).
  void sched_event(const TraceRecord& in, int64_t t) {
    const perfq_record& rec = in.rec;
    uint32_t tid = 0;
    bool alive = false;
    if (in.source == PERFQ_KERNEL_SOURCE) {
      tid = static_cast<uint32_t>(rec.arg);
      ThreadSched& ts = sched_of_[tid];
      switch (rec.event) {
        case PERFQ_KEV_SCHED_OUT:
          if (ts.off_since < 0) {
            ts.off_since = t;
            ts.woken_at = -1;
          }
          return;
        case PERFQ_KEV_SCHED_IN:
          if (ts.off_since >= 0) {
            ts.off_total += std::max<int64_t>(0, t - ts.off_since);
            ts.off_since = -1;
          }
          return;
        case PERFQ_KEV_SCHED_WAKEUP:
          if (ts.off_since >= 0) ts.woken_at = t;
          return;
        default:
          alive = true;  // a syscall or uprobe runs in the thread
      }
    } else {
      auto it = tid_of_.find(stream_key(in.source, rec.stream));
      if (it == tid_of_.end()) return;
      tid = it->second;
      alive = true;
    }
    auto it = sched_of_.find(tid);
    if (!alive || it == sched_of_.end() || it->second.off_since < 0) return;
    ThreadSched& ts = it->second;
    const int64_t ran_from = std::min(t, std::max(ts.off_since, ts.woken_at));
    ts.off_total += std::max<int64_t>(0, ran_from - ts.off_since);
    ts.off_since = -1;
    ++r_.jobs.off_cpu.inferred_switch_ins;
    if (in.source != PERFQ_KERNEL_SOURCE) ++r_.jobs.off_cpu.records_while_off;
  }

  // Whether a complete job's times are out of order, and whether that is
  // proven: reversed by more than the two times' claims add up to (a
  // reversal within them is what the clocks' uncertainty allows; with no
  // claim nothing is proven).
  void check_order(uint64_t id, const Job& j) {
    bool reversed = false;
    std::optional<ReportViolation> proven;
    for (int i = 0; i < 3; ++i) {
      if (j.t[i] <= j.t[i + 1]) continue;
      reversed = true;
      if (j.claim[i] == kClaimUnbounded || j.claim[i + 1] == kClaimUnbounded) continue;
      const int64_t beyond = j.t[i] - j.t[i + 1] - int64_t{j.claim[i]} - int64_t{j.claim[i + 1]};
      if (beyond > 0 && !proven) {
        proven.emplace();
        proven->corr_id = id;
        std::copy(std::begin(j.t), std::end(j.t), proven->t);
        std::copy(std::begin(j.claim), std::end(j.claim), proven->claim);
        std::copy(std::begin(j.conv), std::end(j.conv), proven->conv);
        proven->step = i;
        proven->beyond_ns = beyond;
      }
    }
    if (proven) {
      ++r_.causality_violations;
      if (r_.violation_list.size() < kViolationsListed) r_.violation_list.push_back(*proven);
    } else if (reversed) {
      ++r_.causality_within_bounds;
    }
  }

  void job(JobRole role, uint64_t id, int64_t t, uint32_t claim, TraceConversion conv,
           uint16_t source, uint16_t stream) {
    Job& j = jobs_[id];
    j.t[role] = t;
    j.claim[role] = claim;
    j.conv[role] = conv;
    j.mask |= static_cast<uint8_t>(1u << role);
    if (role == 0 && sched_) {
      auto it = tid_of_.find(stream_key(source, stream));
      if (it != tid_of_.end()) {
        j.tid = it->second;
        j.off_at_submit = sched_of_[j.tid].off_at(t);
      }
    }
    if (j.mask != 0xf) return;
    if (j.tid != 0) {
      // Records come in time order: the thread's total now, less at submit.
      const int64_t off = sched_of_[j.tid].off_at(std::max(t, j.t[3])) - j.off_at_submit;
      auto& oc = r_.jobs.off_cpu;
      ++oc.jobs;
      if (off > 0) {
        ++oc.jobs_off_cpu;
        off_cpu_.add(off);
        const ReportOffCpuJob w{id, j.tid, off, j.t[3] - j.t[0]};
        if (worst_.size() < kWorstOffCpu) {
          worst_.push_back(w);
        } else {
          auto min = std::min_element(
              worst_.begin(), worst_.end(),
              [](const auto& a, const auto& b) { return a.off_cpu_ns < b.off_cpu_ns; });
          if (min->off_cpu_ns < off) *min = w;
        }
      }
    }
    ++job_count_;
    worst_job({id, j.t[0], j.t[1], j.t[2], j.t[3]});
    lat_[0].add(j.t[1] - j.t[0]);
    lat_[1].add(j.t[2] - j.t[1]);
    lat_[2].add(j.t[3] - j.t[2]);
    check_order(id, j);
    jobs_.erase(id);
  }

  // A counter's value: min and max with their first times, and the mean
  // (a running one: exact enough in double for any count).
  static void counter_value(ReportEvent& e, uint64_t v, int64_t t) {
    ReportValues& s = e.values;
    if (e.count == 1 || v < s.min) {
      s.min = v;
      s.min_at_ns = t;
    }
    if (e.count == 1 || v > s.max) {
      s.max = v;
      s.max_at_ns = t;
    }
    s.mean += (static_cast<double>(v) - s.mean) / static_cast<double>(e.count);
  }

  static void byte_call(BytesState& b, uint64_t bytes, int64_t t) {
    if (b.calls == 0 || bytes < b.min) b.min = bytes;
    if (b.calls == 0 || bytes > b.max) {
      b.max = bytes;
      b.max_at_ns = t;
    }
    ++b.calls;
    b.bytes += bytes;
  }

  // The PCIe link a source's bytes crossed, as far as the trace knows: a
  // device's own; for a host's, the one device of that host with link
  // figures (none when it has several: the record does not say which).
  // *known: how many links it could be.
  const TraceSource* link_of(uint16_t source, uint32_t* known) const {
    auto ceiling = [](const TraceSource& s) {
      return s.kind == TraceSourceKind::kDevice && s.pci && s.pci->pcie && s.pci->pcie->link_current
                 ? s.pci->pcie->link_current->ceiling_bytes_per_s()
                 : 0.0;
    };
    *known = 0;
    const TraceSource* src = r_.metadata.find_source(source);
    if (!src) return nullptr;
    if (src->kind == TraceSourceKind::kDevice) {
      *known = ceiling(*src) > 0;
      return *known ? src : nullptr;
    }
    const TraceSource* found = nullptr;
    for (const auto& s : r_.metadata.sources) {
      if (s.host != src->host || ceiling(s) <= 0) continue;
      ++*known;
      found = &s;
    }
    return *known == 1 ? found : nullptr;
  }

  ReportThroughput throughput(const ReportEvent& e, const BytesState& b, double secs) const {
    ReportThroughput t;
    t.calls = b.calls;
    t.bytes = static_cast<double>(b.bytes);
    t.min_bytes = b.min;
    t.max_bytes = b.max;
    t.max_at_ns = b.max_at_ns;
    t.bytes_per_call = b.calls ? t.bytes / static_cast<double>(b.calls) : 0;
    t.bytes_per_s = secs > 0 ? t.bytes / secs : 0;
    t.ranges = b.ranges;
    t.range_bytes = static_cast<double>(b.range_bytes);
    t.range_ns = static_cast<double>(b.range_ns);
    t.in_range_bytes_per_s = t.range_ns > 0 ? t.range_bytes / (t.range_ns / 1e9) : 0;
    if (const TraceSource* l = link_of(e.source, &t.links_known)) {
      const PciLink& link = *l->pci->pcie->link_current;
      t.link_source = l->id;
      t.link = pci_link_name(link);
      t.link_bytes_per_s = link.ceiling_bytes_per_s();
      t.link_share = t.bytes_per_s / t.link_bytes_per_s;
      t.in_range_link_share = t.in_range_bytes_per_s / t.link_bytes_per_s;
    }
    return t;
  }

  // Keeps the kWorstJobs longest jobs (submit to complete).
  void worst_job(const ReportJob& j) {
    if (worst_jobs_.size() < kWorstJobs) {
      worst_jobs_.push_back(j);
      return;
    }
    auto min = std::min_element(
        worst_jobs_.begin(), worst_jobs_.end(),
        [](const ReportJob& a, const ReportJob& b) { return a.latency_ns() < b.latency_ns(); });
    if (min->latency_ns() < j.latency_ns()) *min = j;
  }

  TraceReport& r_;
  const std::map<uint16_t, Resync>* resync_;
  bool count_gaps_ = true;
  analysis::Timeline timeline_;
  std::vector<ReportJob> worst_jobs_;
  bool have_time_ = false;
  int64_t first_ = 0;
  int64_t last_ = 0;
  std::map<uint32_t, StreamState> streams_;
  std::unordered_map<uint64_t, EvInfo> evinfo_;
  std::map<uint64_t, ReportEvent> events_;
  std::unordered_map<uint64_t, BytesState> bytes_;  // event_key -> events whose arg is a byte count
  std::map<std::pair<uint16_t, std::string>, LatencyHistogram> pairs_;
  std::map<std::tuple<uint16_t, std::string, std::string>, ReportNested> nested_;
  // The longest range of each name: its duration and when it began.
  std::map<std::pair<uint16_t, std::string>, std::pair<int64_t, int64_t>> longest_;
  std::map<uint16_t, ReportSync> sync_;
  std::map<uint16_t, std::set<uint32_t>> segments_;
  std::map<uint16_t, ClockModel> last_model_;  // the newest valid model per device
  analysis::SyncResiduals residuals_;          // the sync rounds against their models
  struct ClaimState {
    ReportClaims totals;
    LatencyHistogram hist;
    std::vector<ReportSegment> segments;  // in host-time order
  };
  std::map<uint16_t, ClaimState> claims_;
  std::unordered_map<uint64_t, Job> jobs_;
  uint64_t job_count_ = 0;
  LatencyHistogram lat_[3];
  // Off-CPU time of the submitting threads (kernel sched events).
  bool sched_ = false;
  std::unordered_map<uint32_t, uint32_t> tid_of_;  // stream_key(source, stream) -> tid
  std::unordered_map<uint32_t, ThreadSched> sched_of_;
  LatencyHistogram off_cpu_;
  std::vector<ReportOffCpuJob> worst_;
};

// First pass of --resync: every sync sample, grouped by device.
class SampleCollector : public TraceVisitor {
 public:
  Status on_metadata(const TraceMetadata& m) override {
    metadata = m;
    return Status::ok();
  }
  Status on_sync_samples(std::span<const TraceSyncSample> s) override {
    for (const auto& x : s) samples[x.source].push_back(x);
    return Status::ok();
  }
  TraceMetadata metadata;
  std::map<uint16_t, std::vector<TraceSyncSample>> samples;
};

// The sync module's whole-recording fit over a device's rounds, with its
// nominal rates (a timer rate of 0 in old traces: the clock's rate).  Null
// when the rates are unknown or nothing could be fitted.
std::shared_ptr<const PiecewiseModel> offline_piecewise(
    const TraceSource* src, const std::vector<TraceSyncSample>& samples) {
  const ClockRates rates = rates_of(src);
  if (!rates.validate().is_ok()) return nullptr;
  const std::vector<SyncRound> rounds = sync_rounds_of(samples);
  OfflineFit fit = fit_offline_rounds(rounds, rates);
  if (fit.model.empty() || fit.model.segments().back().knots.empty()) return nullptr;
  return std::make_shared<const PiecewiseModel>(std::move(fit.model));
}

}  // namespace

Result<TraceReport> analyze_trace(const std::string& path, const TraceReportOptions& options) {
  auto reader = TraceReader::open(path);
  if (!reader.is_ok()) return reader.status();
  TraceReport r;
  r.path = path;
  std::map<uint16_t, Resync> models;
  std::error_code size_error;
  const uint64_t bytes_total = std::filesystem::file_size(path, size_error);
  const int passes = options.resync ? 2 : 1;
  // The visitor with a progress callback around it, when one is wanted.
  auto with_progress = [&](TraceVisitor& v, int pass) -> std::unique_ptr<TraceVisitor> {
    if (!options.progress) return nullptr;
    return make_progress_visitor(*reader, size_error ? 0 : bytes_total, pass, passes,
                                 options.progress, v);
  };
  if (options.resync) {
    SampleCollector c;
    auto shown = with_progress(c, 1);
    Status s = reader->read(shown ? *shown : static_cast<TraceVisitor&>(c));
    if (!s.is_ok() && s.code() != Errc::kCorrupt) return s;
    for (auto& [src, samples] : c.samples) {
      Resync rs;
      rs.piecewise = offline_piecewise(c.metadata.find_source(src), samples);
      if (!rs.piecewise) {
        // Too few usable rounds to fit: the device keeps its online times,
        // and the report says so rather than claim a resync.
        r.resync_notes.push_back(fmt::format(
            "source {}: no offline model ({} sync samples could not be fitted); its times are the "
            "recording's own",
            src, samples.size()));
        continue;
      }
      // Summarize the whole-recording model by its last segment: offset at
      // its last knot, rate averaged from its first knot to its last.
      const auto& knots = rs.piecewise->segments().back().knots;
      rs.summary = knots.back();
      const int64_t dd = time_diff(knots.back().device_ref, knots.front().device_ref);
      if (dd > 0) {
        const auto dh =
            static_cast<long double>(time_diff(knots.back().to_host(knots.back().device_ref),
                                               knots.front().to_host(knots.front().device_ref)));
        rs.summary.ns_per_tick = dh / static_cast<long double>(dd);
      }
      // The worst claim of any segment's knots is the whole model's.
      for (const auto& seg : rs.piecewise->segments())
        for (const auto& k : seg.knots) rs.worst_ns = std::max(rs.worst_ns, k.uncertainty_ns);
      models[src] = std::move(rs);
    }
  }
  Analyzer a(r, options.resync ? &models : nullptr, options.filter.events.empty());
  auto filtered = make_filter_visitor(options.filter, a);
  TraceVisitor& inner = options.filter.empty() ? static_cast<TraceVisitor&>(a) : *filtered;
  auto shown = with_progress(inner, passes);
  Status s = reader->read(shown ? *shown : inner);
  if (!s.is_ok()) {
    if (s.code() != Errc::kCorrupt) return s;
    r.stopped_early = s.message();
    r.stop_offset = reader->error_offset();
  }
  r.chunks = reader->summary().chunks;
  r.clean_end = reader->summary().clean_end;
  r.problems = reader->summary().problems;
  a.finish(options);
  return r;
}

}  // namespace perfq
