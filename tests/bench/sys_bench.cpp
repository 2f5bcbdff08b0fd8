// Process-level helpers of scripts/bench.py; each prints one JSON line.
//
//   perfq_sys_bench compute --calibrate
//       the compute chunk (loop iterations) that takes about 1 us here.
//   perfq_sys_bench compute --chunk N --seconds S [--trace]
//       a compute-bound worker: chunks of N iterations for S seconds of its
//       own CPU time; with --trace it records one perfq_instant per chunk
//       (about 1 M events/s) through the daemon at PERFQ_SOCKET.  Prints the
//       chunks per CPU second and per wall second, and the library's counts.
//   perfq_sys_bench sync --device SPEC --rounds N [--samples K] [--enough-reads E]
//                        [--no-announce]
//       N HostSync rounds (mode A) against a running device (perfq-devsim),
//       at most K register reads each (the daemon's 48 by default), ending
//       once E were tight (HostSyncOptions::enough_reads; 0: K), 10 ms
//       apart, each announced to the device as the daemon does
//       (HostSync::next_round_in(); not with --no-announce); prints the
//       median and mean host CPU time per round, the mean reads and the
//       rounds that found the device awake for them.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "device/device.h"
#include "device/device_clock.h"
#include "device/timer.h"
#include "host/host_sync.h"
#include "host/transport.h"
#include "perfq/perfq.h"

namespace perfq {
namespace {

uint64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
}

// The work: a dependent chain of multiply-xorshift steps (no memory traffic).
__attribute__((noinline)) uint64_t compute(uint64_t x, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    x ^= x >> 17;
    x *= 0x9E3779B97F4A7C15ull;
    x += i;
  }
  return x;
}

const char* arg_value(int argc, char** argv, const char* name, const char* def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return def;
}
bool has_flag(int argc, char** argv, const char* name) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return true;
  return false;
}

int cmd_compute(int argc, char** argv) {
  if (has_flag(argc, argv, "--calibrate")) {
    uint64_t n = 1000, x = 1;
    for (;;) {
      const uint64_t t0 = thread_cpu_ns();
      x = compute(x, n);
      const uint64_t dt = thread_cpu_ns() - t0;
      if (dt > 50'000'000) {
        const uint64_t chunk = std::max<uint64_t>(1, n * 1000 / dt);
        std::printf("{\"chunk\":%llu,\"x\":%llu}\n", static_cast<unsigned long long>(chunk),
                    static_cast<unsigned long long>(x & 1));
        return 0;
      }
      n *= 2;
    }
  }
  const uint64_t chunk = std::stoull(arg_value(argc, argv, "--chunk", "100"));
  const double seconds = std::stod(arg_value(argc, argv, "--seconds", "1"));
  const bool trace = has_flag(argc, argv, "--trace");
  uint32_t ev = 0;
  if (trace) {
    if (perfq_init("perfq-interference", nullptr) != 0 || !perfq_wait_connected(5000)) {
      std::fprintf(stderr, "perfq_sys_bench: no daemon at PERFQ_SOCKET\n");
      return 1;
    }
    ev = perfq_event("compute_chunk", PERFQ_KIND_INSTANT);
    if (perfq_thread_init("worker") != 0) {
      std::fprintf(stderr, "perfq_sys_bench: no ring for the worker\n");
      return 1;
    }
  }
  const uint64_t budget = static_cast<uint64_t>(seconds * 1e9);
  const uint64_t cpu0 = thread_cpu_ns(), wall0 = monotonic_ns();
  uint64_t x = 1, chunks = 0, cpu = 0;
  // Check the CPU clock every 1024 chunks only: it is a system call.
  while (cpu < budget) {
    for (int k = 0; k < 1024; ++k) {
      x = compute(x, chunk);
      if (trace) perfq_instant(ev, chunks + static_cast<uint64_t>(k));
    }
    chunks += 1024;
    cpu = thread_cpu_ns() - cpu0;
  }
  const uint64_t wall = monotonic_ns() - wall0;
  perfq_stats st{};
  perfq_get_stats(&st);
  std::printf(
      "{\"chunks\":%llu,\"chunks_per_cpu_s\":%.1f,\"chunks_per_wall_s\":%.1f,\"events_per_s\":%.1f,"
      "\"recorded\":%llu,\"lost\":%llu,\"dropped\":%llu,\"x\":%llu}\n",
      static_cast<unsigned long long>(chunks),
      static_cast<double>(chunks) * 1e9 / static_cast<double>(cpu),
      static_cast<double>(chunks) * 1e9 / static_cast<double>(wall),
      trace ? static_cast<double>(chunks) * 1e9 / static_cast<double>(wall) : 0.0,
      static_cast<unsigned long long>(st.recorded), static_cast<unsigned long long>(st.lost),
      static_cast<unsigned long long>(st.dropped + st.not_recording),
      static_cast<unsigned long long>(x & 1));
  if (trace) perfq_shutdown();
  return 0;
}

