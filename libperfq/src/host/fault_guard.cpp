#include "host/fault_guard.h"

#include <errno.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <mutex>

namespace perfq {
namespace {

constexpr int kSlots = 64;

// One registered range.  `state`: 0 free, 1 being written, 2 live.  The
// handler only trusts a slot whose state it read as 2 (acquire) before and
// after reading the fields.
struct Slot {
  std::atomic<int> state{0};
  std::atomic<uintptr_t> begin{0};
  std::atomic<size_t> len{0};
  std::atomic<std::atomic<bool>*> gone{nullptr};
};

Slot g_slots[kSlots];
std::atomic<uint64_t> g_hits{0};
struct sigaction g_previous;
std::once_flag g_install_once;

void pass_on(int sig, siginfo_t* info, void* ctx) {
  if (g_previous.sa_flags & SA_SIGINFO) {
    if (g_previous.sa_sigaction) {
      g_previous.sa_sigaction(sig, info, ctx);
      return;
    }
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
    return;
  }
  // The default action: for a fault, returning re-executes the access, which
  // faults again and kills the process; a sent signal is raised again.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(SIGBUS, &dfl, nullptr);
  if (info == nullptr || info->si_code <= 0) raise(SIGBUS);
}

void on_sigbus(int sig, siginfo_t* info, void* ctx) {
  const int saved_errno = errno;  // the interrupted code's
  if (info != nullptr && info->si_code > 0) {
    const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
    for (Slot& s : g_slots) {
      if (s.state.load(std::memory_order_acquire) != 2) continue;
      const uintptr_t begin = s.begin.load(std::memory_order_relaxed);
      const size_t len = s.len.load(std::memory_order_relaxed);
      std::atomic<bool>* gone = s.gone.load(std::memory_order_relaxed);
      if (addr < begin || addr - begin >= len) continue;
      if (s.state.load(std::memory_order_acquire) != 2) continue;
      // Gone first: another thread that reads the zeros mapped next must
      // find the flag set when it checks it after its read.  Set after the
      // mapping, a thread that read zeros in between took them for the
      // device's words (a queue whose tail went backwards: "failed", not
      // "gone").
      if (gone) gone->store(true, std::memory_order_seq_cst);
      // The system call itself, not libc's mmap, which a sanitizer
      // intercepts (its interceptor's work is not async-signal-safe).
      const long p = syscall(SYS_mmap, begin, len, PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0L);
      if (p == -1) break;  // cannot contain it: the default action
      g_hits.fetch_add(1, std::memory_order_relaxed);
      errno = saved_errno;
      return;  // the access retries and reads zeros
    }
  }
  pass_on(sig, info, ctx);
}

}  // namespace

void install_fault_guard() noexcept {
  std::call_once(g_install_once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &g_previous);
  });
}

uint64_t fault_guard_hits() noexcept { return g_hits.load(std::memory_order_relaxed); }

FaultGuardRange::FaultGuardRange(void* addr, size_t len, std::atomic<bool>* gone) noexcept {
  install_fault_guard();
  for (int i = 0; i < kSlots; ++i) {
    int expected = 0;
    if (!g_slots[i].state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) continue;
    g_slots[i].begin.store(reinterpret_cast<uintptr_t>(addr), std::memory_order_relaxed);
    g_slots[i].len.store(len, std::memory_order_relaxed);
    g_slots[i].gone.store(gone, std::memory_order_relaxed);
    g_slots[i].state.store(2, std::memory_order_release);  // pairs with the handler's acquire
    slot_ = i;
    return;
  }
}

void FaultGuardRange::reset() noexcept {
  if (slot_ < 0) return;
  g_slots[slot_].state.store(0, std::memory_order_release);
  slot_ = -1;
}

}  // namespace perfq
