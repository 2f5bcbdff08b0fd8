#include "progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include <fmt/format.h>

namespace perfqctl {

// PERFQ_PROGRESS_AFTER_MS: after how long the bar appears (default 1000).
TerminalProgress::TerminalProgress()
    : tty_(isatty(STDERR_FILENO) == 1), start_(std::chrono::steady_clock::now()), last_(start_) {
  if (const char* e = std::getenv("PERFQ_PROGRESS_AFTER_MS"); e && *e)
    after_s_ = std::strtod(e, nullptr) / 1000.0;
}

TerminalProgress::~TerminalProgress() {
  if (drawn_) std::fputs("\r\033[K", stderr);
}

perfq::TraceProgress TerminalProgress::callback() {
  if (!tty_) return {};
  return [this](const perfq::TraceProgressInfo& p) { show(p); };
}

void TerminalProgress::show(const perfq::TraceProgressInfo& p) {
  using namespace std::chrono;
  const auto now = steady_clock::now();
  const double elapsed = duration<double>(now - start_).count();
  const bool last = p.bytes_done >= p.bytes_total && p.pass == p.passes;  // the end: 100%
  if (elapsed < after_s_ || (drawn_ && !last && now - last_ < milliseconds(100))) return;
  last_ = now;
  // Of the whole job (a report with --resync reads the file twice).
  const double total = static_cast<double>(p.bytes_total) * p.passes;
  const double done =
      static_cast<double>(p.bytes_done) + static_cast<double>(p.bytes_total) * (p.pass - 1);
  const double frac = total > 0 ? std::min(1.0, done / total) : 0;
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(frac * kWidth);
  const double rate = static_cast<double>(p.records) / elapsed;
  std::string left = "?";
  if (frac > 0.001) {
    const auto secs = static_cast<long>(elapsed * (1 - frac) / frac);
    left = fmt::format("{}:{:02}", secs / 60, secs % 60);
  }
  std::fputs(fmt::format("\r[{}{}] {:3.0f}%  {} records  {:.2f} M/s  {} left\033[K",
                         std::string(filled, '#'), std::string(kWidth - filled, '.'), frac * 100,
                         p.records, rate / 1e6, left)
                 .c_str(),
             stderr);
  drawn_ = true;
}

}  // namespace perfqctl
