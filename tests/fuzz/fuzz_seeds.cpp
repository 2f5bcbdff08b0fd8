// perfq_fuzz_seeds DIR: the fuzzers' seed corpora, made the way perfq makes
// the real thing: synthetic recordings through the trace writer (compressed
// and not, with losses and index gaps), a device region as a device lays it
// out, an application's hello, control requests as perfqctl sends them,
// sync rounds as a device answers them, and a thread's ring as the daemon
// hands it over.  DIR/trace, DIR/region, DIR/app_events, DIR/control,
// DIR/sync, DIR/app_ring.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "core/region.h"
#include "core/spsc_ring.h"
#include "trace/synth.h"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: perfq_fuzz_seeds DIR\n");
    return 2;
  }
  const fs::path dir = argv[1];
  for (const char* sub : {"trace", "region", "app_events", "control", "sync", "app_ring"})
    fs::create_directories(dir / sub);
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

  // Control requests, one per line, as perfqctl writes them.
  std::ofstream(dir / "control" / "requests.jsonl")
      << R"({"cmd":"status"})"
      << "\n"
      << R"({"cmd":"devices","all":true})"
      << "\n"
      << R"({"cmd":"start","output":"/var/tmp/x.trace","force":false,"devices":["shm:/dev/shm/d",)"
      << R"("/dev/perfq0"],"sync_interval_ms":100,"sync_mode":"b","duration_s":2.5,)"
      << R"("kernel_events":"sched,syscalls","pids":[1,42],"uprobes":["/bin/true:main"]})"
      << "\n"
      << R"({"cmd":"stop"})"
      << "\n";

  // Sync rounds: the declared rates (1 GHz clock, 62.5 MHz timer), then
  // rounds of 8 host reads (H1, R2, H2) and 8 device samples (R1, D, R1)
  // of a device 1 ms ahead, running 20 ppm fast.
  {
    std::string in;
    auto put64 = [&in](uint64_t v) { in.append(reinterpret_cast<const char*>(&v), 8); };
    put64(1'000'000'000);
    put64(62'500'000);
    for (int round = 0; round < 12; ++round) {
      in.push_back(8);
      in.push_back(8);
      const uint64_t h0 = 5'000'000'000ull + static_cast<uint64_t>(round) * 100'000'000ull;
      for (int i = 0; i < 8; ++i) {
        const uint64_t h = h0 + static_cast<uint64_t>(i) * 3000;
        put64(h);
        put64(h * 62'500'000ull / 1'000'000'000ull);  // R2, the timer in its ticks
        put64(h + 250);
        put64(0);
      }
      for (int i = 0; i < 8; ++i) {
        const uint64_t h = h0 + static_cast<uint64_t>(i) * 3000 + 1000;
        const uint64_t r = h * 62'500'000ull / 1'000'000'000ull;
        put64(r);
        put64(h + 1'000'000 + h / 50'000);  // D: 1 ms ahead, 20 ppm fast
        put64(r + 2);
        put64(0);
      }
    }
    std::ofstream(dir / "sync" / "rounds.bin", std::ios::binary) << in;
  }

  // A thread's ring as perfq-daemon hands it over: its reply, the seals
  // (shrink and grow), and the memfd's bytes (header, SPSC header, slots).
  {
    const uint64_t cap = 64;
    std::string ring(PERFQ_APP_RING_OFFSET_SLOTS + cap * sizeof(perfq_record), '\0');
    perfq_app_ring_header hdr{};
    hdr.magic = PERFQ_APP_RING_MAGIC;
    hdr.version = PERFQ_ABI_VERSION;
    hdr.stream = 3;
    hdr.recording = 1;
    std::memcpy(ring.data(), &hdr, sizeof hdr);
    if (!perfq::SpscRingMemory<perfq_record>::init(ring.data() + PERFQ_APP_RING_OFFSET_SPSC,
                                                   ring.size() - PERFQ_APP_RING_OFFSET_SPSC, cap)
             .is_ok()) {
      std::fprintf(stderr, "perfq_fuzz_seeds: cannot lay out an app ring\n");
      return 1;
    }
    std::ofstream(dir / "app_ring" / "ring.bin", std::ios::binary)
        << R"({"ok":true,"stream":3,"ring_records":64,"bytes":)" << ring.size() << "}\n"
        << '\x03' << ring;
  }
  return 0;
}
