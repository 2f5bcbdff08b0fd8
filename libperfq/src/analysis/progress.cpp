// make_progress_visitor() (perfq/progress.h).
#include "perfq/progress.h"

namespace perfq {

namespace {

class ProgressVisitor : public TraceVisitor {
 public:
  ProgressVisitor(const TraceReader& reader, TraceProgressInfo info, TraceProgress progress,
                  TraceVisitor& inner)
      : reader_(reader), info_(info), progress_(std::move(progress)), inner_(inner) {}

  Status on_metadata(const TraceMetadata& m) override { return inner_.on_metadata(m); }
  Status on_records(std::span<const TraceRecord> r) override {
    Status s = inner_.on_records(r);
    info_.records += r.size();
    // The reader counts a chunk's bytes once it is delivered: this one's
    // are at most one chunk ahead of bytes_done.
    info_.bytes_done = reader_.summary().bytes;
    progress_(info_);
    return s;
  }
  Status on_sync_samples(std::span<const TraceSyncSample> s) override {
    return inner_.on_sync_samples(s);
  }
  Status on_clock_models(std::span<const TraceClockModel> m) override {
    return inner_.on_clock_models(m);
  }
  Status on_losses(std::span<const TraceLoss> l) override { return inner_.on_losses(l); }
  Status on_end(const TraceEnd& e) override {
    info_.bytes_done = info_.bytes_total;
    progress_(info_);
    return inner_.on_end(e);
  }

 private:
  const TraceReader& reader_;
  TraceProgressInfo info_;
  TraceProgress progress_;
  TraceVisitor& inner_;
};

}  // namespace

std::unique_ptr<TraceVisitor> make_progress_visitor(const TraceReader& reader, uint64_t bytes_total,
                                                    int pass, int passes, TraceProgress progress,
                                                    TraceVisitor& inner) {
  TraceProgressInfo info;
  info.bytes_total = bytes_total;
  info.pass = pass;
  info.passes = passes;
  return std::make_unique<ProgressVisitor>(reader, info, std::move(progress), inner);
}

}  // namespace perfq
