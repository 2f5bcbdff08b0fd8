// Exports of a trace file to the viewers people already use, behind
// `perfqctl export`.  Every export streams: it holds one chunk of the input
// and a small per-stream state, never the whole trace.
//
//   perfetto     Perfetto protobuf (Trace / TracePacket / TrackDescriptor /
//                TrackEvent / InternedData / ClockSnapshot), encoded by a
//                small hand-written protobuf writer: interned names, times as
//                deltas on a sequence per track, counter tracks; the message
//                subset (Perfetto's names and numbers) is
//                tests/data/perfetto_trace.proto.  With `compress`, the
//                packets go in zlib-compressed batches (TracePacket
//                .compressed_packets, as Perfetto's own DEFLATE compression
//                writes them), about a quarter of the size; the Perfetto UI
//                and trace_processor read both.
//   chrome-json  Trace Event Format (JSON object form, us timestamps).
//   ctf          a CTF 1.8 directory: `metadata` (TSDL) + `stream_0`.
//   csv          one row per record:
//                time_ns,source,stream,index,event,name,kind,raw_time,arg,
//                claim_ns,converted_by,source_id
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "perfq/filter.h"
#include "perfq/progress.h"
#include "perfq/status.h"

namespace perfq {

enum class TraceExportFormat { kPerfetto, kChromeJson, kCtf, kCsv };

// "perfetto", "chrome-json", "ctf" or "csv".
Result<TraceExportFormat> parse_export_format(std::string_view name);
const char* export_format_name(TraceExportFormat f);

struct TraceExportSummary {
  uint64_t records = 0;  // records read from the trace and exported
  // Non-empty when the input ended at a torn or corrupt chunk: the reader's
  // message; everything before it was exported.
  std::string stopped_early;
  uint64_t stop_offset = 0;
  // Faults of the file's structure the reader read past (TraceProblem).
  std::vector<TraceProblem> problems;
};

// Exports the trace at `in` to `out` (a file, "-" for standard output; a
// directory for ctf, created if missing, or with "-" that directory as a tar
// archive of ctf/metadata and ctf/stream_0 on standard output).  Fails on an
// unreadable input header or any write error.  Only what `filter` keeps is
// exported (perfq/filter.h); `progress`, when set, is called after each chunk.
Result<TraceExportSummary> export_trace(const std::string& in, TraceExportFormat format,
                                        const std::string& out, const TraceFilter& filter = {},
                                        const TraceProgress& progress = {});

// How an export is written, where a format has a choice.
struct TraceExportOptions {
  // perfetto: zlib-compressed packet batches (TracePacket.compressed_packets).
  // Other formats refuse it (export_trace fails with kInvalidArgument).
  bool compress = false;
};
// export_trace() with options.
Result<TraceExportSummary> export_trace(const std::string& in, TraceExportFormat format,
                                        const std::string& out, const TraceExportOptions& options,
                                        const TraceFilter& filter = {},
                                        const TraceProgress& progress = {});

}  // namespace perfq
