#include "app/host_clock.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

namespace perfq {

namespace host_clock_detail {
Published g_published;
}  // namespace host_clock_detail

namespace {

uint64_t to_mult(long double ns_per_tick) {
  return static_cast<uint64_t>(std::llround(ns_per_tick * 4294967296.0L));
}

}  // namespace

void TscCalibrator::pop_front() {
  std::copy(points_.begin() + 1, points_.begin() + static_cast<long>(n_), points_.begin());
  --n_;
}

void TscCalibrator::restart(const TscPoint& p) {
  points_[0] = p;
  n_ = 1;
  has_map_ = false;
  interval_ = kFirstInterval;
}

TscCalibrator::Action TscCalibrator::add(const TscPoint& p) {
  // A bracket much wider than the tightest seen was preempted or
  // interrupted: skip it (but not forever: a machine may get slower).
  if (p.width > 4 * min_width_ + 256 && rejected_in_row_ < 8) {
    ++rejected_in_row_;
    return Action::kNone;
  }
  rejected_in_row_ = 0;
  min_width_ = std::min(min_width_, p.width);
  if (n_ > 0 && (p.tsc <= points_[n_ - 1].tsc || p.ns <= points_[n_ - 1].ns)) {
    // The TSC or the clock did not move forward between two points: not a
    // clock to extrapolate (a TSC that differs between CPUs, or was reset).
    ++resets_;
    const bool had = has_map_;
    restart(p);
    if (++resets_in_row_ >= 3) return Action::kDisable;
    return had ? Action::kWithdraw : Action::kNone;
  }
  if (n_ == kMaxPoints) pop_front();
  points_[n_++] = p;
  // The rate over the last few seconds: long enough to average the points'
  // noise away, short enough to follow a change of the clock's rate.
  while (n_ > 2 && p.ns - points_[1].ns >= kWindowNs) pop_front();
  std::chrono::milliseconds next = std::min(interval_ * 2, kMaxInterval);
  if (n_ < 2) {
    interval_ = next;
    return Action::kNone;
  }
  const TscPoint& o = points_[0];
  const long double rate =
      static_cast<long double>(p.ns - o.ns) / static_cast<long double>(p.tsc - o.tsc);
  if (!(rate >= 0.05L && rate <= 20.0L)) return Action::kDisable;  // 50 MHz .. 20 GHz
  if (!has_map_) {
    interval_ = next;
    if (p.ns - o.ns < kMinBaselineNs) return Action::kNone;
    map_ = TscMap{p.tsc, p.ns, to_mult(rate)};
    has_map_ = true;
    last_error_ns_ = 0;
    return Action::kPublish;
  }
  const uint64_t v = map_.at(p.tsc);
  const auto err = static_cast<double>(static_cast<int64_t>(v - p.ns));
  last_error_ns_ = err;
  if (std::fabs(err) > static_cast<double>(kResetNs)) {
    ++resets_;
    restart(p);
    if (++resets_in_row_ >= 3) return Action::kDisable;
    return Action::kWithdraw;
  }
  resets_in_row_ = 0;
  if (std::fabs(err) > kFarNs)
    next = std::max(interval_ / 4, std::chrono::milliseconds(kFirstInterval));
  else if (std::fabs(err) > kCloseNs)
    next = interval_;
  interval_ = next;
  // Start where the old map is now (no step), and steer so as to meet the
  // clock, extrapolated at the measured rate, when the next point is due.
  const long double next_ticks =
      static_cast<long double>(std::chrono::nanoseconds(interval_).count()) / rate;
  const long double steer =
      std::clamp(-static_cast<long double>(err) / next_ticks, -rate * kMaxSlew, rate * kMaxSlew);
  map_ = TscMap{p.tsc, v, to_mult(rate + steer)};
  return Action::kPublish;
}

TscPoint host_clock_sample(int tries) noexcept {
  TscPoint best{0, monotonic_ns(), UINT64_MAX};
#if defined(__x86_64__)
  for (int i = 0; i < tries; ++i) {
    _mm_lfence();
    const uint64_t t1 = __rdtsc();
    _mm_lfence();
    const uint64_t ns = monotonic_ns();
    _mm_lfence();
    const uint64_t t2 = __rdtsc();
    _mm_lfence();
    if (t2 >= t1 && t2 - t1 < best.width) best = TscPoint{t1 + (t2 - t1) / 2, ns, t2 - t1};
  }
#else
  (void)tries;
  best.width = 0;
#endif
  return best;
}

namespace {

// Reads the start of a small file into buf (NUL-terminated): no heap, since
// the connector thread may be here while the process exits (LeakSanitizer
// saw a std::ifstream's buffer as leaked then).
size_t read_head(const char* path, char* buf, size_t cap) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  size_t n = 0;
  if (fd >= 0) {
    while (n + 1 < cap) {
      const ssize_t r = ::read(fd, buf + n, cap - 1 - n);
      if (r <= 0) break;
      n += static_cast<size_t>(r);
    }
    ::close(fd);
  }
  buf[n] = '\0';
  return n;
}

// Whether `word` is a whole space-separated word of line [b, e).
bool has_word(const char* b, const char* e, const char* word) {
  const size_t len = std::strlen(word);
  for (const char* p = b; p + len <= e; ++p) {
    if (std::strncmp(p, word, len) != 0) continue;
    const bool start = p == b || p[-1] == ' ' || p[-1] == '\t';
    const bool end = p + len == e || p[len] == ' ' || p[len] == '\n';
    if (start && end) return true;
  }
  return false;
}

// Whether this machine's TSC is a clock: invariant, and what the kernel's
// own CLOCK_MONOTONIC is built on.
bool tsc_usable() {
#if defined(__x86_64__)
  const char* env = std::getenv("PERFQ_HOST_CLOCK");
  if (env && std::strcmp(env, "monotonic") == 0) return false;
  // The first CPU's flags line is within the first few KiB.
  char cpu[16384];
  read_head("/proc/cpuinfo", cpu, sizeof(cpu));
  const char* f = std::strstr(cpu, "\nflags");
  if (!f) return false;
  ++f;
  const char* e = std::strchr(f, '\n');
  if (!e) return false;  // cut: not the whole line
  if (!has_word(f, e, "constant_tsc") || !has_word(f, e, "nonstop_tsc")) return false;
  char src[64];
  read_head("/sys/devices/system/clocksource/clocksource0/current_clocksource", src, sizeof(src));
  src[std::strcspn(src, "\n")] = '\0';
  return std::strcmp(src, "tsc") == 0 || std::strcmp(src, "kvm-clock") == 0 ||
         std::strcmp(src, "hyperv_clocksource_tsc_page") == 0;
#else
  return false;
#endif
}

// Trivially destructible: the connector thread may still calibrate while
// exit() runs the static destructors.
struct Updater {
  std::atomic<pid_t> owner{0};  // the process whose thread calibrates now
  // -1: not decided yet; written by the owner, read by host_clock_source().
  std::atomic<int> enabled{-1};
  TscCalibrator cal;
  uint64_t due_ns = 0;
};
Updater g_updater;
static_assert(std::is_trivially_destructible_v<Updater>);

// Writer side of the sequence word (one writer at a time: g_updater.owner).
void withdraw() {
  auto& p = host_clock_detail::g_published;
  const uint64_t s = p.seq.load(std::memory_order_relaxed);
  if ((s & 1) == 0) p.seq.store(s + 1, std::memory_order_relaxed);
}

void publish(const TscMap& m) {
  auto& p = host_clock_detail::g_published;
  uint64_t s = p.seq.load(std::memory_order_relaxed);
  if ((s & 1) == 0) p.seq.store(++s, std::memory_order_relaxed);
  // Release stores: a reader that sees any new field also sees the odd
  // sequence word, so its second read of the word tells it to retry.
  p.base_tsc.store(m.base_tsc, std::memory_order_release);
  p.base_ns.store(m.base_ns, std::memory_order_release);
  p.mult.store(m.mult, std::memory_order_release);
  p.reach.store(m.reach(), std::memory_order_release);
  p.seq.store(s + 1, std::memory_order_release);
}

}  // namespace

