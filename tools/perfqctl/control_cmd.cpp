// perfqctl start / stop / status / devices: talk to perfq-daemon over its
// control socket (one JSON object per line each way; see daemon/control.h).
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "app/json_lines.h"
#include "commands.h"
#include "core/json_schema.h"
#include "host/pci_scan.h"
#include "perfq/pci.h"

namespace perfqctl {
namespace {

using nlohmann::json;
using perfq::LineBuffer;
using perfq::recv_chunk;
using perfq::send_line;
using perfq::Status;

constexpr const char* kDefaultSocket = "/run/perfq/perfqd.sock";

std::string default_socket() {
  const char* env = std::getenv("PERFQ_SOCKET");
  return env && *env ? env : kDefaultSocket;
}

volatile sig_atomic_t g_interrupted = 0;
void on_sigint(int) { g_interrupted = 1; }

// One connection to the daemon.
class Client {
 public:
  // "" on success, else what went wrong and what to do.
  std::string connect(const std::string& path) {
    path_ = path;
    sockaddr_un addr{};
    if (path.size() >= sizeof(addr.sun_path)) return "socket path " + path + " is too long";
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) return std::string("socket: ") + std::strerror(errno);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      const int err = errno;
      std::string msg = "cannot reach perfq-daemon at " + path + ": " + std::strerror(err);
      if (err == ENOENT || err == ECONNREFUSED)
        msg +=
            " (is it running? `systemctl start perfq-daemon`, or run `perfq-daemon "
            "--socket PATH` and pass the same --socket here)";
      else if (err == EACCES)
        msg += " (no permission on the socket or its folder)";
      return msg;
    }
    return "";
  }
  ~Client() {
    if (fd_ >= 0) ::close(fd_);
  }

  // Sends req and returns the final reply; interim progress lines go to
  // `progress`.  On a transport failure returns {"ok":false,"error":...}.
  json request(const json& req, const std::function<void(const json&)>& progress = {}) {
    if (Status s = send_line(fd_, req.dump()); !s)
      return failure("sending to the daemon: " + s.message());
    while (true) {
      while (auto line = buf_.next_line()) {
        json j = json::parse(*line, nullptr, false);
        if (j.is_discarded() || !j.is_object())
          return failure("the daemon sent a reply that is not JSON");
        if (j.contains("progress")) {
          if (progress) progress(j["progress"]);
          continue;
        }
        return j;
      }
      if (buf_.overflow()) return failure("the daemon sent a reply line over 64 MiB");
      const long n = recv_chunk(fd_, buf_, nullptr);
      if (n < 0)
        return failure(std::string("reading the daemon's reply: ") +
                       std::strerror(static_cast<int>(-n)));
      if (n == 0) return failure("the daemon closed the connection without a reply (did it exit?)");
    }
  }

 private:
  static json failure(const std::string& m) { return {{"ok", false}, {"error", m}}; }
  std::string path_;
  int fd_ = -1;
  LineBuffer buf_{64u << 20};  // a status of thousands of streams is large, not endless
};

int fail(const std::string& cmd, const std::string& msg) {
  std::fprintf(stderr, "perfqctl %s: %s\n", cmd.c_str(), msg.c_str());
  return kExitFail;
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char s[32];
  std::snprintf(s, sizeof(s), u ? "%.1f %s" : "%.0f %s", b, units[u]);
  return s;
}

std::string fmt_gbs(double bytes_per_s) {
  char s[32];
  std::snprintf(s, sizeof(s), "%.2f", bytes_per_s / 1e9);
  return s;
}

uint64_t u64(const json& j, const char* k) {
  return j.contains(k) && j[k].is_number() ? j[k].get<uint64_t>() : 0;
}
double dbl(const json& j, const char* k) {
  return j.contains(k) && j[k].is_number() ? j[k].get<double>() : 0.0;
}

