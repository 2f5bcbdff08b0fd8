// merge_traces(): several hosts' traces on one timeline (perfqctl merge).
//
// Pass 1 reads each input's metadata (with its host clock snapshots), sync
// samples, clock models and losses, and counts its records.  From the
// snapshots it derives, per host, a map from its CLOCK_MONOTONIC to the
// first host's: t + off_i(t) is CLOCK_REALTIME on host i (off_i interpolated
// between the snapshots), less off_0 there.  Pass 2 reads the inputs again,
// each on a thread of its own that converts its records (a source id of its
// own, the time mapped) into batches on a short queue, and merges the
// queues' heads by time into the output: memory holds a few chunks of each
// input, whatever their length.  The map is monotonic, so each input's
// order is kept.
#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <queue>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "perfq/perfq_abi.h"
#include "perfq/trace.h"
#include "perfq_kevent.h"  // PERFQ_KERNEL_SOURCE

namespace perfq {

namespace {

// One input's snapshots as a map of its monotonic time to realtime - monotonic.
class RealtimeOffset {
 public:
  explicit RealtimeOffset(std::vector<TraceHostClock> clocks) : clocks_(std::move(clocks)) {
    std::sort(clocks_.begin(), clocks_.end(),
              [](const auto& a, const auto& b) { return a.monotonic_ns < b.monotonic_ns; });
  }
  bool empty() const { return clocks_.empty(); }
  const std::vector<TraceHostClock>& clocks() const { return clocks_; }
  // realtime - monotonic at monotonic time t: linear between snapshots,
  // the nearest one's outside them.
  int64_t at(int64_t t) const {
    if (clocks_.size() == 1 || t <= clocks_.front().monotonic_ns) return off(clocks_.front());
    if (t >= clocks_.back().monotonic_ns) return off(clocks_.back());
    auto hi = std::upper_bound(clocks_.begin(), clocks_.end(), t,
                               [](int64_t v, const auto& c) { return v < c.monotonic_ns; });
    auto lo = hi - 1;
    const double f = static_cast<double>(t - lo->monotonic_ns) /
                     static_cast<double>(hi->monotonic_ns - lo->monotonic_ns);
    return off(*lo) + static_cast<int64_t>(f * static_cast<double>(off(*hi) - off(*lo)));
  }
  // The most realtime moved against monotonic between two snapshots: what
  // interpolating between them may be off by (a step or a change of slew
  // between them; a steady slew it follows exactly).
  int64_t largest_move() const {
    int64_t m = 0;
    for (size_t k = 1; k < clocks_.size(); ++k)
      m = std::max(m, std::abs(off(clocks_[k]) - off(clocks_[k - 1])));
    return m;
  }
  int64_t widest_bracket() const {
    int64_t w = 0;
    for (const auto& c : clocks_) w = std::max(w, c.bracket_ns);
    return w;
  }
  bool all_synchronized() const {
    return std::all_of(clocks_.begin(), clocks_.end(),
                       [](const auto& c) { return c.synchronized; });
  }
  int64_t worst_esterror() const {
    int64_t e = 0;
    for (const auto& c : clocks_) e = std::max(e, c.esterror_ns);
    return e;
  }

 private:
  static int64_t off(const TraceHostClock& c) { return c.realtime_ns - c.monotonic_ns; }
  std::vector<TraceHostClock> clocks_;
};

// Pass 1: everything but the records.
struct Collected : TraceVisitor {
  TraceMetadata meta;
  std::vector<TraceSyncSample> samples;
  std::vector<TraceClockModel> models;
  std::vector<TraceLoss> losses;
  uint64_t records = 0;
  Status on_metadata(const TraceMetadata& m) override {
    meta = m;
    return Status::ok();
  }
  Status on_records(std::span<const TraceRecord> r) override {
    records += r.size();
    return Status::ok();
  }
  Status on_sync_samples(std::span<const TraceSyncSample> s) override {
    samples.insert(samples.end(), s.begin(), s.end());
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
};

struct Input {
  std::string path;
  Collected c;
  std::optional<RealtimeOffset> offset;
  std::map<uint16_t, uint16_t> ids;  // its source ids -> the merged trace's
  int64_t shift_at_start = 0;
};

// Host time t of input `in` on the reference's timeline.
int64_t to_reference(const Input& in, const Input& ref, int64_t t) {
  if (&in == &ref) return t;
  const int64_t real = t + in.offset->at(t);
  // The reference's offset where its monotonic clock reads about that.
  const int64_t guess = real - ref.offset->at(t);
  return real - ref.offset->at(guess);
}

// A short queue of converted record batches from one reader thread.
class BatchQueue {
 public:
  void push(std::vector<TraceRecord> b) {
    std::unique_lock lock(mu_);
    room_.wait(lock, [&] { return q_.size() < kDepth || abandoned_; });
    if (abandoned_) return;
    q_.push_back(std::move(b));
    ready_.notify_one();
  }
  // An empty batch: the input is done.
  std::vector<TraceRecord> pop() {
    std::unique_lock lock(mu_);
    ready_.wait(lock, [&] { return !q_.empty(); });
    auto b = std::move(q_.front());
    q_.pop_front();
    room_.notify_one();
    return b;
  }
  void abandon() {
    std::lock_guard lock(mu_);
    abandoned_ = true;
    room_.notify_all();
  }

