#include "daemon.h"

#include "app/json_lines.h"

#include <glob.h>
#include <grp.h>
#include <malloc.h>
#include <pthread.h>
#include <pwd.h>
#include <unistd.h>

#include <spdlog/spdlog.h>
#include <algorithm>
#include <filesystem>

#include "device/device.h"
#include "device/device_clock.h"
#include "host/pci_scan.h"
#include "host/transport.h"
#include "request.h"

namespace perfqd {

using namespace perfq;
using nlohmann::json;

namespace {

HostAppsOptions apps_options(const DaemonConfig& c) {
  HostAppsOptions o;
  o.ring_records = c.ring_records;
  return o;
}

}  // namespace

std::string Peer::describe() const {
  // The user's name too, for the journal: "uid 1001 (alice, pid 4242)".
  std::string name;
  passwd pw{};
  passwd* found = nullptr;
  char buf[1024];
  if (::getpwuid_r(cred.uid, &pw, buf, sizeof(buf), &found) == 0 && found)
    name = std::string(found->pw_name) + ", ";
  return "uid " + std::to_string(cred.uid) + " (" + name + "pid " + std::to_string(cred.pid) + ")";
}

Daemon::Daemon(DaemonConfig config)
    : config_(std::move(config)), started_ns_(now_ns()), apps_(apps_options(config_)) {
  {
    std::lock_guard lock(config_mu_);
    resolve_group();
  }
  collector_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "pq-collect");
    collector_main();
  });
}

Daemon::~Daemon() {
  shutdown();
  quit_ = true;
  wake_collector();
  if (collector_.joinable()) collector_.join();
}

DaemonConfig Daemon::config() const {
  std::lock_guard lock(config_mu_);
  return config_;
}

bool Daemon::privileged(const Peer& p) const {
  if (p.cred.uid == 0 || p.cred.uid == geteuid()) return true;
  std::optional<gid_t> gid;
  {
    std::lock_guard lock(config_mu_);
    gid = group_gid_;
  }
  if (!gid) return false;
  if (p.cred.gid == *gid) return true;
  return std::find(p.groups.begin(), p.groups.end(), *gid) != p.groups.end();
}

void Daemon::resolve_group() {
  // Under config_mu_.  Looked up here (start, SIGHUP), not per connection:
  // the accept loop asks privileged() for every connection, and a name
  // service may be slow.
  group_gid_.reset();
  if (config_.group.empty()) return;
  struct group gr {
  }, *found = nullptr;
  std::vector<char> buf(16384);
  if (getgrnam_r(config_.group.c_str(), &gr, buf.data(), buf.size(), &found) == 0 && found) {
    group_gid_ = found->gr_gid;
    return;
  }
  spdlog::info(
      "group '{}' does not exist: only root and the daemon's user may start and stop recordings "
      "(looked up again on SIGHUP)",
      config_.group);
}

Status Daemon::adopt_app(UniqueFd fd, const json& hello, const Peer& peer) {
  // The host input is resumed before the application learns of its ring
  // (adopt() replies), and the collector checks for applications under the
  // same lock: it never suspends the input of one that may record.
  Status s;
  {
    std::lock_guard lock(apps_mu_);
    {
      std::lock_guard l2(rec_mu_);
      if (rec_) rec_->resume_host_input();
    }
    s = apps_.adopt(std::move(fd), hello, peer.cred);
    apps_changed_ = true;
  }
  wake_collector();
  return s;
}

json Daemon::handle(const json& req, const Peer& peer,
                    const std::function<void(const json&)>& progress) {
  const std::string cmd = req.value("cmd", "");
  try {
    if (cmd == "status") return status();
    if (cmd == "devices") {
      if (std::string e = check_field(req, "all", "boolean"); !e.empty())
        return error_reply("devices: " + e);
      return devices(req.value("all", false));
    }
    if (cmd == "start" || cmd == "stop") {
      if (!privileged(peer)) {
        spdlog::warn("refused {} from {}: not root nor in group {}", cmd, peer.describe(),
                     config().group);
        return error_reply("permission denied: " + cmd + " needs root or membership in the '" +
                           config().group + "' group (you are " + peer.describe() + ")");
      }
      std::lock_guard lock(control_mu_);
      return cmd == "start" ? start(req, peer) : stop(progress, false);
    }
    if (cmd == "ping") return {{"ok", true}, {"pid", getpid()}};
  } catch (const json::exception& e) {
    return error_reply(std::string("bad request: ") + e.what());
  }
  return error_reply("unknown command '" + cmd +
                     "' (commands: start, stop, status, devices, ping)");
}

