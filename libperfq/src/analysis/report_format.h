// What the report's formats (report_json.cpp, report_text.cpp) share.
#pragma once
#include <cstdint>
#include <string>

#include <fmt/format.h>

#include "perfq/report.h"

namespace perfq::report_format {

inline std::string source_name(const TraceReport& r, uint16_t id) {
  const TraceSource* s = r.metadata.find_source(id);
  return s ? r.metadata.source_label(*s) : fmt::format("source {}", id);
}

inline const char* source_kind(const TraceReport& r, uint16_t id) {
  const TraceSource* s = r.metadata.find_source(id);
  return s ? trace_source_kind_name(s->kind) : "host";
}

}  // namespace perfq::report_format
