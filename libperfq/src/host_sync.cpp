#include "perfq/host_sync.h"

#include <time.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <thread>

#include "perfq/device_clock.h"
#include "perfq/sync_buffer.h"

namespace perfq {
namespace {

uint64_t thread_cpu_ns() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

ClockRates rates_of(const Region& r) {
  ClockRates c;
  c.device_hz = r.header().device_clock_hz;
  c.timer_hz = r.header().timer_hz;
  return c;
}

}  // namespace

HostSync::HostSync(DeviceTransport& device, HostSyncOptions opts)
    : device_(device),
      opts_(opts),
      rates_(rates_of(device.region())),
      sync_(rates_, opts.sync) {
  // Continue after the rounds a previous host (a restarted daemon) used.
  const uint32_t seen = __atomic_load_n(&device.region().timer()->window, __ATOMIC_ACQUIRE);
  auto b = read_sample_batch(&device.region().sync()->device_samples);
  uint32_t last = b.is_ok() ? b->round : 0;
  next_round_ = std::max(seen, last) + 1;
  if (next_round_ == 0) next_round_ = 1;
}

Result<RoundResult> HostSync::round() {
  const uint64_t cpu0 = thread_cpu_ns();
  perfq_sync_page* page = device_.region().sync();
  const uint32_t r = next_round_++;
  if (next_round_ == 0) next_round_ = 1;  // round 0 means "closed"

  auto host = device_.clock_samples(r, opts_.samples, opts_.read_timeout);
  if (!host) return host.status();

  // The device publishes its samples of round r as it sees the window close.
  const uint64_t deadline =
      monotonic_ns() + static_cast<uint64_t>(opts_.device_timeout.count()) * 1'000'000ull;
  Result<SampleBatch> dev = Status(Errc::kTimeout, "");
  uint32_t spins = 0;
  while (true) {
    dev = read_sample_batch(&page->device_samples);
    // A read that keeps meeting a write in progress (kTimeout) tries again
    // until the deadline; a corrupt batch is an error at once.
    if (!dev && dev.status().code() != Errc::kTimeout)
      return Status(dev.status().code(), device_.spec() + ": device samples: " +
                                             dev.status().message());
    if (dev && dev->round == r) break;
    if (monotonic_ns() > deadline)
      return Status(Errc::kTimeout, device_.spec() + ": the device did not publish its samples "
                                    "of sync round " + std::to_string(r) + " within " +
                                    std::to_string(opts_.device_timeout.count()) + " ms");
    if (++spins > 64) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }

  auto obs = make_paired_observation(*host, dev->samples, rates_, opts_.selection, r);
  if (!obs) return Status(obs.status().code(), device_.spec() + ": sync round " +
                                                   std::to_string(r) + ": " +
                                                   obs.status().message());
  RoundResult res;
  res.observation = *obs;
  // Gate against the usual uncertainty of this device's rounds.
  double gate = opts_.gate_floor_ns;
  if (!recent_unc_.empty()) {
    std::vector<double> v = recent_unc_;
    std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
    gate = std::max(gate, opts_.gate_factor * v[v.size() / 2]);
  }
  if (recent_unc_.size() < 16)
    recent_unc_.push_back(obs->uncertainty_ns);
  else
    recent_unc_[recent_pos_++ % 16] = obs->uncertainty_ns;
  res.verdict = obs->uncertainty_ns <= gate || !sync_.has_model() ? sync_.add(*obs)
                                                                  : ClockSync::Verdict::kOutlier;
  if (opts_.mode == PERFQ_SYNC_MODE_B) {
    write_sample_batch(&page->mailbox, r, *host);
    __atomic_store_n(&page->mode, static_cast<uint32_t>(PERFQ_SYNC_MODE_B), __ATOMIC_RELEASE);
  } else {
    __atomic_store_n(&page->mode, static_cast<uint32_t>(PERFQ_SYNC_MODE_A), __ATOMIC_RELEASE);
  }
  if (sync_.has_model()) publish_clock_model(page, sync_.current());
  rounds_.push_back(SyncRound{r, std::move(host.value()), std::move(dev->samples)});
  res.cpu_ns = thread_cpu_ns() - cpu0;
  return res;
}

}  // namespace perfq