json Daemon::start(const json& req, const Peer& peer) {
  {
    std::lock_guard lock(rec_mu_);
    if (rec_)
      return error_reply("a recording is already running (writing " + rec_->options().output +
                         "); stop it first with `perfqctl stop`");
  }
  const DaemonConfig c = config();
  RecordingOptions o;
  if (std::string e = parse_start(req, c, o); !e.empty()) return error_reply("start: " + e);
  o.ring_records = c.ring_records;
  o.device_grace_ns = static_cast<int64_t>(c.device_latency_ms) * 1'000'000;
  o.host_grace_ns = static_cast<int64_t>(c.host_latency_ms) * 1'000'000;
  o.device_timeout_ns = static_cast<int64_t>(c.device_timeout_ms) * 1'000'000;
  o.merge.max_delay_ns = static_cast<int64_t>(c.max_delay_ms) * 1'000'000;
  o.merge.stream_timeout_ns = static_cast<int64_t>(c.stream_timeout_ms) * 1'000'000;
  o.writer.compress = c.compress;
  o.writer.zstd_level = c.zstd_level;
  o.owner_uid = peer.cred.uid;
  o.owner_gid = peer.cred.gid;
  o.requested_by = peer.describe();

  auto rec = Recording::start(o);
  if (!rec) {
    spdlog::warn("start refused: {}", rec.status().message());
    return error_reply(rec.status().message());
  }
  std::shared_ptr<Recording> r = std::move(rec.value());
  {
    std::lock_guard lock(rec_mu_);
    r->set_host_start(now_ns());
    rec_ = r;
    last_collected_ = true;
  }
  // The collector attaches to the new recording at once, and suspends its
  // host input if no application is connected.
  {
    std::lock_guard lock(apps_mu_);
    apps_changed_ = true;
  }
  wake_collector();
  // Only now may applications record: the collector has a recording to
  // pass their records to.
  apps_.set_recording(true);
  spdlog::info("recording to {} ({} device(s), sync every {} ms, mode {}{}) for {}", o.output,
               o.devices.size(), o.sync_interval_ms, o.sync_mode == PERFQ_SYNC_MODE_B ? "b" : "a",
               o.duration_s > 0 ? ", " + std::to_string(o.duration_s) + " s" : "", peer.describe());
  json devs = json::array();
  for (const auto& d : o.devices) devs.push_back(d);
  json reply = {{"ok", true},
                {"output", o.output},
                {"devices", devs},
                {"start_ns", r->start_ns()},
                {"duration_s", o.duration_s}};
  if (!r->warnings().empty()) reply["warnings"] = r->warnings();
  return reply;
}

