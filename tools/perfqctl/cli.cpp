// What several subcommands share on the command line: the default trace
// file name, the check of a duration, and the unknown command's nearest
// match.
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "commands.h"
#include "recording.h"

namespace perfqctl {

std::string default_trace_name() {
  const time_t now = ::time(nullptr);
  tm local{};
  ::localtime_r(&now, &local);
  char name[64];
  std::strftime(name, sizeof(name), "perfq-%Y%m%d-%H%M%S.trace", &local);
  return name;
}

CLI::Validator duration_check() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        char* end = nullptr;
        const double s = std::strtod(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size() ||
            !(s >= 0 && s <= perfqd::kMaxDurationS))
          return "'" + text + "' is not a duration: give seconds from 0 to " +
                 std::to_string(static_cast<long>(perfqd::kMaxDurationS)) + " (0: no limit)";
        return "";
      },
      "SECONDS");
}

namespace {

// Optimal string alignment distance: insertions, deletions, substitutions
// and swaps of two neighbours ("reprot" is one from "report").
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

}  // namespace

std::string unknown_command(CLI::App& app, int argc, char** argv) {
  // The first word that is neither an option nor the value of --socket.
  std::string word;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--socket") {
      ++i;
      continue;
    }
    if (a.empty() || a[0] == '-') continue;
    word = a;
    break;
  }
  if (word.empty()) return "";
  std::string best;
  size_t best_distance = 0;
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    const std::string& name = sub->get_name();
    if (name == word) return "";
    const size_t dist = edit_distance(word, name);
    if (best.empty() || dist < best_distance) {
      best = name;
      best_distance = dist;
    }
  }
  std::string msg = "unknown command '" + word + "'";
  // Close enough to be a slip: at most two edits, and fewer than half the word.
  if (!best.empty() && best_distance <= 2 && 2 * best_distance < word.size())
    msg += "; did you mean '" + best + "'?";
  return msg + " (commands: " + command_names(app) + ")";
}

std::string command_names(CLI::App& app) {
  std::string names;
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    names += (names.empty() ? "" : ", ") + sub->get_name();
  return names;
}

}  // namespace perfqctl
