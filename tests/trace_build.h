// Small traces built record by record, for tests that need exact contents
// (the synthetic generator in trace/synth.h makes whole workloads).
#pragma once

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "perfq/trace.h"

namespace perfq {

// Host-clock instants, each stream's indexes counted per source.
struct TraceBuilder {
  std::vector<TraceRecord> records;
  std::vector<std::pair<uint16_t, uint64_t>> next_index;  // source -> next index

  void instant(uint16_t source, uint16_t stream, uint32_t event, int64_t t, uint64_t arg) {
    uint64_t* idx = nullptr;
    for (auto& [s, n] : next_index)
      if (s == source) idx = &n;
    if (!idx) idx = &next_index.emplace_back(source, 0).second;
    TraceRecord r;
    r.source = source;
    r.rec.index = (*idx)++;
    r.rec.event = event;
    r.rec.stream = stream;
    r.rec.flags = PERFQ_FLAGS(PERFQ_KIND_INSTANT, PERFQ_CLOCK_HOST);
    r.rec.time = static_cast<uint64_t>(t);
    r.rec.arg = arg;
    r.time_ns = t;
    records.push_back(r);
  }

  void write(const std::string& path, const TraceMetadata& meta) const {
    auto w = TraceWriter::open(path, meta);
    REQUIRE(w.is_ok());
    REQUIRE(w->append_records(records).is_ok());
    REQUIRE(w->close().is_ok());
  }
};

}  // namespace perfq
