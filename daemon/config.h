// perfq-daemon's settings: every option is a command-line flag and a key of
// the config file (/etc/perfq/perfq-daemon.conf, "key = value" lines; see
// daemon/perfq-daemon.conf).  A flag given on the command line wins over the
// file.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace perfqd {

inline constexpr const char* kDefaultSocket = "/run/perfq/perfqd.sock";
inline constexpr const char* kDefaultConfig = "/etc/perfq/perfq-daemon.conf";

struct DaemonConfig {
  std::string config_file = kDefaultConfig;
  std::string socket = kDefaultSocket;
  std::vector<std::string> devices;  // recorded when `start` names none
  std::string group = "perfq";       // members may start and stop recordings
  std::string log_level = "info";
  std::string log_target = "auto";  // auto | stderr | journal
  unsigned sync_interval_ms = 100;
  std::string sync_mode = "a";
  uint64_t ring_records = 1 << 16;   // per host application thread
  unsigned max_delay_ms = 2000;      // the merge never holds records longer
  unsigned stream_timeout_ms = 500;  // a silent stream stops holding the merge
  unsigned device_latency_ms = 250;  // device records may trail their time by this
  unsigned host_latency_ms = 100;    // host records may trail their time by this
  // A device whose collector's heartbeat stands still this long (and whose
  // queue is empty) has stopped answering: its drain ends.  0: never.
  unsigned device_timeout_ms = 2000;
  bool compress = true;
  int zstd_level = 1;
  std::string metrics;  // ADDR:PORT of the Prometheus endpoint; "" = none
};

// Registers every option on `app` (used again on SIGHUP to reload).
void add_config_options(CLI::App& app, DaemonConfig& c);

// Checks the values that CLI11 cannot ("" on success).
std::string validate_config(const DaemonConfig& c);

}  // namespace perfqd
