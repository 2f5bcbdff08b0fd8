#include "merge.h"

#include <algorithm>
#include <chrono>

#include "device/device_clock.h"

namespace perfqd {

using perfq::TraceRecord;

namespace {
bool earlier(const TraceRecord& a, const TraceRecord& b) { return a.time_ns < b.time_ns; }
}  // namespace

Merger::Merger(MergeOptions opts) : opts_(opts) {}
Merger::~Merger() = default;

Merger::Input* Merger::add_input(std::string name, int64_t bound) {
  std::lock_guard lock(mu_);
  inputs_.push_back(std::unique_ptr<Input>(new Input(std::move(name), bound, now_ns())));
  return inputs_.back().get();
}

std::vector<TraceRecord> Merger::take_spare_locked() {
  std::vector<TraceRecord> v;
  if (!spare_.empty()) {
    v = std::move(spare_.back());
    spare_.pop_back();
  } else {
    v.reserve(kRunRecords);
  }
  return v;
}

// A stable sort of a batch made of ascending stretches (a device's batch
// is its streams' records, each stream's in order): merge neighbouring
// stretches pairwise, through the input's scratch buffer, so that nothing
// is allocated once the buffer has grown.
void Merger::sort_batch(Input* in, std::vector<TraceRecord>& v) {
  const size_t n = v.size();
  std::vector<size_t>& bounds = in->sort_bounds_;
  bounds.clear();
  bounds.push_back(0);
  for (size_t i = 1; i < n; ++i)
    if (v[i].time_ns < v[i - 1].time_ns) bounds.push_back(i);
  if (bounds.size() == 1) return;  // already in order
  bounds.push_back(n);
  std::vector<TraceRecord>& tmp = in->sort_scratch_;
  tmp.resize(n);
  std::vector<TraceRecord>* src = &v;
  std::vector<TraceRecord>* dst = &tmp;
  while (bounds.size() > 2) {
    size_t w = 0;
    for (size_t k = 0; k + 1 < bounds.size(); k += 2) {
      const size_t lo = bounds[k];
      const size_t mid = bounds[k + 1];
      const size_t hi = k + 2 < bounds.size() ? bounds[k + 2] : mid;
      std::merge(
          src->begin() + static_cast<ptrdiff_t>(lo), src->begin() + static_cast<ptrdiff_t>(mid),
          src->begin() + static_cast<ptrdiff_t>(mid), src->begin() + static_cast<ptrdiff_t>(hi),
          dst->begin() + static_cast<ptrdiff_t>(lo), earlier);
      bounds[w++] = lo;
    }
    bounds[w++] = n;
    bounds.resize(w);
    std::swap(src, dst);
  }
  if (src != &v) v.swap(tmp);
}

void Merger::push(Input* in, std::vector<TraceRecord>& records, int64_t bound) {
  // The batch is the producer's: sort it before taking the lock.
  sort_batch(in, records);
  const int64_t now = now_ns();
  bool wake = false;
  {
    std::lock_guard lock(mu_);
    size_t i = 0;
    Run* tail = in->runs_.empty() ? nullptr : &in->runs_.back();
    if (tail != nullptr && !records.empty() && tail->pos < tail->recs.size() &&
        records.front().time_ns < tail->recs.back().time_ns &&
        tail->recs.size() + records.size() <= tail->recs.capacity()) {
      // The batch overlaps the end of the input's last run (its streams'
      // records interleave across batches): merge it into that end rather
      // than start a run that would alternate with it record by record.
      auto from = std::upper_bound(tail->recs.begin() + static_cast<ptrdiff_t>(tail->pos),
                                   tail->recs.end(), records.front(), earlier);
      const size_t at = static_cast<size_t>(from - tail->recs.begin());
      std::vector<TraceRecord>& merged = in->merge_scratch_;
      merged.resize(tail->recs.size() - at + records.size());
      std::merge(from, tail->recs.end(), records.begin(), records.end(), merged.begin(), earlier);
      tail->recs.resize(at);
      tail->recs.insert(tail->recs.end(), merged.begin(), merged.end());
      i = records.size();
    }
    while (i < records.size()) {
      Run* last = in->runs_.empty() ? nullptr : &in->runs_.back();
      // Continue the input's last run when the batch follows it in time.
      if (last == nullptr || last->recs.size() >= last->recs.capacity() ||
          records[i].time_ns < last->recs.back().time_ns) {
        in->runs_.push_back(Run{take_spare_locked(), 0, next_seq_++});
        last = &in->runs_.back();
      }
      const size_t room = std::max(last->recs.capacity(), kRunRecords) - last->recs.size();
      const size_t n = std::min(room, records.size() - i);
      last->recs.insert(last->recs.end(), records.begin() + static_cast<ptrdiff_t>(i),
                        records.begin() + static_cast<ptrdiff_t>(i + n));
      i += n;
    }
    // Below a watermark already taken: the file has said none would come.
    if (!records.empty() && records.front().time_ns < complete_)
      stats_.late += static_cast<uint64_t>(
          std::lower_bound(records.begin(), records.end(), complete_,
                           [](const TraceRecord& r, int64_t t) { return r.time_ns < t; }) -
          records.begin());
    pending_.fetch_add(records.size(), std::memory_order_relaxed);
    pushed_since_take_ += records.size();
    stats_.pushed += records.size();
    if (bound > in->bound_) in->bound_ = bound;
    in->heard_at_ = now;
    wake = pushed_since_take_ >= opts_.wake_writer_at || (idle_waiting_ && !records.empty());
    if (wake) idle_waiting_ = false;  // one wake for the first push
  }
  records.clear();
  if (wake) wake_.notify_one();
}

void Merger::advance(Input* in, int64_t bound) {
  const int64_t now = now_ns();
  std::lock_guard lock(mu_);
  if (bound > in->bound_) in->bound_ = bound;
  in->heard_at_ = now;
}

void Merger::suspend(Input* in) {
  {
    std::lock_guard lock(mu_);
    in->suspended_ = true;
  }
  wake_.notify_one();  // the watermark may have moved
}

void Merger::resume(Input* in, int64_t bound) {
  const int64_t now = now_ns();
  std::lock_guard lock(mu_);
  in->suspended_ = false;
  if (bound > in->bound_) in->bound_ = bound;
  in->heard_at_ = now;
}

void Merger::close(Input* in) {
  {
    std::lock_guard lock(mu_);
    in->closed_ = true;
  }
  wake_.notify_one();
}

bool Merger::holds_back_locked(const Input& in, int64_t now) const {
  // Closed, suspended or timed out: no longer holds the watermark back.
  return !in.closed_ && !in.suspended_ && now - in.heard_at_ <= opts_.stream_timeout_ns;
}

int64_t Merger::watermark_locked(int64_t now) const {
  int64_t w = INT64_MAX;
  for (const auto& in : inputs_)
    if (holds_back_locked(*in, now)) w = std::min(w, in->bound_);
  if (w == INT64_MAX) w = now;  // nothing holds it: everything up to now
  return std::max(w, now - opts_.max_delay_ns);
}

size_t Merger::release_locked(std::vector<TraceRecord>& out, size_t max) {
  capped_ = false;
  // A min-heap of the runs with records, by (time of the head, seq).
  struct Head {
    int64_t t;
    uint64_t seq;
    Run* run;
  };
  auto later = [](const Head& a, const Head& b) { return a.t != b.t ? a.t > b.t : a.seq > b.seq; };
  std::vector<Head> heap;
  for (auto& in : inputs_)
    for (auto& r : in->runs_)
      if (r.pos < r.recs.size()) heap.push_back({r.recs[r.pos].time_ns, r.seq, &r});
  std::make_heap(heap.begin(), heap.end(), later);
  const size_t first = out.size();
  while (!heap.empty()) {
    if (out.size() - first >= max) {
      capped_ = true;
      break;
    }
    std::pop_heap(heap.begin(), heap.end(), later);
    Head h = heap.back();
    heap.pop_back();
    Run& r = *h.run;
    // Take the run's records up to the next run's head in one stretch: a
    // device's run usually goes a long way before another input's record
    // comes between.
    size_t end = r.pos + 1;
    if (heap.empty()) {
      end = r.recs.size();
    } else {
      // Up to the next head; at its time too when this run is the older.
      const int64_t until = heap.front().t;
      const bool first_on_ties = r.seq < heap.front().seq;
      while (end < r.recs.size() &&
             (r.recs[end].time_ns < until || (first_on_ties && r.recs[end].time_ns == until)))
        ++end;
    }
    const size_t room = max - (out.size() - first);  // >= 1: checked above
    if (end - r.pos > room) end = r.pos + room;
    out.insert(out.end(), r.recs.begin() + static_cast<ptrdiff_t>(r.pos),
               r.recs.begin() + static_cast<ptrdiff_t>(end));
    r.pos = end;
    if (r.pos < r.recs.size()) {
      heap.push_back({r.recs[r.pos].time_ns, r.seq, &r});
      std::push_heap(heap.begin(), heap.end(), later);
    }
  }
  // Drop drained runs, keeping a few buffers for the next pushes.
  for (auto& in : inputs_) {
    auto& runs = in->runs_;
    auto keep = runs.begin();
    for (auto it = runs.begin(); it != runs.end(); ++it) {
      if (it->pos < it->recs.size()) {
        if (keep != it) *keep = std::move(*it);
        ++keep;
      } else if (spare_.size() < kSpareRuns && it->recs.capacity() == kRunRecords) {
        it->recs.clear();
        spare_.push_back(std::move(it->recs));
      }
    }
    runs.erase(keep, runs.end());
  }
  const size_t n = out.size() - first;
  pending_.fetch_sub(n, std::memory_order_relaxed);
  stats_.released += n;
  return n;
}

size_t Merger::take(std::vector<TraceRecord>& out, int64_t max_wait_ns, size_t max_records,
                    int64_t* complete) {
  std::unique_lock lock(mu_);
  // A take cut short by max_records continues at once.
  auto quiet = [&] { return !capped_ && !kicked_ && pushed_since_take_ < opts_.wake_writer_at; };
  if (max_wait_ns > 0 && quiet()) {
    if (pending_.load(std::memory_order_relaxed) == 0) {
      // Idle: a long wait, which the first push ends; its records then
      // wait max_wait_ns like any (not the rest of the idle wait).
      idle_waiting_ = true;
      wake_.wait_for(lock, std::chrono::nanoseconds(std::max(max_wait_ns, opts_.idle_wait_ns)));
      idle_waiting_ = false;
      if (pending_.load(std::memory_order_relaxed) > 0 && quiet())
        wake_.wait_for(lock, std::chrono::nanoseconds(max_wait_ns));
    } else {
      wake_.wait_for(lock, std::chrono::nanoseconds(max_wait_ns));
    }
  }
  pushed_since_take_ = 0;
  kicked_ = false;
  // The watermark before the take: no input will push below it.
  int64_t w = watermark_locked(now_ns());
  const size_t n = release_locked(out, max_records);
  // A take cut short leaves the newest records pending: complete only up
  // to the oldest of those.
  for (const auto& in : inputs_)
    for (const auto& r : in->runs_)
      if (r.pos < r.recs.size()) w = std::min(w, r.recs[r.pos].time_ns);
  complete_ = std::max(complete_, w);
  if (complete) *complete = complete_;
  return n;
}

void Merger::wake_writer() {
  {
    std::lock_guard lock(mu_);
    kicked_ = true;
  }
  wake_.notify_one();
}

size_t Merger::take_all(std::vector<TraceRecord>& out) {
  std::lock_guard lock(mu_);
  return release_locked(out, SIZE_MAX);
}

MergeStats Merger::stats() const {
  const int64_t now = now_ns();
  std::lock_guard lock(mu_);
  MergeStats s = stats_;
  s.pending = pending_.load(std::memory_order_relaxed);
  // The watermark now, and the input that holds it there (none: the
  // merge's max_delay does, or nothing holds it back).
  s.watermark = watermark_locked(now);
  for (const auto& in : inputs_) {
    if (holds_back_locked(*in, now) && in->bound_ == s.watermark) {
      s.held_by = in->name_;
      break;
    }
  }
  return s;
}

}  // namespace perfqd
