#include "host/host_sync.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <span>

#include "core/os_wait.h"
#include "device/device_clock.h"
#include "sync/sync_buffer.h"

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
      sync_(rates_, opts.sync),
      gate_(opts.gate) {
  // Continue after the rounds a previous host (a restarted daemon) used.
  const uint32_t seen = __atomic_load_n(&device.region().timer()->window, __ATOMIC_ACQUIRE);
  auto b = read_sample_batch(&device.region().sync()->device_samples);
  uint32_t last = b.is_ok() ? b->round : 0;
  next_round_ = std::max(seen, last) + 1;
  if (next_round_ == 0) next_round_ = 1;
}

EnoughReads HostSync::enough() const {
  if (opts_.enough_reads == 0 || tightest_n_ < 16) return {};
  std::array<uint64_t, 64> d = tightest_;
  const size_t n = std::min(tightest_n_, d.size());
  std::nth_element(d.begin(), d.begin() + static_cast<std::ptrdiff_t>(n / 4),
                   d.begin() + static_cast<std::ptrdiff_t>(n));
  const double q = static_cast<double>(d[n / 4]);
  const SelectionConfig& sel = opts_.selection;
  return {opts_.enough_reads,
          static_cast<uint64_t>(q + std::max(sel.margin_ns, sel.margin_frac * q))};
}

void HostSync::next_round_in(std::chrono::microseconds in) {
  if (in.count() <= 0) {
    device_.announce_round(std::chrono::microseconds(0));
    return;
  }
  // Counted from the end of the last round's reads, as the device counts.
  const uint64_t since = reads_ended_ns_ == 0 ? 0 : (monotonic_ns() - reads_ended_ns_) / 1000;
  device_.announce_round(in + std::chrono::microseconds(since));
}

Result<RoundResult> HostSync::round() {
  const uint64_t cpu0 = thread_cpu_ns();
  perfq_sync_page* page = device_.region().sync();
  const uint32_t r = next_round_++;
  if (next_round_ == 0) next_round_ = 1;  // round 0 means "closed"

  auto host = device_.clock_samples(r, opts_.samples, opts_.read_timeout, enough());
  reads_ended_ns_ = monotonic_ns();
  if (!host) return host.status();

  // The device publishes its samples of round r as it sees the window close,
  // within microseconds when it runs.  Spin on the batch's round word (one
  // load; the whole batch is read once it matches), then sleep on it: the
  // timer server wakes the word after publishing.  A wakeup costs tens of
  // microseconds of CPU time on a VM, far more than the usual spin.
  const perfq_sample_batch* batch = &page->device_samples;
  uint32_t* round_word = const_cast<uint32_t*>(&batch->round);
  const uint64_t t0 = monotonic_ns();
  const uint64_t deadline = t0 + static_cast<uint64_t>(opts_.device_timeout.count()) * 1'000'000ull;
  Result<SampleBatch> dev = Status(Errc::kTimeout, "");
  for (uint32_t spin = 1;; ++spin) {
    const uint32_t seen = __atomic_load_n(round_word, __ATOMIC_ACQUIRE);
    if (seen == r) {
      dev = read_sample_batch(batch);
      // A read that keeps meeting a write in progress (kTimeout) tries again
      // until the deadline; a corrupt batch is an error at once.
      if (!dev && dev.status().code() != Errc::kTimeout)
        return Status(dev.status().code(),
                      device_.spec() + ": device samples: " + dev.status().message());
      if (dev && dev->round == r) break;
    }
    cpu_relax();
    if ((spin & 63) != 0) continue;
    const uint64_t now = monotonic_ns();
    if (now > deadline)
      return Status(Errc::kTimeout, device_.spec() +
                                        ": the device did not publish its samples "
                                        "of sync round " +
                                        std::to_string(r) + " within " +
                                        std::to_string(opts_.device_timeout.count()) + " ms");
    if (now - t0 > opts_.batch_spin_ns) futex_wait(round_word, seen, std::chrono::milliseconds(1));
  }

  auto obs = make_observation(*host, dev->samples, rates_,
                              selection_for(opts_.selection, sync_.current(), rates_), r);
  if (!obs)
    return Status(obs.status().code(), device_.spec() + ": sync round " + std::to_string(r) + ": " +
                                           obs.status().message());
  // Its tightest read (the selection's), for the next rounds' enough().
  tightest_[tightest_n_++ % tightest_.size()] = static_cast<uint64_t>(obs->host_delay_ns);
  RoundResult res;
  res.observation = *obs;
  res.verdict = gate_.feed(sync_, *obs);
  if (opts_.mode == PERFQ_SYNC_MODE_B) {
    write_sample_batch(&page->mailbox, r, *host);
    __atomic_store_n(&page->mode, static_cast<uint32_t>(PERFQ_SYNC_MODE_B), __ATOMIC_RELEASE);
  } else {
    __atomic_store_n(&page->mode, static_cast<uint32_t>(PERFQ_SYNC_MODE_A), __ATOMIC_RELEASE);
  }
  if (sync_.has_model()) publish_clock_model(page, sync_.current());
  const size_t keep = std::max<size_t>(opts_.keep_rounds, 1);
  if (rounds_.size() / 2 >= keep)  // in halves: amortized O(1) per round
    rounds_.erase(rounds_.begin(), rounds_.end() - static_cast<std::ptrdiff_t>(keep - 1));
  rounds_.push_back(SyncRound{r, std::move(host.value()), std::move(dev->samples)});
  res.cpu_ns = thread_cpu_ns() - cpu0;
  return res;
}

}  // namespace perfq
