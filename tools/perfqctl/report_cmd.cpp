// perfqctl report FILE [--json] [--resync]
#include <cstdio>
#include <string>

#include "commands.h"
#include "perfq/report.h"

namespace perfqctl {

void add_report_command(CLI::App& app, int& exit_code) {
  struct Args {
    std::string file;
    bool json = false;
    bool resync = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("report", "analyse a trace: records, losses, sync, latencies");
  sub->add_option("FILE", args->file, "trace file")->required();
  sub->add_flag("--json", args->json, "print the report as JSON");
  sub->add_flag("--resync", args->resync,
                "recompute device times with one offline model fitted over all sync samples");
  sub->callback([args, &exit_code] {
    perfq::TraceReportOptions opt;
    opt.resync = args->resync;
    auto r = perfq::analyze_trace(args->file, opt);
    if (!r.is_ok()) {
      std::fprintf(stderr, "perfqctl: report: %s\n", r.status().message().c_str());
      exit_code = kExitFail;
      return;
    }
    std::string out =
        args->json ? perfq::report_to_json(r.value()) : perfq::report_to_text(r.value());
    std::fwrite(out.data(), 1, out.size(), stdout);
    if (std::fflush(stdout) != 0) {
      std::perror("perfqctl: report: stdout");
      exit_code = kExitFail;
      return;
    }
    if (!r->stopped_early.empty()) {
      // The report covers everything before the damage; say where it is.
      std::fprintf(stderr, "perfqctl: report: trace damaged: %s\n", r->stopped_early.c_str());
      exit_code = kExitFail;
      return;
    }
    exit_code = kExitOk;
  });
}

}  // namespace perfqctl
