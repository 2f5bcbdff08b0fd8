#include "app_proto.h"

#include "perfq/perfq_abi.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
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
  } else if (start_ > kAppMaxLine) {
    buf_.erase(0, start_);
    start_ = 0;
  }
  return line;
}

Status send_line(int sock, const std::string& line, int pass_fd) {
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
    const ssize_t n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
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

Result<std::string> read_line(int sock, LineBuffer& buf, UniqueFd* fd_out) {
  while (true) {
    if (auto line = buf.next_line()) return std::move(*line);
    if (buf.overflow()) return Status(Errc::kCorrupt, "reply longer than 64 KiB");
    const long n = recv_chunk(sock, buf, fd_out);
    if (n == 0) return Status(Errc::kUnavailable, "connection closed by the daemon");
    if (n == -EAGAIN || n == -EWOULDBLOCK)
      return Status(Errc::kTimeout, "no reply from the daemon in time");
    if (n < 0) return Status::from_errno("recv", static_cast<int>(-n));
  }
}

std::string clean_name(const std::string& s, size_t max) {
  std::string out;
  for (char ch : s) {
    if (out.size() >= max) break;
    out.push_back(ch >= 0x20 && ch < 0x7f ? ch : '?');
  }
  return out;
}

nlohmann::json event_to_json(const EventInfo& e) {
  return {{"id", e.event}, {"name", e.name}, {"kind", e.kind}};
}

Status parse_events(const nlohmann::json& arr, size_t max_id, std::vector<EventInfo>* out) {
  if (!arr.is_array()) return Status(Errc::kInvalidArgument, "events must be an array");
  if (arr.size() > max_id) return Status(Errc::kInvalidArgument, "too many events");
  for (const auto& e : arr) {
    if (!e.is_object() || !e.contains("id") || !e["id"].is_number_unsigned() ||
        !e.contains("name") || !e["name"].is_string() || !e.contains("kind") ||
        !e["kind"].is_number_unsigned())
      return Status(Errc::kInvalidArgument, "event needs id, name and kind");
    const uint64_t id = e["id"].get<uint64_t>();
    const uint64_t kind = e["kind"].get<uint64_t>();
    const std::string name = e["name"].get<std::string>();
    if (id == 0 || id > max_id)
      return Status(Errc::kInvalidArgument, "event id " + std::to_string(id) + " out of range");
    if (kind < PERFQ_KIND_BEGIN || kind > PERFQ_KIND_COUNTER)
      return Status(Errc::kInvalidArgument, "event kind " + std::to_string(kind) + " invalid");
    if (name.empty() || name.size() >= PERFQ_EVENT_NAME_LEN)
      return Status(Errc::kInvalidArgument, "event name must be 1 to 47 bytes");
    out->push_back({static_cast<uint32_t>(id), static_cast<uint16_t>(kind), clean_name(name, 47)});
  }
  return Status::ok();
}


}  // namespace perfq
