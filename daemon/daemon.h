// perfq-daemon's state: the host application registry and its collector
// thread, the current recording, and the control requests that act on them.
//
// Threading: handle() and adopt_app() from any connection thread; the
// daemon's own mutex serializes start/stop.  tick() from the main thread.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>

#include "app/host_apps.h"
#include "config.h"
#include "core/mapping.h"
#include "recording.h"

namespace perfqd {

// Who sent a request (SO_PEERCRED and SO_PEERGROUPS of the connection).
struct Peer {
  ucred cred{};
  std::vector<gid_t> groups;
  std::string describe() const;
};

class Daemon {
 public:
  explicit Daemon(DaemonConfig config);
  ~Daemon();

  // One control request; `progress` sends an interim line to the client.
  nlohmann::json handle(const nlohmann::json& req, const Peer& peer,
                        const std::function<void(const nlohmann::json&)>& progress);
  // An application's connection (its first line was app_hello).
  perfq::Status adopt_app(perfq::UniqueFd fd, const nlohmann::json& hello, const Peer& peer);

  // Main thread, a few times a second: stops a recording whose duration
  // elapsed or whose file failed.
  void tick();
  // SIGHUP: new settings for the next recordings and the log level.
  void reload(const DaemonConfig& c);
  // SIGTERM: stop the recording cleanly (returns when the trace is closed).
  void shutdown();

  DaemonConfig config() const;
  // What `perfqctl status` prints, also served as Prometheus metrics
  // (metrics.h); any thread.
  nlohmann::json status() const;
  // Root, the daemon's own user, or a member of the configured group (its
  // gid is looked up at start and on SIGHUP); any thread, cheap.
  bool privileged(const Peer& p) const;

 private:
  nlohmann::json start(const nlohmann::json& req, const Peer& peer);
  nlohmann::json stop(const std::function<void(const nlohmann::json&)>& progress, bool automatic);
  static void add_counts(nlohmann::json& totals, const nlohmann::json& rec);
  // Configured devices and /dev/perfqN (with their PCI facts), and the PCI
  // devices bound to perfq (every PCI device with `all`).
  nlohmann::json devices(bool all) const;
  void collector_main();
  // Waits until the collector has finished a pass that began after this
  // call, so every host record stored before it has reached the recording.
  void collector_sync();

  void resolve_group();

  mutable std::mutex config_mu_;
  DaemonConfig config_;
  std::optional<gid_t> group_gid_;  // config_.group's, under config_mu_
  const int64_t started_ns_;

  perfq::HostApps apps_;

  // The recording, shared with the collector thread.
  mutable std::mutex rec_mu_;
  std::shared_ptr<Recording> rec_;
  std::shared_ptr<Recording> stopping_;  // between rec_.reset() and its counts joining finished_
  nlohmann::json last_;                  // summary of the last stopped recording
  nlohmann::json finished_ = nlohmann::json::object();  // counts of stopped recordings
  bool last_collected_ = true;                          // a `stop` has returned it
  std::mutex control_mu_;                               // one start/stop at a time

  std::thread collector_;
  std::atomic<bool> quit_{false};
  std::mutex pass_mu_;
  std::condition_variable pass_cv_;
  uint64_t passes_done_ = 0;
  std::atomic<bool> pass_wanted_{false};
  // An application connected or a recording started: the collector, asleep
  // while no application is connected, has work.  Set under apps_mu_ with
  // the host input resumed, so that an application never records while the
  // collector's host input is suspended.
  std::mutex apps_mu_;
  std::atomic<bool> apps_changed_{false};
  void wake_collector();
};

}  // namespace perfqd
