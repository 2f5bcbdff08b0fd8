#include "merge.h"

#include <algorithm>
#include <chrono>

#include "perfq/device_clock.h"

namespace perfqd {

using perfq::TraceRecord;

namespace {
bool earlier(const TraceRecord& a, const TraceRecord& b) { return a.time_ns < b.time_ns; }
int64_t now_ns() { return static_cast<int64_t>(perfq::monotonic_ns()); }
}  // namespace

Merger::Merger(MergeOptions opts) : opts_(opts) {}
Merger::~Merger() = default;

Merger::Input* Merger::add_input(std::string name, int64_t bound) {
  std::lock_guard lock(mu_);
  inputs_.push_back(std::unique_ptr<Input>(new Input(std::move(name), bound, now_ns())));
  return inputs_.back().get();
}

void Merger::push(Input* in, std::vector<TraceRecord>& records, int64_t bound) {
  const int64_t now = now_ns();
  bool wake = false;
  {
    std::lock_guard lock(mu_);
    incoming_.insert(incoming_.end(), records.begin(), records.end());
    stats_.pushed += records.size();
    if (bound > in->bound_) in->bound_ = bound;
    in->heard_at_ = now;
    wake = incoming_.size() + sorted_.size() >= opts_.wake_writer_at;
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

void Merger::close(Input* in) {
  {
    std::lock_guard lock(mu_);
    in->closed_ = true;
  }
  wake_.notify_one();
}

int64_t Merger::watermark_locked(int64_t now) const {
  int64_t w = INT64_MAX;
  for (const auto& in : inputs_) {
    if (in->closed_) continue;
    if (now - in->heard_at_ > opts_.stream_timeout_ns) continue;  // timed out
    w = std::min(w, in->bound_);
  }
  if (w == INT64_MAX) w = now;  // nothing holds it: everything up to now
  return std::max(w, now - opts_.max_delay_ns);
}

size_t Merger::release_locked(std::vector<TraceRecord>& out, int64_t limit) {
  if (!incoming_.empty()) {
    std::stable_sort(incoming_.begin(), incoming_.end(), earlier);
    const size_t mid = sorted_.size();
    sorted_.insert(sorted_.end(), incoming_.begin(), incoming_.end());
    std::inplace_merge(sorted_.begin(), sorted_.begin() + static_cast<ptrdiff_t>(mid),
                       sorted_.end(), earlier);
    incoming_.clear();
  }
  auto cut = sorted_.begin();
  if (limit == INT64_MAX) {
    cut = sorted_.end();
  } else {
    cut = std::lower_bound(sorted_.begin(), sorted_.end(), limit,
                           [](const TraceRecord& r, int64_t t) { return r.time_ns < t; });
  }
  const size_t n = static_cast<size_t>(cut - sorted_.begin());
  for (auto it = sorted_.begin(); it != cut; ++it) {
    if (it->time_ns < released_upto_) ++stats_.late;
    else released_upto_ = it->time_ns;
  }
  out.insert(out.end(), sorted_.begin(), cut);
  sorted_.erase(sorted_.begin(), cut);
  stats_.released += n;
  return n;
}

size_t Merger::take_ready(std::vector<TraceRecord>& out, int64_t now, int64_t max_wait_ns) {
  std::unique_lock lock(mu_);
  if (max_wait_ns > 0 && incoming_.size() + sorted_.size() < opts_.wake_writer_at)
    wake_.wait_for(lock, std::chrono::nanoseconds(max_wait_ns));
  now = std::max(now, now_ns());
  const int64_t w = watermark_locked(now);
  stats_.watermark = w;
  return release_locked(out, w);
}

size_t Merger::take_all(std::vector<TraceRecord>& out) {
  std::lock_guard lock(mu_);
  return release_locked(out, INT64_MAX);
}

MergeStats Merger::stats() const {
  std::lock_guard lock(mu_);
  MergeStats s = stats_;
  s.pending = sorted_.size() + incoming_.size();
  return s;
}

}  // namespace perfqd
