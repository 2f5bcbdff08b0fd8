// pq-collect: the host collector thread (ARCHITECTURE.md, data flow step 3).
//
// One thread for the daemon's life: it drains every instrumented
// application's host queues (HostApps: one SPSC ring per application
// thread, in a memfd the daemon maps) and passes the records, the
// applications' sources and their losses to the current recording, which
// merges them as its "host" input.  It sleeps while no application is
// connected (the host input suspended meanwhile, so that it holds no device
// record back), and a stop asks it for full passes (collector_sync()).
// Everything that runs on this thread is here: the Daemon's loop and the
// Recording's host input.
#include <pthread.h>

#include <spdlog/spdlog.h>
#include <algorithm>

#include "daemon.h"
#include "device/device.h"
#include "recording.h"

namespace perfqd {

using namespace perfq;

namespace {

constexpr size_t kHostDrainPerRing = 4096;

}  // namespace

// ---- The Daemon's collector loop ----------------------------------------------------------

void Daemon::wake_collector() {
  { std::lock_guard lock(pass_mu_); }  // not between the collector's check and its wait
  pass_cv_.notify_all();
}

void Daemon::collector_sync() {
  // Two full passes requested one after the other: the second surely began
  // after this call (the first may have been under way already).
  std::unique_lock lock(pass_mu_);
  for (int i = 0; i < 2; ++i) {
    const uint64_t target = passes_done_ + 1;
    pass_wanted_ = true;
    pass_cv_.notify_all();
    if (!pass_cv_.wait_for(lock, std::chrono::seconds(5),
                           [&] { return passes_done_ >= target && !pass_wanted_; }))
      spdlog::warn("the host collector did not finish a pass in 5 s");
  }
}

void Daemon::collector_main() {
  // Back off to 2 ms sleeps, and to 10 ms once no application recorded for a
  // quarter second (a default 64 Ki-record ring holds 10 ms at 6 M records/s).
  Backoff busy(std::chrono::microseconds(2000), 64, std::chrono::microseconds(10000),
               std::chrono::microseconds(250000));
  std::map<uint16_t, TraceSource> sources;  // the live applications', for new recordings
  std::shared_ptr<Recording> attached;      // the recording the collector last fed
  while (!quit_) {
    std::shared_ptr<Recording> rec;
    {
      std::lock_guard lock(rec_mu_);
      rec = rec_;
    }
    if (rec && rec != attached) {
      std::vector<TraceSource> all;
      for (const auto& [id, s] : sources) all.push_back(s);
      rec->on_host_sources(all);
    }
    attached = rec;
    // A full pass (asked for by a stop) empties every ring of what it held
    // when the pass began.
    const bool full = pass_wanted_.exchange(false);
    const int64_t t0 = now_ns();
    size_t n = apps_.drain(
        [&](uint16_t source, std::span<const perfq_record> recs) {
          if (rec) rec->on_host_records(source, recs);
        },
        full ? SIZE_MAX : kHostDrainPerRing);
    auto changed = apps_.take_changed_sources();
    for (const auto& s : changed) sources[s.id] = s;
    // An application that ended is no source of a later recording (it was
    // listed in every new trace, and the collector kept them all).
    for (const uint16_t id : apps_.take_gone_sources()) sources.erase(id);
    auto losses = apps_.take_losses(t0);
    if (rec) {
      const int64_t grace = rec->options().host_grace_ns;
      rec->on_host_sources(changed);
      if (!losses.empty()) rec->on_host_losses(losses);
      rec->on_host_idle(full || n < kHostDrainPerRing ? t0 - grace : INT64_MIN);
    }
    rec.reset();
    if (full) {
      std::lock_guard lock(pass_mu_);
      ++passes_done_;
    }
    pass_cv_.notify_all();
    if (pass_wanted_.load() || n >= kHostDrainPerRing / 2) {
      busy.reset();  // a ring is filling, or a stop waits for a full pass
      continue;
    }
    if (n > 0) busy.steady();  // a trickle: take it in batches, one wakeup per 2 ms
    // No application connected, so no ring: nothing can come until one
    // connects, and adopt_app() wakes us then.  Sleep (a wakeup costs tens
    // of microseconds on a VM: polling for nothing was a third of an idle
    // daemon's CPU), with the host input suspended so that it does not hold
    // the devices' records back meanwhile.
    bool no_apps = false;
    {
      std::lock_guard lock(apps_mu_);
      if (!apps_changed_.exchange(false) && apps_.apps() == 0 && apps_.rings() == 0) {
        no_apps = true;
        if (attached) attached->suspend_host_input();
      }
    }
    if (no_apps) {
      std::unique_lock lock(pass_mu_);
      pass_cv_.wait_for(lock, std::chrono::seconds(1), [&] {
        return pass_wanted_.load() || quit_.load() || apps_changed_.load();
      });
      busy.reset();
    } else if (attached) {
      busy.wait();
    } else {
      // No recording, but applications connected: drop what they write
      // twenty times a second.
      std::unique_lock lock(pass_mu_);
      pass_cv_.wait_for(lock, std::chrono::milliseconds(50),
                        [&] { return pass_wanted_.load() || quit_.load(); });
    }
  }
}

// ---- A recording's host input (called from the loop above) -------------------------------

void Recording::on_host_sources(const std::vector<TraceSource>& sources) {
  if (sources.empty()) return;
  if (kernel_) {
    // Registered applications are traced from the moment they are known.
    std::lock_guard lock(kernel_mu_);
    for (const auto& s : sources) {
      if (s.kind != TraceSourceKind::kHost || s.pid == 0 ||
          std::find(traced_pids_.begin(), traced_pids_.end(), s.pid) != traced_pids_.end())
        continue;
      if (Status st = kernel_->trace_pid(s.pid); !st)
        spdlog::warn("kernel events: {}", st.message());
      else
        traced_pids_.push_back(s.pid);
    }
  }
  TraceMetadata m;
  m.sources = sources;
  {
    std::lock_guard lock(stats_mu_);
    for (const auto& s : sources) host_names_[s.id] = s.name;
  }
  queue_metadata(m);
}

void Recording::on_host_records(uint16_t source, std::span<const perfq_record> records) {
  std::lock_guard lock(stats_mu_);
  const auto it_name = host_names_.find(source);
  for (const auto& r : records) {
    if (static_cast<int64_t>(r.time) < host_start_ns_) {
      ++before_start_;
      continue;
    }
    TraceRecord tr;
    tr.source = source;
    tr.rec = r;
    tr.time_ns = static_cast<int64_t>(r.time);
    host_batch_.push_back(tr);
    auto& hs = host_streams_[{source, r.stream}];
    if (hs.app.empty() && it_name != host_names_.end()) hs.app = it_name->second;
    ++hs.records;
    hs.last_ns = tr.time_ns;
  }
}

void Recording::set_host_start(int64_t t) {
  std::lock_guard lock(stats_mu_);
  host_start_ns_ = t;
}

void Recording::on_host_losses(const std::vector<TraceLoss>& losses) {
  for (const auto& l : losses) {
    {
      std::lock_guard lock(stats_mu_);
      host_streams_[{l.source, l.stream}].lost += l.count;
    }
    queue_loss(l);
  }
}

void Recording::on_host_idle(int64_t bound) {
  std::vector<TraceRecord> batch;
  {
    std::lock_guard lock(stats_mu_);
    batch.swap(host_batch_);
  }
  merger_.push(host_input_, batch, bound);
}

void Recording::suspend_host_input() { merger_.suspend(host_input_); }

void Recording::resume_host_input() { merger_.resume(host_input_, now_ns() - opts_.host_grace_ns); }

}  // namespace perfqd
