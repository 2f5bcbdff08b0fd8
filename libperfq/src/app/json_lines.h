// The one framing of perfq's Unix-socket protocols (the daemon's control
// socket, perfqctl, and applications' libperfq): one JSON object per
// '\n'-terminated line, read through a LineBuffer that bounds a line.
#pragma once

#include <cstddef>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>

#include "core/mapping.h"
#include "perfq/status.h"

namespace perfq {

// An application's lines (app_proto.h) are at most this long.
inline constexpr size_t kAppMaxLine = 64 * 1024;

// Accumulates bytes read from a stream socket and cuts them into lines.
class LineBuffer {
 public:
  // max_line: the longest line a peer may send (overflow()).
  explicit LineBuffer(size_t max_line = kAppMaxLine) : max_(max_line) {}
  size_t max_line() const { return max_; }
  void append(const char* p, size_t n) { buf_.append(p, n); }
  // The next complete line without its '\n', if any.
  std::optional<std::string> next_line();
  // True when the pending (incomplete) data already exceeds max_line().
  bool overflow() const { return buf_.size() - start_ > max_; }
  bool empty() const { return buf_.size() == start_; }
  void clear() {
    buf_.clear();
    start_ = 0;
    scanned_ = 0;
  }

 private:
  size_t max_;
  std::string buf_;
  size_t start_ = 0;    // first byte not yet returned
  size_t scanned_ = 0;  // bytes from start_ known to hold no '\n'
};

// A JSON object as one line of these protocols: compact, and any string that
// is not valid UTF-8 sent with U+FFFD in its place rather than throwing.
std::string json_line(const nlohmann::json& j);

// The reply to a request that failed, in both protocols (the daemon's control
// socket, an application's): {"ok": false, "error": what}.
nlohmann::json error_reply(const std::string& what);

// Send line + '\n' in full (blocking socket: up to its SO_SNDTIMEO;
// non-blocking: fails on EAGAIN).  pass_fd >= 0 travels with the first
// byte (SCM_RIGHTS).  MSG_NOSIGNAL: a closed peer is an error, never SIGPIPE.
// timeout_ms >= 0: the whole line must be taken within that time, whatever
// the socket's mode (a peer that does not read gets kTimeout; 0: only what
// fits now).
Status send_line(int sock, const std::string& line, int pass_fd = -1, int timeout_ms = -1);

// Read up to one chunk into buf; any fds passed with it are appended to
// *fds when fds is not null (closed otherwise).  Returns bytes read, 0 at
// EOF, -errno on error (-EAGAIN for a non-blocking socket with nothing).
long recv_chunk(int sock, LineBuffer& buf, UniqueFd* fd_out);

// Blocking read of one line (bounded by the socket's SO_RCVTIMEO), with
// the fd passed with it, if any.  `peer` names the other end in errors.
Result<std::string> read_line(int sock, LineBuffer& buf, UniqueFd* fd_out,
                              const char* peer = "the daemon");

}  // namespace perfq
