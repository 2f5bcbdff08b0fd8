// export_trace(): streaming exports of a trace file (see perfq/export.h):
// the format names and the dispatch to each format's file.
#include "perfq/export.h"

#include <filesystem>

#include <fmt/format.h>

#include "analysis/export/export_internal.h"

namespace perfq {

Result<TraceExportFormat> parse_export_format(std::string_view name) {
  if (name == "perfetto") return TraceExportFormat::kPerfetto;
  if (name == "chrome-json") return TraceExportFormat::kChromeJson;
  if (name == "ctf") return TraceExportFormat::kCtf;
  if (name == "csv") return TraceExportFormat::kCsv;
  return Status(Errc::kInvalidArgument,
                fmt::format("unknown export format '{}' (perfetto, chrome-json, ctf, csv)", name));
}

const char* export_format_name(TraceExportFormat f) {
  switch (f) {
    case TraceExportFormat::kPerfetto:
      return "perfetto";
    case TraceExportFormat::kChromeJson:
      return "chrome-json";
    case TraceExportFormat::kCtf:
      return "ctf";
    case TraceExportFormat::kCsv:
      return "csv";
  }
  return "?";
}

Result<TraceExportSummary> export_trace(const std::string& in, TraceExportFormat format,
                                        const std::string& out, const TraceFilter& filter,
                                        const TraceProgress& progress) {
  return export_trace(in, format, out, TraceExportOptions{}, filter, progress);
}

Result<TraceExportSummary> export_trace(const std::string& in, TraceExportFormat format,
                                        const std::string& out, const TraceExportOptions& options,
                                        const TraceFilter& filter, const TraceProgress& progress) {
  using namespace export_detail;
  if (options.compress && format != TraceExportFormat::kPerfetto)
    return Status(Errc::kInvalidArgument, fmt::format("{} cannot be compressed (only perfetto can)",
                                                      export_format_name(format)));
  auto reader = TraceReader::open(in);
  if (!reader.is_ok()) return reader.status();
  TraceExportSummary sum;
  OutFile file;
  Status s;
  auto run = [&](TraceVisitor& v) -> Status {
    auto filtered = make_filter_visitor(filter, v);
    TraceVisitor& inner = filter.empty() ? v : *filtered;
    std::error_code size_error;
    const uint64_t bytes_total = std::filesystem::file_size(in, size_error);
    auto shown = progress ? make_progress_visitor(*reader, size_error ? 0 : bytes_total, 1, 1,
                                                  progress, inner)
                          : nullptr;
    Status r = reader->read(shown ? *shown : inner);
    sum.records = reader->summary().records;
    sum.problems = reader->summary().problems;
    if (!r.is_ok() && r.code() == Errc::kCorrupt) {
      sum.stopped_early = r.message();
      sum.stop_offset = reader->error_offset();
      return Status::ok();
    }
    return r;
  };
  switch (format) {
    case TraceExportFormat::kCsv:
      s = export_csv(file, out, run);
      break;
    case TraceExportFormat::kChromeJson:
      s = export_chrome_json(file, out, run);
      break;
    case TraceExportFormat::kPerfetto:
      s = export_perfetto(file, out, run, options.compress);
      break;
    case TraceExportFormat::kCtf:
      s = export_ctf(file, out, run);
      break;
  }
  if (!s.is_ok()) return s;
  if (s = file.close(); !s.is_ok()) return s;
  return sum;
}

}  // namespace perfq
