// The line framing of perfq's socket protocols (app/json_lines.h).
#include "app/json_lines.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

namespace perfq {

std::optional<std::string> LineBuffer::next_line() {
  const size_t nl = buf_.find('\n', start_ + scanned_);
  if (nl == std::string::npos) {
    scanned_ = buf_.size() - start_;
    if (start_ > 0 && start_ == buf_.size()) clear();
    return std::nullopt;
  }
  std::string line = buf_.substr(start_, nl - start_);
  start_ = nl + 1;
  scanned_ = 0;
  if (start_ == buf_.size()) {
    clear();
  } else if (start_ > max_) {
    buf_.erase(0, start_);
    start_ = 0;
  }
  return line;
}

std::string json_line(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

nlohmann::json error_reply(const std::string& what) { return {{"ok", false}, {"error", what}}; }

Status send_line(int sock, const std::string& line, int pass_fd, int timeout_ms) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::milliseconds(std::max(timeout_ms, 0));
  const int flags = MSG_NOSIGNAL | (timeout_ms >= 0 ? MSG_DONTWAIT : 0);
  std::string data = line;
  data.push_back('\n');
  size_t off = 0;
  bool fd_sent = pass_fd < 0;
  while (off < data.size()) {
    iovec iov{data.data() + off, data.size() - off};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int))];
    if (!fd_sent) {
      std::memset(cbuf, 0, sizeof(cbuf));
      msg.msg_control = cbuf;
      msg.msg_controllen = sizeof(cbuf);
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
    }
    const ssize_t n = ::sendmsg(sock, &msg, flags);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (timeout_ms >= 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
        pollfd pfd{sock, POLLOUT, 0};
        if (left > 0 && (::poll(&pfd, 1, static_cast<int>(left)) >= 0 || errno == EINTR)) continue;
        return Status(Errc::kTimeout, fmt::format("the peer took {} of {} bytes within {} ms", off,
                                                  data.size(), timeout_ms));
      }
      return Status::from_errno("send");
    }
    fd_sent = true;
    off += static_cast<size_t>(n);
  }
  return Status::ok();
}

long recv_chunk(int sock, LineBuffer& buf, UniqueFd* fd_out) {
  char data[4096];
  iovec iov{data, sizeof(data)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char cbuf[CMSG_SPACE(4 * sizeof(int))];
  msg.msg_control = cbuf;
  msg.msg_controllen = sizeof(cbuf);
  ssize_t n;
  do {
    n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return -errno;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (fd_out && !fd_out->valid())
        fd_out->reset(fd);
      else
        ::close(fd);  // one fd per reply at most; more is a confused peer
    }
  }
  buf.append(data, static_cast<size_t>(n));
  return static_cast<long>(n);
}

Result<std::string> read_line(int sock, LineBuffer& buf, UniqueFd* fd_out, const char* peer) {
  while (true) {
    if (auto line = buf.next_line()) return std::move(*line);
    if (buf.overflow())
      return Status(Errc::kCorrupt, fmt::format("reply longer than {} bytes", buf.max_line()));
    const long n = recv_chunk(sock, buf, fd_out);
    if (n == 0) return Status(Errc::kUnavailable, fmt::format("connection closed by {}", peer));
    if (n == -EAGAIN || n == -EWOULDBLOCK)
      return Status(Errc::kTimeout, fmt::format("no reply from {} in time", peer));
    if (n < 0) return Status::from_errno("recv", static_cast<int>(-n));
  }
}

}  // namespace perfq
