#include "control.h"

#include "app/json_lines.h"
#include "core/json_schema.h"
#include "request.h"

#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <spdlog/spdlog.h>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

namespace perfqd {

using namespace perfq;
using nlohmann::json;

namespace {

// One line to a control client (app/json_lines.h): every reply, error and
// progress line goes through here and carries "schema_version"
// (core/json_schema.h).  Taken by the client within timeout_ms; false when
// the client is gone or does not read.
bool send_line(int fd, json j, int timeout_ms = kReplyDeadlineMs) {
  j["schema_version"] = kJsonSchemaVersion;
  const Status s = perfq::send_line(fd, json_line(j), -1, timeout_ms);
  if (s.code() == Errc::kTimeout)
    spdlog::debug("control: closing a connection that does not read its replies ({})", s.message());
  return s.is_ok();
}

Peer peer_of(int fd) {
  Peer p;
  socklen_t len = sizeof(p.cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &p.cred, &len) != 0) {
    p.cred.uid = static_cast<uid_t>(-1);
    p.cred.gid = static_cast<gid_t>(-1);
  }
  std::vector<gid_t> groups(64);
  len = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
  if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len) != 0 && errno == ERANGE) {
    groups.resize(len / sizeof(gid_t));
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len) != 0) len = 0;
  }
  groups.resize(len / sizeof(gid_t));
  p.groups = std::move(groups);
  return p;
}

}  // namespace

Result<std::unique_ptr<ControlServer>> ControlServer::listen(const std::string& path,
                                                             Daemon& daemon) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path))
    return Status(Errc::kInvalidArgument, "socket path " + path + " is too long");
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);

  const auto dir = std::filesystem::path(path).parent_path();
  if (!dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return Status(Errc::kIo, "cannot create " + dir.string() + ": " + ec.message());
  }
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return Status::from_errno("socket");
  // Is a daemon already there?
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode))
      return Status(Errc::kInvalidArgument, path + " exists and is not a socket; not replacing it");
    UniqueFd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (::connect(probe.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0)
      return Status(Errc::kUnavailable, "another perfq-daemon is listening on " + path);
    ::unlink(path.c_str());  // left behind by a daemon that died
  }
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
    return Status::from_errno("bind " + path);
  // Anyone may connect (status, applications); start/stop are checked per
  // request with SO_PEERCRED.
  ::chmod(path.c_str(), 0666);
  if (::listen(fd.get(), 128) != 0) return Status::from_errno("listen " + path);
  return std::unique_ptr<ControlServer>(new ControlServer(path, std::move(fd), daemon));
}

ControlServer::~ControlServer() { close(); }

