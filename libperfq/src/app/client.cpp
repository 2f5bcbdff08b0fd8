// The host instrumentation API (perfq.h): the application side.
//
// Per thread, a ThreadState holds the thread's ring (its producer end) and
// the connection generation the ring belongs to.  The fast path is: one
// relaxed load of the global generation, compare with the thread's, the
// ring's `recording` word (relaxed), a clock read (host_clock.h: the TSC
// scaled to CLOCK_MONOTONIC where it can be), a 32-byte store and a
// release of the tail.  Everything else happens on the slow path, under
// the client mutex: the first event of a thread, and the first event after
// the generation changed (connected, disconnected, shut down).
//
// Connection changes are made by the connector thread, always under the
// mutex, and each one bumps the generation.  A thread that notices a new
// generation gives up its old ring itself: it is the ring's only writer, so
// its mapping is unmapped only by the thread that writes to it, never under
// a writer.  Requests on the connection (thread rings, new events) are
// synchronous round trips under the mutex, bounded by SO_RCVTIMEO; a
// failed one marks the connection broken (shutdown(2)), and the connector,
// which watches the socket for a hang-up, closes it and reconnects.
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "app/app_proto.h"
#include "app/host_clock.h"
#include "core/mapping.h"
#include "core/spsc_ring.h"
#include "device/device_clock.h"
#include "perfq/perfq.h"

#define PERFQ_UNLIKELY(x) __builtin_expect(!!(x), 0)