// The kernel events line of a status or stop summary (nothing when off).
void print_kernel(const json& s) {
  if (!s.contains("kernel") || !s["kernel"].is_object()) return;
  const json& k = s["kernel"];
  const std::string state = k.value("state", "off");
  if (state == "off") return;
  if (state == "unavailable") {
    std::printf("  kernel events: unavailable: %s\n", k.value("error", "?").c_str());
    return;
  }
  std::string pids;
  if (k.contains("traced_pids"))
    for (const auto& p : k["traced_pids"]) pids += (pids.empty() ? "" : ",") + p.dump();
  std::printf("  kernel events (%s): %llu records, %llu dropped; traced pids %s\n", state.c_str(),
              static_cast<unsigned long long>(u64(k, "records")),
              static_cast<unsigned long long>(u64(k, "dropped")),
              pids.empty() ? "none yet" : pids.c_str());
}

void print_summary(const json& s) {
  std::printf("trace %s: %llu records, %s in %.1f s%s\n", s.value("output", "?").c_str(),
              static_cast<unsigned long long>(u64(s, "records")),
              human_bytes(static_cast<double>(u64(s, "bytes"))).c_str(), dbl(s, "duration_s"),
              s.value("complete", true) ? "" : " (INCOMPLETE)");
  if (s.contains("devices"))
    for (const auto& d : s["devices"]) {
      std::printf(
          "  device %s (%s): %llu records, %llu lost, %s", d.value("device", "?").c_str(),
          d.value("state", "?").c_str(), static_cast<unsigned long long>(u64(d, "records")),
          static_cast<unsigned long long>(u64(d, "lost")),
          d.contains("sync") && d["sync"].value("synchronized", false) ? "" : "not synchronized");
      if (d.contains("sync") && d["sync"].value("synchronized", false))
        std::printf("%s, +-%.0f ns, %llu rounds", d["sync"].value("standing", "?").c_str(),
                    dbl(d["sync"], "uncertainty_ns"),
                    static_cast<unsigned long long>(u64(d["sync"], "rounds")));
      std::printf("\n");
      if (d.contains("error"))
        std::printf("    error: %s\n", d["error"].get<std::string>().c_str());
    }
  if (s.contains("host_streams")) {
    uint64_t recs = 0, lost = 0;
    for (const auto& h : s["host_streams"]) {
      recs += u64(h, "records");
      lost += u64(h, "lost");
    }
    std::printf("  host: %zu thread stream(s), %llu records, %llu lost\n", s["host_streams"].size(),
                static_cast<unsigned long long>(recs), static_cast<unsigned long long>(lost));
  }
  print_kernel(s);
  if (s.contains("error")) std::printf("  error: %s\n", s["error"].get<std::string>().c_str());
}

struct Common {
  std::string socket = default_socket();
  bool json_out = false;
};

// The `stop` exchange, with progress on a terminal.
int do_stop(Client& c, const Common& o, const char* cmd) {
  const bool tty = isatty(2);
  json r = c.request({{"cmd", "stop"}}, [&](const json& p) {
    if (tty)
      std::fprintf(stderr, "\rstopping: %llu records written, %llu to go, %.1f s   ",
                   static_cast<unsigned long long>(u64(p, "written")),
                   static_cast<unsigned long long>(u64(p, "pending")), dbl(p, "elapsed_s"));
  });
  if (tty) std::fprintf(stderr, "\r%60s\r", "");
  if (!r.value("ok", false)) return fail(cmd, r.value("error", "failed"));
  if (o.json_out)
    std::printf("%s\n", r.dump().c_str());
  else
    print_summary(r);
  return r.value("complete", true) ? kExitOk : kExitFail;
}

struct StartOptions {
  std::string output;  // default_trace_name() when empty
  bool force = false;  // replace an existing output file
  std::vector<std::string> devices;
  double duration = 0;
  unsigned sync_interval_ms = 0;
  std::string sync_mode;
  bool no_wait = false;
  std::string kernel_events;         // "sched,syscalls"
  std::vector<uint32_t> pids;        // traced besides the registered applications
  std::vector<std::string> uprobes;  // PATH:SYMBOL
};

