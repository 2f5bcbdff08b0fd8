// CSV export: one line per record.
#include "analysis/export/export_internal.h"

namespace perfq::export_detail {

namespace {

std::string csv_field(std::string_view s) {
  if (s.find_first_of(",\"\n\r") == std::string_view::npos) return std::string(s);
  std::string o = "\"";
  for (char c : s) {
    if (c == '"') o += '"';
    o += c;
  }
  return o + "\"";
}

class CsvExport : public TraceVisitor {
 public:
  explicit CsvExport(OutFile& out) : out_(out) {}
  Status start() {
    return out_.write(
        "time_ns,source,stream,index,event,name,kind,raw_time,arg,claim_ns,converted_by,"
        "source_id\n");
  }
  Status on_metadata(const TraceMetadata& m) override {
    names_.set_metadata(m);
    return Status::ok();
  }
  Status on_records(std::span<const TraceRecord> recs) override {
    line_.clear();
    for (const auto& r : recs) {
      // claim_ns empty: no bound (unsynchronized).
      fmt::format_to(std::back_inserter(line_), "{},{},{},{},{},{},{},{},{},", r.time_ns,
                     csv_field(names_.source_name(r.source)), r.rec.stream, r.rec.index,
                     r.rec.event, csv_field(names_.event(r.source, r.rec.event).name),
                     record_kind_name(r.kind()), r.rec.time, r.rec.arg);
      if (r.claim_ns != kClaimUnbounded)
        fmt::format_to(std::back_inserter(line_), "{}", r.claim_ns);
      // source_id: two sources may share a name (two devices alike).
      fmt::format_to(std::back_inserter(line_), ",{},{}\n", trace_conversion_name(r.conv),
                     r.source);
    }
    return out_.write(line_);
  }

 private:
  OutFile& out_;
  Names names_;
  std::string line_;
};

}  // namespace

Status export_csv(OutFile& file, const std::string& out, const ReadTrace& read) {
  Status s;
  if (s = file.open(out); !s.is_ok()) return s;
  CsvExport v(file);
  if (s = v.start(); !s.is_ok()) return s;
  return read(v);
}

}  // namespace perfq::export_detail
