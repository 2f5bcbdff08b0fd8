// perfq_fuzz_seeds DIR: the fuzzers' seed corpora, made the way perfq makes
// the real thing: synthetic recordings through the trace writer (compressed
// and not, with losses and index gaps), a device region as a device lays it
// out, and an application's hello.  DIR/trace, DIR/region, DIR/app_events.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "core/region.h"
#include "trace/synth.h"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: perfq_fuzz_seeds DIR\n");
    return 2;
  }
  const fs::path dir = argv[1];
  for (const char* sub : {"trace", "region", "app_events"}) fs::create_directories(dir / sub);
  int n = 0;
  for (bool compress : {false, true}) {
    perfq::SynthTraceOptions o;
    o.jobs = 12;
    o.drop_every = 5;
    o.lost_record_count = 3;
    o.loss_chunk_count = 2;
    o.model_error_ns = 700;
    perfq::TraceWriterOptions w;
    w.compress = compress;
    w.records_per_chunk = 16;
    const std::string path = (dir / "trace" / ("synth-" + std::to_string(n++) + ".pq")).string();
    if (auto r = perfq::write_synthetic_trace(path, o, w); !r.is_ok()) {
      std::fprintf(stderr, "perfq_fuzz_seeds: %s\n", r.status().message().c_str());
      return 1;
    }
  }
  perfq::RegionGeometry g;
  g.ring_capacity = 64;
  g.dict_capacity = 8;
  g.app_size = 4096;
  const std::string region = (dir / "region" / "region.bin").string();
  if (auto r = perfq::Region::create(region, g); !r.is_ok()) {
    std::fprintf(stderr, "perfq_fuzz_seeds: %s\n", r.status().message().c_str());
    return 1;
  }
  std::ofstream(dir / "app_events" / "hello.json")
      << R"({"cmd":"app_hello","version":1,"pid":42,"name":"demo","events":[)"
      << R"({"id":1,"name":"job_submit","kind":3},{"id":2,"name":"work","kind":1}]})";
  std::ofstream(dir / "app_events" / "events.json")
      << R"([{"id":3,"name":"bytes","kind":4},{"id":255,"name":"x","kind":2}])";
  return 0;
}