int run_start(const Common& o, const StartOptions& s) {
  Client c;
  if (auto e = c.connect(o.socket); !e.empty()) return fail("start", e);
  const std::string output = s.output.empty() ? default_trace_name() : s.output;
  std::error_code ec;
  const auto out = std::filesystem::absolute(output, ec);
  if (ec) return fail("start", "bad output path " + output + ": " + ec.message());
  // The daemon creates the file, and refuses one that exists unless forced.
  json req = {{"cmd", "start"}, {"output", out.lexically_normal().string()}, {"force", s.force}};
  if (!s.devices.empty()) req["devices"] = s.devices;
  if (s.duration > 0) req["duration_s"] = s.duration;
  if (s.sync_interval_ms) req["sync_interval_ms"] = s.sync_interval_ms;
  if (!s.sync_mode.empty()) req["sync_mode"] = s.sync_mode;
  if (!s.kernel_events.empty()) req["kernel_events"] = s.kernel_events;
  if (!s.pids.empty()) req["pids"] = s.pids;
  std::vector<std::string> uprobes;
  for (const auto& u : s.uprobes) {
    // The daemon resolves PATH in its own file system: make it absolute.
    const auto colon = u.rfind(':');
    if (colon == std::string::npos || colon == 0)
      return fail("start", "--uprobe " + u + ": expected PATH:SYMBOL");
    std::error_code uec;
    const auto p = std::filesystem::absolute(u.substr(0, colon), uec);
    uprobes.push_back((uec ? u.substr(0, colon) : p.lexically_normal().string()) + u.substr(colon));
  }
  if (!uprobes.empty()) req["uprobes"] = uprobes;
  json r = c.request(req);
  if (!r.value("ok", false)) return fail("start", r.value("error", "failed"));
  if (s.output.empty())
    std::fprintf(stderr, "perfqctl start: no -o given: the trace is %s\n",
                 r.value("output", "").c_str());
  if (r.contains("warnings") && !o.json_out)
    for (const auto& w : r["warnings"])
      if (w.is_string())
        std::fprintf(stderr, "perfqctl start: warning: %s\n", w.get<std::string>().c_str());
  if (s.duration <= 0 || s.no_wait) {
    if (o.json_out)
      std::printf("%s\n", r.dump().c_str());
    else
      std::printf(
          "recording to %s%s\n", r.value("output", "").c_str(),
          s.duration > 0 ? " (stops by itself after the duration)" : "; `perfqctl stop` ends it");
    return kExitOk;
  }
  // A recording with a duration: wait for it, showing progress on a
  // terminal; Ctrl-C stops it early (the trace is still complete).
  signal(SIGINT, on_sigint);
  const bool tty = isatty(2);
  const std::string recording = r.value("output", "");
  while (!g_interrupted) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    json st = c.request({{"cmd", "status"}});
    if (!st.value("ok", false)) return fail("start", st.value("error", "status failed"));
    const json& rec = st["recording"];
    if (rec.is_null() || rec.value("output", "") != recording) break;
    if (!tty) continue;
    // What the devices lost (their queues overflowed, or the drain fell
    // behind), as status counts it.
    uint64_t lost = 0;
    for (const auto& dev : rec.value("devices", json::array())) lost += u64(dev, "lost");
    std::fprintf(stderr, "\rrecording %s: %.1f / %.1f s, %llu records, %llu lost by devices\033[K",
                 recording.c_str(), dbl(rec, "elapsed_s"), s.duration,
                 static_cast<unsigned long long>(u64(rec, "records")),
                 static_cast<unsigned long long>(lost));
  }
  if (tty) std::fprintf(stderr, "\r\033[K");
  // Collect the summary (this also stops it early after Ctrl-C).
  return do_stop(c, o, "start");
}

int run_stop(const Common& o) {
  Client c;
  if (auto e = c.connect(o.socket); !e.empty()) return fail("stop", e);
  return do_stop(c, o, "stop");
}

