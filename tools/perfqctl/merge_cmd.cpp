// perfqctl merge A.trace B.trace ... -o OUT [--force]: several hosts' traces
// on one timeline (the first one's), for report and every export.
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "commands.h"
#include "perfq/trace.h"

namespace perfqctl {

void add_merge_command(CLI::App& app, int& exit_code) {
  struct Args {
    std::vector<std::string> files;
    std::string out;
    bool force = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand(
      "merge",
      "put traces of several hosts on one timeline (the first trace's host's), each host's "
      "alignment and its bound in the metadata");
  sub->add_option("FILES", args->files, "two trace files or more; the first is the reference")
      ->required()
      ->expected(2, -1);
  sub->add_option("-o,--output", args->out, "the merged trace")->required();
  sub->add_flag("--force", args->force, "replace an existing output file");
  sub->footer(
      "Each trace carries snapshots of its host's CLOCK_MONOTONIC against CLOCK_REALTIME (at the\n"
      "start, every 5 s and at the stop) with the kernel's own estimate of realtime's error\n"
      "(adjtimex). merge maps every host's times to the first host's CLOCK_MONOTONIC through\n"
      "both hosts' realtime, and states for each host the offset and its bound: the snapshot\n"
      "brackets, plus both kernels' estimated realtime error (none when both traces come from\n"
      "one kernel), or no bound when a host's realtime was not synchronized (no NTP or PTP).\n"
      "See docs/multi-host.md for starting and stopping recordings on many hosts together.");
  sub->callback([args, &exit_code] {
    perfq::TraceMergeOptions o;
    o.replace = args->force;
    auto r = perfq::merge_traces(args->files, args->out, o);
    if (!r.is_ok()) {
      std::fprintf(stderr, "perfqctl: merge: %s\n", r.status().message().c_str());
      exit_code = r.status().code() == perfq::Errc::kExists ? kExitUsage : kExitFail;
      if (r.status().code() == perfq::Errc::kExists)
        std::fprintf(stderr, "perfqctl: merge: --force replaces it\n");
      return;
    }
    std::printf("merged %zu traces into %s: %llu records\n", args->files.size(), args->out.c_str(),
                static_cast<unsigned long long>(r->records));
    for (const auto& h : r->hosts) {
      const std::string bound =
          h.uncertainty_ns < 0
              ? std::string("no bound")
              : fmt::format("+-{:.3f} us", static_cast<double>(h.uncertainty_ns) / 1e3);
      std::printf("  host %s (%s): offset %+.3f us, %s: %s\n", h.name.c_str(), h.file.c_str(),
                  static_cast<double>(h.offset_ns) / 1e3, bound.c_str(), h.alignment.c_str());
    }
    for (const auto& w : r->warnings)
      std::fprintf(stderr, "perfqctl: merge: warning: %s\n", w.c_str());
    exit_code = kExitOk;
  });
}

}  // namespace perfqctl
