#include "control.h"

#include "app/json_lines.h"

#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <spdlog/spdlog.h>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

namespace perfqd {

using namespace perfq;
using nlohmann::json;

namespace {

// A control client silent this long is hung up on.
constexpr int kIdleTimeoutMs = 60'000;

// One reply line (app/json_lines.h); false when the client is gone.
bool send_line(int fd, const json& j) {
  return perfq::send_line(fd, j.dump(-1, ' ', false, json::error_handler_t::replace)).is_ok();
}

json error(const std::string& msg) { return {{"ok", false}, {"error", msg}}; }

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
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
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
  if (::listen(fd.get(), 64) != 0) return Status::from_errno("listen " + path);
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

void ControlServer::accept_one() {
  UniqueFd conn(::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC));
  if (!conn.valid()) {
    if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
      spdlog::warn("accept: {}", std::strerror(errno));
    return;
  }
  if (active_.load() >= kMaxConnections) {
    send_line(conn.get(),
              error("too many connections (" + std::to_string(kMaxConnections) + "); try again"));
    return;
  }
  ++active_;
  std::thread([this, c = std::move(conn)]() mutable {
    pthread_setname_np(pthread_self(), "pq-control");
    serve(std::move(c));
    --active_;
  }).detach();
}

void ControlServer::serve(UniqueFd conn) {
  const Peer peer = peer_of(conn.get());
  perfq::LineBuffer buf(kMaxRequestBytes);
  bool first = true;
  while (!closing_) {
    // One line at a time.
    std::optional<std::string> next;
    while (!(next = buf.next_line())) {
      if (buf.overflow()) {
        send_line(conn.get(), error("request longer than " + std::to_string(kMaxRequestBytes) +
                                    " bytes; closing the connection"));
        spdlog::warn("{}: request over {} bytes refused", peer.describe(), kMaxRequestBytes);
        return;
      }
      pollfd pfd{conn.get(), POLLIN, 0};
      const int pr = ::poll(&pfd, 1, kIdleTimeoutMs);
      if (pr == 0) return;  // idle client
      if (pr < 0) {
        if (errno == EINTR) continue;
        return;
      }
      const long n = perfq::recv_chunk(conn.get(), buf, nullptr);  // passed fds are closed
      if (n <= 0) return;                                          // hung up
    }
    const std::string line = std::move(*next);
    if (line.size() > kMaxRequestBytes) {
      send_line(conn.get(), error("request longer than " + std::to_string(kMaxRequestBytes) +
                                  " bytes; closing the connection"));
      return;
    }
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json req = json::parse(line, nullptr, false);
    if (req.is_discarded() || !req.is_object()) {
      if (!send_line(conn.get(), error("malformed request: expected one JSON object per line")))
        return;
      first = false;
      continue;
    }
    if (!req.contains("cmd") || !req["cmd"].is_string()) {
      if (!send_line(conn.get(), error("request has no \"cmd\" string"))) return;
      first = false;
      continue;
    }
    if (req["cmd"] == "app_hello") {
      if (!first || !buf.empty()) {
        send_line(conn.get(), error("app_hello must be the first and only line before its reply"));
        return;
      }
      if (Status s = daemon_.adopt_app(std::move(conn), req, peer); !s)
        spdlog::warn("application {} refused: {}", peer.describe(), s.message());
      return;  // the connection now belongs to HostApps (or was closed)
    }
    first = false;
    auto progress = [&](const json& p) { send_line(conn.get(), json{{"progress", p}}); };
    const json reply = daemon_.handle(req, peer, progress);
    if (!send_line(conn.get(), reply)) return;
  }
}

}  // namespace perfqd