int run_status(const Common& o) {
  Client c;
  if (auto e = c.connect(o.socket); !e.empty()) return fail("status", e);
  json r = c.request({{"cmd", "status"}});
  if (!r.value("ok", false)) return fail("status", r.value("error", "failed"));
  if (o.json_out) {
    std::printf("%s\n", r.dump().c_str());
    return kExitOk;
  }
  const json& d = r["daemon"];
  std::printf("perfq-daemon %s, pid %d, up %.0f s, socket %s, %zu application(s) connected\n",
              d.value("version", "?").c_str(), d.value("pid", 0), dbl(d, "uptime_s"),
              d.value("socket", "?").c_str(), d.value("apps", size_t{0}));
  const json& rec = r["recording"];
  if (rec.is_null()) {
    std::printf("not recording\n");
    const json& last = r["last"];
    if (!last.is_null()) {
      std::printf("last recording: %s, %llu records%s\n", last.value("output", "?").c_str(),
                  static_cast<unsigned long long>(u64(last, "records")),
                  last.contains("stop_reason")
                      ? (", stopped: " + last.value("stop_reason", "")).c_str()
                      : "");
      if (last.contains("error"))
        std::printf("  error: %s\n", last["error"].get<std::string>().c_str());
    }
  } else {
    std::printf(
        "recording to %s for %.1f s%s: %llu records written (%s), %llu pending, %llu late\n",
        rec.value("output", "?").c_str(), dbl(rec, "elapsed_s"),
        rec.contains("duration_s")
            ? (" of " + std::to_string(static_cast<int>(dbl(rec, "duration_s")))).c_str()
            : "",
        static_cast<unsigned long long>(u64(rec, "records")),
        human_bytes(static_cast<double>(u64(rec, "bytes"))).c_str(),
        static_cast<unsigned long long>(u64(rec["merge"], "pending")),
        static_cast<unsigned long long>(u64(rec["merge"], "late")));
    if (rec.contains("error"))  // the trace file failed (a full disk): the recording stops
      std::printf("  error: %s\n", rec["error"].get<std::string>().c_str());
    for (const auto& dev : rec["devices"]) {
      std::printf(
          "  device %s \"%s\" %s: %llu records (%.0f/s), %llu lost, %llu invalid, ring %llu/%llu\n",
          dev.value("device", "?").c_str(), dev.value("name", "").c_str(),
          dev.value("state", "?").c_str(), static_cast<unsigned long long>(u64(dev, "records")),
          dbl(dev, "rate_per_s"), static_cast<unsigned long long>(u64(dev, "lost")),
          static_cast<unsigned long long>(u64(dev, "invalid")),
          static_cast<unsigned long long>(u64(dev, "ring_fill")),
          static_cast<unsigned long long>(u64(dev, "ring_capacity")));
      const json& sy = dev["sync"];
      if (sy.value("synchronized", false))
        std::printf(
            "    sync mode %s: %s, +-%.0f ns, %llu rounds "
            "(%llu failed), last %.0f ms ago, every %llu ms\n",
            sy.value("mode", "?").c_str(), sy.value("standing", "?").c_str(),
            dbl(sy, "uncertainty_ns"), static_cast<unsigned long long>(u64(sy, "rounds")),
            static_cast<unsigned long long>(u64(sy, "failed_rounds")), dbl(sy, "last_round_ago_ms"),
            static_cast<unsigned long long>(u64(sy, "interval_ms")));
      else
        std::printf("    sync: not synchronized yet%s\n",
                    sy.contains("last_error")
                        ? (" (" + sy["last_error"].get<std::string>() + ")").c_str()
                        : "");
      if (dev.contains("error"))
        std::printf("    error: %s\n", dev["error"].get<std::string>().c_str());
    }
    for (const auto& h : rec["host_streams"])
      std::printf("  app %s (source %d) thread %d: %llu records (%.0f/s), %llu lost\n",
                  h.value("app", "?").c_str(), h.value("source", 0), h.value("stream", 0),
                  static_cast<unsigned long long>(u64(h, "records")), dbl(h, "rate_per_s"),
                  static_cast<unsigned long long>(u64(h, "lost")));
    print_kernel(rec);
  }
  for (const auto& s : r["app_streams"])
    std::printf(
        "  ring: app %s pid %u thread %s (tid %u): %llu records, %llu lost, fill %llu/%llu%s\n",
        s.value("app", "?").c_str(), s.value("pid", 0u), s.value("thread", "").c_str(),
        s.value("tid", 0u), static_cast<unsigned long long>(u64(s, "records")),
        static_cast<unsigned long long>(u64(s, "lost")),
        static_cast<unsigned long long>(u64(s, "ring_fill")),
        static_cast<unsigned long long>(u64(s, "ring_capacity")),
        s.value("alive", true) ? "" : " (exited)");
  return kExitOk;
}