void ControlServer::close() {
  if (closing_.exchange(true)) return;
  if (listen_fd_.valid()) {
    listen_fd_.reset();
    ::unlink(path_.c_str());
  }
  // Connection threads are detached; wait (bounded) for them to leave.
  for (int i = 0; i < 500 && active_.load() > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

std::string ControlServer::take_slot(const Peer& peer, bool privileged) {
  std::lock_guard lock(slots_mu_);
  std::string why;
  if (privileged) {
    // Whatever the others hold, kReservedPrivileged slots are left.
    if (privileged_ + unprivileged_ >= kMaxUnprivileged + kReservedPrivileged)
      why = "too many connections (" + std::to_string(kMaxUnprivileged + kReservedPrivileged) +
            "); try again";
  } else if (per_uid_[peer.cred.uid] >= kMaxPerUid) {
    why = "too many connections from uid " + std::to_string(peer.cred.uid) + " (at most " +
          std::to_string(kMaxPerUid) + "); try again";
  } else if (unprivileged_ >= kMaxUnprivileged) {
    why = "too many connections (" + std::to_string(kMaxUnprivileged) +
          " from users not in the daemon's group); try again";
  }
  if (why.empty()) {
    ++(privileged ? privileged_ : unprivileged_);
    if (!privileged) ++per_uid_[peer.cred.uid];
    return why;
  }
  if (per_uid_[peer.cred.uid] == 0) per_uid_.erase(peer.cred.uid);
  ++refused_;
  // One line per burst, not per connection: a flood must not flood the log.
  const int64_t now = now_ns();
  if (now - refused_log_ns_ >= 10'000'000'000) {
    spdlog::warn("control: refused {} connection(s) over the limits (latest: {}: {})",
                 refused_ - refused_logged_, peer.describe(), why);
    refused_logged_ = refused_;
    refused_log_ns_ = now;
  }
  return why;
}

void ControlServer::release_slot(const Peer& peer, bool privileged) {
  std::lock_guard lock(slots_mu_);
  --(privileged ? privileged_ : unprivileged_);
  if (!privileged && --per_uid_[peer.cred.uid] <= 0) per_uid_.erase(peer.cred.uid);
}

json ControlServer::stats() const {
  std::lock_guard lock(slots_mu_);
  int most = 0;
  for (const auto& [uid, n] : per_uid_) most = std::max(most, n);
  return {{"privileged", privileged_},
          {"unprivileged", unprivileged_},
          {"most_of_one_uid", most},
          {"refused", refused_}};
}

void ControlServer::accept_one() {
  // The listening socket is non-blocking: take what is pending (a bounded
  // batch, so that signals and tick() still run under a flood).
  for (int i = 0; i < 256; ++i) {
    UniqueFd conn(::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!conn.valid()) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
        spdlog::warn("accept: {}", std::strerror(errno));
      return;
    }
    const Peer peer = peer_of(conn.get());
    const bool privileged = daemon_.privileged(peer);
    if (std::string why = take_slot(peer, privileged); !why.empty()) {
      send_line(conn.get(), error_reply(why), 0);  // only if it fits now; then closed
      continue;
    }
    ++active_;
    std::thread([this, c = std::move(conn), peer, privileged]() mutable {
      pthread_setname_np(pthread_self(), "pq-control");
      serve(std::move(c), peer);
      release_slot(peer, privileged);
      --active_;
    }).detach();
  }
}

void ControlServer::serve(UniqueFd conn, const Peer& peer) {
  perfq::LineBuffer buf(kMaxRequestBytes);
  bool first = true;
  int64_t request_ns = 0;  // when the first byte of the pending request came (0: none)
  while (!closing_) {
    // One line at a time.
    std::optional<std::string> next;
    while (!(next = buf.next_line())) {
      if (buf.overflow()) {
        send_line(conn.get(),
                  error_reply("request longer than " + std::to_string(kMaxRequestBytes) +
                              " bytes; closing the connection"));
        spdlog::warn("{}: request over {} bytes refused", peer.describe(), kMaxRequestBytes);
        return;
      }
      if (buf.empty()) request_ns = 0;
      int timeout_ms = kIdleTimeoutMs;
      if (request_ns != 0) {
        timeout_ms = static_cast<int>(
            std::max<int64_t>(0, kRequestDeadlineMs - (now_ns() - request_ns) / 1'000'000));
        if (timeout_ms == 0) {
          send_line(conn.get(), error_reply("request not finished (no newline) within " +
                                            std::to_string(kRequestDeadlineMs) +
                                            " ms of its first byte; closing the connection"));
          spdlog::debug("control: {}: request not finished in time; closed", peer.describe());
          return;
        }
      }
      pollfd pfd{conn.get(), POLLIN, 0};
      const int pr = ::poll(&pfd, 1, timeout_ms);
      if (pr == 0 && request_ns == 0) return;  // idle client
      if (pr == 0) continue;                   // the request's deadline: answered above
      if (pr < 0) {
        if (errno == EINTR) continue;
        return;
      }
      const long n = perfq::recv_chunk(conn.get(), buf, nullptr);  // passed fds are closed
      if (n <= 0) return;                                          // hung up
      if (request_ns == 0) request_ns = now_ns();
    }
    // What follows the line (pipelined requests) arrived by now.
    request_ns = buf.empty() ? 0 : now_ns();
    const std::string line = std::move(*next);
    if (line.size() > kMaxRequestBytes) {
      send_line(conn.get(), error_reply("request longer than " + std::to_string(kMaxRequestBytes) +
                                        " bytes; closing the connection"));
      return;
    }
    std::string why;
    std::optional<json> parsed = parse_request_line(line, &why);
    if (!parsed) {
      if (!send_line(conn.get(), error_reply(why))) return;
      first = false;
      continue;
    }
    json& req = *parsed;
    if (req["cmd"] == "app_hello") {
      if (!first || !buf.empty()) {
        send_line(conn.get(),
                  error_reply("app_hello must be the first and only line before its reply"));
        return;
      }
      if (Status s = daemon_.adopt_app(std::move(conn), req, peer); !s)
        spdlog::warn("application {} refused: {}", peer.describe(), s.message());
      return;  // the connection now belongs to HostApps (or was closed)
    }
    first = false;
    auto progress = [&](const json& p) { send_line(conn.get(), json{{"progress", p}}); };
    json reply = daemon_.handle(req, peer, progress);
    if (req["cmd"] == "status" && reply.value("ok", false)) reply["daemon"]["control"] = stats();
    if (!send_line(conn.get(), reply)) return;
  }
}

}  // namespace perfqd
