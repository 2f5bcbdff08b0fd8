// The report's time axis (ReportTimeline in perfq/report.h): per-bin counts
// of every stream and sync figures of every device, in bins that double in
// width whenever they would exceed kTimelineMaxBins.  Internal to analysis/.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <vector>

#include "perfq/report.h"

namespace perfq::analysis {

class Timeline {
 public:
  // The axis starts here (the recording's start), if called before any add.
  void start_at(int64_t t) {
    if (!started_) {
      tl_.start_ns = t;
      started_ = true;
    }
  }

  void add_records(uint16_t source, uint16_t stream, int64_t t, uint64_t n) {
    const size_t b = bin(t);
    bump(series(source, stream).records, b, n);
  }
  void add_lost(uint16_t source, uint16_t stream, int64_t t, uint64_t n) {
    const size_t b = bin(t);
    bump(series(source, stream).lost, b, n);
  }
  // A sync round at t; its residual where it gave an observation and a
  // model was in force.
  void add_round(uint16_t source, int64_t t, bool failed, std::optional<double> residual_ns) {
    const size_t b = bin(t);
    TimelineSync& s = sync(source);
    bump(s.rounds, b, 1);
    if (failed) bump(s.failed, b, 1);
    if (residual_ns) worst(s.worst_residual_ns, b, std::fabs(*residual_ns));
  }
  void add_model(uint16_t source, int64_t t, double bound_ns) {
    const size_t b = bin(t);
    worst(sync(source).claimed_bound_ns, b, bound_ns);
  }

  // Every series padded to the same number of bins.
  ReportTimeline finish() {
    ReportTimeline out = tl_;
    out.bins = bins_;
    for (auto& [key, s] : streams_) {
      s.records.resize(bins_);
      s.lost.resize(bins_);
      out.streams.push_back(s);
    }
    for (auto& [key, s] : sync_) {
      s.rounds.resize(bins_);
      s.failed.resize(bins_);
      s.worst_residual_ns.resize(bins_, kNone);
      s.claimed_bound_ns.resize(bins_, kNone);
      out.sync.push_back(s);
    }
    return out;
  }

 private:
  static constexpr double kNone = std::numeric_limits<double>::quiet_NaN();
  static constexpr int64_t kFirstBinNs = 1000;

  size_t bin(int64_t t) {
    start_at(t);
    if (t < tl_.start_ns) t = tl_.start_ns;
    auto b = static_cast<uint64_t>(t - tl_.start_ns) / static_cast<uint64_t>(tl_.bin_ns);
    while (b >= kTimelineMaxBins) {
      widen();
      b /= 2;
    }
    bins_ = std::max<size_t>(bins_, b + 1);
    return static_cast<size_t>(b);
  }

  // Twice as wide: bin i takes old bins 2i and 2i+1.
  void widen() {
    tl_.bin_ns *= 2;
    auto sum = [](std::vector<uint64_t>& v) {
      for (size_t i = 0; i < v.size(); ++i) v[i / 2] = (i % 2 ? v[i / 2] : 0) + v[i];
      v.resize((v.size() + 1) / 2);
    };
    auto max = [](std::vector<double>& v) {
      for (size_t i = 0; i < v.size(); ++i) v[i / 2] = i % 2 ? larger(v[i / 2], v[i]) : v[i];
      v.resize((v.size() + 1) / 2);
    };
    for (auto& [key, s] : streams_) {
      sum(s.records);
      sum(s.lost);
    }
    for (auto& [key, s] : sync_) {
      sum(s.rounds);
      sum(s.failed);
      max(s.worst_residual_ns);
      max(s.claimed_bound_ns);
    }
    bins_ = (bins_ + 1) / 2;
  }

  static double larger(double a, double b) {
    if (std::isnan(a)) return b;
    if (std::isnan(b)) return a;
    return std::max(a, b);
  }
  static void bump(std::vector<uint64_t>& v, size_t b, uint64_t n) {
    if (v.size() <= b) v.resize(b + 1);
    v[b] += n;
  }
  static void worst(std::vector<double>& v, size_t b, double x) {
    if (v.size() <= b) v.resize(b + 1, kNone);
    v[b] = larger(v[b], x);
  }
  TimelineStream& series(uint16_t source, uint16_t stream) {
    TimelineStream& s = streams_[(uint32_t{source} << 16) | stream];
    s.source = source;
    s.stream = stream;
    return s;
  }
  TimelineSync& sync(uint16_t source) {
    TimelineSync& s = sync_[source];
    s.source = source;
    return s;
  }

  ReportTimeline tl_{0, kFirstBinNs, 0, {}, {}};
  bool started_ = false;
  size_t bins_ = 0;
  std::map<uint32_t, TimelineStream> streams_;
  std::map<uint16_t, TimelineSync> sync_;
};

}  // namespace perfq::analysis