std::chrono::milliseconds host_clock_update() noexcept {
  using std::chrono::milliseconds;
  const pid_t me = ::getpid();
  pid_t expected = 0;
  if (!g_updater.owner.compare_exchange_strong(expected, me, std::memory_order_acquire)) {
    // Another thread calibrates; or a fork() copied a calibration in
    // progress, whose thread does not exist in this process.
    if (expected == me ||
        !g_updater.owner.compare_exchange_strong(expected, me, std::memory_order_acquire))
      return TscCalibrator::kFirstInterval;
  }
  struct Release {
    ~Release() { g_updater.owner.store(0, std::memory_order_release); }
  } release;
  if (g_updater.enabled.load(std::memory_order_relaxed) < 0)
    g_updater.enabled.store(tsc_usable() ? 1 : 0, std::memory_order_relaxed);
  if (g_updater.enabled.load(std::memory_order_relaxed) == 0) return milliseconds::max();
  const uint64_t now = monotonic_ns();
  if (now < g_updater.due_ns) return milliseconds((g_updater.due_ns - now + 999'999) / 1'000'000);
  switch (g_updater.cal.add(host_clock_sample())) {
    case TscCalibrator::Action::kPublish:
      publish(g_updater.cal.map());
      break;
    case TscCalibrator::Action::kWithdraw:
      withdraw();
      break;
    case TscCalibrator::Action::kDisable:
      withdraw();
      g_updater.enabled.store(0, std::memory_order_relaxed);
      return milliseconds::max();
    case TscCalibrator::Action::kNone:
      break;
  }
  const milliseconds next = g_updater.cal.next_interval();
  g_updater.due_ns = now + static_cast<uint64_t>(std::chrono::nanoseconds(next).count());
  return next;
}

const char* host_clock_source() noexcept {
#if defined(__x86_64__)
  // What host_clock_ns() uses now: a map that has lapsed (nobody renewed
  // it for kReachNs) leaves the records to clock_gettime.
  TscMap m;
  if (host_clock_detail::map_for(__rdtsc(), &m)) return "tsc";
#endif
  return g_updater.enabled.load(std::memory_order_relaxed) == 0 ? "monotonic" : "calibrating";
}

}  // namespace perfq