json Daemon::stop(const std::function<void(const json&)>& progress, bool automatic) {
  std::shared_ptr<Recording> rec;
  {
    std::lock_guard lock(rec_mu_);
    rec = rec_;
    if (!rec) {
      if (!automatic && !last_collected_ && !last_.is_null()) {
        last_collected_ = true;
        json j = last_;
        j["ok"] = true;
        j["note"] = "the recording had already stopped: " + last_.value("stop_reason", "");
        return j;
      }
      return error_reply("no recording is running (start one with `perfqctl start`)");
    }
  }
  // Applications stop recording; the collector passes everything they
  // stored, then lets go of the recording.
  apps_.pause_applications();
  collector_sync();
  {
    std::lock_guard lock(rec_mu_);
    rec_.reset();
    stopping_ = rec;  // its counts stay in status' totals until they join finished_
  }
  apps_.set_recording(false);
  collector_sync();  // no pass still holds the recording
  const std::string reason = automatic ? (rec->status().contains("error") ? "the trace file failed"
                                                                          : "its duration elapsed")
                                       : "perfqctl stop";
  json j = rec->stop(progress);
  j["ok"] = true;
  j["stop_reason"] = reason;
  {
    std::lock_guard lock(rec_mu_);
    last_ = j;
    last_collected_ = !automatic;
    add_counts(finished_, j);
    finished_["recordings"] = finished_.value("recordings", 0) + 1;
    stopping_.reset();
  }
  // The recording's buffers (its merge's runs, its rings' copies) go back
  // to the system, not only to the allocator: a backlog once (a busy
  // machine, a slow disk) would otherwise stay in the daemon's RSS for good
  // (a soak's recordings after one peaked at 138 MiB where they had 95-110).
  rec.reset();
  malloc_trim(0);
  return j;
}

void Daemon::tick() {
  std::shared_ptr<Recording> rec;
  {
    std::lock_guard lock(rec_mu_);
    rec = rec_;
  }
  if (rec && rec->wants_stop()) {
    std::unique_lock lock(control_mu_, std::try_to_lock);
    if (!lock) return;  // a start/stop is under way; look again later
    std::shared_ptr<Recording> again;
    {
      std::lock_guard l2(rec_mu_);
      again = rec_;
    }
    if (again == rec) stop({}, true);
  }
}

void Daemon::shutdown() {
  std::lock_guard lock(control_mu_);
  bool running;
  {
    std::lock_guard l2(rec_mu_);
    running = rec_ != nullptr;
  }
  if (running) {
    spdlog::info("stopping the recording before exit");
    stop({}, true);
  }
}

void Daemon::reload(const DaemonConfig& c) {
  std::lock_guard lock(config_mu_);
  if (c.socket != config_.socket)
    spdlog::warn("reload: the socket path changes only at restart (still {})", config_.socket);
  const std::string socket = config_.socket;
  config_ = c;
  config_.socket = socket;
  resolve_group();
  spdlog::info("reloaded the configuration from {}", c.config_file);
}

// Adds a recording's counts (its status or stop summary) to `totals`, the
// daemon's counts since it started: status' "totals" (and the Prometheus
// counters, which never go down between recordings).
void Daemon::add_counts(json& totals, const json& rec) {
  // `to` may still be null (a device or application seen for the first time).
  auto count = [](const json& j, const char* key) {
    return j.is_object() ? j.value(key, uint64_t{0}) : uint64_t{0};
  };
  auto add = [&](json& to, const char* key, const json& from) {
    to[key] = count(to, key) + count(from, key);
  };
  add(totals, "records", rec);
  add(totals, "bytes", rec);
  for (const auto& d : rec.value("devices", json::array())) {
    json& t = totals["devices"][d.value("device", std::string())];
    for (const char* k : {"records", "bytes", "lost", "invalid"}) add(t, k, d);
    const json sync = d.value("sync", json::object());
    t["sync_rounds"] = count(t, "sync_rounds") + count(sync, "rounds");
    t["sync_failed_rounds"] = count(t, "sync_failed_rounds") + count(sync, "failed_rounds");
  }
  for (const auto& h : rec.value("host_streams", json::array())) {
    json& t = totals["apps"][h.value("app", std::string())];
    for (const char* k : {"records", "bytes", "lost"}) add(t, k, h);
  }
}

