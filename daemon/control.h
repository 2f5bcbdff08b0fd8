// The control socket: a Unix stream socket, one JSON object per line each
// way.  A connection's first line decides what it is:
//   {"cmd":"app_hello",...}  an instrumented application; the connection is
//                            handed to HostApps and never read here again;
//   anything else            a control client (perfqctl): requests and
//                            replies, one line each, until it hangs up.
// Every reply carries "ok"; a request that is not a JSON object, lacks
// "cmd", or is longer than kMaxRequestBytes gets {"ok":false,"error":...}
// and never reaches the recording.  Interim lines of a long request (stop)
// carry "progress" instead of "ok".
//
// Anyone may connect (mode 0666), so no one may block it: root and the
// daemon's group (Daemon::privileged, the rule of start/stop) always get
// through.  Peers that are not privileged share kMaxUnprivileged
// connections, at most kMaxPerUid per uid; kReservedPrivileged more are
// kept for privileged peers.  A connection over its limits is answered
// with an error and closed at once, without blocking the accept.  A
// request must be complete (its newline) within kRequestDeadlineMs of its
// first byte, a reply taken within kReplyDeadlineMs, and a connection
// silent for kIdleTimeoutMs is hung up on; each of these closes it.
//
// Threading: accept_one() and close() on the main thread; one thread per
// accepted connection (the limits above bound them); stats() any thread.
#pragma once

#include <atomic>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "core/mapping.h"
#include "daemon.h"
#include "perfq/status.h"

namespace perfqd {

inline constexpr size_t kMaxRequestBytes = 64 * 1024;
inline constexpr int kMaxUnprivileged = 64;
inline constexpr int kMaxPerUid = 16;
inline constexpr int kReservedPrivileged = 16;
inline constexpr int kRequestDeadlineMs = 2'000;
inline constexpr int kReplyDeadlineMs = 2'000;
inline constexpr int kIdleTimeoutMs = 60'000;

class ControlServer {
 public:
  // Binds and listens.  A socket file left by a dead daemon is replaced; a
  // live daemon on the same path is an error.
  static perfq::Result<std::unique_ptr<ControlServer>> listen(const std::string& path,
                                                              Daemon& daemon);
  ~ControlServer();

  int fd() const { return listen_fd_.get(); }
  // Accepts the pending connections (the listening socket was readable);
  // never blocks.
  void accept_one();
  // Waits for every connection thread to finish (after the socket closed).
  void close();
  // Connections now (privileged, unprivileged, the most of one uid) and
  // those refused since the start: status' "control".
  nlohmann::json stats() const;

 private:
  ControlServer(std::string path, perfq::UniqueFd fd, Daemon& daemon)
      : path_(std::move(path)), listen_fd_(std::move(fd)), daemon_(daemon) {}
  void serve(perfq::UniqueFd conn, const Peer& peer);
  // Takes a connection slot for the peer, or says why not ("" = taken).
  std::string take_slot(const Peer& peer, bool privileged);
  void release_slot(const Peer& peer, bool privileged);

  std::string path_;
  perfq::UniqueFd listen_fd_;
  Daemon& daemon_;
  std::atomic<int> active_{0};
  std::atomic<bool> closing_{false};

  mutable std::mutex slots_mu_;
  int privileged_ = 0, unprivileged_ = 0;
  std::map<uid_t, int> per_uid_;  // unprivileged connections by uid
  uint64_t refused_ = 0;
  uint64_t refused_logged_ = 0;
  int64_t refused_log_ns_ = 0;
};

}  // namespace perfqd
