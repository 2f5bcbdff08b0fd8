// perfq-demo-app: a host program driving the software device's emulated
// accelerator.  Each thread claims a job channel, submits jobs (correlation
// id, requested duration), and waits for their completions, keeping a few in
// flight.  Prints one JSON line: jobs submitted and completed, the host's
// view of the submit-to-complete latency, and the host events it recorded.
//
// Instrumented with the host API (perfq.h): each thread records job_submit
// just before it pushes a job to the device and job_complete when it sees
// the job's completion, arg = the job's correlation id (the id the device
// records in job_start/job_end).  Without a perfq-daemon the events are
// dropped (counted) and the jobs run all the same.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "device/device.h"
#include "device/device_clock.h"
#include "host/transport.h"
#include "jobq.h"
#include "perfq/perfq.hpp"

// Every job submit goes through this plain C function, so that a uprobe can
// see it without changing code, as people watch a driver library's submit
// call: `perfqctl start --uprobe $(which perfq-demo-app):perfq_demo_submit`
// (entry: the job's correlation id, low 32 bits; return: 1 when the device
// took the job).  noipa: never inlined, cloned or folded away.
extern "C" __attribute__((noipa)) int perfq_demo_submit(uint64_t corr_id, perfq::HostJobChannel* ch,
                                                        const perfq_job* job) {
  (void)corr_id;
  return ch->submit(*job) ? 1 : 0;
}

namespace perfq {
namespace {

struct Options {
  std::string device;
  uint64_t jobs = 1000;
  unsigned threads = 2;
  double job_us = 20;
  unsigned inflight = 4;
  double timeout_s = 10;
  std::string socket;  // perfq-daemon's socket; empty: $PERFQ_SOCKET or the default
  double connect_s = 0.5;
  uint64_t copy_bytes = 0;  // staged per job before its submit (h2d_copy)
};

struct HostEvents {
  Event submit{"job_submit", EventKind::kInstant};
  Event complete{"job_complete", EventKind::kInstant};
  // The job's payload copied into a staging buffer before the submit, as a
  // driver stages a host-to-device transfer: its arg is the byte count.
  Event copy{"h2d_copy", EventKind::kSpan, PERFQ_ARG_BYTES};
};

struct ThreadResult {
  uint64_t submitted = 0, completed = 0, unknown = 0;
  uint64_t submit_calls = 0;  // perfq_demo_submit() calls, taken or not
  uint64_t copied_bytes = 0;  // payload bytes staged (h2d_copy)
  std::vector<uint64_t> latency_ns;
  std::string error;
};

void run_thread(const JobQueue& q, unsigned t, uint64_t count, const Options& o,
                const HostEvents& ev, ThreadResult& res) {
  perfq_thread_init(("job-" + std::to_string(t)).c_str());
  auto ch = q.claim(static_cast<uint64_t>(getpid()));
  if (!ch) {
    res.error = ch.status().message();
    return;
  }
  const uint64_t prefix =
      (static_cast<uint64_t>(getpid()) & 0xffffff) << 40 | static_cast<uint64_t>(t & 0xff) << 32;
  std::unordered_map<uint64_t, uint64_t> submit_time;  // corr id -> host time
  // The payload and its staging buffer (each job's bytes differ a little).
  std::vector<unsigned char> payload(o.copy_bytes), staging(o.copy_bytes);
  res.latency_ns.reserve(count);
  Backoff idle(std::chrono::microseconds(50));
  uint64_t last_progress = monotonic_ns();
  const auto timeout_ns = static_cast<uint64_t>(o.timeout_s * 1e9);
  while (res.completed < count) {
    bool progress = false;
    while (res.submitted < count && submit_time.size() < o.inflight) {
      const uint64_t now = monotonic_ns();
      const perfq_job job{prefix | (res.submitted + 1), static_cast<uint64_t>(o.job_us * 1000), now,
                          0};
      if (o.copy_bytes) {
        payload[res.submitted % o.copy_bytes] = static_cast<unsigned char>(res.submitted);
        span_begin(ev.copy, o.copy_bytes);
        std::memcpy(staging.data(), payload.data(), o.copy_bytes);
        span_end(ev.copy, o.copy_bytes);
        res.copied_bytes += o.copy_bytes;
      }
      instant(ev.submit, job.corr_id);
      ++res.submit_calls;
      if (!perfq_demo_submit(job.corr_id, &*ch, &job)) break;
      submit_time.emplace(job.corr_id, now);
      ++res.submitted;
      progress = true;
    }
    perfq_job_completion c;
    while (ch->poll_completion(&c)) {
      const uint64_t now = monotonic_ns();
      auto it = submit_time.find(c.corr_id);
      if (it == submit_time.end()) {
        ++res.unknown;  // not ours: the device answered garbage
        continue;
      }
      instant(ev.complete, c.corr_id);
      res.latency_ns.push_back(now - it->second);
      submit_time.erase(it);
      ++res.completed;
      progress = true;
    }
    if (ch->fault()) {
      res.error = "completion ring: " + ch->fault().describe();
      return;
    }
    if (progress) {
      last_progress = monotonic_ns();
      idle.reset();
    } else {
      if (monotonic_ns() - last_progress > timeout_ns) {
        res.error = "no job completed for " + std::to_string(o.timeout_s) +
                    " s: is the device (perfq-devsim) running?";
        return;
      }
      idle.wait();
    }
  }
}

uint64_t percentile(std::vector<uint64_t>& v, double p) {
  if (v.empty()) return 0;
  const size_t k =
      std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<long>(k), v.end());
  return v[k];
}

int run(const Options& o) {
  auto dev = open_transport(o.device);
  if (!dev) {
    std::fprintf(stderr, "perfq-demo-app: %s\n", dev.status().message().c_str());
    return 1;
  }
  auto q = JobQueue::attach((*dev)->region().app_area());
  if (!q) {
    std::fprintf(stderr, "perfq-demo-app: %s: %s\n", o.device.c_str(),
                 q.status().message().c_str());
    return 1;
  }
  if (o.threads > q->channels()) {
    std::fprintf(stderr, "perfq-demo-app: %u threads but the device has only %u job channels\n",
                 o.threads, q->channels());
    return 2;
  }
  perfq_init("perfq-demo-app", o.socket.empty() ? nullptr : o.socket.c_str());
  const HostEvents ev;
  // Give a running daemon a moment, so the first jobs are recorded too.
  const bool connected = perfq_wait_connected(static_cast<int>(o.connect_s * 1000)) == 1;
  std::vector<ThreadResult> results(o.threads);
  std::vector<std::thread> threads;
  const uint64_t start = monotonic_ns();
  for (unsigned t = 0; t < o.threads; ++t) {
    const uint64_t count = o.jobs / o.threads + (t < o.jobs % o.threads ? 1 : 0);
    threads.emplace_back([&, t, count] { run_thread(*q, t, count, o, ev, results[t]); });
  }
  for (auto& th : threads) th.join();
  const double elapsed = static_cast<double>(monotonic_ns() - start) / 1e9;

  uint64_t submitted = 0, completed = 0, unknown = 0, submit_calls = 0, copied_bytes = 0;
  std::vector<uint64_t> lat;
  int rc = 0;
  for (auto& r : results) {
    submitted += r.submitted;
    completed += r.completed;
    unknown += r.unknown;
    submit_calls += r.submit_calls;
    copied_bytes += r.copied_bytes;
    lat.insert(lat.end(), r.latency_ns.begin(), r.latency_ns.end());
    if (!r.error.empty()) {
      std::fprintf(stderr, "perfq-demo-app: %s\n", r.error.c_str());
      rc = 1;
    }
  }
  perfq_stats hs{};
  perfq_get_stats(&hs);
  nlohmann::json out = {
      {"submitted", submitted},
      {"completed", completed},
      {"unknown_completions", unknown},
      {"submit_calls", submit_calls},
      {"copied_bytes", copied_bytes},
      {"pid", getpid()},
      {"threads", o.threads},
      {"elapsed_s", elapsed},
      {"latency_ns", {{"p50", percentile(lat, 50)}, {"p99", percentile(lat, 99)}}},
      // recorded + dropped + not_recording + lost = the events attempted
      {"host_events",
       {{"recorded", hs.recorded},
        {"dropped", hs.dropped},
        {"not_recording", hs.not_recording},
        {"lost", hs.lost},
        {"connected", connected}}}};
  std::printf("%s\n", out.dump().c_str());
  std::fflush(stdout);
  perfq_shutdown();
  return rc;
}

}  // namespace
}  // namespace perfq

