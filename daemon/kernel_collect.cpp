// pq-kernel: the kernel-event collector thread of a recording (the host's
// kernel events, `perfqctl start --kernel-events/--uprobe`).
//
// Opens the BPF program (kernel_events.h) when the recording asks for
// kernel events, traces the registered applications' processes as they
// become known (Recording::on_host_sources), and drains the BPF ring buffer
// every 10 ms into the merge as one more host input, kernel-side drops into
// the loss table.  Where BPF is unavailable the recording goes on without
// it, with one warning.
#include <pthread.h>

#include <spdlog/spdlog.h>

#include "kernel_events.h"
#include "perfq_kevent.h"
#include "recording.h"

namespace perfqd {

using namespace perfq;
using nlohmann::json;

Status Recording::open_kernel_events() {
  if (!opts_.kernel.any()) return Status::ok();
  auto k = KernelEvents::open(opts_.kernel);
  // A uprobe on a function that is not there is the request's fault: refused.
  if (!k && (k.status().code() == Errc::kNotFound || k.status().code() == Errc::kInvalidArgument))
    return Status(k.status().code(), "kernel events: " + k.status().message());
  if (!k) {
    // Said once, here; the recording goes on with everything else.
    kernel_error_ = k.status().message();
    warnings_.push_back("kernel events: " + kernel_error_ + "; recording everything else");
    spdlog::warn("{}", warnings_.back());
    metadata_.options["kernel_events_error"] = kernel_error_;
    return Status::ok();
  }
  kernel_ = std::move(k.value());
  metadata_.sources.push_back(kernel_->describe());
  const auto& ko = opts_.kernel;
  std::string what = std::string(ko.sched ? "sched," : "") + (ko.syscalls ? "syscalls," : "");
  for (const auto& u : ko.uprobes) what += "uprobe " + u + ",";
  if (!what.empty()) what.pop_back();
  metadata_.options["kernel_events"] = what;
  return Status::ok();
}

void Recording::start_kernel_thread() {
  if (!kernel_) return;
  kernel_input_ = merger_.add_input("kernel", start_ns_ - opts_.host_grace_ns);
  kernel_thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "pq-kernel");
    kernel_main();
  });
}

// The kernel collector: everything the BPF program stored, every 10 ms (the
// program wakes this thread early only when its buffer fills up), into the
// merger with the host grace; kernel-side drops into the loss table.
void Recording::kernel_main() {
  std::vector<TraceRecord> out;
  std::vector<uint64_t> dropped_seen;
  std::vector<uint64_t> last_index;
  bool failed = false;
  auto pass = [&](int timeout_ms) {
    const int64_t t0 = now_ns();
    out.clear();
    auto n = kernel_->poll(out, timeout_ms);
    if (!n && !failed) {
      failed = true;
      spdlog::error("kernel events: {}; no more kernel events in this recording",
                    n.status().message());
    }
    for (const auto& r : out) {
      if (r.rec.stream >= last_index.size()) last_index.resize(r.rec.stream + 1u, 0);
      last_index[r.rec.stream] = r.rec.index;
    }
    kernel_records_ += out.size();
    merger_.push(kernel_input_, out, t0 - opts_.host_grace_ns);
    const auto dropped = kernel_->dropped();
    if (dropped_seen.size() < dropped.size()) dropped_seen.resize(dropped.size(), 0);
    for (size_t cpu = 0; cpu < dropped.size(); ++cpu) {
      if (dropped[cpu] <= dropped_seen[cpu]) continue;
      const uint64_t d = dropped[cpu] - dropped_seen[cpu];
      dropped_seen[cpu] = dropped[cpu];
      kernel_dropped_ += d;
      queue_loss({PERFQ_KERNEL_SOURCE, static_cast<uint16_t>(cpu),
                  TraceLossReason::kKernelBufferFull, d, now_ns(),
                  cpu < last_index.size() ? last_index[cpu] : 0});
    }
  };
  while (!kernel_stop_) pass(10);
  pass(0);  // what was stored before the stop
  merger_.close(kernel_input_);
}

json Recording::kernel_status() const {
  if (!opts_.kernel.any()) return {{"state", "off"}};
  if (!kernel_) return {{"state", "unavailable"}, {"error", kernel_error_}};
  json pids = json::array();
  {
    std::lock_guard lock(kernel_mu_);
    for (uint32_t p : opts_.kernel.pids) pids.push_back(p);
    for (uint32_t p : traced_pids_) pids.push_back(p);
  }
  return {{"state", kernel_stop_ ? "stopped" : "recording"},
          {"records", kernel_records_.load()},
          {"dropped", kernel_dropped_.load()},
          {"missed", kernel_->missed()},
          {"traced_pids", pids},
          {"sched", opts_.kernel.sched},
          {"syscalls", opts_.kernel.syscalls},
          {"uprobes", opts_.kernel.uprobes}};
}

}  // namespace perfqd
