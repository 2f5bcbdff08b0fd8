// Host kernel events for a recording: scheduler switches and wakeups,
// syscalls and uprobes of the traced processes, through a BPF ring buffer
// (daemon/bpf/kevents.bpf.c, a CO-RE skeleton) into the merge as one more
// host input (source PERFQ_KERNEL_SOURCE, a stream per CPU).  See
// daemon/bpf/perfq_kevent.h for the record layout.
//
// Optional twice over: the daemon is built without it when the build machine
// lacks clang, bpftool or kernel BTF (PERFQ_HAVE_BPF), and a daemon without
// CAP_BPF + CAP_PERFMON (or root) cannot load it.  Either way open() says so
// and the recording goes on without kernel events.
//
// Threading: open() and trace_pid() from any one thread at a time;
// poll() and dropped() from the collector thread.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "perfq/status.h"
#include "perfq/trace.h"

namespace perfqd {

struct KernelEventOptions {
  bool sched = false;                // sched_switch, sched_wakeup(_new)
  bool syscalls = false;             // raw_syscalls sys_enter / sys_exit
  std::vector<uint32_t> pids;        // processes traced besides the registered applications
  std::vector<std::string> uprobes;  // "PATH:SYMBOL", entry and return events
  bool any() const { return sched || syscalls || !uprobes.empty(); }
};

// "sched,syscalls" (either, both; "all" for both) into `o`; a clear error
// naming the unknown word otherwise.
perfq::Status parse_kernel_event_list(const std::string& list, KernelEventOptions* o);
// "PATH:SYMBOL" with an absolute PATH that exists and a non-empty SYMBOL.
perfq::Status check_uprobe_spec(const std::string& spec);

// Whether this daemon was built with the BPF collector.
bool kernel_events_built();

class KernelEvents {
 public:
  // Load the BPF program, attach what `o` asks for and trace o.pids.  An
  // error says what is missing (the build, a capability, kernel support)
  // and what to do.
  static perfq::Result<std::unique_ptr<KernelEvents>> open(const KernelEventOptions& o);
  ~KernelEvents();

  // The trace source: id PERFQ_KERNEL_SOURCE, kind kernel, its events.
  perfq::TraceSource describe() const;

  // Trace the process `tgid` from now on (sched and syscall events).
  perfq::Status trace_pid(uint32_t tgid);

  // Wait up to `timeout_ms` for events, then append everything waiting to
  // `out` (host time, stream = CPU, a per-CPU index).  Returns how many.
  perfq::Result<size_t> poll(std::vector<perfq::TraceRecord>& out, int timeout_ms);

  // Events the kernel could not store (ring buffer full), per CPU, since
  // open().
  std::vector<uint64_t> dropped() const;
  // Program runs the kernel skipped since open() (a BPF program does not
  // run nested in itself on a CPU: its events are lost), per program.
  uint64_t missed() const;

  const KernelEventOptions& options() const { return opts_; }

  struct Impl;

 private:
  explicit KernelEvents(const KernelEventOptions& o);
  KernelEventOptions opts_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace perfqd