namespace perfq {
namespace {

using json = nlohmann::json;

constexpr int kIoTimeoutMs = 2000;
constexpr auto kBackoffMin = std::chrono::milliseconds(10);
constexpr auto kBackoffMax = std::chrono::milliseconds(1000);

// poll(2)'s timeout for a wait of `d` (max(): none).
int poll_timeout(std::chrono::milliseconds d) {
  if (d == std::chrono::milliseconds::max()) return -1;
  return static_cast<int>(std::clamp<std::chrono::milliseconds::rep>(d.count(), 1, 60'000));
}

// Single-writer counters other threads may read.
inline void bump(std::atomic<uint64_t>& c) noexcept {
  c.store(c.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}

struct ThreadState {
  // Hot: written by the owner thread only (under the client mutex).
  uint64_t gen = 0;                      // 0: never seen any generation
  perfq_app_ring_header* hdr = nullptr;  // null: no ring in this generation
  perfq_spsc_header* spsc = nullptr;
  ChunkedProducer<perfq_record> producer;
  uint16_t stream = 0;
  std::atomic<uint64_t> dropped{0};
  std::atomic<uint64_t> not_recording{0};

  // Under the client mutex.
  Mapping mapping;
  uint64_t base_recorded = 0;  // from rings given up before
  uint64_t base_lost = 0;
  std::string name;
  uint32_t tid = 0;
  int ring_error = 0;  // -errno of the last failed ring request
};

// First event of a thread: the state; at thread exit: give the ring up.
thread_local ThreadState* t_state __attribute__((tls_model("initial-exec"))) = nullptr;

struct ThreadExitHook {
  bool armed = false;
  ~ThreadExitHook();
};
thread_local ThreadExitHook t_exit_hook;

// The global connection generation; changes only under the client mutex.
std::atomic<uint64_t> g_gen{1};

class Client {
 public:
  // ---- lifecycle (serialized by life_mu_) ----
  int init(const char* app_name, const char* socket_path, bool lazy);
  void shutdown();
  void ensure_started() {
    if (!started_.load(std::memory_order_acquire)) init(nullptr, nullptr, true);
  }

  // ---- under mu_ ----
  ThreadState* refresh_thread_locked();
  void release_ring_locked(ThreadState* t);
  int acquire_ring_locked(ThreadState* t);
  void thread_exit(ThreadState* t);
  // nargs names of the arg (0: one unnamed number, 1: one named number,
  // 2: two 32-bit numbers, upper half first).
  uint32_t register_event(const char* name, int kind, const char* const* arg_names = nullptr,
                          size_t nargs = 0);
  struct perfq_category* category(const char* name);
  int category_enable(const char* name, int enabled);
  int thread_init(const char* name);
  bool wait_connected(int timeout_ms);
  bool connected() {
    std::lock_guard l(mu_);
    return usable_locked();
  }
  void stats(perfq_stats* out);

  // fork(): the parent's state is consistent across it (both locks held);
  // the child starts afresh.
  void before_fork() {
    life_mu_.lock();
    mu_.lock();
    cats_mu_.lock();
  }
  void after_fork_parent() {
    cats_mu_.unlock();
    mu_.unlock();
    life_mu_.unlock();
  }
  void after_fork_child();

  std::mutex mu_;

 private:
  enum class Life { kNew, kRunning, kShutdown };

  void connector_main();
  Result<UniqueFd> handshake(const std::string& path, const std::string& hello);
  bool usable_locked() const { return conn_.valid() && !broken_; }
  void mark_broken_locked() {
    if (conn_.valid() && !broken_) {
      broken_ = true;
      ::shutdown(conn_.get(), SHUT_RDWR);  // wakes the connector's poll
    }
  }
  Result<json> request_locked(const json& req, UniqueFd* fd_out);
  void disconnect_locked() {
    conn_.reset();
    broken_ = false;
    rbuf_.clear();
    g_gen.fetch_add(1, std::memory_order_relaxed);
    cv_.notify_all();
  }
  bool wait_stop(std::chrono::milliseconds d);

  std::mutex life_mu_;
  std::atomic<bool> started_{false};
  Life life_ = Life::kNew;  // under life_mu_
  std::thread connector_;
  UniqueFd wake_;  // eventfd: stop the connector

  // Under mu_.
  bool stopping_ = false;
  std::string app_name_, socket_path_;
  UniqueFd conn_;
  bool broken_ = false;
  LineBuffer rbuf_;
  uint64_t ring_records_ = 0;
  std::condition_variable cv_;
  std::vector<EventInfo> events_;  // id = index + 1
  std::unordered_map<std::string, uint32_t> by_name_;
  std::vector<ThreadState*> threads_;
  uint64_t exited_recorded_ = 0, exited_lost_ = 0, exited_dropped_ = 0, exited_not_recording_ = 0;
  uint64_t connections_ = 0;

  // A refused call (perfq.h: "Errors are never silent"): errno and the count.
  template <typename T>
  T refuse(int err, T ret) {
    errors_.fetch_add(1, std::memory_order_relaxed);
    errno = err;
    return ret;
  }
  std::atomic<uint64_t> errors_{0};

  // Categories: created once, never freed (records test them unlocked).
  // Each starts as PERFQ_CATEGORIES says (rules parsed on first use).
  struct perfq_category* category_locked(const std::string& name, bool from_env);
  std::mutex cats_mu_;
  std::unordered_map<std::string, std::unique_ptr<struct perfq_category>> cats_;
  std::vector<std::pair<std::string, bool>> cat_rules_;  // (name or "*", enable)
  bool cat_rules_read_ = false;
};

// What perfq_category() returns for an invalid name: always disabled.
struct perfq_category g_invalid_category = {0};

// 0, or the errno for a category or event name (perfq.h: 1..47 bytes).
int check_name(const char* name, size_t* len) {
  if (!name) return EINVAL;
  *len = ::strnlen(name, PERFQ_EVENT_NAME_LEN);
  if (*len == 0) return EINVAL;
  if (*len >= PERFQ_EVENT_NAME_LEN) return ENAMETOOLONG;
  return 0;
}

Client& client() {
  // Never destroyed: threads may record (and exit) during static destruction.
  static Client* c = [] {
    auto* cl = new Client;
    pthread_atfork([] { client().before_fork(); }, [] { client().after_fork_parent(); },
                   [] { client().after_fork_child(); });
    return cl;
  }();
  return *c;
}

// In the child only this thread exists, and it holds both locks.  The
// rings are the parent's (shared mappings): forget them without a word to
// them (no `finished` mark), close the child's copy of the connection, and
// let the child connect as an application of its own on its next event.
void Client::after_fork_child() {
  for (ThreadState* t : threads_) {
    t->hdr = nullptr;
    t->spsc = nullptr;
    t->producer = ChunkedProducer<perfq_record>();
    t->mapping.reset();  // unmaps in the child only
  }
  conn_.reset();
  broken_ = false;
  rbuf_.clear();
  stopping_ = false;
  wake_.reset();
  cats_mu_.unlock();
  // The connector thread does not exist here: drop its handle unjoined.
  new (&connector_) std::thread();
  if (life_ == Life::kRunning) life_ = Life::kNew;
  started_.store(false, std::memory_order_relaxed);
  g_gen.fetch_add(1, std::memory_order_relaxed);
  mu_.unlock();
  life_mu_.unlock();
}

std::string default_app_name() {
  std::string s = program_invocation_short_name ? program_invocation_short_name : "";
  return s.empty() ? "app" : s;
}

uint32_t gettid_u32() { return static_cast<uint32_t>(::syscall(SYS_gettid)); }

std::string current_thread_name() {
  char buf[32] = {};
  if (pthread_getname_np(pthread_self(), buf, sizeof(buf)) == 0 && buf[0]) return buf;
  return "tid " + std::to_string(gettid_u32());
}

int Client::init(const char* app_name, const char* socket_path, bool lazy) {
  std::lock_guard lg(life_mu_);
  if (life_ == Life::kRunning) return lazy ? 0 : -EALREADY;
  if (lazy && life_ == Life::kShutdown) return 0;  // stays off until perfq_init()
  std::string name = app_name && *app_name ? app_name : default_app_name();
  std::string path;
  if (lazy) {
    // A forked child keeps what its parent was started with.
    std::lock_guard l(mu_);
    if (!socket_path_.empty()) {
      name = app_name_;
      path = socket_path_;
    }
  }
  if (!path.empty()) {
  } else if (socket_path && *socket_path)
    path = socket_path;
  else if (const char* env = std::getenv(PERFQ_SOCKET_ENV); env && *env)
    path = env;
  else
    path = PERFQ_DEFAULT_SOCKET;
  if (name.size() > 255 || path.size() >= sizeof(sockaddr_un::sun_path)) return -EINVAL;
  const int efd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (efd < 0) return -errno;
  {
    std::lock_guard l(mu_);
    app_name_ = name;
    socket_path_ = path;
    stopping_ = false;
  }
  wake_.reset(efd);
  try {
    connector_ = std::thread([this] { connector_main(); });
  } catch (...) {
    wake_.reset();
    return -EAGAIN;
  }
  life_ = Life::kRunning;
  started_.store(true, std::memory_order_release);
  return 0;
}

void Client::shutdown() {
  std::lock_guard lg(life_mu_);
  if (life_ != Life::kRunning) {
    life_ = Life::kShutdown;
    return;
  }
  {
    std::lock_guard l(mu_);
    stopping_ = true;
  }
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_.get(), &one, sizeof(one));
  connector_.join();
  {
    std::lock_guard l(mu_);
    if (conn_.valid()) disconnect_locked();
    g_gen.fetch_add(1, std::memory_order_relaxed);
  }
  wake_.reset();
  life_ = Life::kShutdown;
  started_.store(false, std::memory_order_release);
}

bool Client::wait_stop(std::chrono::milliseconds d) {
  pollfd p{wake_.get(), POLLIN, 0};
  ::poll(&p, 1, static_cast<int>(d.count()));
  std::lock_guard l(mu_);
  return stopping_;
}

Result<UniqueFd> Client::handshake(const std::string& path, const std::string& hello) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Status::from_errno("socket");
  timeval tv{kIoTimeoutMs / 1000, (kIoTimeoutMs % 1000) * 1000};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
    return Status::from_errno("connect " + path);
  if (Status s = send_line(fd.get(), hello); !s) return s;
  LineBuffer buf;
  auto line = read_line(fd.get(), buf, nullptr);
  if (!line) return line.status();
  const json r = json::parse(*line, nullptr, false);
  if (r.is_discarded() || !r.is_object() || !r.value("ok", false))
    return Status(Errc::kUnavailable, "daemon refused: " + *line);
  const uint64_t records = r.value("ring_records", uint64_t{0});
  std::lock_guard l(mu_);
  ring_records_ = records;
  return fd;
}

void Client::connector_main() {
  auto backoff = kBackoffMin;
  while (true) {
    std::string path, hello;
    size_t sent = 0;
    {
      std::lock_guard l(mu_);
      if (stopping_) return;
      if (conn_.valid()) {
        // Connected: watch for the daemon going away (or a broken request).
        const int cfd = conn_.get();
        pollfd p[2] = {{cfd, POLLRDHUP, 0}, {wake_.get(), POLLIN, 0}};
        mu_.unlock();
        // conn_ is closed only by this thread, so cfd stays valid here.
        // It also keeps the record clock's TSC map current (host_clock.h).
        ::poll(p, 2, poll_timeout(host_clock_update()));
        mu_.lock();
        if (stopping_) return;
        if (p[0].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) disconnect_locked();
        continue;
      }
      json j = {{"cmd", "app_hello"},
                {"version", kAppProtoVersion},
                {"pid", ::getpid()},
                {"name", app_name_}};
      j["events"] = json::array();
      for (const auto& e : events_) j["events"].push_back(event_to_json(e));
      sent = events_.size();
      hello = json_line(j);
      path = socket_path_;
    }
    auto fd = handshake(path, hello);
    if (fd) {
      std::unique_lock l(mu_);
      if (stopping_) return;
      conn_ = std::move(*fd);
      broken_ = false;
      rbuf_.clear();
      if (events_.size() > sent) {
        json j = {{"cmd", "events"}, {"events", json::array()}};
        for (size_t i = sent; i < events_.size(); ++i)
          j["events"].push_back(event_to_json(events_[i]));
        if (!request_locked(j, nullptr)) {
          conn_.reset();
          broken_ = false;
        }
      }
      if (conn_.valid()) {
        ++connections_;
        g_gen.fetch_add(1, std::memory_order_relaxed);
        cv_.notify_all();
        backoff = kBackoffMin;
        continue;
      }
    }
    host_clock_update();  // calibrating before the daemon is there
    if (wait_stop(backoff)) return;
    backoff =
        std::min(backoff * 2, std::chrono::duration_cast<std::chrono::milliseconds>(kBackoffMax));
  }
}

Result<json> Client::request_locked(const json& req, UniqueFd* fd_out) {
  if (!usable_locked()) return Status(Errc::kUnavailable, "not connected");
  if (Status s = send_line(conn_.get(), json_line(req)); !s) {
    mark_broken_locked();
    return s;
  }
  auto line = read_line(conn_.get(), rbuf_, fd_out);
  if (!line) {
    mark_broken_locked();
    return line.status();
  }
  json r = json::parse(*line, nullptr, false);
  if (r.is_discarded() || !r.is_object()) {
    mark_broken_locked();
    return Status(Errc::kCorrupt, "malformed reply");
  }
  if (!r.value("ok", false))
    return Status(Errc::kInvalidArgument, r.value("error", std::string("refused")));
  return r;
}

void Client::release_ring_locked(ThreadState* t) {
  if (!t->hdr) return;
  t->producer.flush();  // the partly filled chunk (the owner's thread: only it writes)
  t->base_recorded += t->producer.tail();
  t->base_lost += load_relaxed(&t->spsc->lost);
  // Pairs with the daemon's load_acquire of `finished` before its last
  // peek: every tail published above is visible to it.
  store_release(&t->hdr->finished, 1);
  t->hdr = nullptr;
  t->spsc = nullptr;
  t->producer = ChunkedProducer<perfq_record>();
  t->mapping.reset();
}

int Client::acquire_ring_locked(ThreadState* t) {
  if (!usable_locked()) return -ENOTCONN;
  if (t->name.empty()) t->name = current_thread_name();
  UniqueFd rfd;
  auto r = request_locked({{"cmd", "thread"}, {"tid", t->tid}, {"name", t->name}}, &rfd);
  if (!r) return r.status().code() == Errc::kInvalidArgument ? -EPERM : -ECONNRESET;
  auto ring = attach_app_ring(rfd.get(), *r);
  if (!ring) return ring.status().code() == Errc::kCorrupt ? -EPROTO : -ENOMEM;
  t->mapping = std::move(ring->mapping);
  t->spsc = ring->spsc;
  t->producer = std::move(ring->producer);
  t->stream = ring->stream;
  t->hdr = ring->hdr;
  return 0;
}

ThreadState* Client::refresh_thread_locked() {
  ThreadState* t = t_state;
  if (!t) {
    t = new (std::nothrow) ThreadState;
    if (!t) return nullptr;
    try {
      threads_.push_back(t);
    } catch (...) {
      delete t;
      return nullptr;
    }
    t->tid = gettid_u32();
    t_state = t;
    t_exit_hook.armed = true;
  }
  const uint64_t gen = g_gen.load(std::memory_order_relaxed);  // stable under mu_
  if (t->gen != gen) {
    release_ring_locked(t);
    t->gen = gen;
    try {
      t->ring_error = acquire_ring_locked(t);
    } catch (...) {
      t->ring_error = -ENOMEM;
    }
    if (t->ring_error != 0 && t->hdr) release_ring_locked(t);
  }
  return t;
}

void Client::thread_exit(ThreadState* t) {
  std::lock_guard l(mu_);
  release_ring_locked(t);
  exited_recorded_ += t->base_recorded;
  exited_lost_ += t->base_lost;
  exited_dropped_ += t->dropped.load(std::memory_order_relaxed);
  exited_not_recording_ += t->not_recording.load(std::memory_order_relaxed);
  threads_.erase(std::remove(threads_.begin(), threads_.end(), t), threads_.end());
  t_state = nullptr;
  delete t;
}

ThreadExitHook::~ThreadExitHook() {
  if (armed && t_state) client().thread_exit(t_state);
}

uint32_t Client::register_event(const char* name, int kind, const char* const* arg_names,
                                size_t nargs) {
  size_t len = 0;
  if (const int err = check_name(name, &len)) return refuse(err, uint32_t{0});
  if (kind < PERFQ_KIND_BEGIN || kind > PERFQ_KIND_COUNTER) return refuse(EINVAL, uint32_t{0});
  size_t arg_len[2] = {0, 0};
  // A counter's arg is its value: one unnamed number.
  if (nargs && kind == PERFQ_KIND_COUNTER) return refuse(EINVAL, uint32_t{0});
  for (size_t i = 0; i < nargs; ++i) {
    if (!arg_names[i]) return refuse(EINVAL, uint32_t{0});
    arg_len[i] = ::strnlen(arg_names[i], PERFQ_ARG_NAME_LEN);
    if (arg_len[i] == 0) return refuse(EINVAL, uint32_t{0});
    if (arg_len[i] >= PERFQ_ARG_NAME_LEN) return refuse(ENAMETOOLONG, uint32_t{0});
  }
  ensure_started();
  try {
    std::vector<std::string> args;
    for (size_t i = 0; i < nargs; ++i) args.emplace_back(arg_names[i], arg_len[i]);
    std::lock_guard l(mu_);
    const std::string n(name, len);
    if (auto it = by_name_.find(n); it != by_name_.end()) {
      const EventInfo& e = events_[it->second - 1];
      if (e.kind != kind || e.args != args) return refuse(EEXIST, uint32_t{0});
      return it->second;
    }
    if (events_.size() >= 65535) return refuse(ENOSPC, uint32_t{0});
    const uint32_t id = static_cast<uint32_t>(events_.size() + 1);
    events_.push_back({id, static_cast<uint16_t>(kind), n, std::move(args)});
    by_name_.emplace(n, id);
    // Known to the daemon before any record can carry the id.  A failure
    // breaks the connection; the next one sends every event in the hello.
    if (usable_locked())
      (void)request_locked(
          {{"cmd", "events"}, {"events", json::array({event_to_json(events_.back())})}}, nullptr);
    return id;
  } catch (...) {
    return refuse(ENOMEM, uint32_t{0});
  }
}

struct perfq_category* Client::category_locked(const std::string& name, bool from_env) {
  if (auto it = cats_.find(name); it != cats_.end()) return it->second.get();
  if (!cat_rules_read_) {
    cat_rules_read_ = true;
    const char* env = std::getenv(PERFQ_CATEGORIES_ENV);
    std::string list = env ? env : "";
    for (size_t pos = 0; pos <= list.size();) {
      size_t comma = list.find(',', pos);
      if (comma == std::string::npos) comma = list.size();
      std::string item = list.substr(pos, comma - pos);
      pos = comma + 1;
      const bool enable = item.empty() || item[0] != '-';
      if (!enable) item.erase(0, 1);
      if (!item.empty()) cat_rules_.emplace_back(item, enable);
    }
  }
  bool enabled = true;
  if (from_env)
    for (const auto& [rule, on] : cat_rules_)
      if (rule == "*" || rule == name) enabled = on;
  auto c = std::make_unique<struct perfq_category>();
  c->enabled = enabled ? 1 : 0;
  return cats_.emplace(name, std::move(c)).first->second.get();
}

struct perfq_category* Client::category(const char* name) {
  size_t len = 0;
  if (const int err = check_name(name, &len)) return refuse(err, &g_invalid_category);
  try {
    std::lock_guard l(cats_mu_);
    return category_locked(std::string(name, len), true);
  } catch (...) {
    return refuse(ENOMEM, &g_invalid_category);
  }
}

int Client::category_enable(const char* name, int enabled) {
  size_t len = 0;
  if (const int err = check_name(name, &len)) return refuse(err, -err);
  try {
    std::lock_guard l(cats_mu_);
    struct perfq_category* c = category_locked(std::string(name, len), false);
    // Pairs with nothing: records test the flag with a relaxed load
    // (perfq_category_enabled()); the switch is not a fence.
    __atomic_store_n(&c->enabled, enabled ? 1 : 0, __ATOMIC_RELAXED);
    return 0;
  } catch (...) {
    return refuse(ENOMEM, -ENOMEM);
  }
}

int Client::thread_init(const char* name) {
  ensure_started();
  std::lock_guard l(mu_);
  ThreadState* t = refresh_thread_locked();
  if (!t) return -ENOMEM;
  try {
    if (name && *name) t->name = name;
    if (!t->hdr && usable_locked()) t->ring_error = acquire_ring_locked(t);
  } catch (...) {
    return -ENOMEM;
  }
  if (t->hdr) return 0;
  return t->ring_error ? t->ring_error : -ENOTCONN;
}

bool Client::wait_connected(int timeout_ms) {
  ensure_started();
  std::unique_lock l(mu_);
  return cv_.wait_for(l, std::chrono::milliseconds(std::max(timeout_ms, 0)), [&] {
    return usable_locked() || stopping_;
  }) && usable_locked();
}

void Client::stats(perfq_stats* out) {
  std::lock_guard l(mu_);
  perfq_stats s{};
  s.recorded = exited_recorded_;
  s.lost = exited_lost_;
  s.dropped = exited_dropped_;
  s.not_recording = exited_not_recording_;
  for (const ThreadState* t : threads_) {
    s.recorded += t->base_recorded;
    s.lost += t->base_lost;
    if (t->hdr) {
      // Pairs with the owner's store_release of `written` (its tail trails it).
      s.recorded += load_acquire(&t->spsc->written);
      s.lost += load_relaxed(&t->spsc->lost);
      ++s.threads;
    }
    s.dropped += t->dropped.load(std::memory_order_relaxed);
    s.not_recording += t->not_recording.load(std::memory_order_relaxed);
  }
  s.connections = connections_;
  s.connected = usable_locked() ? 1 : 0;
  s.errors = errors_.load(std::memory_order_relaxed);
  *out = s;
}

ThreadState* slow_path() noexcept {
  Client& c = client();
  c.ensure_started();
  std::lock_guard l(c.mu_);
  return c.refresh_thread_locked();
}

inline void record(uint32_t event, unsigned kind, uint64_t arg) noexcept {
  ThreadState* t = t_state;
  if (PERFQ_UNLIKELY(!t || t->gen != g_gen.load(std::memory_order_relaxed))) {
    t = slow_path();
    if (!t) return;
  }
  if (PERFQ_UNLIKELY(!t->hdr)) {
    bump(t->dropped);
    return;
  }
  if (PERFQ_UNLIKELY(!load_relaxed(&t->hdr->recording))) {
    bump(t->not_recording);
    return;
  }
  const perfq_record r{t->producer.tail(), event, t->stream, PERFQ_FLAGS(kind, PERFQ_CLOCK_HOST),
                       host_clock_ns(),    arg};
  // Full ring: refused, never overwritten, counted in the header for the daemon.
  if (PERFQ_UNLIKELY(!t->producer.try_push(r)))
    store_relaxed(&t->spsc->lost, load_relaxed(&t->spsc->lost) + 1);
}

}  // namespace
}  // namespace perfq

extern "C" {

int perfq_init(const char* app_name, const char* socket_path) {
  try {
    return perfq::client().init(app_name, socket_path, false);
  } catch (...) {
    return -ENOMEM;
  }
}

uint32_t perfq_event(const char* name, int kind) {
  return perfq::client().register_event(name, kind);
}

uint32_t perfq_event_arg(const char* name, int kind, const char* arg) {
  return perfq::client().register_event(name, kind, &arg, 1);
}

uint32_t perfq_event2(const char* name, int kind, const char* arg_hi, const char* arg_lo) {
  const char* const args[2] = {arg_hi, arg_lo};
  return perfq::client().register_event(name, kind, args, 2);
}

void perfq_begin(uint32_t event, uint64_t arg) { perfq::record(event, PERFQ_KIND_BEGIN, arg); }
void perfq_end(uint32_t event, uint64_t arg) { perfq::record(event, PERFQ_KIND_END, arg); }
void perfq_instant(uint32_t event, uint64_t arg) { perfq::record(event, PERFQ_KIND_INSTANT, arg); }
void perfq_counter(uint32_t event, uint64_t value) {
  perfq::record(event, PERFQ_KIND_COUNTER, value);
}
void perfq_record_event(uint32_t event, int kind, uint64_t arg) {
  if (kind >= PERFQ_KIND_BEGIN && kind <= PERFQ_KIND_COUNTER)
    perfq::record(event, static_cast<unsigned>(kind), arg);
}

int perfq_thread_init(const char* thread_name) { return perfq::client().thread_init(thread_name); }

int perfq_wait_connected(int timeout_ms) {
  return perfq::client().wait_connected(timeout_ms) ? 1 : 0;
}

int perfq_connected(void) { return perfq::client().connected() ? 1 : 0; }

struct perfq_category* perfq_category(const char* name) {
  return perfq::client().category(name);
}

int perfq_category_enable(const char* name, int enabled) {
  return perfq::client().category_enable(name, enabled);
}

void perfq_read_stats(struct perfq_stats* out, size_t size) {
  if (!out) return;
  perfq_stats s{};
  perfq::client().stats(&s);
  std::memcpy(out, &s, std::min(size, sizeof(s)));
}

// The first release's struct perfq_stats ended with `threads`: 48 bytes.
static_assert(offsetof(perfq_stats, errors) == 48, "perfq_stats: fields are only ever appended");

// The first release's entry point (perfq.h's macro of the same name calls
// perfq_read_stats()): programs built against it have the struct up to
// `threads`.
void(perfq_get_stats)(struct perfq_stats* out) {
  perfq_read_stats(out, offsetof(perfq_stats, errors));
}

void perfq_shutdown(void) { perfq::client().shutdown(); }

}  // extern "C"
