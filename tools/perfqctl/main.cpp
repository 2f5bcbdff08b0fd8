// perfqctl: control and analysis of perfq traces.  Thin: parse, call
// libperfq, map errors to exit codes (0 ok, 1 failure, 2 usage error).
// Data goes to stdout, diagnostics to stderr, one line each.
#include <cstdio>

#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{
      "perfqctl: drive perfq-daemon (start, stop, status, devices) and analyse traces (report, "
      "export)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "perfqctl " PERFQ_VERSION_STRING,
                       "Print perfqctl's version and exit");
  int exit_code = perfqctl::kExitOk;
  perfqctl::add_control_commands(app, exit_code);
  perfqctl::add_record_command(app, exit_code);
  perfqctl::add_report_command(app, exit_code);
  perfqctl::add_export_command(app, exit_code);
  perfqctl::add_merge_command(app, exit_code);
  // Before CLI11, which would only say that a command is required.
  if (const std::string e = perfqctl::unknown_command(app, argc, argv); !e.empty()) {
    std::fprintf(stderr, "perfqctl: %s\n", e.c_str());
    return perfqctl::kExitUsage;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::RequiredError& e) {
    if (app.get_subcommands().empty())  // no command at all
      std::fprintf(stderr, "perfqctl: a command is required (commands: %s; see perfqctl --help)\n",
                   perfqctl::command_names(app).c_str());
    else
      std::fprintf(stderr, "perfqctl: %s (see perfqctl --help)\n", e.what());
    return perfqctl::kExitUsage;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "perfqctl: %s (see perfqctl --help)\n", e.what());
    return perfqctl::kExitUsage;
  }
  return exit_code;
}