struct DevicesOptions {
  bool all = false;
  std::string pci_dump;  // read an lspci -xxx dump here instead of asking the daemon
};

std::string dash(const std::optional<int>& v) { return v ? std::to_string(*v) : "-"; }

// The PCI devices as a table, then a note for each link trained below its
// capability.
void print_pci_table(const std::vector<perfq::PciDevice>& devs) {
  std::printf("%-13s %-9s %-12s %4s %5s  %-9s %-9s %7s %9s %5s  %s\n", "ADDRESS", "IDS", "DRIVER",
              "NUMA", "IOMMU", "LINK", "MAX LINK", "GB/s", "MPS", "MRRS", "NAME");
  for (const auto& d : devs) {
    std::string now = "-", max = "-", gbs = "-", mps = "-", mrrs = "-";
    if (!d.config_readable) {
      now = "unknown";
    } else if (!d.pcie) {
      now = "PCI";  // conventional: no PCIe capability
    } else {
      const auto& p = *d.pcie;
      if (!p.link_max && !p.link_current)
        now = "none";
      else if (!p.link_current)
        now = "down";
      if (p.link_current) {
        now = perfq::pci_link_name(*p.link_current);
        gbs = fmt_gbs(p.link_current->ceiling_bytes_per_s());
      }
      if (p.link_max) max = perfq::pci_link_name(*p.link_max);
      if (p.max_payload) mps = std::to_string(*p.max_payload);
      if (p.max_payload_supported) mps += "/" + std::to_string(*p.max_payload_supported);
      if (p.max_read_request) mrrs = std::to_string(*p.max_read_request);
    }
    std::printf("%-13s %-9s %-12s %4s %5s  %-9s %-9s %7s %9s %5s  %s%s\n", d.address.c_str(),
                d.ids_text().c_str(), d.driver.value_or("-").c_str(), dash(d.numa_node).c_str(),
                dash(d.iommu_group).c_str(), now.c_str(), max.c_str(), gbs.c_str(), mps.c_str(),
                mrrs.c_str(), d.display_name().c_str(), d.error.empty() ? "" : " (incomplete)");
  }
  for (const auto& d : devs) {
    if (d.pcie && d.pcie->trained_below_max())
      std::printf("note: %s %s\n", d.address.c_str(), perfq::pci_link_summary(d).c_str());
    if (!d.error.empty()) std::printf("note: %s: %s\n", d.address.c_str(), d.error.c_str());
  }
}

int print_pci(const std::vector<perfq::PciDevice>& devs, bool all) {
  if (devs.empty()) {
    std::printf(all ? "no PCI devices\n"
                    : "no PCI device is bound to perfq (`perfqctl devices --all` lists every PCI "
                      "device)\n");
    return kExitOk;
  }
  std::printf("%s\n", all ? "PCI devices:" : "PCI devices bound to perfq:");
  print_pci_table(devs);
  return kExitOk;
}

