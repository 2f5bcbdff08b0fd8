// perfq-devsim: the device side in software.
//
// Creates or opens a region (a file under /dev/shm, or the file backing
// QEMU's ivshmem device), publishes its event dictionary and job queue, and
// runs the device: synthetic worker threads and job workers record into
// their own queues, one collector moves the records into the shared ring,
// and a timer server answers the host's register reads.  Runs until SIGINT,
// SIGTERM or --duration, then prints exactly one JSON line of accounting.
#include <pthread.h>
#include <signal.h>
#include <time.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "core/region.h"
#include "device/device.h"
#include "device/device_clock.h"
#include "device/timer.h"
#include "jobq.h"

namespace perfq {
namespace {

// The device's event dictionary.
enum DevsimEvent : uint32_t {
  kEvJobStart = 1,
  kEvJobEnd = 2,
  kEvTick = 3,
  kEvDmaRead = 4,  // with --job-bytes: a job's payload read, its arg the byte count
};

const std::vector<EventInfo> kDictionary = {
    {PERFQ_EVENT_LOST, PERFQ_KIND_LOST, "perfq_lost"},
    {kEvJobStart, PERFQ_KIND_BEGIN, "job_start"},
    {kEvJobEnd, PERFQ_KIND_END, "job_end"},
    {kEvTick, PERFQ_KIND_INSTANT, "tick"},
};
const EventInfo kDmaRead = {kEvDmaRead, PERFQ_KIND_INSTANT, "dma_read", {std::string(kArgBytes)}};

struct Options {
  std::string region;
  bool create = false;
  uint64_t ring_records = 1u << 16;
  uint64_t region_size = 0;
  uint64_t queue_records = 1u << 14;
  unsigned workers = 2;
  unsigned job_workers = 2;
  double rate = 10000;
  double duration = 0;
  int64_t clock_offset_ns = 0;
  double clock_drift_ppm = 0;
  uint64_t clock_jitter_ns = 0;
  std::vector<double> step_at;
  std::vector<int64_t> step_ns;
  uint64_t timer_hz = 1'000'000'000;
  uint64_t timer_offset = 0;
  bool truth = false;
  bool wait_host = false;
  double start_after = 0;
  uint64_t job_bytes = 0;
  std::string name = "perfq-devsim";
};

void sleep_ns(uint64_t ns) {
  timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  nanosleep(&ts, nullptr);
}

// A synthetic worker: `tick` events at a steady rate, scheduled against the
// clock so a stall anywhere else does not slow it down.  It sleeps until
// at least kBurst events are due (at most 1 ms): every sleep costs a
// context switch, tens of us in a VM, and waking for each of 500 000
// events a second would spend the CPU the drain needs on the switches.
constexpr double kBurst = 256;
constexpr uint64_t kMaxNap = 1'000'000;
void synthetic_worker(DeviceQueue& s, const SimClock& clock, double rate, bool truth,
                      const std::atomic<bool>& go, const std::atomic<bool>& stop) {
  if (rate <= 0) return;
  while (!go.load(std::memory_order_acquire)) {
    if (stop.load(std::memory_order_relaxed)) return;
    sleep_ns(100'000);
  }
  const double period_ns = 1e9 / rate;
  const auto nap = static_cast<uint64_t>(std::min(kBurst * period_ns, double(kMaxNap)));
  const uint64_t start = monotonic_ns();
  uint64_t n = 0;
  while (!stop.load(std::memory_order_relaxed)) {
    const uint64_t now = monotonic_ns();
    const auto due = static_cast<uint64_t>(static_cast<double>(now - start) / period_ns) + 1;
    for (int burst = 0; n < due && burst < 4096; ++burst, ++n) {
      const uint64_t t = monotonic_ns();
      (void)s.record_at(kEvTick, PERFQ_KIND_INSTANT, clock.device_time_at(t), truth ? t : n);
    }
    if (n >= due) {
      const auto next = start + static_cast<uint64_t>(static_cast<double>(n) * period_ns);
      const uint64_t t = monotonic_ns();
      if (next > t) sleep_ns(std::min(std::max(next - t, nap), kMaxNap));
    }
  }
}

// A job worker: runs the jobs of its channels (busy for the requested time)
// and posts completions; job_start/job_end carry the correlation id.
void job_worker(DeviceQueue& s, const SimClock& clock, const JobQueue& q, unsigned index,
                unsigned count, uint64_t job_bytes, const std::atomic<bool>& stop,
                std::atomic<uint64_t>& done) {
  const perfq_dev_jobq jq = q.device();
  Backoff idle(std::chrono::microseconds(100));
  while (!stop.load(std::memory_order_relaxed)) {
    bool worked = false;
    for (uint32_t ch = index; ch < jq.channels; ch += count) {
      // Host not reaping: leave the job queued.
      if (!perfq_dev_jobq_can_complete(&jq, ch)) continue;
      perfq_job job;
      if (!perfq_dev_jobq_take(&jq, ch, &job)) continue;
      const uint64_t duration = std::min<uint64_t>(job.duration_ns, 1'000'000'000);
      const uint64_t t0 = monotonic_ns();
      const uint64_t d0 = clock.device_time_at(t0);
      (void)s.record_at(kEvJobStart, PERFQ_KIND_BEGIN, d0, job.corr_id);
      if (job_bytes) (void)s.record_at(kEvDmaRead, PERFQ_KIND_INSTANT, d0, job_bytes);
      while (monotonic_ns() - t0 < duration) {
      }
      const uint64_t d1 = clock.now();
      (void)s.record_at(kEvJobEnd, PERFQ_KIND_END, d1, job.corr_id);
      const perfq_job_completion c{job.corr_id, d0, d1, 0, 0};
      (void)perfq_dev_jobq_complete(&jq, ch, &c);  // room was checked above
      done.fetch_add(1, std::memory_order_relaxed);
      worked = true;
    }
    if (worked)
      idle.reset();
    else
      idle.wait();
  }
}

SimClockConfig clock_config(const Options& o, uint64_t t_start) {
  SimClockConfig cc;
  cc.offset_ns = o.clock_offset_ns;
  cc.drift_ppm = o.clock_drift_ppm;
  cc.jitter_ns = o.clock_jitter_ns;
  cc.timer_hz = o.timer_hz;
  cc.timer_offset = o.timer_offset;
  for (size_t i = 0; i < o.step_at.size(); ++i)
    cc.steps.push_back({t_start + static_cast<uint64_t>(o.step_at[i] * 1e9), o.step_ns[i]});
  return cc;
}

// The region of --region: created with the device's geometry (--create) or opened as it is.
Result<Region> open_region(const Options& o) {
  if (!o.create) return Region::open(o.region);
  RegionGeometry g;
  g.ring_capacity = o.ring_records;
  g.device_name = o.name;
  g.timer_hz = o.timer_hz;
  g.features = PERFQ_FEAT_TIMER_REQRESP | PERFQ_FEAT_JOB_QUEUE | PERFQ_FEAT_DEVICE_NOW;
  g.min_region_size = o.region_size;
  return Region::create(o.region, g);
}

int fail(const Status& s) {
  std::fprintf(stderr, "perfq-devsim: %s\n", s.message().c_str());
  return 1;
}

// Blocks the stop signals in this thread and every thread it starts later;
// the main thread waits for them with sigtimedwait.
sigset_t block_stop_signals() {
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  return sigs;
}

// One queue per device thread: the synthetic workers' first, then the job workers'.
struct Streams {
  std::vector<std::unique_ptr<DeviceQueue>> owned;
  std::vector<DeviceQueue*> raw;
  std::vector<std::string> names;
};

Streams make_streams(const Options& o, unsigned job_workers, const SimClock& clock) {
  Streams st;
  for (unsigned i = 0; i < o.workers + job_workers; ++i) {
    st.owned.push_back(
        std::make_unique<DeviceQueue>(static_cast<uint16_t>(i), o.queue_records, clock));
    st.raw.push_back(st.owned.back().get());
    st.names.push_back(i < o.workers ? "worker" + std::to_string(i)
                                     : "jobworker" + std::to_string(i - o.workers));
  }
  return st;
}

// Starts the synthetic workers (o.rate shared among them) and the job workers.
std::vector<std::thread> start_workers(const Options& o, const Streams& st, const SimClock& clock,
                                       const JobQueue& jobq, unsigned job_workers,
                                       const std::atomic<bool>& go, const std::atomic<bool>& stop,
                                       std::atomic<uint64_t>& jobs_done) {
  std::vector<std::thread> workers;
  const double per_worker = o.workers ? o.rate / o.workers : 0;
  for (unsigned i = 0; i < o.workers; ++i)
    workers.emplace_back([&st, &clock, &go, &stop, per_worker, truth = o.truth, i] {
      synthetic_worker(*st.raw[i], clock, per_worker, truth, go, stop);
    });
  for (unsigned j = 0; j < job_workers; ++j)
    workers.emplace_back([&st, &clock, &jobq, &stop, &jobs_done, first = o.workers, job_workers, j,
                          bytes = o.job_bytes] {
      job_worker(*st.raw[first + j], clock, jobq, j, job_workers, bytes, stop, jobs_done);
    });
  return workers;
}

// Whether the host has a sync round open now.
bool round_open(const Region& r) {
  return __atomic_load_n(&r.timer()->window, __ATOMIC_ACQUIRE) != 0;
}

// How the run ended: the stop signal (none: not positive), when the
// synthetic workers started (0: never), and how long it ran from then.
struct Ending {
  int sig = 0;
  uint64_t t_go = 0;
  double elapsed_s = 0;
};

// Waits for a stop signal or the end of --duration (with --wait-host, from
// the host's first sync round: a host that records, and then sets go;
// --start-after later than that, or than the start).
Ending wait_for_stop(const Options& o, const sigset_t& sigs, const Region& r,
                     const TimerServer& timer, uint64_t t_start, std::atomic<bool>& go) {
  Ending end;
  const uint64_t after_ns = static_cast<uint64_t>(o.start_after * 1e9);
  uint64_t ready = o.wait_host ? 0 : t_start;
  end.t_go = go.load(std::memory_order_relaxed) ? t_start : 0;
  for (;;) {
    // The timer server has answered a read: a sync round was open (the
    // window itself may open and close between two looks).
    if (!ready && (timer.served() > 0 || round_open(r))) {
      ready = monotonic_ns();
      std::fprintf(stderr, "perfq-devsim: the host is recording\n");
    }
    if (!end.t_go && ready && monotonic_ns() - ready >= after_ns) {
      end.t_go = monotonic_ns();
      go.store(true, std::memory_order_release);
      std::fprintf(stderr, "perfq-devsim: synthetic workers start\n");
    }
    timespec ts{0, end.t_go ? 100'000'000 : 1'000'000};
    end.sig = sigtimedwait(&sigs, nullptr, &ts);
    if (end.sig == SIGINT || end.sig == SIGTERM) break;
    if (end.t_go && o.duration > 0 &&
        static_cast<double>(monotonic_ns() - end.t_go) >= o.duration * 1e9)
      break;
  }
  end.elapsed_s = static_cast<double>(monotonic_ns() - (end.t_go ? end.t_go : t_start)) / 1e9;
  return end;
}

// The host converts a device time once a sync round after it is in its
// model: keep the timer register answering until the host stops asking
// (no round for kLingerIdleNs), at most kLingerMaxNs, so that the last
// records get that round instead of leaving without a bound.  A second
// SIGINT/SIGTERM ends it at once.  Returns the seconds it lingered.
double linger_for_host(const sigset_t& sigs, const Region& r, const TimerServer& timer) {
  constexpr uint64_t kLingerIdleNs = 300'000'000, kLingerMaxNs = 2'000'000'000;
  const uint64_t linger_from = monotonic_ns();
  uint64_t windows = timer.windows(), idle_since = linger_from;
  for (;;) {
    const uint64_t now = monotonic_ns();
    if (now - idle_since >= kLingerIdleNs || now - linger_from >= kLingerMaxNs) break;
    timespec ts{0, 5'000'000};
    const int s2 = sigtimedwait(&sigs, nullptr, &ts);
    if (s2 == SIGINT || s2 == SIGTERM) break;
    if (timer.windows() != windows || round_open(r)) {
      windows = timer.windows();
      idle_since = monotonic_ns();
    }
  }
  return static_cast<double>(monotonic_ns() - linger_from) / 1e9;
}

// The per-stream accounting and its totals: emitted, dropped, delivered, streams.
nlohmann::json stream_accounting(const Streams& st, const DeviceCollector& collector) {
  nlohmann::json js = nlohmann::json::array();
  uint64_t emitted = 0, dropped = 0, delivered = 0;
  for (size_t i = 0; i < st.raw.size(); ++i) {
    const StreamDelivery& d = collector.delivery()[i];
    const uint64_t e = st.raw[i]->emitted();
    const uint64_t dr = st.raw[i]->dropped() + d.undelivered;
    emitted += e;
    dropped += dr;
    delivered += d.delivered;
    js.push_back({{"stream", i},
                  {"name", st.names[i]},
                  {"emitted", e},
                  {"dropped", dr},
                  {"delivered", d.delivered},
                  {"lost_reported", d.lost_reported}});
  }
  return {{"emitted", emitted}, {"dropped", dropped}, {"delivered", delivered}, {"streams", js}};
}

int run(const Options& o) {
  const uint64_t t_start = monotonic_ns();
  SimClock clock(clock_config(o, t_start));

  Result<Region> region = open_region(o);
  if (!region) return fail(region.status());
  const Region& r = *region;
  std::vector<EventInfo> dictionary = kDictionary;
  if (o.job_bytes) dictionary.push_back(kDmaRead);
  if (Status s = publish_dictionary(r, dictionary); !s) return fail(s);
  auto jobq = JobQueue::format(r.app_area());
  if (!jobq) return fail(jobq.status());
  const unsigned job_workers = std::min<unsigned>(o.job_workers, jobq->channels());

  const sigset_t sigs = block_stop_signals();
  const Streams streams = make_streams(o, job_workers, clock);
  std::atomic<bool> stop_workers{false}, stop_device{false}, stop_timer{false},
      go{!o.wait_host && o.start_after <= 0};
  std::atomic<uint64_t> jobs_done{0};
  DeviceCollector collector(r, streams.raw, clock);
  TimerServer timer(r, clock);
  std::thread collector_thread([&] { collector.run(stop_device); });
  std::thread timer_thread([&] {
    pthread_setname_np(pthread_self(), "pq-timer");
    timer.run(stop_timer);
  });
  std::vector<std::thread> workers =
      start_workers(o, streams, clock, *jobq, job_workers, go, stop_workers, jobs_done);

  // Everything is up: the host may use the device now.
  set_device_state(r, PERFQ_DEVICE_RUNNING);
  std::fprintf(stderr,
               "perfq-devsim: device '%s' running on %s (ring %llu records, %u workers, "
               "%u job workers, %u job channels)\n",
               r.device_name().c_str(), o.region.c_str(),
               static_cast<unsigned long long>(r.ring_capacity()), o.workers, job_workers,
               jobq->channels());

  const Ending end = wait_for_stop(o, sigs, r, timer, t_start, go);
  stop_workers = true;
  for (auto& t : workers) t.join();
  stop_device = true;  // the collector delivers what is queued, then stops
  collector_thread.join();
  const double lingered = linger_for_host(sigs, r, timer);
  stop_timer = true;
  timer_thread.join();

  nlohmann::json out = stream_accounting(streams, collector);
  out["jobs_completed"] = jobs_done.load();
  out["duration_s"] = end.elapsed_s;
  out["waited_for_host_s"] = end.t_go ? static_cast<double>(end.t_go - t_start) / 1e9 : -1.0;
  out["region"] = o.region;
  out["ring_records"] = r.ring_capacity();
  out["timer_reads_served"] = timer.served();
  out["timer_lingered_s"] = lingered;
  out["signal"] = end.sig > 0 ? strsignal(end.sig) : "none";
  if (collector.fault()) out["fault"] = "host head: " + collector.fault().describe();
  std::printf("%s\n", out.dump().c_str());
  std::fflush(stdout);
  if (collector.fault()) {
    std::fprintf(stderr, "perfq-devsim: stopped: the host wrote a bad head: %s\n",
                 collector.fault().describe().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace perfq

int main(int argc, char** argv) {
  perfq::Options o;
  CLI::App app{
      "perfq-devsim: the perfq device in software. Creates or opens a shared region (a file\n"
      "under /dev/shm, or the file backing a QEMU ivshmem device), and runs device workers,\n"
      "job workers, the collector and the timer register until SIGINT/SIGTERM or --duration.\n"
      "Prints one JSON line of accounting on exit (emitted, dropped, per stream)."};
  app.add_option("--region", o.region, "Region file (e.g. /dev/shm/perfq0)")->required();
  app.add_flag("--create", o.create, "Create (or re-create) the region instead of opening it");
  app.add_option("--ring-records", o.ring_records,
                 "Shared ring capacity, a power of two (with --create)")
      ->capture_default_str();
  app.add_option("--region-size", o.region_size,
                 "Pad the region to at least this many bytes (e.g. an ivshmem BAR size)");
  app.add_option("--queue-records", o.queue_records,
                 "Capacity of each worker's own queue, a power of two")
      ->capture_default_str();
  app.add_option("--workers", o.workers, "Synthetic worker threads")->capture_default_str();
  app.add_option("--job-workers", o.job_workers, "Job worker threads")->capture_default_str();
  app.add_option("--job-bytes", o.job_bytes,
                 "Each job reads a payload of N bytes: a dma_read instant at its start whose arg,\n"
                 "declared a byte count, the report turns into throughput (0: none)")
      ->capture_default_str();
  app.add_option("--rate", o.rate,
                 "Synthetic events per second, all workers together (in bursts of up to 256 "
                 "events or 1 ms each)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--duration", o.duration, "Stop after S seconds (default: run until a signal)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--clock-offset-ns", o.clock_offset_ns,
                 "Device clock D minus host CLOCK_MONOTONIC, ns (any signed value)");
  app.add_option("--clock-drift-ppm", o.clock_drift_ppm, "Device clock drift, ppm")
      ->check(CLI::Range(-100000.0, 100000.0));
  app.add_option("--clock-jitter-ns", o.clock_jitter_ns,
                 "Random delay of up to J ns between paired clock reads and before serving a "
                 "register read");
  app.add_option("--clock-step-at", o.step_at,
                 "Step the device clock S seconds after start (repeatable)");
  app.add_option("--clock-step-ns", o.step_ns,
                 "Size of each step, ns, either sign (one per --clock-step-at)");
  app.add_option("--timer-hz", o.timer_hz, "Timer register rate, Hz")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, uint64_t{PERFQ_CLOCK_HZ_MAX}));
  app.add_option("--timer-offset", o.timer_offset, "Timer register value at host time 0, ticks");
  app.add_option("--device-name", o.name, "Device name published in the region")
      ->capture_default_str();
  app.add_flag("--truth", o.truth,
               "Store the true host CLOCK_MONOTONIC time of each synthetic event in its arg");
  app.add_flag("--wait-host", o.wait_host,
               "Synthetic workers start when the host opens its first sync round (a recording "
               "started), as a device whose tracing the host turns on; --duration counts from "
               "then. Without it they start at once and fill the ring before anyone drains it");
  app.add_option("--start-after", o.start_after,
                 "Synthetic and job workers start S seconds later (after the host's first sync "
                 "round with --wait-host): a device idle at first; --duration counts from then")
      ->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  if (o.step_at.size() != o.step_ns.size()) {
    std::fprintf(stderr,
                 "perfq-devsim: give one --clock-step-ns per --clock-step-at (%zu vs %zu)\n",
                 o.step_at.size(), o.step_ns.size());
    return 2;
  }
  if (!perfq::is_pow2(o.queue_records) || o.queue_records < 2) {
    std::fprintf(stderr, "perfq-devsim: --queue-records %llu is not a power of two >= 2\n",
                 static_cast<unsigned long long>(o.queue_records));
    return 2;
  }
  if (o.workers + o.job_workers == 0 || o.workers + o.job_workers > 65535) {
    std::fprintf(stderr, "perfq-devsim: need 1..65535 worker threads in all\n");
    return 2;
  }
  return perfq::run(o);
}
