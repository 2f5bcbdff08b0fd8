#include "trace/synth.h"

#include <algorithm>
#include <map>

namespace perfq {
namespace {

// The two sources: the host application and the device (synth.h).
TraceMetadata synth_metadata(const SynthTraceOptions& o) {
  TraceMetadata m;
  m.describe_this_host();
  m.options["mode"] = "synthetic";
  TraceSource host;
  host.id = 0;
  host.kind = TraceSourceKind::kHost;
  host.name = "synth-app";
  host.pid = 4242;
  host.events = {{1, PERFQ_KIND_INSTANT, "job_submit"},  {2, PERFQ_KIND_INSTANT, "job_complete"},
                 {3, PERFQ_KIND_BEGIN, "work"},          {4, PERFQ_KIND_END, "work_done"},
                 {5, PERFQ_KIND_COUNTER, "queue_depth"}, {6, PERFQ_KIND_LOST, "lost"}};
  if (!o.transfer_bytes.empty())
    host.events.push_back({7, PERFQ_KIND_BEGIN, "h2d_copy", {std::string(kArgBytes)}});
  TraceSource dev;
  dev.id = 1;
  dev.kind = TraceSourceKind::kDevice;
  dev.name = "synth-dev";
  dev.pci_address = "0000:03:00.0";
  dev.link = "Gen4 x8";
  if (o.device_pci) {
    dev.pci = o.device_pci;
    dev.pci_address = o.device_pci->address;
    dev.link = o.device_pci->pcie && o.device_pci->pcie->link_current
                   ? pci_link_name(*o.device_pci->pcie->link_current)
                   : "";
  }
  dev.clock_hz = 1'000'000'000;
  dev.events = {{1, PERFQ_KIND_BEGIN, "job_start"},
                {2, PERFQ_KIND_END, "job_end"},
                {3, PERFQ_KIND_COUNTER, "dma_bytes"}};
  if (!o.transfer_bytes.empty())
    dev.events.push_back({4, PERFQ_KIND_INSTANT, "dma_write", {std::string(kArgBytes)}});
  m.sources = {host, dev};
  return m;
}

// Every job's records, in host-time order.
std::vector<TraceRecord> synth_records(const SynthTraceOptions& o) {
  std::vector<TraceRecord> recs;
  std::map<uint32_t, uint64_t> next_index;  // (source << 16 | stream)
  auto add = [&](uint16_t source, uint16_t stream, uint32_t event, uint16_t kind, int64_t h,
                 uint64_t arg) {
    TraceRecord r;
    r.source = source;
    r.rec.stream = stream;
    r.rec.event = event;
    r.rec.arg = arg;
    r.rec.index = next_index[(uint32_t{source} << 16) | stream]++;
    if (source == 1) {
      r.rec.flags = PERFQ_FLAGS(kind, PERFQ_CLOCK_DEVICE);
      r.rec.time = static_cast<uint64_t>(h - o.device_offset_ns);
      r.time_ns = h + o.model_error_ns;
      r.conv = TraceConversion::kModel;
      r.claim_ns = 200;  // the model's (below)
      if (o.drop_every && stream == 0 && r.rec.index % o.drop_every == o.drop_every - 1) {
        return;  // dropped: leaves an index gap
      }
    } else {
      r.rec.flags = PERFQ_FLAGS(kind, PERFQ_CLOCK_HOST);
      r.rec.time = static_cast<uint64_t>(h);
      r.time_ns = h;
    }
    recs.push_back(r);
  };
  for (uint64_t i = 0; i < o.jobs; ++i) {
    const int64_t submit = o.start_ns + static_cast<int64_t>(i) * o.period_ns;
    const int64_t start = submit + o.submit_to_start[i % o.submit_to_start.size()];
    const int64_t end = start + o.start_to_end[i % o.start_to_end.size()];
    const int64_t complete = end + o.end_to_complete[i % o.end_to_complete.size()];
    const auto hs = static_cast<uint16_t>(i % 2);
    const auto ds = static_cast<uint16_t>(i % 3);
    const uint64_t id = 1000 + i;
    if (o.work_pairs) {
      add(0, hs, 3, PERFQ_KIND_BEGIN, submit - 600, id);
      add(0, hs, 4, PERFQ_KIND_END, submit - 100, id);
    }
    if (!o.transfer_bytes.empty()) {
      const uint64_t bytes = o.transfer_bytes[i % o.transfer_bytes.size()];
      add(0, hs, 7, PERFQ_KIND_BEGIN, submit - 90, bytes);
      add(0, hs, 4, PERFQ_KIND_END, submit - 10, bytes);
      add(1, ds, 4, PERFQ_KIND_INSTANT, start + 2, bytes);
    }
    add(0, hs, 1, PERFQ_KIND_INSTANT, submit, id);
    add(0, hs, 5, PERFQ_KIND_COUNTER, submit + 1, i % 8);
    add(1, ds, 1, PERFQ_KIND_BEGIN, start, id);
    add(1, ds, 3, PERFQ_KIND_COUNTER, start + 1, 4096);
    add(1, ds, 2, PERFQ_KIND_END, end, id);
    add(0, hs, 2, PERFQ_KIND_INSTANT, complete, id);
  }
  if (o.lost_record_count) {
    add(0, 1, 6, PERFQ_KIND_LOST, o.start_ns + 50, o.lost_record_count);
  }
  std::stable_sort(recs.begin(), recs.end(), [](const TraceRecord& a, const TraceRecord& b) {
    return a.time_ns < b.time_ns;
  });
  return recs;
}

// The device's clock model and its sync samples, spread over the recording.
Status write_synth_sync(TraceWriter& w, const SynthTraceOptions& o) {
  const int64_t span = std::max<int64_t>(1, static_cast<int64_t>(o.jobs) * o.period_ns);
  TraceClockModel cm;
  cm.source = 1;
  cm.installed_ns = o.start_ns;
  cm.model.device_ref = static_cast<uint64_t>(o.start_ns - o.device_offset_ns);
  cm.model.host_ref_ns = o.start_ns + o.model_error_ns;
  cm.model.rate_ppb = 0;
  cm.model.uncertainty_ns = 200;
  cm.model.flags = PERFQ_SYNC_MODEL_VALID;
  if (Status s = w.append_clock_model(cm); !s.is_ok()) return s;
  std::vector<TraceSyncSample> samples;
  for (uint64_t k = 0; k < o.sync_samples; ++k) {
    const int64_t h = o.start_ns + span * static_cast<int64_t>(k) /
                                       static_cast<int64_t>(std::max<uint64_t>(1, o.sync_samples));
    const auto r = static_cast<uint64_t>(h - o.device_offset_ns);  // R == D here
    TraceSyncSample s;
    s.source = 1;
    s.round = static_cast<uint32_t>(k);
    s.host = {static_cast<uint64_t>(h - 200), r, static_cast<uint64_t>(h + 200), 0};
    s.device = {r - 5, r, r + 5, 0};
    samples.push_back(s);
  }
  return w.append_sync_samples(samples);
}

}  // namespace

Result<uint64_t> write_synthetic_trace(const std::string& path, const SynthTraceOptions& o,
                                       const TraceWriterOptions& wopt) {
  if (o.submit_to_start.empty() || o.start_to_end.empty() || o.end_to_complete.empty()) {
    return Status(Errc::kInvalidArgument, "synthetic trace: empty latency list");
  }
  const TraceMetadata m = synth_metadata(o);
  const std::vector<TraceRecord> recs = synth_records(o);
  auto w = TraceWriter::open(path, m, wopt);
  if (!w.is_ok()) return w.status();
  if (Status s = write_synth_sync(*w, o); !s.is_ok()) return s;
  if (o.loss_chunk_count) {
    TraceLoss l;
    l.source = 0;
    l.stream = 0;
    l.reason = TraceLossReason::kHostRingFull;
    l.count = o.loss_chunk_count;
    l.time_ns = o.start_ns + 10;
    if (Status s = w->append_loss(l); !s.is_ok()) return s;
  }
  if (Status s = w->append_records(recs); !s.is_ok()) return s;
  if (Status s = w->close(); !s.is_ok()) return s;
  return static_cast<uint64_t>(recs.size());
}

}  // namespace perfq