// Offline: the devices of an `lspci -xxx` dump, no daemon needed.
int run_devices_dump(const Common& o, const DevicesOptions& opt) {
  perfq::PciScanOptions so;
  so.dump_file = opt.pci_dump;
  auto scan = perfq::scan_pci(so);
  if (!scan) return fail("devices", scan.status().message());
  for (const auto& w : scan->warnings) std::fprintf(stderr, "perfqctl devices: %s\n", w.c_str());
  if (o.json_out) {
    json list = json::array();
    for (const auto& d : scan->devices) list.push_back(perfq::pci_device_to_json(d));
    std::printf("%s\n", json{{"ok", true},
                             {"schema_version", perfq::kJsonSchemaVersion},
                             {"pci_dump", opt.pci_dump},
                             {"pci_devices", list}}
                            .dump()
                            .c_str());
    return kExitOk;
  }
  return print_pci(scan->devices, true);
}

int run_devices(const Common& o, const DevicesOptions& opt) {
  if (!opt.pci_dump.empty()) return run_devices_dump(o, opt);
  Client c;
  if (auto e = c.connect(o.socket); !e.empty()) return fail("devices", e);
  json r = c.request({{"cmd", "devices"}, {"all", opt.all}});
  if (!r.value("ok", false)) return fail("devices", r.value("error", "failed"));
  if (o.json_out) {
    std::printf("%s\n", r.dump().c_str());
    return kExitOk;
  }
  if (r["devices"].empty())
    std::printf("no devices (configure them with perfq-daemon --device, or load perfq.ko)\n");
  for (const auto& d : r["devices"]) {
    if (d.value("state", "") == "unavailable") {
      std::printf("%s  unavailable: %s\n", d.value("device", "?").c_str(),
                  d.value("error", "").c_str());
    } else {
      std::printf("%s  \"%s\" %s, ring %llu records, clock %llu Hz, timer %llu Hz%s%s\n",
                  d.value("device", "?").c_str(), d.value("name", "").c_str(),
                  d.value("state", "?").c_str(),
                  static_cast<unsigned long long>(u64(d, "ring_capacity")),
                  static_cast<unsigned long long>(u64(d, "clock_hz")),
                  static_cast<unsigned long long>(u64(d, "timer_hz")),
                  d.value("configured", false) ? ", configured" : "",
                  d.value("recording", false) ? ", recording" : "");
    }
    if (d.contains("pci")) {
      auto p = perfq::pci_device_from_json(d["pci"]);
      if (p)
        std::printf("    pci %s  %s [%s]  %s\n", p->address.c_str(), p->display_name().c_str(),
                    p->ids_text().c_str(), perfq::pci_link_summary(p.value()).c_str());
    } else if (d.contains("pci_error")) {
      std::printf("    pci: %s\n", d["pci_error"].get<std::string>().c_str());
    }
  }
  std::printf("\n");
  if (r.contains("pci_error")) {
    std::fprintf(stderr, "perfqctl devices: the daemon cannot read the PCI bus: %s\n",
                 r["pci_error"].get<std::string>().c_str());
    return kExitOk;
  }
  if (r.contains("pci_warnings"))
    for (const auto& w : r["pci_warnings"])
      std::fprintf(stderr, "perfqctl devices: %s\n", w.get<std::string>().c_str());
  std::vector<perfq::PciDevice> devs;
  for (const auto& j : r.value("pci_devices", json::array())) {
    auto p = perfq::pci_device_from_json(j);
    if (!p) return fail("devices", "the daemon's reply: " + p.status().message());
    devs.push_back(std::move(p.value()));
  }
  return print_pci(devs, opt.all);
}

void add_socket_option(CLI::App* cmd, Common& o) {
  cmd->add_option("--socket", o.socket,
                  "perfq-daemon's control socket (default: $PERFQ_SOCKET, else " +
                      std::string(kDefaultSocket) + ")");
}

}  // namespace

