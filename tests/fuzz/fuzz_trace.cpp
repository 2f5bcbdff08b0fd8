// libFuzzer: a hostile trace file.  The reader (file header, every chunk
// kind, the file's structure), then everything perfq does with what it
// read: the report (with and without --resync) in each rendering, or (built
// with PERFQ_FUZZ_EXPORTS: perfq_fuzz_trace_export) every export.  Whatever
// the bytes, no crash, no hang, no unbounded allocation; an error is a
// Status with an offset.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "perfq/export.h"
#include "perfq/report.h"
#include "perfq/trace.h"

namespace {

// A scratch folder of this process, removed when it exits (libFuzzer ends a
// timed run with exit()), so that runs leave nothing in /dev/shm.
std::string& scratch_path() {
  static std::string path;
  return path;
}
void remove_scratch() {
  std::error_code ec;
  std::filesystem::remove_all(scratch_path(), ec);
}
std::string scratch_dir() {
  static const bool made = [] {
    scratch_path() = "/dev/shm/perfq-fuzz-trace-" + std::to_string(::getpid());
    std::filesystem::create_directories(scratch_path());
    std::atexit(remove_scratch);
    return true;
  }();
  (void)made;
  return scratch_path();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string dir = scratch_dir();
  const std::string in = dir + "/in.pq";
  {
    std::FILE* f = std::fopen(in.c_str(), "wb");
    if (!f) return 0;
    std::fwrite(data, 1, size, f);
    std::fclose(f);
  }
#ifndef PERFQ_FUZZ_EXPORTS
  for (bool resync : {false, true}) {
    perfq::TraceReportOptions o;
    o.resync = resync;
    auto r = perfq::analyze_trace(in, o);
    if (!r.is_ok()) break;  // refused at the header: the exports refuse it too
    (void)perfq::report_to_json(r.value());
    (void)perfq::report_to_text(r.value());
    (void)perfq::report_to_html(r.value(), "/* chart.js */");
  }
#else
  for (auto fmt : {perfq::TraceExportFormat::kCsv, perfq::TraceExportFormat::kChromeJson,
                   perfq::TraceExportFormat::kPerfetto, perfq::TraceExportFormat::kCtf}) {
    const std::string out = dir + "/out." + perfq::export_format_name(fmt);
    (void)perfq::export_trace(in, fmt, out);
  }
#endif
  return 0;
}