int main(int argc, char** argv) {
  perfq::Options o;
  CLI::App app{
      "perfq-demo-app: submit jobs to a perfq device's job queue from several threads and\n"
      "wait for their completions. Prints one JSON line with the counts and latencies."};
  app.add_option("--device", o.device,
                 "Device: /dev/perfqN (perfq.ko) or shm:PATH (the region perfq-devsim serves)")
      ->required();
  app.add_option("--jobs", o.jobs, "Jobs to run, all threads together")->capture_default_str();
  app.add_option("--threads", o.threads, "Submitting threads, one job channel each")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1024u));
  app.add_option("--job-us", o.job_us, "How long the device works on each job, microseconds")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e6));
  app.add_option("--inflight", o.inflight, "Jobs in flight per thread")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 16));
  app.add_option("--timeout", o.timeout_s, "Give up after S seconds without a completion")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--socket", o.socket,
                 "perfq-daemon's control socket (default: $PERFQ_SOCKET, else " PERFQ_DEFAULT_SOCKET
                 ")");
  app.add_option("--connect-timeout", o.connect_s,
                 "Wait up to S seconds for the daemon before starting the jobs")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 60.0));
  app.add_option("--copy-bytes", o.copy_bytes,
                 "Before each submit, copy a payload of N bytes into a staging buffer, recorded\n"
                 "as an h2d_copy range whose arg is the byte count (report: throughput)")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 30));
  CLI11_PARSE(app, argc, argv);
  return perfq::run(o);
}