void add_control_commands(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<Common>();
  add_socket_option(&app, *o);

  auto s = std::make_shared<StartOptions>();
  CLI::App* start = app.add_subcommand(
      "start",
      "Start a recording in perfq-daemon: its devices and every instrumented application, "
      "merged into one trace file. With --duration, waits for it to end (progress on a "
      "terminal, Ctrl-C stops early) and prints the summary; otherwise returns at once.");
  start->add_option("-o,--output", s->output,
                    "Trace file, created by the daemon as you; an existing one is refused "
                    "unless --force (default: perfq-YYYYMMDD-HHMMSS.trace here)");
  start->add_flag("--force", s->force, "Overwrite the -o file if it exists");
  start
      ->add_option("--device", s->devices,
                   "Device to record (repeatable): " + std::string(kDeviceForms) +
                       "; default: the daemon's configured devices")
      ->allow_extra_args(false);
  start->add_option("--duration", s->duration, "Stop after S seconds")->check(duration_check());
  start
      ->add_option("--sync-interval-ms", s->sync_interval_ms,
                   "Time between clock sync rounds (default: the daemon's)")
      ->check(CLI::Range(1u, 60000u));
  start
      ->add_option("--sync-mode", s->sync_mode,
                   "a: the host converts device times; b: the device does (default: the daemon's)")
      ->check(CLI::IsMember({"a", "b"}));
  start->add_option("--kernel-events", s->kernel_events,
                    "Also record host kernel events with BPF, for the registered applications "
                    "and --pid processes: sched (switches, wakeups), syscalls, or both "
                    "(sched,syscalls). Needs a daemon with CAP_BPF+CAP_PERFMON (root); without, "
                    "the recording goes on without them and says so");
  start
      ->add_option("--pid", s->pids,
                   "With --kernel-events or --uprobe: also trace this process (repeatable)")
      ->allow_extra_args(false);
  start
      ->add_option("--uprobe", s->uprobes,
                   "Record entry and return of a function in any binary, PATH:SYMBOL "
                   "(repeatable; every process running it, or only the --pid ones)")
      ->allow_extra_args(false);
  start->add_flag("--no-wait", s->no_wait, "With --duration: return at once");
  start->add_flag("--json", o->json_out, "Print the daemon's reply as JSON");
  add_socket_option(start, *o);
  start->callback([o, s, &exit_code] { exit_code = run_start(*o, *s); });

  CLI::App* stop = app.add_subcommand(
      "stop",
      "Stop the recording; returns when the trace file is complete, then prints its summary");
  stop->add_flag("--json", o->json_out, "Print the summary as JSON");
  add_socket_option(stop, *o);
  stop->callback([o, &exit_code] { exit_code = run_stop(*o); });

  CLI::App* status = app.add_subcommand(
      "status",
      "Show the daemon, the recording (per stream: records, bytes, losses, ring fill, "
      "rates; per device: clock offset, drift, uncertainty, last round) and the "
      "connected applications");
  status->add_flag("--json", o->json_out, "Print JSON");
  add_socket_option(status, *o);
  status->callback([o, &exit_code] { exit_code = run_status(*o); });

  auto dv = std::make_shared<DevicesOptions>();
  CLI::App* devices = app.add_subcommand(
      "devices",
      "List the daemon's configured devices and the /dev/perfqN present, with state, and the "
      "PCI devices bound to perfq: address, IDs and names (pci.ids), driver, NUMA node, IOMMU "
      "group, current and maximum PCIe link with its bandwidth ceiling, max payload and read "
      "request sizes");
  devices->add_flag("--all", dv->all, "List every PCI device, not only those bound to perfq");
  devices->add_option("--pci-dump", dv->pci_dump,
                      "Read the PCI devices from this `lspci -xxx` output instead of asking "
                      "the daemon (no daemon needed)");
  devices->add_flag("--json", o->json_out, "Print JSON");
  add_socket_option(devices, *o);
  devices->callback([o, dv, &exit_code] { exit_code = run_devices(*o, *dv); });
}

}  // namespace perfqctl
