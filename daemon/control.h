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
// Threading: run() on the main thread; one thread per connection (at most
// kMaxConnections at a time).
#pragma once

#include <atomic>
#include <string>

#include "core/mapping.h"
#include "daemon.h"
#include "perfq/status.h"

namespace perfqd {

inline constexpr size_t kMaxRequestBytes = 64 * 1024;
inline constexpr int kMaxConnections = 64;

class ControlServer {
 public:
  // Binds and listens.  A socket file left by a dead daemon is replaced; a
  // live daemon on the same path is an error.
  static perfq::Result<std::unique_ptr<ControlServer>> listen(const std::string& path,
                                                              Daemon& daemon);
  ~ControlServer();

  int fd() const { return listen_fd_.get(); }
  // Accepts one pending connection (the listening socket was readable).
  void accept_one();
  // Waits for every connection thread to finish (after the socket closed).
  void close();

 private:
  ControlServer(std::string path, perfq::UniqueFd fd, Daemon& daemon)
      : path_(std::move(path)), listen_fd_(std::move(fd)), daemon_(daemon) {}
  void serve(perfq::UniqueFd conn);

  std::string path_;
  perfq::UniqueFd listen_fd_;
  Daemon& daemon_;
  std::atomic<int> active_{0};
  std::atomic<bool> closing_{false};
};

}  // namespace perfqd
