#include "kernel_events.h"

#include <unistd.h>

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <cerrno>
#include <cstring>
#include <sstream>

#include "perfq/perfq_abi.h"
#include "perfq_kevent.h"

#if PERFQ_HAVE_BPF
#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include "kevents.skel.h"
#endif

namespace perfqd {

using namespace perfq;

Status parse_kernel_event_list(const std::string& list, KernelEventOptions* o) {
  std::stringstream ss(list);
  std::string word;
  bool any = false;
  while (std::getline(ss, word, ',')) {
    if (word.empty()) continue;
    any = true;
    if (word == "sched") {
      o->sched = true;
    } else if (word == "syscalls") {
      o->syscalls = true;
    } else if (word == "all") {
      o->sched = o->syscalls = true;
    } else {
      return Status(Errc::kInvalidArgument,
                    "unknown kernel event class '" + word + "' (known: sched, syscalls, all)");
    }
  }
  if (!any)
    return Status(Errc::kInvalidArgument, "no kernel event class given (sched, syscalls, all)");
  return Status::ok();
}

Status check_uprobe_spec(const std::string& spec) {
  const auto colon = spec.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == spec.size())
    return Status(Errc::kInvalidArgument,
                  "uprobe '" + spec + "': expected PATH:SYMBOL (e.g. /usr/bin/app:submit_job)");
  const std::string path = spec.substr(0, colon);
  if (path[0] != '/')
    return Status(Errc::kInvalidArgument, "uprobe '" + spec + "': PATH must be absolute");
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
    return Status(Errc::kNotFound, "uprobe '" + spec + "': " + path + " is not a file");
  return Status::ok();
}

#if PERFQ_HAVE_BPF

bool kernel_events_built() { return true; }

namespace {

int libbpf_to_spdlog(enum libbpf_print_level level, const char* fmt, va_list ap) {
  if (level == LIBBPF_DEBUG) return 0;
  char buf[1024];
  const int n = std::vsnprintf(buf, sizeof(buf), fmt, ap);
  std::string line(buf, n > 0 ? std::min<size_t>(static_cast<size_t>(n), sizeof(buf) - 1) : 0);
  while (!line.empty() && line.back() == '\n') line.pop_back();
  spdlog::debug("libbpf: {}", line);
  return 0;
}

std::string why_not_loaded(int err) {
  err = err < 0 ? -err : err;
  if (err == EPERM || err == EACCES)
    return fmt::format(
        "kernel events need CAP_BPF and CAP_PERFMON (or root), and perfq-daemon runs as uid {} "
        "without them ({}): run the daemon as root (the systemd unit does), or record without "
        "--kernel-events",
        ::geteuid(), std::strerror(err));
  if (err == ENOENT || err == ESRCH || err == EINVAL || err == EOPNOTSUPP)
    return fmt::format(
        "this kernel lacks what kernel events need ({}): BTF (/sys/kernel/btf/vmlinux), "
        "BTF-enabled tracepoints, uprobes",
        std::strerror(err));
  return fmt::format("loading the BPF program failed: {}", std::strerror(err));
}

}  // namespace

struct KernelEvents::Impl {
  kevents* skel = nullptr;
  ring_buffer* rb = nullptr;
  std::vector<bpf_link*> links;
  std::vector<perfq_kevent> batch;   // poll()'s, in ring order
  std::vector<uint64_t> next_index;  // per CPU stream
  int ncpus = 1;

  ~Impl() {
    if (rb) ring_buffer__free(rb);
    for (auto* l : links) bpf_link__destroy(l);
    if (skel) kevents__destroy(skel);
  }

  static int on_event(void* ctx, void* data, size_t size) {
    auto* self = static_cast<Impl*>(ctx);
    if (size < sizeof(perfq_kevent)) return 0;
    perfq_kevent e;
    std::memcpy(&e, data, sizeof(e));
    self->batch.push_back(e);
    return 0;
  }

  // Ring order is reservation order: an interrupt between a program's
  // reservation and its clock read can put a later time first on a CPU.
  // Indexes follow time order within each CPU's stream.
  void convert(std::vector<TraceRecord>& out) {
    std::stable_sort(batch.begin(), batch.end(), [](const perfq_kevent& a, const perfq_kevent& b) {
      return a.cpu != b.cpu ? a.cpu < b.cpu : a.time < b.time;
    });
    for (const auto& e : batch) convert_one(e, out);
    batch.clear();
  }

  void convert_one(const perfq_kevent& e, std::vector<TraceRecord>& out) {
    if (e.cpu >= next_index.size()) next_index.resize(e.cpu + 1u, 0);
    TraceRecord tr;
    tr.source = PERFQ_KERNEL_SOURCE;
    tr.rec.index = next_index[e.cpu]++;
    tr.rec.event = e.event;
    tr.rec.stream = e.cpu;
    tr.rec.flags = PERFQ_FLAGS(PERFQ_KIND_INSTANT, PERFQ_CLOCK_HOST);
    tr.rec.time = e.time;
    tr.rec.arg = static_cast<uint64_t>(static_cast<uint32_t>(e.value)) << 32 | e.tid;
    tr.time_ns = static_cast<int64_t>(e.time);
    out.push_back(tr);
  }

