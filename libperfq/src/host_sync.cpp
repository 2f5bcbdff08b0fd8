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

// The device takes sample i right after answering host read i, so pairs
// are microseconds apart and R's own rate error cannot bias the offset (it
// would if the tightest host and device samples came from different ends of
// a long round).  Each pair gives one observation; the pairs whose combined
// delay is within the selection margin of the tightest are averaged.
Result<SyncObservation> pair_observation(const std::vector<perfq_clock_sample>& host,
                                         const std::vector<perfq_clock_sample>& dev,
                                         const ClockRates& rates, const SelectionConfig& sel,
                                         uint32_t round) {
  if (host.size() != dev.size()) return make_observation(host, dev, rates, sel, round);
  std::vector<SyncObservation> obs;
  obs.reserve(host.size());
  for (size_t i = 0; i < host.size(); ++i) {
    auto o = make_observation(std::span(&host[i], 1), std::span(&dev[i], 1), rates, sel, round);
    if (o) obs.push_back(*o);
  }
  if (obs.empty()) return make_observation(host, dev, rates, sel, round);
  auto delay = [](const SyncObservation& o) { return o.host_delay_ns + o.device_delay_ns; };
  double best = delay(obs[0]);
  for (const auto& o : obs) best = std::min(best, delay(o));
  const double limit = best + std::max(sel.margin_ns, sel.margin_frac * best);
  const SyncObservation& ref = *std::min_element(
      obs.begin(), obs.end(), [&](const auto& a, const auto& b) { return delay(a) < delay(b); });
  // Average the selected points (they lie on one line, so their mean does).
  long double dd = 0, dh = 0, unc = 0;
  uint16_t used = 0;
  for (const auto& o : obs) {
    if (delay(o) > limit) continue;
    dd += static_cast<long double>(time_diff(o.device_time, ref.device_time));
    dh += static_cast<long double>(time_diff(o.host_ns, ref.host_ns));
    unc += o.uncertainty_ns;
    ++used;
  }
  SyncObservation out = ref;
  out.device_time = ref.device_time + static_cast<uint64_t>(std::llround(dd / used));
  out.host_ns = ref.host_ns + static_cast<uint64_t>(std::llround(dh / used));
  out.uncertainty_ns = static_cast<double>(unc / used);
  out.host_used = used;
  out.device_used = used;
  return out;
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
    if (!dev) return Status(dev.status().code(), device_.spec() + ": device samples: " +
                                                     dev.status().message());
    if (dev->round == r) break;
    if (monotonic_ns() > deadline)
      return Status(Errc::kTimeout, device_.spec() + ": the device did not publish its samples "
                                    "of sync round " + std::to_string(r) + " within " +
                                    std::to_string(opts_.device_timeout.count()) + " ms");
    if (++spins > 64) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }

  auto obs = pair_observation(*host, dev->samples, rates_, opts_.selection, r);
  if (!obs) return Status(obs.status().code(), device_.spec() + ": sync round " +
                                                   std::to_string(r) + ": " +
                                                   obs.status().message());
  RoundResult res;
  res.observation = *obs;
  res.verdict = sync_.add(*obs);
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
