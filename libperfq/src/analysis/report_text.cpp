// report_to_text(): the report as text (`perfqctl report`).
#include "perfq/report.h"

#include <cmath>

#include <fmt/format.h>

#include "analysis/report_format.h"

namespace perfq {

using report_format::source_kind;
using report_format::source_name;

namespace {

std::string ns_text(int64_t ns) {
  double a = std::fabs(static_cast<double>(ns));
  if (a >= 1e9) return fmt::format("{:.3f} s", static_cast<double>(ns) / 1e9);
  if (a >= 1e6) return fmt::format("{:.3f} ms", static_cast<double>(ns) / 1e6);
  if (a >= 1e3) return fmt::format("{:.3f} us", static_cast<double>(ns) / 1e3);
  return fmt::format("{} ns", ns);
}

// Bytes in decimal units, as link speeds are given (GB = 1e9 bytes).
std::string bytes_text(double b) {
  const double a = std::fabs(b);
  if (a >= 1e12) return fmt::format("{:.3f} TB", b / 1e12);
  if (a >= 1e9) return fmt::format("{:.3f} GB", b / 1e9);
  if (a >= 1e6) return fmt::format("{:.3f} MB", b / 1e6);
  if (a >= 1e3) return fmt::format("{:.3f} kB", b / 1e3);
  return fmt::format("{:.0f} B", b);
}

// The events whose arg is a byte count: what they moved, how fast, and
// how much of their PCIe link that is.
template <class Line>
void throughput_text(const TraceReport& r, Line& line) {
  bool any = false;
  for (const auto& e : r.events) {
    if (!e.throughput) continue;
    const ReportThroughput& t = *e.throughput;
    if (!any) line("throughput (events whose arg is a byte count)");
    any = true;
    line(fmt::format("  {:<24} {:<24} {} in {} calls, {} a call (min {}, max {} at {})",
                     source_name(r, e.source), e.name, bytes_text(t.bytes), t.calls,
                     bytes_text(t.bytes_per_call), t.min_bytes, t.max_bytes, t.max_at_ns));
    std::string rates = fmt::format("{}/s over the recording", bytes_text(t.bytes_per_s));
    if (t.link_source) rates += fmt::format(" ({:.2f}% of the link)", t.link_share * 100);
    if (t.ranges && t.range_ns > 0) {
      rates +=
          fmt::format(", {}/s within its {} ranges", bytes_text(t.in_range_bytes_per_s), t.ranges);
      if (t.link_source) rates += fmt::format(" ({:.2f}%)", t.in_range_link_share * 100);
    }
    line(fmt::format("  {:<24} {}", "", rates));
    if (t.link_source && (t.link_share > 1 || t.in_range_link_share > 1))
      line(
          fmt::format("  {:<24} above the link's ceiling: these bytes did not all cross it in "
                      "these times (a copy in host memory, or ranges shorter than the transfers)",
                      ""));
    const TraceSource* src = r.metadata.find_source(e.source);
    const bool device = src && src->kind == TraceSourceKind::kDevice;
    line(t.link_source
             ? fmt::format("  {:<24} link: {} {}, {}/s each direction", "",
                           source_name(r, t.link_source), t.link, bytes_text(t.link_bytes_per_s))
             : fmt::format("  {:<24} link: not known ({})", "",
                           device          ? "the device has no PCIe link figures"
                           : t.links_known ? fmt::format("{} devices of its host have link "
                                                         "figures; the record does not say "
                                                         "which link the bytes crossed",
                                                         t.links_known)
                                           : "no device of its host has PCIe link figures"));
  }
}

std::string dist_text(const LatencyStats& d) {
  if (d.count == 0) return "none";
  return fmt::format("n={} min {} p50 {} p90 {} p99 {} max {}", d.count, ns_text(d.min),
                     ns_text(d.p50), ns_text(d.p90), ns_text(d.p99), ns_text(d.max));
}

// The claims of a device's recorded times, and per segment where there
// are several: what a reader may trust of each part of the recording.
template <class Line>
void claims_text(const ReportSync& d, Line& line) {
  const ReportClaims& c = d.claims;
  if (c.records == 0) return;
  std::string how;
  auto part = [&how](uint64_t n, const char* what) {
    if (n) how += fmt::format("{}{} {}", how.empty() ? "" : ", ", n, what);
  };
  part(c.by_daemon, "by the daemon");
  part(c.by_device, "by the device");
  part(c.forced, "forced, without a round after them");
  part(c.unclaimed, "with no claim stored");
  line(fmt::format("  {:<24} times converted: {} ({})", "", c.records, how));
  if (c.claim_ns.count)
    line(fmt::format("  {:<24} each within its claim: p50 +-{} ns  p99 +-{} ns  worst +-{} ns", "",
                     c.claim_ns.p50, c.claim_ns.p99, c.claim_ns.max));
  if (c.unbounded)
    line(
        fmt::format("  {:<24} UNSYNCHRONIZED: {} records have no bound (no sync round vouched for "
                    "their time), from {} to {}",
                    "", c.unbounded, c.unbounded_first_ns, c.unbounded_last_ns));
  if (d.segment_list.size() < 2) return;
  for (const auto& sg : d.segment_list) {
    const std::string from = sg.from_ns == INT64_MIN ? "start" : std::to_string(sg.from_ns);
    line(
        fmt::format("  {:<24} segment {} from {}: {} records, worst claim +-{} ns{}  ({} models, "
                    "loosest +-{} ns)",
                    "", sg.segment, from, sg.records, sg.worst_claim_ns,
                    sg.unbounded ? fmt::format(", {} unsynchronized", sg.unbounded) : "", sg.models,
                    sg.worst_model_ns));
  }
}

template <class Line>
void pci_text(const TraceReport& r, Line& line) {
  bool pci_header = false;
  for (const auto& s : r.metadata.sources) {
    if (!s.pci) continue;
    if (!pci_header) line("pci");
    pci_header = true;
    const PciDevice& d = *s.pci;
    std::string where =
        fmt::format("  {:<24} {}  {} [{}]", s.name, d.address, d.display_name(), d.ids_text());
    if (d.driver) where += "  driver " + *d.driver;
    if (d.numa_node) where += fmt::format("  numa node {}", *d.numa_node);
    if (d.iommu_group) where += fmt::format("  iommu group {}", *d.iommu_group);
    line(where);
    line("    " + pci_link_summary(d));
    if (const std::string p = pci_payload_summary(d); !p.empty()) line("    " + p);
  }
}

// Records and losses, per stream.
template <class Line>
void records_text(const TraceReport& r, Line& line) {
  line(fmt::format("records       host {}  device {}", r.records_host, r.records_device));
  for (const auto& s : r.streams) {
    line(fmt::format("  {:<24} {:<6} stream {:<5} {:>12} records", source_name(r, s.source),
                     source_kind(r, s.source), s.stream, s.records));
  }
  line(fmt::format(
      "lost          host {}  device {}{}", r.lost_host, r.lost_device,
      r.index_gaps_counted
          ? ""
          : "  (as reported only: with --event, index gaps are not losses one can see)"));
  for (const auto& s : r.streams) {
    if (!s.lost && !s.loss_events) continue;
    line(
        fmt::format("  {:<24} stream {:<5} lost {} (reported {}, index gaps {}) in {} events, "
                    "first at {} (index {}), last at {}",
                    source_name(r, s.source), s.stream, s.lost, s.reported_lost, s.gap_lost,
                    s.loss_events, s.first_loss_ns, s.first_loss_index, s.last_loss_ns));
  }
}

template <class Line>
void sync_text(const TraceReport& r, Line& line) {
  line("sync");
  if (r.sync.empty()) line("  no devices");
  for (const auto& d : r.sync) {
    if (!d.synchronized) {
      line(
          fmt::format("  {:<24} not synchronized (no clock model)  samples {}", d.name, d.samples));
      continue;
    }
    line(fmt::format("  {:<24} {}{}", d.name, standing_text(d.standing),
                     d.resynced ? "  (offline resync)" : ""));
    line(fmt::format(
        "  {:<24} bound +-{} ns (worst of the recording +-{} ns)  samples {}  models {}  "
        "segments {}",
        "", d.uncertainty_ns, d.worst_uncertainty_ns, d.samples, d.models, d.segments));
    claims_text(d, line);
  }
  for (const auto& n : r.resync_notes) line("  note: " + n);
}

template <class Line>
void jobs_text(const TraceReport& r, Line& line) {
  line(fmt::format("jobs          {} complete, {} incomplete", r.jobs.count, r.jobs.incomplete));
  line(fmt::format("  submit->start   {}", dist_text(r.jobs.submit_to_start)));
  line(fmt::format("  start->end      {}", dist_text(r.jobs.start_to_end)));
  line(fmt::format("  end->complete   {}", dist_text(r.jobs.end_to_complete)));
  if (r.jobs.off_cpu.available) {
    const auto& oc = r.jobs.off_cpu;
    line(fmt::format("  submitting thread off-CPU during {} of {} jobs: {}", oc.jobs_off_cpu,
                     oc.jobs, dist_text(oc.off_cpu)));
    for (const auto& w : oc.worst)
      line(fmt::format("    job {:#x} (tid {}): off-CPU {:.1f} us of {:.1f} us", w.corr_id, w.tid,
                       static_cast<double>(w.off_cpu_ns) / 1e3,
                       static_cast<double>(w.latency_ns) / 1e3));
  }
}

}  // namespace

std::string report_to_text(const TraceReport& r) {
  std::string o;
  auto line = [&o](const std::string& s) { o += s + "\n"; };
  line(fmt::format("trace {}  (host {}, {}, perfq {})", r.path, r.metadata.host_name,
                   r.metadata.kernel, r.metadata.perfq_version));
  if (!r.stopped_early.empty()) {
    line(fmt::format("WARNING: trace ends early: {}; the figures cover the {} chunks before it",
                     r.stopped_early, r.chunks));
  }
  for (const auto& p : r.problems) line("WARNING: trace damaged: " + p.message);
  for (const auto& s : r.metadata.sources) {
    if (!s.ended) continue;
    const int64_t from = r.duration_of_recording ? r.recording_start_ns : r.first_ns;
    line(fmt::format("WARNING: {} {} ended {} into the recording ({}): {}",
                     trace_source_kind_name(s.kind), s.name, ns_text(s.ended->time_ns - from),
                     s.ended->state, s.ended->reason));
  }
  if (r.stopped_early.empty() && r.problems.empty() && !r.clean_end) {
    line("note: no end chunk (the writer did not close the file); all chunks are complete");
  }
  for (size_t i = 0; i < r.metadata.hosts.size(); ++i) {
    const TraceHost& h = r.metadata.hosts[i];
    line(fmt::format("host {:<9} {} ({}): {}", h.name, h.file, h.kernel,
                     i == 0 ? std::string("the reference timeline")
                     : h.uncertainty_ns < 0
                         ? fmt::format("offset {:+.3f} us, NO BOUND: {}",
                                       static_cast<double>(h.offset_ns) / 1e3, h.alignment)
                         : fmt::format("offset {:+.3f} us, within +-{:.3f} us",
                                       static_cast<double>(h.offset_ns) / 1e3,
                                       static_cast<double>(h.uncertainty_ns) / 1e3)));
  }
  pci_text(r, line);
  line(fmt::format(
      "duration      {}{}", ns_text(r.duration_ns),
      r.duration_of_recording ? "" : " (first to last record: the recorder stated no interval)"));
  records_text(r, line);
  sync_text(r, line);
  line("events");
  for (const auto& e : r.events) {
    line(fmt::format("  {:<24} {:<24} {:<8} {:>12}  {:>12.1f}/s", source_name(r, e.source), e.name,
                     record_kind_name(e.kind), e.count, e.rate_per_s));
    if (e.kind == PERFQ_KIND_COUNTER && e.count)
      line(fmt::format("  {:<24} values min {} (at {}) mean {:.1f} max {} (at {})", "",
                       e.values.min, e.values.min_at_ns, e.values.mean, e.values.max,
                       e.values.max_at_ns));
  }
  throughput_text(r, line);
  line("durations (begin/end)");
  for (const auto& p : r.pairs) {
    line(fmt::format("  {:<24} {:<24} {} (the longest at {})", source_name(r, p.source), p.name,
                     dist_text(p.duration), p.max_at_ns));
  }
  if (r.unmatched_ends) line(fmt::format("  {} end records had no open begin", r.unmatched_ends));
  for (const auto& n : r.nested)
    line(fmt::format("  {:<24} {} inside {}: {:.1f}% of its time ({} ranges)",
                     source_name(r, n.source), n.child, n.parent, n.share * 100, n.count));
  jobs_text(r, line);
  line(fmt::format("causality violations  {}{}", r.causality_violations,
                   r.causality_within_bounds
                       ? fmt::format(" ({} more out of order within their sync bounds)",
                                     r.causality_within_bounds)
                       : std::string()));
  static constexpr const char* kTimes[] = {"submit", "start", "end", "complete"};
  for (const auto& v : r.violation_list) {
    std::string times;
    for (int k = 0; k < 4; ++k) {
      times += fmt::format("{}{} {}", k ? ", " : "", kTimes[k], v.t[k]);
      if (v.conv[k] != TraceConversion::kNone)
        times += v.claim[k] == kClaimUnbounded
                     ? fmt::format(" (no bound, {})", trace_conversion_name(v.conv[k]))
                     : fmt::format(" (+-{} ns, {})", v.claim[k], trace_conversion_name(v.conv[k]));
    }
    line(fmt::format("  job {:#x}: {} > {} by {} ns beyond the claims: {}", v.corr_id,
                     kTimes[v.step], kTimes[v.step + 1], v.beyond_ns, times));
  }
  return o;
}

}  // namespace perfq