 private:
  static constexpr size_t kDepth = 4;
  std::mutex mu_;
  std::condition_variable room_, ready_;
  std::deque<std::vector<TraceRecord>> q_;
  bool abandoned_ = false;
};

struct Feeder : TraceVisitor {
  const Input& in;
  const Input& ref;
  BatchQueue& q;
  Feeder(const Input& i, const Input& r, BatchQueue& queue) : in(i), ref(r), q(queue) {}
  Status on_records(std::span<const TraceRecord> recs) override {
    std::vector<TraceRecord> b(recs.begin(), recs.end());
    for (auto& r : b) {
      auto it = in.ids.find(r.source);
      if (it != in.ids.end()) r.source = it->second;
      r.time_ns = to_reference(in, ref, r.time_ns);
    }
    if (!b.empty()) q.push(std::move(b));
    return Status::ok();
  }
};

}  // namespace

Result<TraceMergeSummary> merge_traces(const std::vector<std::string>& paths,
                                       const std::string& output,
                                       const TraceMergeOptions& options) {
  if (paths.size() < 2) return Status(Errc::kInvalidArgument, "merge: give two traces or more");
  TraceMergeSummary summary;
  std::vector<Input> inputs(paths.size());
  for (size_t i = 0; i < paths.size(); ++i) {
    Input& in = inputs[i];
    in.path = paths[i];
    auto r = TraceReader::open(in.path);
    if (!r) return r.status();
    const Status s = r->read(in.c);
    if (!s) {
      if (s.code() != Errc::kCorrupt) return s;
      summary.warnings.push_back(s.message() + " (merged what came before)");
    }
    for (const auto& p : r->summary().problems) summary.warnings.push_back(p.message);
    if (in.c.meta.host_clocks.empty())
      return Status(Errc::kInvalidArgument,
                    in.path +
                        ": no snapshots of its host's clocks (written by a perfq that did not "
                        "record them): it cannot be put on another host's timeline");
    in.offset.emplace(in.c.meta.host_clocks);
  }

  // The hosts, their alignment, and every source with an id of its own.
  const Input& ref = inputs[0];
  TraceMetadata merged = ref.c.meta;
  merged.sources.clear();
  merged.hosts.clear();
  std::set<uint16_t> used;
  for (const auto& s : ref.c.meta.sources) used.insert(s.id);
  uint16_t next_id = 1;
  std::set<std::string> names;
  for (size_t i = 0; i < inputs.size(); ++i) {
    Input& in = inputs[i];
    const TraceMetadata& m = in.c.meta;
    TraceHost h;
    h.name = m.host_name.empty() ? "host" : m.host_name;
    for (int n = 2; names.count(h.name); ++n)
      h.name = fmt::format("{}#{}", m.host_name.empty() ? "host" : m.host_name, n);
    names.insert(h.name);
    h.machine_id = m.machine_id;
    h.boot_id = m.boot_id;
    h.kernel = m.kernel;
    h.file = in.path;
    const int64_t t0 = in.offset->clocks().front().monotonic_ns;
    h.offset_ns = to_reference(in, ref, t0) - t0;
    if (i == 0) {
      h.uncertainty_ns = 0;
      h.alignment = "the reference: the merged trace's times are its CLOCK_MONOTONIC";
    } else {
      // The snapshot brackets, and what interpolating between snapshots may
      // be off by on either host.
      const int64_t brackets = (in.offset->widest_bracket() + 1) / 2 +
                               (ref.offset->widest_bracket() + 1) / 2 + in.offset->largest_move() +
                               ref.offset->largest_move();
      if (!m.boot_id.empty() && m.boot_id == ref.c.meta.boot_id) {
        h.uncertainty_ns = brackets;
        h.alignment = fmt::format(
            "recorded on the same kernel as {} (boot id {}): one CLOCK_REALTIME, so the bound "
            "is the two snapshot brackets and how far realtime moved between snapshots",
            merged.hosts[0].name, m.boot_id);
      } else if (in.offset->all_synchronized() && ref.offset->all_synchronized()) {
        h.uncertainty_ns = brackets + in.offset->worst_esterror() + ref.offset->worst_esterror();
        h.alignment = fmt::format(
            "through CLOCK_REALTIME of both hosts, each synchronized (the kernels estimate their "
            "errors at {} and {} us): the bound is those, the snapshot brackets and how far "
            "realtime moved between snapshots",
            in.offset->worst_esterror() / 1000, ref.offset->worst_esterror() / 1000);
      } else {
        h.uncertainty_ns = -1;
        const std::string& who = in.offset->all_synchronized() ? merged.hosts[0].name : h.name;
        h.alignment = fmt::format(
            "through CLOCK_REALTIME, but {}'s was not synchronized (adjtimex STA_UNSYNC: no NTP "
            "or PTP daemon disciplined it) during the recording: no bound on the alignment",
            who);
        summary.warnings.push_back(h.name + ": " + h.alignment);
      }
    }
    merged.hosts.push_back(h);
    for (const auto& s : m.sources) {
      uint16_t id = s.id;
      if (i > 0) {
        while (used.count(next_id) || next_id == PERFQ_KERNEL_SOURCE) {
          if (next_id == UINT16_MAX)
            return Status(Errc::kInvalidArgument, "merge: more sources than 65535 ids");
          ++next_id;
        }
        id = next_id;
        used.insert(id);
      }
      in.ids[s.id] = id;
      TraceSource copy = s;
      copy.id = id;
      copy.host = static_cast<uint16_t>(i);
      if (copy.ended) copy.ended->time_ns = to_reference(in, ref, copy.ended->time_ns);
      merged.sources.push_back(std::move(copy));
    }
  }
  // The recording's interval: the earliest start to the latest stop.
  std::optional<int64_t> start, stop;
  for (const Input& in : inputs) {
    if (auto s = in.c.meta.option_int("start_ns"))
      start = std::min(start.value_or(INT64_MAX), to_reference(in, ref, *s));
    if (auto s = in.c.meta.option_int("stop_ns"))
      stop = std::max(stop.value_or(INT64_MIN), to_reference(in, ref, *s));
  }
  if (start) merged.options["start_ns"] = std::to_string(*start);
  if (stop) merged.options["stop_ns"] = std::to_string(*stop);
  std::string files;
  for (const auto& p : paths) files += (files.empty() ? "" : " ") + p;
  merged.options["merged_from"] = files;

  TraceWriterOptions wo;
  wo.replace = options.replace;
  auto w = TraceWriter::open(output, merged, wo);
  if (!w) return w.status();

  // Samples, models and losses, on the merged timeline.
  for (const Input& in : inputs) {
    std::vector<TraceSyncSample> samples = in.c.samples;
    for (auto& s : samples) {
      s.source = in.ids.count(s.source) ? in.ids.at(s.source) : s.source;
      if (s.has_host()) {
        s.host.before =
            static_cast<uint64_t>(to_reference(in, ref, static_cast<int64_t>(s.host.before)));
        s.host.after =
            static_cast<uint64_t>(to_reference(in, ref, static_cast<int64_t>(s.host.after)));
      }
    }
    if (!samples.empty())
      if (Status s = w->append_sync_samples(samples); !s) return s;
    for (TraceClockModel m : in.c.models) {
      m.source = in.ids.count(m.source) ? in.ids.at(m.source) : m.source;
      m.installed_ns = to_reference(in, ref, m.installed_ns);
      m.model.host_ref_ns = to_reference(in, ref, m.model.host_ref_ns);
      if (Status s = w->append_clock_model(m); !s) return s;
    }
    for (TraceLoss l : in.c.losses) {
      l.source = in.ids.count(l.source) ? in.ids.at(l.source) : l.source;
      l.time_ns = to_reference(in, ref, l.time_ns);
      if (Status s = w->append_loss(l); !s) return s;
    }
  }

  // Records: a reader thread per input, merged by time.
  std::vector<BatchQueue> queues(inputs.size());
  std::vector<Status> results(inputs.size(), Status::ok());
  std::vector<std::thread> readers;
  for (size_t i = 0; i < inputs.size(); ++i)
    readers.emplace_back([&, i] {
      auto r = TraceReader::open(inputs[i].path);
      if (r) {
        Feeder f(inputs[i], ref, queues[i]);
        if (Status s = r->read(f); !s && s.code() != Errc::kCorrupt) results[i] = s;
      } else {
        results[i] = r.status();
      }
      queues[i].push({});
    });
  struct Head {
    std::vector<TraceRecord> batch;
    size_t pos = 0;
  };
  std::vector<Head> heads(inputs.size());
  using Item = std::pair<int64_t, size_t>;  // time, input
  std::priority_queue<Item, std::vector<Item>, std::greater<>> heap;
  auto refill = [&](size_t i) {
    heads[i].batch = queues[i].pop();
    heads[i].pos = 0;
    if (!heads[i].batch.empty()) heap.emplace(heads[i].batch[0].time_ns, i);
  };
  for (size_t i = 0; i < inputs.size(); ++i) refill(i);
  std::vector<TraceRecord> out;
  out.reserve(16384);
  Status written = Status::ok();
  while (!heap.empty() && written) {
    const size_t i = heap.top().second;
    heap.pop();
    Head& h = heads[i];
    out.push_back(h.batch[h.pos++]);
    if (h.pos < h.batch.size())
      heap.emplace(h.batch[h.pos].time_ns, i);
    else
      refill(i);
    if (out.size() == out.capacity()) {
      written = w->append_records(out);
      summary.records += out.size();
      out.clear();
    }
  }
  if (written && !out.empty()) {
    written = w->append_records(out);
    summary.records += out.size();
  }
  for (auto& q : queues) q.abandon();
  for (auto& t : readers) t.join();
  if (!written) return written;
  for (const Status& s : results)
    if (!s) return s;
  if (Status s = w->close(); !s) return s;
  summary.hosts = merged.hosts;
  return summary;
}

}  // namespace perfq
