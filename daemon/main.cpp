// perfq-daemon: drains the devices and the instrumented applications,
// synchronizes the clocks, and writes merged traces, driven by perfqctl over
// a Unix socket.  Runs in the foreground (systemd Type=notify).
//
//   SIGTERM, SIGINT  stop the recording cleanly (the trace is closed), exit
//   SIGHUP           reload the config file
#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/sinks/systemd_sink.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>

#include "config.h"
#include "control.h"
#include "daemon.h"
#include "metrics.h"

namespace {

using namespace perfqd;

// Parse argv (and the config file it names) into c; "" or the error.
std::string parse(int argc, char** argv, DaemonConfig& c, bool* exit_now, int* exit_code) {
  CLI::App app{
      "perfq-daemon: records PCIe devices and instrumented applications into merged, "
      "clock-synchronized traces; driven by `perfqctl start/stop/status/devices`"};
  add_config_options(app, c);
  app.set_version_flag("--version", "perfq-daemon " PERFQ_VERSION_STRING,
                       "Print perfq-daemon's version and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForVersion& e) {
    *exit_now = true;
    *exit_code = app.exit(e);
    return "";
  } catch (const CLI::CallForHelp& e) {
    *exit_now = true;
    *exit_code = app.exit(e);
    return "";
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  // The file actually read (set_config keeps only its default in c).
  if (const CLI::Option* conf = app.get_config_ptr(); conf && conf->count() > 0)
    c.config_file = conf->as<std::string>();
  return validate_config(c);
}

void setup_logging(const DaemonConfig& c) {
  const bool journal =
      c.log_target == "journal" || (c.log_target == "auto" && std::getenv("JOURNAL_STREAM"));
  std::shared_ptr<spdlog::logger> logger;
  if (journal)
    logger = std::make_shared<spdlog::logger>(
        "perfqd", std::make_shared<spdlog::sinks::systemd_sink_mt>("perfq-daemon"));
  else
    logger = std::make_shared<spdlog::logger>(
        "perfqd", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  if (journal)
    logger->set_pattern("%v");
  else
    logger->set_pattern("%Y-%m-%d %H:%M:%S.%e perfq-daemon %l: %v");
  logger->set_level(spdlog::level::from_str(c.log_level));
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(logger);
}

}  // namespace

int main(int argc, char** argv) {
  // glibc gives threads their own malloc arenas (up to 8 per core), and an
  // arena keeps what its threads freed: the daemon's short-lived threads (a
  // control connection each, a recording's drain and writer) took its peak
  // RSS from 26 to 58 MiB over ten 60-s recordings of `make soak` at 200 000
  // records/s; with MALLOC_ARENA_MAX=1, 28 MiB in every recording (two
  // arenas still grew: 25 to 35 MiB in four).  One arena, unless the
  // environment says otherwise; the threads' own caches (tcache) still serve
  // small blocks without the arena's lock.
  if (std::getenv("MALLOC_ARENA_MAX") == nullptr) mallopt(M_ARENA_MAX, 1);
  // A buffer of 256 KiB or more (a merge run is 768 KiB, a drain's batch
  // 512 KiB) is a mapping of its own, unmapped when freed.  glibc's default
  // raises that threshold to the largest such buffer freed (up to 32 MiB),
  // after which they come from the heap, whose free middle stays in the RSS
  // until malloc_trim: a backlog's peak stayed to the recording's end.
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") == nullptr) mallopt(M_MMAP_THRESHOLD, 256 * 1024);
  DaemonConfig config;
  bool exit_now = false;
  int exit_code = 0;
  if (std::string err = parse(argc, argv, config, &exit_now, &exit_code); !err.empty()) {
    std::fprintf(stderr, "perfq-daemon: %s (see perfq-daemon --help)\n", err.c_str());
    return 2;
  }
  if (exit_now) return exit_code;
  try {
    setup_logging(config);
  } catch (const spdlog::spdlog_ex& e) {
    std::fprintf(stderr, "perfq-daemon: logging setup failed: %s\n", e.what());
    return 1;
  }

  // Signals are taken synchronously by the main loop; every thread started
  // from here on inherits the mask.
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &mask, nullptr);
  signal(SIGPIPE, SIG_IGN);
  const int sfd = signalfd(-1, &mask, SFD_CLOEXEC);
  if (sfd < 0) {
    spdlog::critical("signalfd: {}", std::strerror(errno));
    return 1;
  }

  auto daemon = std::make_unique<Daemon>(config);
  auto server = ControlServer::listen(config.socket, *daemon);
  if (!server) {
    spdlog::critical("{}", server.status().message());
    return 1;
  }
  std::unique_ptr<MetricsServer> metrics;
  if (!config.metrics.empty()) {
    auto m = MetricsServer::listen(config.metrics, *daemon);
    if (!m) {
      spdlog::critical("{}", m.status().message());
      return 1;
    }
    metrics = std::move(m.value());
    spdlog::info("Prometheus metrics at http://{}/metrics (port {})", config.metrics,
                 metrics->port());
  }
  spdlog::info("perfq-daemon {} listening on {} ({} configured device(s))", PERFQ_VERSION_STRING,
               config.socket, config.devices.size());
  sd_notifyf(0, "READY=1\nSTATUS=listening on %s\nMAINPID=%d", config.socket.c_str(), getpid());

  bool running = true;
  while (running) {
    pollfd fds[2] = {{server.value()->fd(), POLLIN, 0}, {sfd, POLLIN, 0}};
    const int n = ::poll(fds, 2, 200);
    if (n < 0 && errno != EINTR) {
      spdlog::critical("poll: {}", std::strerror(errno));
      break;
    }
    if (n > 0 && (fds[0].revents & POLLIN)) server.value()->accept_one();
    if (n > 0 && (fds[1].revents & POLLIN)) {
      signalfd_siginfo si{};
      if (::read(sfd, &si, sizeof(si)) == sizeof(si)) {
        if (si.ssi_signo == SIGHUP) {
          DaemonConfig fresh;
          bool dummy_exit = false;
          int dummy_code = 0;
          if (std::string err = parse(argc, argv, fresh, &dummy_exit, &dummy_code); !err.empty()) {
            spdlog::error("reload refused, keeping the old settings: {}", err);
          } else {
            sd_notify(0, "RELOADING=1");
            daemon->reload(fresh);
            spdlog::get("perfqd")->set_level(spdlog::level::from_str(fresh.log_level));
            sd_notify(0, "READY=1");
          }
        } else {
          spdlog::info("{}: stopping", strsignal(static_cast<int>(si.ssi_signo)));
          running = false;
        }
      }
    }
    daemon->tick();
  }
  sd_notify(0, "STOPPING=1\nSTATUS=stopping: closing the trace");
  daemon->shutdown();
  metrics.reset();  // before the daemon it reads
  server.value()->close();
  daemon.reset();
  spdlog::info("perfq-daemon exits");
  return 0;
}
