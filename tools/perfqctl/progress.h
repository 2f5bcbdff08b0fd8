// A progress bar for report and export on the terminal (stderr): records
// done, their rate and the time left, redrawn at most ten times a second
// once the work has run for a second; nothing at all when stderr is not a
// terminal.  One thread.
#pragma once

#include <chrono>
#include <cstdio>

#include "perfq/progress.h"

namespace perfqctl {

class TerminalProgress {
 public:
  TerminalProgress();
  ~TerminalProgress();  // clears the bar
  TerminalProgress(const TerminalProgress&) = delete;
  TerminalProgress& operator=(const TerminalProgress&) = delete;
  // The callback for libperfq (empty when stderr is not a terminal).
  perfq::TraceProgress callback();

 private:
  void show(const perfq::TraceProgressInfo& p);
  bool tty_ = false;
  bool drawn_ = false;
  double after_s_ = 1.0;
  std::chrono::steady_clock::time_point start_, last_;
};

}  // namespace perfqctl