  Status attach(bpf_program* prog, const char* what) {
    bpf_link* l = bpf_program__attach(prog);
    if (!l) {
      const int err = errno;
      return Status(Errc::kUnavailable, fmt::format("attaching {}: {}", what, why_not_loaded(err)));
    }
    links.push_back(l);
    return Status::ok();
  }

  Status attach_uprobe(const std::string& spec, size_t i, bool ret, int pid) {
    const auto colon = spec.rfind(':');
    const std::string path = spec.substr(0, colon), sym = spec.substr(colon + 1);
    // What LIBBPF_OPTS() does, in C++ (the macro is a GNU statement
    // expression around a C99 compound literal).
    bpf_uprobe_opts uo{};
    uo.sz = sizeof(uo);
    uo.func_name = sym.c_str();
    uo.retprobe = ret;
    uo.bpf_cookie = i;
    bpf_link* l = bpf_program__attach_uprobe_opts(
        ret ? skel->progs.pq_uprobe_return : skel->progs.pq_uprobe_entry, pid, path.c_str(), 0,
        &uo);
    if (!l) {
      const int err = errno;
      const bool have_uprobes = ::access("/sys/bus/event_source/devices/uprobe/type", R_OK) == 0;
      if (!have_uprobes)
        return Status(Errc::kUnavailable,
                      fmt::format("uprobe '{}': this kernel has no uprobe event source "
                                  "(/sys/bus/event_source/devices/uprobe)",
                                  spec));
      if (err == ENOENT || err == ESRCH)
        return Status(Errc::kNotFound,
                      fmt::format("uprobe '{}': no function '{}' in {} (is the binary stripped?)",
                                  spec, sym, path));
      return Status(Errc::kUnavailable, fmt::format("uprobe '{}': {}", spec, why_not_loaded(err)));
    }
    links.push_back(l);
    return Status::ok();
  }
};

KernelEvents::KernelEvents(const KernelEventOptions& o)
    : opts_(o), impl_(std::make_unique<Impl>()) {}
KernelEvents::~KernelEvents() = default;

Result<std::unique_ptr<KernelEvents>> KernelEvents::open(const KernelEventOptions& o) {
  if (o.uprobes.size() > PERFQ_KEV_MAX_UPROBES)
    return Status(Errc::kInvalidArgument,
                  fmt::format("at most {} uprobes per recording", PERFQ_KEV_MAX_UPROBES));
  for (const auto& u : o.uprobes)
    if (Status s = check_uprobe_spec(u); !s) return s;
  libbpf_set_print(libbpf_to_spdlog);
  std::unique_ptr<KernelEvents> k(new KernelEvents(o));
  Impl& im = *k->impl_;
  im.skel = kevents__open();
  if (!im.skel) return Status(Errc::kUnavailable, why_not_loaded(errno));
  im.skel->rodata->want_sched = o.sched;
  im.skel->rodata->want_syscalls = o.syscalls;
  // Programs not asked for are not even loaded (one kernel may lack them).
  bpf_program__set_autoload(im.skel->progs.pq_sched_switch, o.sched);
  bpf_program__set_autoload(im.skel->progs.pq_sched_wakeup, o.sched);
  bpf_program__set_autoload(im.skel->progs.pq_sched_wakeup_new, o.sched);
  bpf_program__set_autoload(im.skel->progs.pq_sys_enter, o.syscalls);
  bpf_program__set_autoload(im.skel->progs.pq_sys_exit, o.syscalls);
  bpf_program__set_autoload(im.skel->progs.pq_uprobe_entry, !o.uprobes.empty());
  bpf_program__set_autoload(im.skel->progs.pq_uprobe_return, !o.uprobes.empty());
  if (int err = kevents__load(im.skel); err != 0)
    return Status(Errc::kUnavailable, why_not_loaded(err));
  im.ncpus = std::max(1, libbpf_num_possible_cpus());
  im.next_index.assign(static_cast<size_t>(im.ncpus), 0);
  for (uint32_t pid : o.pids)
    if (Status s = k->trace_pid(pid); !s) return s;
  if (o.sched) {
    if (Status s = im.attach(im.skel->progs.pq_sched_switch, "sched_switch"); !s) return s;
    if (Status s = im.attach(im.skel->progs.pq_sched_wakeup, "sched_wakeup"); !s) return s;
    if (Status s = im.attach(im.skel->progs.pq_sched_wakeup_new, "sched_wakeup_new"); !s) return s;
  }
  if (o.syscalls) {
    if (Status s = im.attach(im.skel->progs.pq_sys_enter, "sys_enter"); !s) return s;
    if (Status s = im.attach(im.skel->progs.pq_sys_exit, "sys_exit"); !s) return s;
  }
  // A uprobe names a binary: every process running it, or only the --pid
  // ones when given.
  std::vector<int> targets;
  for (uint32_t p : o.pids) targets.push_back(static_cast<int>(p));
  if (targets.empty()) targets.push_back(-1);
  for (size_t i = 0; i < o.uprobes.size(); ++i)
    for (int pid : targets)
      for (bool ret : {false, true})
        if (Status s = im.attach_uprobe(o.uprobes[i], i, ret, pid); !s) return s;
  im.rb = ring_buffer__new(bpf_map__fd(im.skel->maps.events), &Impl::on_event, &im, nullptr);
  if (!im.rb)
    return Status(Errc::kUnavailable, fmt::format("BPF ring buffer: {}", std::strerror(errno)));
  return k;
}