json Daemon::status() const {
  json j = {{"ok", true}};
  const DaemonConfig c = config();
  j["daemon"] = {{"pid", getpid()},
                 {"version", PERFQ_VERSION_STRING},
                 {"uptime_s", static_cast<double>(now_ns() - started_ns_) / 1e9},
                 {"socket", c.socket},
                 {"devices", c.devices},
                 {"apps", apps_.apps()}};
  std::shared_ptr<Recording> rec, stopping;
  json totals;
  {
    std::lock_guard lock(rec_mu_);
    rec = rec_;
    stopping = stopping_;
    j["last"] = last_;
    totals = finished_;
  }
  j["recording"] = rec ? rec->status() : json(nullptr);
  // Counters never go down: a recording being stopped still counts.
  if (rec) add_counts(totals, j["recording"]);
  if (stopping) add_counts(totals, stopping->status());
  totals["recordings"] = totals.value("recordings", 0) + (rec || stopping ? 1 : 0);
  j["totals"] = std::move(totals);
  json streams = json::array();
  for (const auto& s : apps_.stats())
    streams.push_back({{"source", s.source},
                       {"stream", s.stream},
                       {"pid", s.pid},
                       {"tid", s.tid},
                       {"app", s.app},
                       {"thread", s.thread},
                       {"records", s.records},
                       {"bytes", s.records * sizeof(perfq_record)},
                       {"lost", s.lost},
                       {"ring_fill", s.fill},
                       {"ring_capacity", s.capacity},
                       {"alive", s.alive}});
  j["app_streams"] = streams;
  return j;
}

json Daemon::devices(bool all) const {
  const DaemonConfig c = config();
  // The PCI bus, read once: every device (the facts of /dev/perfqN come
  // from here too); the reply lists those bound to perfq, or all of them.
  auto scan = scan_pci();
  if (!scan) spdlog::warn("devices: {}", scan.status().message());
  auto on_bus = [&](const std::string& address) -> const PciDevice* {
    if (!scan) return nullptr;
    for (const auto& p : scan->devices)
      if (p.address == address) return &p;
    return nullptr;
  };
  std::vector<std::string> specs = c.devices;
  glob_t g{};
  if (glob("/dev/perfq[0-9]*", 0, nullptr, &g) == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i)
      if (std::find(specs.begin(), specs.end(), g.gl_pathv[i]) == specs.end())
        specs.push_back(g.gl_pathv[i]);
  globfree(&g);
  std::shared_ptr<Recording> rec;
  {
    std::lock_guard lock(rec_mu_);
    rec = rec_;
  }
  json list = json::array();
  for (const auto& spec : specs) {
    json d = {
        {"device", spec},
        {"configured", std::find(c.devices.begin(), c.devices.end(), spec) != c.devices.end()}};
    if (rec) {
      const auto& rd = rec->options().devices;
      d["recording"] = std::find(rd.begin(), rd.end(), spec) != rd.end();
    }
    // A /dev/perfqN is a PCI device (shm: regions are not).
    if (spec.rfind("/dev/perfq", 0) == 0) {
      auto address = perfq_device_pci_address(spec);
      if (!address)
        d["pci_error"] = address.status().message();
      else if (const PciDevice* p = on_bus(address.value()))
        d["pci"] = pci_device_to_json(*p);
      else
        d["pci_error"] = "PCI device " + address.value() + " is not on the bus" +
                         (scan ? "" : " (" + scan.status().message() + ")");
    }
    auto t = open_transport(spec);
    if (!t) {
      d["state"] = "unavailable";
      d["error"] = t.status().message();
    } else {
      const Region& r = t.value()->region();
      const auto st = device_state(r);
      d["state"] = st == PERFQ_DEVICE_RUNNING   ? "running"
                   : st == PERFQ_DEVICE_STOPPED ? "stopped"
                                                : "init";
      d["name"] = r.device_name();
      d["ring_capacity"] = r.ring_capacity();
      d["region_size"] = r.size();
      d["clock_hz"] = r.header().device_clock_hz;
      d["timer_hz"] = r.header().timer_hz;
      d["abi_version"] = r.header().abi_version;
    }
    list.push_back(d);
  }
  json reply = {{"ok", true}, {"devices", list}, {"all", all}};
  json pci = json::array();
  if (scan) {
    for (const auto& p : scan->devices)
      if (all || p.driver == "perfq") pci.push_back(pci_device_to_json(p));
    if (!scan->warnings.empty()) reply["pci_warnings"] = scan->warnings;
  } else {
    reply["pci_error"] = scan.status().message();
  }
  reply["pci_devices"] = std::move(pci);
  return reply;
}

}  // namespace perfqd