int cmd_sync(int argc, char** argv) {
  const std::string spec = arg_value(argc, argv, "--device", "");
  const int rounds = std::stoi(arg_value(argc, argv, "--rounds", "50"));
  std::unique_ptr<DeviceTransport> t;
  for (int i = 0; i < 1000 && !t; ++i) {
    auto r = open_transport(spec);
    if (r.is_ok() && device_state(r.value()->region()) == PERFQ_DEVICE_RUNNING)
      t = std::move(r.value());
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (!t) {
    std::fprintf(stderr, "perfq_sys_bench: no running device at %s\n", spec.c_str());
    return 1;
  }
  // As the daemon's sync thread does.
  if (Status s = raise_sync_priority(); !s)
    std::fprintf(stderr, "perfq_sys_bench: %s\n", s.message().c_str());
  HostSyncOptions so;
  so.keep_rounds = 1;  // as the daemon: each round goes to the trace at once
  so.samples = std::stoul(arg_value(argc, argv, "--samples", std::to_string(so.samples).c_str()));
  so.enough_reads =
      std::stoul(arg_value(argc, argv, "--enough-reads", std::to_string(so.enough_reads).c_str()));
  const bool announce = !has_flag(argc, argv, "--no-announce");
  HostSync hs(*t, so);
  std::vector<uint64_t> cpu;
  int failed = 0;
  size_t reads = 0;
  size_t awake = 0;  // rounds that found the device's timer server awake for them
  for (int i = 0; i < rounds; ++i) {
    awake += __atomic_load_n(&t->region().timer()->serving, __ATOMIC_ACQUIRE) == 1;
    auto r = hs.round();
    if (r) {
      cpu.push_back(r->cpu_ns);
      reads += hs.rounds().back().host.size();
    } else {
      ++failed;
    }
    // The daemon's pace, roughly, announced as the daemon does.
    if (announce) hs.next_round_in(std::chrono::milliseconds(10));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (cpu.empty()) {
    std::fprintf(stderr, "perfq_sys_bench: every sync round failed\n");
    return 1;
  }
  std::sort(cpu.begin(), cpu.end());
  double mean = 0;
  for (uint64_t c : cpu) mean += static_cast<double>(c);
  mean /= static_cast<double>(cpu.size());
  std::printf(
      "{\"rounds\":%zu,\"failed\":%d,\"median_cpu_ns\":%llu,\"mean_cpu_ns\":%.0f,"
      "\"p90_cpu_ns\":%llu,\"max_cpu_ns\":%llu,\"mean_reads\":%.1f,\"awake_rounds\":%zu}\n",
      cpu.size(), failed, static_cast<unsigned long long>(cpu[cpu.size() / 2]), mean,
      static_cast<unsigned long long>(cpu[cpu.size() * 9 / 10]),
      static_cast<unsigned long long>(cpu.back()),
      static_cast<double>(reads) / static_cast<double>(cpu.size()), awake);
  return 0;
}

}  // namespace
}  // namespace perfq

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "compute") == 0) return perfq::cmd_compute(argc, argv);
  if (argc >= 2 && std::strcmp(argv[1], "sync") == 0) return perfq::cmd_sync(argc, argv);
  std::fprintf(stderr, "usage: perfq_sys_bench compute|sync ...\n");
  return 2;
}
