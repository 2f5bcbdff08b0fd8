#include "config.h"

namespace perfqd {

void add_config_options(CLI::App& app, DaemonConfig& c) {
  app.set_config("--config", c.config_file,
                 "Config file: 'key = value' lines, keys are the long option names "
                 "(a missing default file is fine)")
      ->capture_default_str();
  app.add_option("--socket", c.socket, "Control socket path")->capture_default_str();
  app.add_option("--device", c.devices,
                 "A device to record when `perfqctl start` names none (repeatable): "
                 "shm:PATH or /dev/perfqN")
      ->allow_extra_args(false);
  app.add_option("--group", c.group,
                 "Group whose members may start and stop recordings (root and the daemon's "
                 "own user always may; anyone who can connect may read status)")
      ->capture_default_str();
  app.add_option("--log-level", c.log_level, "trace, debug, info, warn, error, critical, off")
      ->capture_default_str()
      ->envname("PERFQ_LOG_LEVEL")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}));
  app.add_option("--log-target", c.log_target,
                 "Where logs go: auto (journald when started by systemd, else stderr), "
                 "stderr or journal")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "stderr", "journal"}));
  app.add_option("--sync-interval-ms", c.sync_interval_ms, "Default time between sync rounds")
      ->capture_default_str()
      ->check(CLI::Range(1u, 60000u));
  app.add_option("--sync-mode", c.sync_mode,
                 "a: the host converts device times; b: the device converts them")
      ->capture_default_str()
      ->check(CLI::IsMember({"a", "b"}));
  app.add_option("--ring-records", c.ring_records,
                 "Records per host application thread ring (a power of two)")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{64}, uint64_t{1} << 24));
  app.add_option("--max-delay-ms", c.max_delay_ms,
                 "The merge never holds a record longer than this (bounds memory)")
      ->capture_default_str()
      ->check(CLI::Range(10u, 600000u));
  app.add_option("--stream-timeout-ms", c.stream_timeout_ms,
                 "A stream silent this long stops holding back the merge")
      ->capture_default_str()
      ->check(CLI::Range(1u, 600000u));
  app.add_option("--device-latency-ms", c.device_latency_ms,
                 "How long after their time device records may still arrive")
      ->capture_default_str()
      ->check(CLI::Range(0u, 600000u));
  app.add_option("--device-timeout-ms", c.device_timeout_ms,
                 "A device whose collector's heartbeat stands still this long with nothing "
                 "queued has stopped: the recording goes on without it and the trace says "
                 "when (0: never)")
      ->capture_default_str()
      ->check(CLI::Range(0u, 600000u));
  app.add_option("--host-latency-ms", c.host_latency_ms,
                 "How long after their time application records may still arrive (a thread "
                 "preempted between taking its timestamp and publishing its record)")
      ->capture_default_str()
      ->check(CLI::Range(0u, 600000u));
  app.add_option("--compress", c.compress, "zstd-compress record chunks (true/false)")
      ->capture_default_str();
  app.add_option("--zstd-level", c.zstd_level, "zstd level for record chunks")
      ->capture_default_str()
      ->check(CLI::Range(1, 19));
  app.add_option("--metrics", c.metrics,
                 "Serve Prometheus metrics at http://ADDR:PORT/metrics (e.g. 127.0.0.1:9464; "
                 "off when empty). Anyone who can reach it may read them; nothing can be "
                 "changed through it");
}

std::string validate_config(const DaemonConfig& c) {
  if (c.ring_records & (c.ring_records - 1))
    return "--ring-records " + std::to_string(c.ring_records) + " is not a power of two";
  if (c.socket.empty()) return "--socket is empty";
  if (c.socket.size() >= 108)
    return "--socket " + c.socket + " is longer than a Unix socket path may be (107 bytes)";
  if (!c.metrics.empty()) {
    const auto colon = c.metrics.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == c.metrics.size() ||
        c.metrics.find_first_not_of("0123456789", colon + 1) != std::string::npos)
      return "--metrics " + c.metrics + " is not ADDR:PORT (e.g. 127.0.0.1:9464)";
  }
  return "";
}

}  // namespace perfqd
