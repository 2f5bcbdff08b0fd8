// Subcommands of perfqctl.  Each add_*_command() registers its subcommand on
// `app`; its callback stores the exit code in `exit_code`:
// 0 ok, 1 failure (message on stderr), 2 usage error.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "perfq/filter.h"

namespace perfqctl {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFail = 1;
inline constexpr int kExitUsage = 2;

// The device specs start and record accept, as their --help says them (the
// transport's own errors name the same two forms: host/transport.cpp).
inline constexpr const char* kDeviceForms =
    "shm:PATH (a software device's region file) or /dev/perfqN (a PCIe device bound to perfq.ko)";

// --from, --to, --source, --stream, --event (report and export).
struct FilterArgs {
  std::string from, to;
  std::vector<std::string> sources;
  std::vector<uint16_t> streams;
  std::vector<std::string> events;
};
void add_filter_options(CLI::App& sub, FilterArgs& f);
// The filter, or false with the reason on stderr ("perfqctl: CMD: ...").
bool filter_of(const FilterArgs& f, const char* cmd, perfq::TraceFilter& out);

// The trace file when -o is not given (start, record): perfq-YYYYMMDD-HHMMSS.trace,
// the local time now, in the current directory (as LTTng names its sessions).
std::string default_trace_name();
// --duration: seconds from 0 to the daemon's limit, said in those words.
CLI::Validator duration_check();
// When argv's command is none of app's: "unknown command 'X'; did you mean
// 'Y'? (commands: ...)"; else "".
std::string unknown_command(CLI::App& app, int argc, char** argv);
// app's commands: "start, stop, ...".
std::string command_names(CLI::App& app);

void add_report_command(CLI::App& app, int& exit_code);
void add_export_command(CLI::App& app, int& exit_code);
void add_record_command(CLI::App& app, int& exit_code);
void add_merge_command(CLI::App& app, int& exit_code);
// start, stop, status, devices (perfq-daemon's control socket)
void add_control_commands(CLI::App& app, int& exit_code);

}  // namespace perfqctl