TraceSource KernelEvents::describe() const {
  TraceSource s;
  s.id = PERFQ_KERNEL_SOURCE;
  s.kind = TraceSourceKind::kKernel;
  s.name = "kernel";
  const uint16_t instant = PERFQ_KIND_INSTANT;
  if (opts_.sched) {
    s.events.push_back({PERFQ_KEV_SCHED_OUT, instant, "sched_switch_out"});
    s.events.push_back({PERFQ_KEV_SCHED_IN, instant, "sched_switch_in"});
    s.events.push_back({PERFQ_KEV_SCHED_WAKEUP, instant, "sched_wakeup"});
  }
  if (opts_.syscalls) {
    s.events.push_back({PERFQ_KEV_SYSCALL_ENTER, instant, "syscall_enter"});
    s.events.push_back({PERFQ_KEV_SYSCALL_EXIT, instant, "syscall_exit"});
  }
  for (size_t i = 0; i < opts_.uprobes.size(); ++i) {
    const std::string sym = opts_.uprobes[i].substr(opts_.uprobes[i].rfind(':') + 1);
    const auto id = static_cast<uint32_t>(PERFQ_KEV_UPROBE_BASE + 2 * i);
    s.events.push_back({id, instant, "uprobe:" + sym});
    s.events.push_back({id + 1, instant, "uretprobe:" + sym});
  }
  return s;
}

Status KernelEvents::trace_pid(uint32_t tgid) {
  const uint8_t one = 1;
  if (bpf_map__update_elem(impl_->skel->maps.traced, &tgid, sizeof(tgid), &one, sizeof(one),
                           BPF_ANY) != 0) {
    const int err = errno;
    return Status(Errc::kUnavailable,
                  fmt::format("tracing pid {}: {}{}", tgid, std::strerror(err),
                              err == E2BIG ? " (at most 4096 traced processes)" : ""));
  }
  return Status::ok();
}

Result<size_t> KernelEvents::poll(std::vector<TraceRecord>& out, int timeout_ms) {
  const size_t before = out.size();
  // The program wakes the collector only when the buffer fills up; the
  // timeout is the usual way in, then everything waiting is consumed.
  int n = ring_buffer__poll(impl_->rb, timeout_ms);
  if (n >= 0 || n == -EINTR) n = ring_buffer__consume(impl_->rb);
  impl_->convert(out);
  if (n < 0 && n != -EINTR)
    return Status(Errc::kIo, fmt::format("BPF ring buffer: {}", std::strerror(-n)));
  return out.size() - before;
}

std::vector<uint64_t> KernelEvents::dropped() const {
  std::vector<uint64_t> v(static_cast<size_t>(impl_->ncpus), 0);
  const uint32_t zero = 0;
  if (bpf_map__lookup_elem(impl_->skel->maps.dropped, &zero, sizeof(zero), v.data(),
                           v.size() * sizeof(uint64_t), 0) != 0)
    return {};
  return v;
}

uint64_t KernelEvents::missed() const {
  uint64_t n = 0;
  bpf_program* p = nullptr;
  bpf_object__for_each_program(p, impl_->skel->obj) {
    const int fd = bpf_program__fd(p);
    if (fd < 0) continue;
    bpf_prog_info info{};
    uint32_t len = sizeof(info);
    if (bpf_obj_get_info_by_fd(fd, &info, &len) == 0) n += info.recursion_misses;
  }
  return n;
}

#else  // !PERFQ_HAVE_BPF

bool kernel_events_built() { return false; }

struct KernelEvents::Impl {};
KernelEvents::KernelEvents(const KernelEventOptions& o) : opts_(o) {}
KernelEvents::~KernelEvents() = default;

Result<std::unique_ptr<KernelEvents>> KernelEvents::open(const KernelEventOptions&) {
  return Status(Errc::kUnavailable,
                "this perfq-daemon was built without kernel events (the build machine lacked "
                "clang, bpftool, libbpf or /sys/kernel/btf/vmlinux)");
}
TraceSource KernelEvents::describe() const { return {}; }
Status KernelEvents::trace_pid(uint32_t) { return Status(Errc::kUnavailable, "no kernel events"); }
Result<size_t> KernelEvents::poll(std::vector<TraceRecord>&, int) { return size_t{0}; }
std::vector<uint64_t> KernelEvents::dropped() const { return {}; }
uint64_t KernelEvents::missed() const { return 0; }

#endif

}  // namespace perfqd
