// TraceFilter (perfq/filter.h): the part of a trace that report and export
// see.
#include "perfq/filter.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

namespace perfq {

Result<TraceTimePoint> parse_trace_time(std::string_view text) {
  const std::string s(text);
  TraceTimePoint t;
  char* end = nullptr;
  errno = 0;
  if (s.size() > 2 && s.ends_with("ns")) {
    const long long v = std::strtoll(s.c_str(), &end, 10);
    if (!errno && end == s.c_str() + s.size() - 2) {
      t.absolute = true;
      t.ns = v;
      return t;
    }
  } else {
    const double v = std::strtod(s.c_str(), &end);
    if (!errno && end == s.c_str() + s.size() && !s.empty() && std::isfinite(v)) {
      t.seconds = v;
      return t;
    }
  }
  return Status(Errc::kInvalidArgument,
                fmt::format("bad time '{}': seconds from the start (1.5) or absolute host ns "
                            "(45244733351578ns)",
                            s));
}

namespace {

class FilterVisitor : public TraceVisitor {
 public:
  FilterVisitor(const TraceFilter& f, TraceVisitor& inner) : f_(f), inner_(inner) {}

  Status on_metadata(const TraceMetadata& m) override {
    meta_ = m;
    if (!start_) start_ = m.option_int("start_ns");
    resolve_sources();
    if (!start_ || (!f_.from && !f_.to)) return inner_.on_metadata(meta_);
    resolve_window();
    // The window as the recording's interval (within the recording's own).
    const int64_t rec_start = *start_;
    const int64_t rec_stop = m.option_int("stop_ns").value_or(INT64_MAX);
    const int64_t a = std::max(rec_start, from_);
    const int64_t b = std::min(rec_stop, to_);
    meta_.options["start_ns"] = std::to_string(a);
    if (rec_stop != INT64_MAX || to_ != INT64_MAX)
      meta_.options["stop_ns"] = std::to_string(std::max(a, b));
    return inner_.on_metadata(meta_);
  }

  Status on_records(std::span<const TraceRecord> recs) override {
    if (!start_ && !recs.empty()) {
      start_ = recs.front().time_ns;
      resolve_window();
    }
    kept_.clear();
    for (const auto& r : recs)
      if (keep(r.source, r.rec.stream, r.time_ns) && keep_event(r)) kept_.push_back(r);
    if (kept_.empty()) return Status::ok();
    return inner_.on_records(kept_);
  }

  Status on_sync_samples(std::span<const TraceSyncSample> s) override {
    return inner_.on_sync_samples(s);
  }
  Status on_clock_models(std::span<const TraceClockModel> m) override {
    return inner_.on_clock_models(m);
  }
  Status on_losses(std::span<const TraceLoss> ls) override {
    std::vector<TraceLoss> kept;
    for (const auto& l : ls)
      if (keep(l.source, l.stream, l.time_ns) && f_.events.empty()) kept.push_back(l);
    if (kept.empty()) return Status::ok();
    return inner_.on_losses(kept);
  }
  Status on_end(const TraceEnd& e) override { return inner_.on_end(e); }

 private:
  void resolve_window() {
    if (!start_) return;
    auto at = [this](const TraceTimePoint& p) {
      return p.absolute ? p.ns : *start_ + static_cast<int64_t>(std::llround(p.seconds * 1e9));
    };
    from_ = f_.from ? at(*f_.from) : INT64_MIN;
    to_ = f_.to ? at(*f_.to) : INT64_MAX;
  }
  void resolve_sources() {
    ids_.clear();
    for (const auto& want : f_.sources) {
      for (const auto& s : meta_.sources)
        if (s.name == want || std::to_string(s.id) == want) ids_.push_back(s.id);
    }
  }
  bool keep(uint16_t source, uint16_t stream, int64_t t) const {
    if (!f_.sources.empty() && std::find(ids_.begin(), ids_.end(), source) == ids_.end())
      return false;
    if (!f_.streams.empty() &&
        std::find(f_.streams.begin(), f_.streams.end(), stream) == f_.streams.end())
      return false;
    return t >= from_ && t <= to_;
  }
  bool keep_event(const TraceRecord& r) const {
    if (f_.events.empty()) return true;
    const TraceSource* s = meta_.find_source(r.source);
    const EventInfo* e = s ? s->find_event(r.rec.event) : nullptr;
    return e && std::find(f_.events.begin(), f_.events.end(), e->name) != f_.events.end();
  }

  const TraceFilter& f_;
  TraceVisitor& inner_;
  TraceMetadata meta_;
  std::optional<int64_t> start_;
  int64_t from_ = INT64_MIN;
  int64_t to_ = INT64_MAX;
  std::vector<uint16_t> ids_;
  std::vector<TraceRecord> kept_;
};

}  // namespace

std::unique_ptr<TraceVisitor> make_filter_visitor(const TraceFilter& filter, TraceVisitor& inner) {
  return std::make_unique<FilterVisitor>(filter, inner);
}

}  // namespace perfq
