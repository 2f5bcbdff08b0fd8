// pq-writer: the merge/writer thread of a recording (ARCHITECTURE.md, data
// flow step 6).
//
// Releases records from the merge (merge.h) behind its watermark and
// appends them to the trace file, together with what the other threads
// queue for it on the side: sync samples and clock models (pq-sync),
// losses (pq-drain, pq-kernel, pq-collect) and metadata (new sources, the
// stop time).  A write error ends the recording: the file keeps what was
// written before.  The file is created with the requesting user's
// file-system identity.
//
// The file is version 2 (docs/trace-format.md): each take's records, in
// time order, then the merge's watermark (how far they are complete); the
// reader merges the takes behind the watermarks.  So what a kill -9 loses
// is what reached the merge since the writer's last take, at most kTakeNs
// before the kill (plus the write), whatever the rate and whatever an input
// still holds back: a take's partial chunk is written with its watermark,
// not when records_per_chunk are pending (16384 records: 8 s at 2 000
// records/s).
#include <sys/fsuid.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "recording.h"

namespace perfqd {

using namespace perfq;

namespace {

// Records the writer takes from the merger at a time: a chunk's worth
// (TraceWriterOptions::records_per_chunk); 64 Ki held 3 MiB more at 5 M/s.
constexpr size_t kWriteBatch = 16384;
constexpr int64_t kTakeNs = 50'000'000;  // the writer takes what was pushed at least this often
constexpr int64_t kHostClockEveryNs = 5'000'000'000;  // a snapshot of the host's clocks this often

// Open (create) the trace file with the requesting user's file-system
// identity, so that a root daemon never writes where that user may not.  An
// existing file is replaced only with `force`: the refusal is decided as the
// file is created (O_EXCL), never by a check before it.
Result<TraceWriter> open_as(const RecordingOptions& o, const TraceMetadata& meta) {
  const bool switch_id = geteuid() == 0 && o.owner_uid != 0;
  if (switch_id) {
    setfsgid(o.owner_gid);
    setfsuid(o.owner_uid);
  }
  TraceWriterOptions wo = o.writer;
  wo.replace = o.force;
  wo.watermarks = true;  // each take's records, then how far they are complete
  auto w = TraceWriter::open(o.output, meta, wo);
  if (switch_id) {
    setfsuid(0);
    setfsgid(0);
  }
  if (!w && w.status().code() == Errc::kExists)
    return Status(Errc::kExists, o.output + " exists; not replacing it (--force overwrites it)");
  return w;
}

}  // namespace

void Recording::queue_sync(std::vector<TraceSyncSample> samples, const TraceClockModel* model) {
  std::lock_guard lock(side_mu_);
  side_samples_.insert(side_samples_.end(), samples.begin(), samples.end());
  if (model) side_models_.push_back(*model);
}

void Recording::queue_loss(const TraceLoss& loss) {
  std::lock_guard lock(side_mu_);
  side_losses_.push_back(loss);
}

void Recording::queue_metadata(const TraceMetadata& m) {
  std::lock_guard lock(side_mu_);
  side_metadata_.push_back(m);
}

void Recording::note_source_ended(uint16_t source, TraceSourceEnd end) {
  // metadata_'s device sources are fixed once the recording has started.
  const TraceSource* described = metadata_.find_source(source);
  if (described == nullptr) return;
  TraceMetadata m;
  m.sources.push_back(*described);
  m.sources.back().ended = std::move(end);
  queue_metadata(m);
}

Status Recording::write_side_queue() {
  std::vector<TraceSyncSample> samples;
  std::vector<TraceClockModel> models;
  std::vector<TraceLoss> losses;
  std::vector<TraceMetadata> metas;
  {
    std::lock_guard lock(side_mu_);
    samples.swap(side_samples_);
    models.swap(side_models_);
    losses.swap(side_losses_);
    metas.swap(side_metadata_);
  }
  for (const auto& m : metas)
    if (Status s = writer_->append_metadata(m); !s) return s;
  if (!samples.empty())
    if (Status s = writer_->append_sync_samples(samples); !s) return s;
  for (const auto& m : models)
    if (Status s = writer_->append_clock_model(m); !s) return s;
  for (const auto& l : losses)
    if (Status s = writer_->append_loss(l); !s) return s;
  return Status::ok();
}

void Recording::writer_main() {
  std::vector<TraceRecord> out;
  auto fail = [this](const Status& s) {
    std::lock_guard lock(stats_mu_);
    if (write_error_.empty()) {
      write_error_ = s.message();
      spdlog::error("trace {}: {}; the recording stops, the file holds what was written before",
                    opts_.output, write_error_);
    }
    write_failed_ = true;
  };
  int64_t clocks_ns = now_ns();  // the last snapshot of the host's clocks
  bool unmarked = false;         // records written since the last watermark
  auto write = [&](bool all) {
    // Every few seconds, how CLOCK_MONOTONIC stands against CLOCK_REALTIME
    // (the kernel may slew realtime): what lines traces of hosts up.
    if (const int64_t t = now_ns(); t - clocks_ns >= kHostClockEveryNs) {
      TraceMetadata m;
      m.host_clocks.push_back(read_host_clock());
      queue_metadata(m);
      clocks_ns = t;
    }
    out.clear();
    int64_t complete = INT64_MIN;
    if (all)
      merger_.take_all(out);
    else
      merger_.take(out, kTakeNs, kWriteBatch, &complete);
    if (write_failed_) return;  // keep the merger empty; nothing more can be written
    Status s = write_side_queue();
    if (s && !out.empty()) s = writer_->append_records(out);
    if (s) {
      for (const auto& r : out) loss_records_ += r.kind() == PERFQ_KIND_LOST;
      unmarked = unmarked || !out.empty();
    }
    // What was taken goes to the file now, a partial chunk included, with
    // how far the records are complete (the reader's cue to give them out).
    // At the stop the file's end is the cue.
    if (s && unmarked && !all) {
      s = writer_->append_watermark(complete);  // flushes the take's partial chunk first
      unmarked = false;
    }
    if (!s) return fail(s);
    std::lock_guard lock(stats_mu_);
    // loss_records_ counts what was appended; records_written() what is in
    // chunks already (a stop's partial chunk waits): never below zero.
    const uint64_t in_file = writer_->records_written();
    records_written_ = in_file > loss_records_ ? in_file - loss_records_ : 0;
    bytes_written_ = writer_->bytes_written();
  };
  while (!writer_stop_) write(false);
  write(true);
}

Status Recording::open_trace() {
  auto w = open_as(opts_, metadata_);
  if (!w) return w.status();
  writer_ = std::make_unique<TraceWriter>(std::move(w.value()));
  return Status::ok();
}

}  // namespace perfqd
