// perfqctl report FILE [OTHER] [--json] [--resync] [--html OUT.html] [--from T] [--to T]
//   [--source S] [--stream N] [--event E]
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "commands.h"
#include "perfq/report.h"
#include "progress.h"

namespace perfqctl {

namespace {

// Each fault of the trace on stderr, one line each: what the report skipped
// (structure problems) and where it stopped (a torn or corrupt chunk); the
// report covers everything else.  True when there was any.
bool say_damage(const perfq::TraceReport& r) {
  for (const auto& p : r.problems)
    std::fprintf(stderr, "perfqctl: report: trace damaged: %s\n", p.message.c_str());
  if (!r.stopped_early.empty())
    std::fprintf(stderr, "perfqctl: report: trace damaged: %s\n", r.stopped_early.c_str());
  return !r.problems.empty() || !r.stopped_early.empty();
}

// Chart.js, inlined into the page: PERFQ_CHARTJS from the environment, else
// Debian's libjs-chart.js.
bool read_chartjs(std::string& out) {
  const char* env = std::getenv("PERFQ_CHARTJS");
  const std::string path = env && *env ? env : PERFQ_CHARTJS;
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  if (!in || ss.str().empty()) {
    std::fprintf(stderr,
                 "perfqctl: report: --html needs Chart.js: cannot read %s (install the Debian "
                 "package libjs-chart.js, or set PERFQ_CHARTJS to its chart.min.js)\n",
                 path.c_str());
    return false;
  }
  out = ss.str();
  return true;
}

bool write_file(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) {
    std::perror(("perfqctl: report: " + path).c_str());
    return false;
  }
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const bool closed = std::fclose(f) == 0;
  if (!ok || !closed) {
    std::perror(("perfqctl: report: " + path + ": write").c_str());
    return false;
  }
  return true;
}

// `report A B`: the second run analysed as the first, the two side by side.
void compare(const perfq::TraceReport& a, const std::string& other,
             const perfq::TraceReportOptions& opt, bool json, int& exit_code) {
  std::optional<TerminalProgress> bar(std::in_place);
  perfq::TraceReportOptions o = opt;
  o.progress = bar->callback();
  auto b = perfq::analyze_trace(other, o);
  bar.reset();
  if (!b.is_ok()) {
    std::fprintf(stderr, "perfqctl: report: %s\n", b.status().message().c_str());
    exit_code = kExitFail;
    return;
  }
  const std::string out =
      json ? perfq::report_compare_json(a, b.value()) : perfq::report_compare_text(a, b.value());
  std::fwrite(out.data(), 1, out.size(), stdout);
  if (std::fflush(stdout) != 0) {
    std::perror("perfqctl: report: stdout");
    exit_code = kExitFail;
    return;
  }
  const bool damaged_a = say_damage(a), damaged_b = say_damage(b.value());
  exit_code = damaged_a || damaged_b ? kExitFail : kExitOk;
}

}  // namespace

void add_filter_options(CLI::App& sub, FilterArgs& f) {
  sub.add_option("--from", f.from,
                 "only from this time: seconds from the start (1.5) or absolute host ns (NNNns)");
  sub.add_option("--to", f.to, "only up to this time (as --from)");
  sub.add_option("--source", f.sources, "only this source (id or name; repeatable)");
  sub.add_option("--stream", f.streams, "only this stream number (repeatable)");
  sub.add_option("--event", f.events, "only this event (name; repeatable)");
}

bool filter_of(const FilterArgs& f, const char* cmd, perfq::TraceFilter& out) {
  for (auto [text, slot] : {std::pair{&f.from, &out.from}, std::pair{&f.to, &out.to}}) {
    if (text->empty()) continue;
    auto t = perfq::parse_trace_time(*text);
    if (!t.is_ok()) {
      std::fprintf(stderr, "perfqctl: %s: %s\n", cmd, t.status().message().c_str());
      return false;
    }
    *slot = t.value();
  }
  out.sources = f.sources;
  out.streams = f.streams;
  out.events = f.events;
  return true;
}

void add_report_command(CLI::App& app, int& exit_code) {
  struct Args {
    std::string file;
    std::string other;  // a second trace: compare
    bool json = false;
    bool resync = false;
    std::string html;
    FilterArgs filter;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("report", "analyse a trace: records, losses, sync, latencies");
  sub->add_option("FILE", args->file, "trace file")->required();
  sub->add_option("OTHER", args->other,
                  "a second trace: compare the two runs, each figure side by side with its change");
  sub->add_flag("--json", args->json, "print the report as JSON");
  sub->add_flag("--resync", args->resync,
                "recompute device times with one offline model fitted over all sync samples");
  sub->add_option("--html", args->html,
                  "write the report as one self-contained HTML page with charts to this file");
  add_filter_options(*sub, args->filter);
  sub->callback([args, &exit_code] {
    perfq::TraceReportOptions opt;
    if (!filter_of(args->filter, "report", opt.filter)) {
      exit_code = kExitUsage;
      return;
    }
    std::string chartjs;
    if (!args->html.empty() && !read_chartjs(chartjs)) {
      exit_code = kExitFail;
      return;
    }
    opt.resync = args->resync;
    if (!args->other.empty() && !args->html.empty()) {
      std::fprintf(stderr, "perfqctl: report: --html takes one trace, not two\n");
      exit_code = kExitUsage;
      return;
    }
    std::optional<TerminalProgress> bar(std::in_place);
    opt.progress = bar->callback();
    auto r = perfq::analyze_trace(args->file, opt);
    bar.reset();  // the bar off the terminal before anything is printed
    if (!r.is_ok()) {
      std::fprintf(stderr, "perfqctl: report: %s\n", r.status().message().c_str());
      exit_code = kExitFail;
      return;
    }
    if (!args->other.empty()) {
      compare(r.value(), args->other, opt, args->json, exit_code);
      return;
    }
    if (!args->html.empty() && !write_file(args->html, perfq::report_to_html(r.value(), chartjs))) {
      exit_code = kExitFail;
      return;
    }
    // With --html alone the page is the output; --json or the text report
    // still go to stdout when asked for (--json) or when no page was.
    if (args->json || args->html.empty()) {
      std::string out =
          args->json ? perfq::report_to_json(r.value()) : perfq::report_to_text(r.value());
      std::fwrite(out.data(), 1, out.size(), stdout);
      if (std::fflush(stdout) != 0) {
        std::perror("perfqctl: report: stdout");
        exit_code = kExitFail;
        return;
      }
    }
    exit_code = say_damage(r.value()) ? kExitFail : kExitOk;
  });
}

}  // namespace perfqctl
