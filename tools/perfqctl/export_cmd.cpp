// perfqctl export FILE --format perfetto|chrome-json|ctf|csv -o OUT [--compress] [--from T]
//   [--to T] [--source S] [--stream N] [--event E]
#include <cstdio>
#include <optional>
#include <string>

#include "commands.h"
#include "perfq/export.h"
#include "progress.h"

namespace perfqctl {

void add_export_command(CLI::App& app, int& exit_code) {
  struct Args {
    std::string file;
    std::string format;
    std::string out;
    FilterArgs filter;
    bool compress = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("export", "convert a trace for other viewers");
  sub->add_option("FILE", args->file, "trace file")->required();
  sub->add_option("--format,-f", args->format, "perfetto, chrome-json, ctf or csv")
      ->required()
      ->check(CLI::IsMember({"perfetto", "chrome-json", "ctf", "csv"}));
  sub->add_option("-o,--output", args->out,
                  "output file, - for standard output (for ctf a directory, or - for a tar of it)")
      ->required();
  sub->add_flag("--compress", args->compress,
                "perfetto: zlib-compressed packets (Perfetto's own DEFLATE compression), about a "
                "quarter of the size; the Perfetto UI and trace_processor read it, protoc "
                "--decode shows only the compressed batches");
  add_filter_options(*sub, args->filter);
  sub->callback([args, &exit_code] {
    perfq::TraceFilter filter;
    if (!filter_of(args->filter, "export", filter)) {
      exit_code = kExitUsage;
      return;
    }
    auto fmt = perfq::parse_export_format(args->format);
    if (!fmt.is_ok()) {
      std::fprintf(stderr, "perfqctl: export: %s\n", fmt.status().message().c_str());
      exit_code = kExitUsage;
      return;
    }
    if (args->compress && fmt.value() != perfq::TraceExportFormat::kPerfetto) {
      std::fprintf(stderr, "perfqctl: export: --compress is for -f perfetto, not %s\n",
                   args->format.c_str());
      exit_code = kExitUsage;
      return;
    }
    perfq::TraceExportOptions options;
    options.compress = args->compress;
    std::optional<TerminalProgress> bar(std::in_place);
    auto r =
        perfq::export_trace(args->file, fmt.value(), args->out, options, filter, bar->callback());
    bar.reset();
    if (!r.is_ok()) {
      std::fprintf(stderr, "perfqctl: export: %s\n", r.status().message().c_str());
      exit_code = kExitFail;
      return;
    }
    exit_code = kExitOk;
    for (const auto& p : r->problems) {
      std::fprintf(stderr, "perfqctl: export: trace damaged: %s\n", p.message.c_str());
      exit_code = kExitFail;
    }
    if (!r->stopped_early.empty()) {
      std::fprintf(stderr,
                   "perfqctl: export: trace damaged, exported the %llu records before it: %s\n",
                   static_cast<unsigned long long>(r->records), r->stopped_early.c_str());
      exit_code = kExitFail;
    }
  });
}

}  // namespace perfqctl
