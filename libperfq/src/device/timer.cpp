#include "device/timer.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <climits>
#include <string>

#include "core/os_wait.h"
#include "core/ring.h"
#include "sync/sync_buffer.h"

namespace perfq {
Status raise_sync_priority() {
  const auto tid = static_cast<id_t>(syscall(SYS_gettid));
  errno = 0;
  const int now = getpriority(PRIO_PROCESS, tid);  // -1 is a valid value: errno tells
  if (errno == 0 && now <= kSyncNice) return Status::ok();
  if (setpriority(PRIO_PROCESS, tid, kSyncNice) != 0)
    return Status::from_errno("setting the sync thread's nice value to " +
                              std::to_string(kSyncNice) + " (needs root or CAP_SYS_NICE)");
  return Status::ok();
}

TimerServer::TimerServer(const Region& region, const DeviceClock& clock, Options opts)
    : region_(region), clock_(clock), opts_(opts) {}

void TimerServer::run(const std::atomic<bool>& stop) {
  (void)raise_sync_priority();  // without the privilege, it serves as it is
  const perfq_dev_port port = device_port(clock_);
  perfq_dev_timer t;
  perfq_dev_timer_init(&t, region_.base(), &region_.header(), &port);
  t.sample_every = std::max<uint32_t>(opts_.sample_every, 1);
  const uint64_t limit = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(opts_.spin_limit).count());
  uint32_t* window = &region_.timer()->window;
  uint64_t quiet_since = monotonic_ns();
  for (uint32_t n = 0; !stop.load(std::memory_order_relaxed); ++n) {
    switch (perfq_dev_timer_poll(&t)) {
      case PERFQ_DEV_TIMER_CLOSED: {
        // Awake from a little before the round the host announced
        // (perfq_dev_timer_idle_us()): it opens the window without a wake
        // or a nap of its own.  Otherwise asleep until the host opens a
        // round (a futex wake where host and device share a kernel, a slow
        // poll where they do not).
        const uint64_t idle_us =
            perfq_dev_timer_idle_us(&t, static_cast<uint32_t>(opts_.lead.count()),
                                    static_cast<uint32_t>(opts_.grace.count()));
        if (idle_us == 0) {
          cpu_relax();
          break;
        }
        futex_wait(
            window, 0,
            std::min<std::chrono::nanoseconds>(
                opts_.poll, std::chrono::microseconds(std::min<uint64_t>(idle_us, 1'000'000))));
        quiet_since = monotonic_ns();
        break;
      }
      case PERFQ_DEV_TIMER_SERVED:
        quiet_since = monotonic_ns();
        n = 0;
        break;
      case PERFQ_DEV_TIMER_PUBLISHED:
        // The host may sleep on the batch's round word (HostSync::round()).
        futex_wake_all(&region_.sync()->device_samples.round);
        quiet_since = monotonic_ns();
        break;
      case PERFQ_DEV_TIMER_WAITING:
        cpu_relax();
        // A reader gone quiet for spin_limit (it died, or forgot to close
        // the window): poll slowly until its next request.
        if ((n & 255) == 0 && monotonic_ns() - quiet_since > limit) {
          perfq_dev_timer_asleep(&t);
          futex_wait(window, t.round, opts_.poll);
          quiet_since = monotonic_ns() - limit;
        }
        break;
    }
    served_.store(t.served, std::memory_order_relaxed);
    windows_.store(t.windows, std::memory_order_relaxed);
  }
}

TimerReader::TimerReader(const Region& region)
    : region_(region), tag_(load_acquire(&region.timer()->req_tag)) {}

bool TimerReader::open_window(uint32_t round) noexcept {
  perfq_timer_page* t = region_.timer();
  // Then `serving`: a device that cleared it after this store sees the
  // window in its sleep's own check (perfq_dev_timer_asleep()).
  __atomic_store_n(&t->window, round == 0 ? 1u : round, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&t->serving, __ATOMIC_SEQ_CST) == 1) return true;
  futex_wake_all(&t->window);
  return false;
}

void TimerReader::announce_window(std::chrono::microseconds after_close) noexcept {
  const auto us = std::clamp<int64_t>(after_close.count(), 0, UINT32_MAX);
  __atomic_store_n(&region_.timer()->next_window_us, static_cast<uint32_t>(us), __ATOMIC_RELAXED);
}

void TimerReader::close_window() noexcept {
  __atomic_store_n(&region_.timer()->window, 0u, __ATOMIC_RELEASE);
}

Result<perfq_clock_sample> TimerReader::read(std::chrono::microseconds timeout) {
  perfq_timer_page* t = region_.timer();
  const uint64_t tag = ++tag_;
  perfq_clock_sample s{};
  s.before = monotonic_ns();
  // Pairs with the server's load_acquire of req_tag.
  store_release(&t->req_tag, tag);
  const uint64_t deadline =
      s.before +
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(timeout).count());
  uint64_t nap_ns = 50'000;
  for (uint32_t n = 0;; ++n) {
    // Pairs with the server's store_release of resp_tag.
    if (load_acquire(&t->resp_tag) == tag) {
      s.value = load_relaxed(&t->resp_value);
      s.after = monotonic_ns();
      return s;
    }
    cpu_relax();
    if ((n & 63) != 0) continue;
    const uint64_t now = monotonic_ns();
    if (now > deadline)
      return Status(Errc::kTimeout, "timer register read timed out after " +
                                        std::to_string(timeout.count()) + " us: device '" +
                                        region_.device_name() + "' did not answer request " +
                                        std::to_string(tag) + " (is the device running?)");
    // A device that does not answer within microseconds is not running right
    // now (a busy machine, or asleep until the window opened): let it run
    // instead of spinning (a yield hands it our CPU at once where it waits
    // for one).  Past a millisecond it is away for longer: back off with
    // sleeps, since every wakeup costs CPU time too (tens of us on a VM).
    // The sample's bracket is wide; the round's selection by delay
    // discards it.
    const uint64_t waited = now - s.before;
    if (waited > 1'000'000) {
      const uint64_t nap = std::min(nap_ns, deadline - now);
      timespec ts{static_cast<time_t>(nap / 1'000'000'000), static_cast<long>(nap % 1'000'000'000)};
      nanosleep(&ts, nullptr);
      nap_ns = std::min<uint64_t>(nap_ns * 2, 1'000'000);
    } else if (waited > 20'000) {
      sched_yield();
    }
  }
}

}  // namespace perfq
