// Subcommands of perfqctl.  Each add_*_command() registers its subcommand on
// `app`; its callback stores the exit code in `exit_code`:
// 0 ok, 1 failure (message on stderr), 2 usage error.
#pragma once

#include <CLI/CLI.hpp>

namespace perfqctl {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFail = 1;
inline constexpr int kExitUsage = 2;

void add_report_command(CLI::App& app, int& exit_code);
void add_export_command(CLI::App& app, int& exit_code);
void add_record_command(CLI::App& app, int& exit_code);
// start, stop, status, devices (perfq-daemon's control socket)
void add_control_commands(CLI::App& app, int& exit_code);

}  // namespace perfqctl
