// LatencyHistogram (perfq/report.h): exact values while they are few,
// then log-linear buckets of 9 significant bits.
#include "perfq/report.h"

#include <algorithm>
#include <cmath>

namespace perfq {

// ---------------------------------------------------------------------------
// LatencyHistogram

namespace {

constexpr int kSubBits = 8;  // 9 significant bits: 2^8 sub-buckets per octave
constexpr uint64_t kSub = uint64_t{1} << kSubBits;

uint32_t bucket_of(uint64_t v) {
  if (v < kSub) return static_cast<uint32_t>(v);
  int e = 63 - __builtin_clzll(v);  // >= kSubBits
  int shift = e - kSubBits;
  uint64_t m = v >> shift;  // in [kSub, 2 kSub)
  return static_cast<uint32_t>((static_cast<uint64_t>(shift) + 1) * kSub + (m - kSub));
}

// Midpoint of the bucket (exact for the unit-wide ones).
uint64_t value_of(uint32_t b) {
  if (b < kSub) return b;
  uint64_t shift = b / kSub - 1;
  uint64_t m = b % kSub + kSub;
  uint64_t lo = m << shift;
  return lo + ((uint64_t{1} << shift) >> 1);
}

}  // namespace

void LatencyHistogram::add(int64_t v) {
  if (count_ == 0) {
    min_ = max_ = v;
  } else {
    min_ = std::min(min_, v);
    max_ = std::max(max_, v);
  }
  ++count_;
  sum_ += v;
  if (!bucketed_) {
    ++exact_[v];
    if (exact_.size() <= kExactValues) return;
    for (const auto& [value, n] : exact_) add_bucketed(value, n);
    exact_.clear();
    bucketed_ = true;
    return;
  }
  add_bucketed(v, 1);
}

void LatencyHistogram::add_bucketed(int64_t v, uint64_t n) {
  if (v >= 0) {
    pos_[bucket_of(static_cast<uint64_t>(v))] += n;
  } else {
    neg_[bucket_of(static_cast<uint64_t>(-(v + 1)) + 1)] += n;
  }
}

int64_t LatencyHistogram::quantile(double q) const {
  if (count_ == 0) return 0;
  q = std::clamp(q, 0.0, 1.0);
  auto rank = static_cast<uint64_t>(std::ceil(q * static_cast<double>(count_)));
  rank = std::clamp<uint64_t>(rank, 1, count_);
  uint64_t seen = 0;
  int64_t v = max_;
  bool found = false;
  for (auto it = exact_.begin(); it != exact_.end() && !found; ++it) {
    seen += it->second;
    if (seen >= rank) {
      v = it->first;
      found = true;
    }
  }
  for (auto it = neg_.rbegin(); it != neg_.rend() && !found; ++it) {
    seen += it->second;
    if (seen >= rank) {
      v = -static_cast<int64_t>(value_of(it->first));
      found = true;
    }
  }
  for (auto it = pos_.begin(); it != pos_.end() && !found; ++it) {
    seen += it->second;
    if (seen >= rank) {
      v = static_cast<int64_t>(value_of(it->first));
      found = true;
    }
  }
  return std::clamp(v, min_, max_);
}

ReportHistogram LatencyHistogram::log_bins(int per_decade) const {
  ReportHistogram h;
  // Bin k holds [10^(k/per_decade), 10^((k+1)/per_decade)); its edges are
  // rounded up to whole ns, and a value goes where its edges put it.
  auto edge = [per_decade](int k) {
    return static_cast<int64_t>(std::ceil(std::pow(10.0, static_cast<double>(k) / per_decade)));
  };
  auto bin_of = [&](int64_t v) {
    int k = static_cast<int>(std::floor(std::log10(static_cast<double>(v)) * per_decade));
    while (k > 0 && edge(k) > v) --k;
    while (edge(k + 1) <= v) ++k;
    return k;
  };
  std::map<int, uint64_t> counts;
  auto add = [&](int64_t v, uint64_t n) {
    if (v <= 0) {
      h.at_most_zero += n;
    } else {
      counts[bin_of(v)] += n;
    }
  };
  for (const auto& [v, n] : exact_) add(v, n);
  for (const auto& [b, n] : pos_) add(static_cast<int64_t>(value_of(b)), n);
  for (const auto& [b, n] : neg_) add(-static_cast<int64_t>(value_of(b)), n);
  if (counts.empty()) return h;
  for (int k = counts.begin()->first; k <= counts.rbegin()->first; ++k) {
    auto it = counts.find(k);
    h.bins.push_back({edge(k), edge(k + 1), it == counts.end() ? 0 : it->second});
  }
  return h;
}

LatencyStats LatencyHistogram::summary() const {
  LatencyStats d;
  d.count = count_;
  if (count_ == 0) return d;
  d.min = min_;
  d.max = max_;
  d.mean = static_cast<double>(sum_ / static_cast<long double>(count_));
  d.p50 = quantile(0.50);
  d.p90 = quantile(0.90);
  d.p99 = quantile(0.99);
  return d;
}

}  // namespace perfq
