// Waiting without the heap or the C++ runtime: a spin hint and shared futex
// waits on words that another process may map (the timer exchange, the
// sync round word).  Internal to libperfq.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <ctime>

namespace perfq {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Shared (not private) futex ops: the word may be mapped by several
// processes.  The wait is bounded by `timeout` and may return early.
inline void futex_wait(uint32_t* word, uint32_t expected,
                       std::chrono::nanoseconds timeout) noexcept {
  timespec ts{static_cast<time_t>(timeout.count() / 1'000'000'000),
              static_cast<long>(timeout.count() % 1'000'000'000)};
  syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);
}

inline void futex_wake_all(uint32_t* word) noexcept {
  syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace perfq
