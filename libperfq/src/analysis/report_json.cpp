// report_to_json(): the report as JSON (`perfqctl report --json`).
#include "perfq/report.h"

#include <nlohmann/json.hpp>

#include <cmath>

#include <fmt/format.h>

#include "analysis/report_format.h"
#include "core/json_schema.h"

namespace perfq {

using report_format::source_kind;
using report_format::source_name;

namespace {

using nlohmann::ordered_json;

ordered_json dist_json(const LatencyStats& d) {
  return ordered_json{{"count", d.count}, {"min", d.min}, {"p50", d.p50},  {"p90", d.p90},
                      {"p99", d.p99},     {"max", d.max}, {"mean", d.mean}};
}

ordered_json sources_json(const TraceReport& r) {
  ordered_json sources = ordered_json::array();
  for (const auto& s : r.metadata.sources) {
    ordered_json src = {{"id", s.id},     {"kind", trace_source_kind_name(s.kind)},
                        {"name", s.name}, {"pci_address", s.pci_address},
                        {"link", s.link}, {"host", s.host}};
    if (s.pci) src["pci"] = ordered_json::parse(pci_device_to_json(*s.pci).dump());
    if (s.ended)
      src["ended"] = ordered_json::parse(trace_source_end_to_json(*s.ended).dump(
          -1, ' ', false, nlohmann::json::error_handler_t::replace));
    sources.push_back(src);
  }
  return sources;
}

// "records" and "lost", with their streams.
void records_json(const TraceReport& r, ordered_json& j) {
  ordered_json streams = ordered_json::array();
  ordered_json loss_streams = ordered_json::array();
  for (const auto& s : r.streams) {
    streams.push_back({{"source", s.source},
                       {"source_name", source_name(r, s.source)},
                       {"kind", source_kind(r, s.source)},
                       {"stream", s.stream},
                       {"records", s.records}});
    if (s.lost || s.loss_events) {
      loss_streams.push_back({{"source", s.source},
                              {"source_name", source_name(r, s.source)},
                              {"kind", source_kind(r, s.source)},
                              {"stream", s.stream},
                              {"lost", s.lost},
                              {"reported", s.reported_lost},
                              {"index_gaps", s.gap_lost},
                              {"loss_events", s.loss_events},
                              {"first_loss_ns", s.first_loss_ns},
                              {"last_loss_ns", s.last_loss_ns},
                              {"first_loss_index", s.first_loss_index}});
    }
  }
  j["records"] = {{"host", r.records_host},
                  {"device", r.records_device},
                  {"total", r.records_host + r.records_device},
                  {"streams", streams}};
  j["lost"] = {{"host", r.lost_host},
               {"device", r.lost_device},
               {"index_gaps_counted", r.index_gaps_counted},
               {"streams", loss_streams}};
}

ordered_json claims_json(const ReportClaims& c) {
  return {{"records", c.records},
          {"by_daemon", c.by_daemon},
          {"by_device", c.by_device},
          {"forced", c.forced},
          {"unbounded", c.unbounded},
          {"unbounded_first_ns", c.unbounded ? ordered_json(c.unbounded_first_ns) : ordered_json()},
          {"unbounded_last_ns", c.unbounded ? ordered_json(c.unbounded_last_ns) : ordered_json()},
          {"unclaimed", c.unclaimed},
          {"worst_ns", c.claim_ns.max},
          {"p50_ns", c.claim_ns.p50},
          {"p99_ns", c.claim_ns.p99}};
}

ordered_json segments_json(const std::vector<ReportSegment>& list) {
  ordered_json segs = ordered_json::array();
  for (const auto& sg : list) {
    ordered_json so = {{"segment", sg.segment}};
    if (sg.from_ns != INT64_MIN) so["from_ns"] = sg.from_ns;
    so["models"] = sg.models;
    so["worst_model_ns"] = sg.worst_model_ns;
    so["records"] = sg.records;
    so["worst_claim_ns"] = sg.worst_claim_ns;
    so["unbounded"] = sg.unbounded;
    segs.push_back(so);
  }
  return segs;
}

// One device's sync figures.
ordered_json sync_json(const ReportSync& d) {
  ordered_json o = {{"synchronized", d.synchronized}};
  if (d.synchronized) {
    o["device_ahead_ns"] = d.standing.device_ahead_ns;
    o["device_fast_ppm"] = d.standing.device_fast_ppm;
    o["standing"] = standing_text(d.standing);
    o["rate_implausible"] = d.standing.rate_implausible;
  }
  o["uncertainty_ns"] = d.uncertainty_ns;
  o["worst_uncertainty_ns"] = d.worst_uncertainty_ns;
  o["samples"] = d.samples;
  o["models"] = d.models;
  o["segments"] = d.segments;
  o["resynced"] = d.resynced;
  o["claims"] = claims_json(d.claims);
  o["segment_list"] = segments_json(d.segment_list);
  return o;
}

// "sync": the first device's figures at the top (the usual single-device
// case), every device's in "devices".
ordered_json sync_section_json(const TraceReport& r) {
  ordered_json devices = ordered_json::array();
  for (const auto& d : r.sync) {
    ordered_json o = {{"source", d.source}, {"name", d.name}};
    o.update(sync_json(d));
    devices.push_back(o);
  }
  ordered_json sync = sync_json(r.sync.empty() ? ReportSync{} : r.sync.front());
  sync["devices"] = devices;
  if (!r.resync_notes.empty()) sync["resync_notes"] = r.resync_notes;
  return sync;
}

ordered_json events_json(const TraceReport& r) {
  ordered_json events = ordered_json::array();
  for (const auto& e : r.events) {
    ordered_json o = {{"source", e.source},
                      {"source_name", source_name(r, e.source)},
                      {"event", e.event},
                      {"name", e.name},
                      {"kind", record_kind_name(e.kind)},
                      {"count", e.count},
                      {"rate_per_s", e.rate_per_s}};
    if (e.kind == PERFQ_KIND_COUNTER && e.count)
      o["values"] = {{"min", e.values.min},
                     {"mean", e.values.mean},
                     {"max", e.values.max},
                     {"min_at_ns", e.values.min_at_ns},
                     {"max_at_ns", e.values.max_at_ns}};
    if (const auto& t = e.throughput) {
      ordered_json link = nullptr;
      if (t->link_source)
        link = {{"source", t->link_source}, {"source_name", source_name(r, t->link_source)},
                {"link", t->link},          {"ceiling_bytes_per_s", t->link_bytes_per_s},
                {"share", t->link_share},   {"in_range_share", t->in_range_link_share}};
      o["throughput"] = {{"calls", t->calls},
                         {"bytes", t->bytes},
                         {"bytes_per_call", t->bytes_per_call},
                         {"min_bytes", t->min_bytes},
                         {"max_bytes", t->max_bytes},
                         {"max_at_ns", t->max_at_ns},
                         {"bytes_per_s", t->bytes_per_s},
                         {"ranges", t->ranges},
                         {"range_bytes", t->range_bytes},
                         {"range_ns", t->range_ns},
                         {"in_range_bytes_per_s", t->in_range_bytes_per_s},
                         {"links_known", t->links_known},
                         {"link", link}};
    }
    events.push_back(o);
  }
  return events;
}

ordered_json durations_json(const TraceReport& r) {
  ordered_json pairs = ordered_json::array();
  for (const auto& p : r.pairs) {
    ordered_json d = dist_json(p.duration);
    pairs.push_back({{"source", p.source},
                     {"source_name", source_name(r, p.source)},
                     {"name", p.name},
                     {"duration_ns", d},
                     {"max_at_ns", p.max_at_ns}});
  }
  return pairs;
}

// A distribution's bins on a log axis: [lo_ns, hi_ns, count] each.
ordered_json bins_json(const ReportHistogram& h) {
  ordered_json bins = ordered_json::array();
  for (const auto& b : h.bins) bins.push_back({b.lo_ns, b.hi_ns, b.count});
  return {{"at_most_zero", h.at_most_zero}, {"bins", bins}};
}

ordered_json jobs_json(const ReportJobs& jobs) {
  ordered_json worst = ordered_json::array();
  for (const auto& w : jobs.worst)
    worst.push_back({{"corr_id", w.corr_id},
                     {"latency_ns", w.latency_ns()},
                     {"submit_ns", w.submit_ns},
                     {"start_ns", w.start_ns},
                     {"end_ns", w.end_ns},
                     {"complete_ns", w.complete_ns}});
  return {{"count", jobs.count},
          {"incomplete", jobs.incomplete},
          {"submit_to_start_ns", dist_json(jobs.submit_to_start)},
          {"start_to_end_ns", dist_json(jobs.start_to_end)},
          {"end_to_complete_ns", dist_json(jobs.end_to_complete)},
          {"histograms",
           {{"submit_to_start_ns", bins_json(jobs.submit_to_start_bins)},
            {"start_to_end_ns", bins_json(jobs.start_to_end_bins)},
            {"end_to_complete_ns", bins_json(jobs.end_to_complete_bins)}}},
          {"worst", worst}};
}

// NaN (nothing in the bin) as null.
ordered_json maybe_json(const std::vector<double>& v) {
  ordered_json a = ordered_json::array();
  for (double x : v) a.push_back(std::isnan(x) ? ordered_json() : ordered_json(x));
  return a;
}

// "timeline": counts per bin of one shared time axis.
ordered_json timeline_json(const TraceReport& r) {
  const ReportTimeline& tl = r.timeline;
  ordered_json streams = ordered_json::array();
  for (const auto& s : tl.streams) {
    streams.push_back({{"source", s.source},
                       {"source_name", source_name(r, s.source)},
                       {"kind", source_kind(r, s.source)},
                       {"stream", s.stream},
                       {"records", s.records},
                       {"lost", s.lost}});
  }
  ordered_json sync = ordered_json::array();
  for (const auto& s : tl.sync) {
    sync.push_back({{"source", s.source},
                    {"source_name", source_name(r, s.source)},
                    {"rounds", s.rounds},
                    {"failed_rounds", s.failed},
                    {"worst_residual_ns", maybe_json(s.worst_residual_ns)},
                    {"claimed_bound_ns", maybe_json(s.claimed_bound_ns)}});
  }
  return {{"start_ns", tl.start_ns},
          {"bin_ns", tl.bin_ns},
          {"bins", tl.bins},
          {"streams", streams},
          {"sync", sync}};
}

ordered_json off_cpu_json(const ReportOffCpu& oc) {
  ordered_json worst = ordered_json::array();
  for (const auto& w : oc.worst)
    worst.push_back({{"corr_id", w.corr_id},
                     {"tid", w.tid},
                     {"off_cpu_ns", w.off_cpu_ns},
                     {"latency_ns", w.latency_ns}});
  return {{"jobs", oc.jobs},
          {"jobs_off_cpu", oc.jobs_off_cpu},
          {"off_cpu_ns", dist_json(oc.off_cpu)},
          {"inferred_switch_ins", oc.inferred_switch_ins},
          {"records_while_off", oc.records_while_off},
          {"worst", worst}};
}

}  // namespace

std::string report_to_json(const TraceReport& r) {
  ordered_json j;
  j["schema_version"] = kJsonSchemaVersion;
  j["file"] = r.path;
  j["complete"] = r.stopped_early.empty() && r.problems.empty();
  j["clean_end"] = r.clean_end;
  if (!r.stopped_early.empty()) {
    j["stopped_early"] = {{"offset", r.stop_offset}, {"reason", r.stopped_early}};
  }
  if (!r.problems.empty()) {
    ordered_json ps = ordered_json::array();
    for (const auto& p : r.problems) ps.push_back({{"offset", p.offset}, {"reason", p.message}});
    j["problems"] = std::move(ps);
  }
  j["host"] = {{"name", r.metadata.host_name},
               {"kernel", r.metadata.kernel},
               {"cpu", r.metadata.cpu},
               {"perfq_version", r.metadata.perfq_version}};
  // A merged trace's hosts (perfqctl merge): each one's alignment on the
  // first one's timeline, and its bound (-1: none).
  if (!r.metadata.hosts.empty()) {
    ordered_json hosts = ordered_json::array();
    for (const auto& h : r.metadata.hosts)
      hosts.push_back(ordered_json::parse(
          trace_host_to_json(h).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)));
    j["hosts"] = std::move(hosts);
  }
  j["sources"] = sources_json(r);
  j["first_ns"] = r.first_ns;
  j["last_ns"] = r.last_ns;
  j["duration_ns"] = r.duration_ns;
  // "recording": the recorder's start to stop; "records": first to last record.
  j["duration_of"] = r.duration_of_recording ? "recording" : "records";
  if (r.duration_of_recording) {
    j["recording_start_ns"] = r.recording_start_ns;
    j["recording_stop_ns"] = r.recording_stop_ns;
  }
  records_json(r, j);
  j["sync"] = sync_section_json(r);
  j["events"] = events_json(r);
  j["durations"] = durations_json(r);
  ordered_json nested = ordered_json::array();
  for (const auto& n : r.nested)
    nested.push_back({{"source", n.source},
                      {"source_name", source_name(r, n.source)},
                      {"parent", n.parent},
                      {"child", n.child},
                      {"count", n.count},
                      {"child_ns", n.child_ns},
                      {"parent_ns", n.parent_ns},
                      {"share", n.share}});
  j["nested"] = nested;
  j["unmatched_ends"] = r.unmatched_ends;
  j["jobs"] = jobs_json(r.jobs);
  if (r.jobs.off_cpu.available) j["off_cpu"] = off_cpu_json(r.jobs.off_cpu);
  j["causality_violations"] = r.causality_violations;
  {
    static constexpr const char* kTimes[] = {"submit", "start", "end", "complete"};
    ordered_json list = ordered_json::array();
    for (const auto& v : r.violation_list) {
      ordered_json o = {{"corr_id", v.corr_id},
                        {"step", fmt::format("{} > {}", kTimes[v.step], kTimes[v.step + 1])},
                        {"beyond_ns", v.beyond_ns}};
      for (int k = 0; k < 4; ++k)
        o[kTimes[k]] = {
            {"time_ns", v.t[k]},
            {"claim_ns", v.claim[k] == kClaimUnbounded ? ordered_json() : ordered_json(v.claim[k])},
            {"converted_by", trace_conversion_name(v.conv[k])}};
      list.push_back(o);
    }
    j["causality_violation_list"] = list;
  }
  j["causality_within_bounds"] = r.causality_within_bounds;
  j["timeline"] = timeline_json(r);
  return j.dump(2, ' ', false, ordered_json::error_handler_t::replace) + "\n";
}

}  // namespace perfq
