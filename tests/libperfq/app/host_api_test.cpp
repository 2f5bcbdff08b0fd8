// The host instrumentation API (perfq.h, perfq.hpp) against HostApps, the
// daemon's registry.  The test plays the daemon: it listens on a Unix
// socket in a temporary directory, reads each hello line and hands the
// connection to HostApps::adopt(); the main thread is the collector.
// Applications are this process (the C++ API) or real child processes
// (perfq_test_app, the C API).
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "app/host_apps.h"
#include "core/region.h"
#include "core/ring.h"
#include "device/device.h"
#include "device/device_clock.h"
#include "host/drain.h"
#include "perfq/perfq.h"
#include "perfq/perfq.hpp"
#include "test_util.h"

namespace perfq {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

const std::string kTestApp = kBin + "/perfq_test_app";

// Read one '\n'-terminated line from a blocking socket, byte by byte (so
// nothing after it is consumed); with the fd passed along, if any.
std::string read_line_fd(int fd, int* passed_fd = nullptr) {
  std::string line;
  while (true) {
    char c;
    iovec iov{&c, 1};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int))];
    msg.msg_control = cbuf;
    msg.msg_controllen = sizeof(cbuf);
    const ssize_t n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    if (n <= 0) return line;
    for (cmsghdr* h = CMSG_FIRSTHDR(&msg); h; h = CMSG_NXTHDR(&msg, h))
      if (h->cmsg_type == SCM_RIGHTS && passed_fd)
        std::memcpy(passed_fd, CMSG_DATA(h), sizeof(int));
    if (c == '\n') return line;
    line.push_back(c);
  }
}

void set_timeout(int fd, int ms) {
  timeval tv{ms / 1000, (ms % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

// The daemon's connection handler, reduced to what HostApps needs.
class FakeDaemon {
 public:
  FakeDaemon(HostApps& apps, std::string path) : apps_(apps), path_(std::move(path)) {}
  ~FakeDaemon() {
    if (thread_.joinable()) {
      const uint64_t one = 1;
      [[maybe_unused]] ssize_t n = ::write(stop_.get(), &one, sizeof(one));
      thread_.join();
    }
    ::unlink(path_.c_str());
  }
  // Bind, listen and serve; false if the socket could not be set up.
  bool listen() {
    listen_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path_.c_str(), sizeof(a.sun_path) - 1);
    if (::bind(listen_.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return false;
    if (::listen(listen_.get(), 64) != 0) return false;
    stop_.reset(::eventfd(0, EFD_CLOEXEC));
    thread_ = std::thread([this] { serve(); });
    return true;
  }
  int adopted() const { return adopted_.load(); }
  int refused() const { return refused_.load(); }

 private:
  void serve() {
    while (true) {
      pollfd p[2] = {{listen_.get(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
      ::poll(p, 2, -1);
      if (p[1].revents) return;
      UniqueFd c(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!c.valid()) continue;
      set_timeout(c.get(), 2000);
      const std::string line = read_line_fd(c.get());
      ucred peer{};
      socklen_t len = sizeof(peer);
      ::getsockopt(c.get(), SOL_SOCKET, SO_PEERCRED, &peer, &len);
      const json hello = json::parse(line, nullptr, false);
      if (apps_.adopt(std::move(c), hello, peer))
        ++adopted_;
      else
        ++refused_;
    }
  }

  HostApps& apps_;
  std::string path_;
  UniqueFd listen_, stop_;
  std::thread thread_;
  std::atomic<int> adopted_{0}, refused_{0};
};

// What the collector (the test's main thread) got.
struct Collected {
  std::map<std::pair<uint16_t, uint16_t>, std::vector<perfq_record>> streams;
  std::map<uint16_t, TraceSource> sources;
  std::vector<TraceLoss> losses;
  uint64_t total = 0;

  uint64_t count(uint16_t source, uint32_t event = 0) const {
    uint64_t n = 0;
    for (const auto& [k, v] : streams)
      if (k.first == source)
        for (const auto& r : v) n += event == 0 || r.event == event;
    return n;
  }
  uint64_t lost(uint16_t source, TraceLossReason why) const {
    uint64_t n = 0;
    for (const auto& l : losses) n += l.source == source && l.reason == why ? l.count : 0;
    return n;
  }
  const TraceSource* by_pid(uint32_t pid) const {
    for (const auto& [id, s] : sources)
      if (s.pid == pid) return &s;
    return nullptr;
  }
  uint32_t event_id(uint16_t source, const std::string& name) const {
    auto it = sources.find(source);
    if (it == sources.end()) return 0;
    for (const auto& e : it->second.events)
      if (e.name == name) return e.event;
    return 0;
  }
};

// One collector pass: records, sources, losses.
void collect(HostApps& h, Collected& c) {
  c.total += h.drain([&](uint16_t source, std::span<const perfq_record> recs) {
    auto& v = c.streams[{source, recs.empty() ? uint16_t{0} : recs[0].stream}];
    v.insert(v.end(), recs.begin(), recs.end());
  });
  for (auto& s : h.take_changed_sources()) c.sources[s.id] = s;
  for (auto& l : h.take_losses(static_cast<int64_t>(monotonic_ns()))) c.losses.push_back(l);
}

// Collect until done() or the deadline; done()'s value.
bool collect_until(HostApps& h, Collected& c, const std::function<bool()>& done,
                   std::chrono::milliseconds timeout = 20s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    collect(h, c);
    if (done()) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
}

// Each stream's records carry index 0, 1, 2... (no gap, no reordering).
bool indices_contiguous(const std::vector<perfq_record>& v) {
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i].index != i) return false;
  return true;
}

json wait_json_line(Child& child, std::chrono::milliseconds timeout = 20s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    const std::string out = child.out();
    const auto brace = out.find('{');
    if (brace != std::string::npos && out.find('\n', brace) != std::string::npos)
      return json::parse(out.substr(brace, out.find('\n', brace) - brace), nullptr, false);
    if (!child.running() && child.out().find('{') == std::string::npos) break;
    std::this_thread::sleep_for(2ms);
  }
  return json();
}

bool wait_output(Child& child, const std::string& what, std::chrono::milliseconds timeout = 20s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (child.out().find(what) != std::string::npos) return true;
    std::this_thread::sleep_for(2ms);
  }
  return false;
}

HostAppsOptions opts(uint64_t ring_records = 1 << 16) {
  HostAppsOptions o;
  o.ring_records = ring_records;
  o.recording = true;
  return o;
}

// ---------------------------------------------------------------------------

TEST_CASE("host api: threads of this process record, every record arrives in order", "[host_api]") {
  TempDir dir("hostapi");
  HostApps apps(opts());
  FakeDaemon daemon(apps, dir.file("d.sock"));
  REQUIRE(daemon.listen());
  REQUIRE(perfq_init("host-api-test", dir.file("d.sock").c_str()) == 0);
  REQUIRE(perfq_init("again", nullptr) == -EALREADY);
  REQUIRE(perfq_wait_connected(10000) == 1);
  perfq_stats before{};
  perfq_get_stats(&before);

  const Event work{"work"};
  const Event tick{"tick", EventKind::kInstant};
  const Event depth{"depth", EventKind::kCounter};
  REQUIRE(work.id() != 0);
  REQUIRE(perfq_event("work", PERFQ_KIND_BEGIN) == work.id());  // idempotent
  REQUIRE(perfq_event("", PERFQ_KIND_BEGIN) == 0);
  REQUIRE(perfq_event("x", 9) == 0);
  REQUIRE(perfq_event(std::string(60, 'a').c_str(), PERFQ_KIND_INSTANT) == 0);

  constexpr unsigned kThreads = 4;
  constexpr uint64_t kIter = 5000;  // 3 records each
  std::atomic<int> ring_errors{0};
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      if (t % 2 == 0 && perfq_thread_init(("w" + std::to_string(t)).c_str()) != 0) ++ring_errors;
      for (uint64_t i = 0; i < kIter; ++i) {
        Scope s{work, uint64_t{t} << 32 | i};
        instant(tick, i);
        counter(depth, i * 2);
      }
    });
  Collected c;
  const uint64_t expected = kThreads * kIter * 4;
  const bool all = collect_until(apps, c, [&] { return c.total >= expected; });
  for (auto& th : threads) th.join();
  CHECK(ring_errors == 0);
  REQUIRE(all);
  CHECK(c.total == expected);
  perfq_stats after{};
  perfq_get_stats(&after);
  CHECK(after.recorded - before.recorded == expected);
  CHECK(after.lost == before.lost);
  CHECK(after.dropped == before.dropped);

  REQUIRE(c.sources.size() == 1);
  const TraceSource& src = c.sources.begin()->second;
  CHECK(src.kind == TraceSourceKind::kHost);
  CHECK(src.name == "host-api-test");
  CHECK(src.pid == static_cast<uint32_t>(getpid()));
  CHECK(src.id >= 256);
  CHECK(c.event_id(src.id, "work") == work.id());
  CHECK(c.event_id(src.id, "depth") == depth.id());

  REQUIRE(c.streams.size() == kThreads);
  for (const auto& [key, v] : c.streams) {
    REQUIRE(v.size() == kIter * 4);
    CHECK(indices_contiguous(v));
    const uint64_t t = v[0].arg >> 32;
    bool order_ok = true;
    for (uint64_t i = 0; i < kIter; ++i) {
      const perfq_record* r = &v[i * 4];
      order_ok &=
          (r[0].flags == PERFQ_FLAGS(PERFQ_KIND_BEGIN, PERFQ_CLOCK_HOST)) &&
          r[0].event == work.id() && r[0].arg == (t << 32 | i) &&
          r[1].flags == PERFQ_FLAGS(PERFQ_KIND_INSTANT, PERFQ_CLOCK_HOST) && r[1].arg == i &&
          r[2].flags == PERFQ_FLAGS(PERFQ_KIND_COUNTER, PERFQ_CLOCK_HOST) && r[2].arg == i * 2 &&
          r[3].flags == PERFQ_FLAGS(PERFQ_KIND_END, PERFQ_CLOCK_HOST) && r[3].arg == r[0].arg &&
          r[0].stream == key.second && r[0].time <= r[3].time &&
          (i == 0 || r[-1].time <= r[0].time);
    }
    CHECK(order_ok);
  }

  // An event registered while connected reaches the daemon before its records.
  const uint32_t late = perfq_event("late_event", PERFQ_KIND_INSTANT);
  REQUIRE(late != 0);
  perfq_instant(late, 42);
  REQUIRE(collect_until(apps, c, [&] { return c.count(src.id, late) == 1; }));
  CHECK(c.event_id(src.id, "late_event") == late);

  // The exited threads' rings are drained and retired; the main thread's
  // ring (it recorded the late event) remains until shutdown.
  REQUIRE(collect_until(apps, c, [&] { return apps.rings() == 1; }));
  CHECK(apps.apps() == 1);
  auto st = apps.stats();
  REQUIRE(st.size() == 1);
  CHECK(st[0].alive);
  CHECK(st[0].records == 1);
  perfq_shutdown();
  CHECK(perfq_connected() == 0);
  REQUIRE(collect_until(apps, c, [&] { return apps.apps() == 0 && apps.rings() == 0; }));
  // After shutdown recording is a no-op that counts.
  perfq_get_stats(&before);
  perfq_instant(late, 1);
  perfq_get_stats(&after);
  CHECK(after.dropped == before.dropped + 1);
  CHECK(after.recorded == before.recorded);
}

TEST_CASE("host api: not recording skips the store, and drained records are discarded",
          "[host_api]") {
  TempDir dir("hostapi");
  HostAppsOptions o = opts();
  o.recording = false;
  HostApps apps(o);
  FakeDaemon daemon(apps, dir.file("d.sock"));
  REQUIRE(daemon.listen());
  REQUIRE(perfq_init("rec-test", dir.file("d.sock").c_str()) == 0);
  REQUIRE(perfq_wait_connected(10000) == 1);
  const Event ev{"ev", EventKind::kInstant};
  perfq_stats before{}, after{};
  std::thread([&] {
    perfq_thread_init("off");
    perfq_get_stats(&before);
    for (int i = 0; i < 100; ++i) instant(ev, 1);
    perfq_get_stats(&after);
  }).join();
  CHECK(after.not_recording - before.not_recording == 100);
  CHECK(after.recorded == before.recorded);

  apps.set_recording(true);
  CHECK(apps.recording());
  std::thread t([&] {
    perfq_thread_init("on");
    for (int i = 0; i < 100; ++i) instant(ev, 2);
    apps.set_recording(false);
    for (int i = 0; i < 100; ++i) instant(ev, 3);
  });
  t.join();
  Collected c;
  REQUIRE(collect_until(apps, c, [&] { return apps.rings() == 0; }));
  CHECK(c.total == 0);  // drained while not recording: discarded
  perfq_shutdown();
}

TEST_CASE("host api: a C application killed with SIGKILL keeps every record it reported",
          "[host_api]") {
  TempDir dir("hostapi");
  HostApps apps(opts());
  FakeDaemon daemon(apps, dir.file("d.sock"));
  REQUIRE(daemon.listen());
  Child app({kTestApp, dir.file("d.sock"), "kill", "3", "5000"});
  REQUIRE(app.started());
  Collected c;
  const json r = wait_json_line(app);
  REQUIRE(r.is_object());
  CHECK(r["recorded"] == 15000);
  CHECK(r["dropped"] == 0);
  CHECK(r["lost"] == 0);
  app.signal(SIGKILL);
  REQUIRE(app.wait(10s));
  REQUIRE(collect_until(apps, c, [&] { return apps.apps() == 0 && apps.rings() == 0; }));
  const TraceSource* src = c.by_pid(static_cast<uint32_t>(app.pid()));
  REQUIRE(src);
  CHECK(src->name == "perfq-test-app");
  CHECK(c.count(src->id) == 15000);
  CHECK(c.streams.size() == 3);
  for (const auto& [k, v] : c.streams) CHECK(indices_contiguous(v));
}

TEST_CASE("host api: an application exiting mid-recording loses nothing of another", "[host_api]") {
  TempDir dir("hostapi");
  HostApps apps(opts());
  FakeDaemon daemon(apps, dir.file("d.sock"));
  REQUIRE(daemon.listen());
  Child quitter({kTestApp, dir.file("d.sock"), "midexit", "2", "20000"});
  Child steady({kTestApp, dir.file("d.sock"), "record", "2", "20000"});
  REQUIRE(quitter.started());
  REQUIRE(steady.started());
  Collected c;
  REQUIRE(collect_until(
      apps, c, [&] { return !quitter.running() && !steady.running(); }, 60s));
  INFO("quitter stderr: " << quitter.err() << "\nsteady stderr: " << steady.err());
  CHECK(quitter.exit_code() == 0);
  CHECK(steady.exit_code() == 0);
  REQUIRE(collect_until(apps, c, [&] { return apps.apps() == 0 && apps.rings() == 0; }));
  const json r = json::parse(steady.out(), nullptr, false);
  REQUIRE(r.is_object());
  const TraceSource* s = c.by_pid(static_cast<uint32_t>(steady.pid()));
  const TraceSource* q = c.by_pid(static_cast<uint32_t>(quitter.pid()));
  REQUIRE(s);
  REQUIRE(q);
  CHECK(r["recorded"] == 40000);
  CHECK(c.count(s->id) == 40000);
  CHECK(c.lost(s->id, TraceLossReason::kHostRingFull) == r["lost"].get<uint64_t>());
  CHECK(c.count(q->id) >= 20000);
  for (const auto& [k, v] : c.streams) CHECK(indices_contiguous(v));
}

TEST_CASE("host api: an application started before the daemon connects later", "[host_api]") {
  TempDir dir("hostapi");
  HostApps apps(opts());
  FakeDaemon daemon(apps, dir.file("d.sock"));
  Child app({kTestApp, dir.file("d.sock"), "early", "2", "1000"});
  REQUIRE(app.started());
  REQUIRE(wait_output(app, "waiting"));  // it records (into nothing) without a daemon
  REQUIRE(app.running());
  REQUIRE(daemon.listen());
  Collected c;
  REQUIRE(collect_until(apps, c, [&] { return !app.running(); }));
  CHECK(app.exit_code() == 0);
  REQUIRE(collect_until(apps, c, [&] { return apps.apps() == 0 && apps.rings() == 0; }));
  const json r = json::parse(app.out().substr(app.out().find('{')), nullptr, false);
  REQUIRE(r.is_object());
  const TraceSource* src = c.by_pid(static_cast<uint32_t>(app.pid()));
  REQUIRE(src);
  CHECK(c.count(src->id, c.event_id(src->id, "tick")) == 2000);
  CHECK(c.count(src->id) == r["recorded"].get<uint64_t>());
  CHECK(r["dropped"].get<uint64_t>() > 0);
  CHECK(r["connections"] == 1);
}

// TSan does not support threads started in the child of a multi-threaded fork.
#if !defined(__SANITIZE_THREAD__)
TEST_CASE("host api: a forked child connects as an application of its own", "[host_api]") {
  TempDir dir("hostapi");
  HostApps apps(opts());
  FakeDaemon daemon(apps, dir.file("d.sock"));
  REQUIRE(daemon.listen());
  Child app({kTestApp, dir.file("d.sock"), "fork", "1", "1000"});
  REQUIRE(app.started());
  Collected c;
  REQUIRE(collect_until(apps, c, [&] { return !app.running(); }));
  INFO("stderr: " << app.err());
  REQUIRE(app.exit_code() == 0);
  REQUIRE(collect_until(apps, c, [&] { return apps.apps() == 0 && apps.rings() == 0; }));
  std::istringstream lines(app.out());
  std::string child_line, parent_line;
  std::getline(lines, child_line);
  std::getline(lines, parent_line);
  const json cj = json::parse(child_line, nullptr, false);
  const json pj = json::parse(parent_line, nullptr, false);
  REQUIRE(cj.is_object());
  REQUIRE(pj.is_object());
  CHECK(cj["recorded"] == 1000);
  CHECK(pj["recorded"] == 2000);
  const TraceSource* parent = c.by_pid(static_cast<uint32_t>(app.pid()));
  const TraceSource* child = c.by_pid(cj["pid"].get<uint32_t>());
  REQUIRE(parent);
  REQUIRE(child);
  CHECK(parent->id != child->id);
  CHECK(c.count(parent->id) == 2000);
  CHECK(c.count(child->id) == 1000);
  for (const auto& [k, v] : c.streams) {
    CHECK(indices_contiguous(v));
    bool args_ok = true;  // the parent's 0..1999, the child's 1000000..
    for (size_t i = 0; i < v.size(); ++i)
      args_ok &= v[i].arg == (k.first == parent->id ? i : 1000000 + i);
    CHECK(args_ok);
  }
}
#endif

TEST_CASE("host api: without a daemon an application runs to completion at once", "[host_api]") {
  TempDir dir("hostapi");
  Child app({kTestApp, dir.file("nobody.sock"), "nodaemon", "2", "1000000"});
  REQUIRE(app.started());
  REQUIRE(app.wait(20s));
  CHECK(app.exit_code() == 0);
  const json r = json::parse(app.out(), nullptr, false);
  REQUIRE(r.is_object());
  CHECK(r["recorded"] == 0);
  CHECK(r["dropped"] == 2000000);
  CHECK(r["elapsed_ms"].get<double>() < 5000);
}

TEST_CASE("host api: a full ring counts every refused record", "[host_api]") {
  TempDir dir("hostapi");
  const uint64_t cap = GENERATE(64, 1024);
  HostApps apps(opts(cap));
  FakeDaemon daemon(apps, dir.file("d.sock"));
  REQUIRE(daemon.listen());
  // Nothing drains while the application records.
  Child app({kTestApp, dir.file("d.sock"), "record", "1", "5000"});
  REQUIRE(app.wait(20s));
  CHECK(app.exit_code() == 0);
  const json r = json::parse(app.out(), nullptr, false);
  REQUIRE(r.is_object());
  CHECK(r["recorded"] == cap);
  CHECK(r["lost"] == 5000 - cap);
  CHECK(r["recorded"].get<uint64_t>() + r["lost"].get<uint64_t>() ==
        r["attempted"].get<uint64_t>());
  Collected c;
  REQUIRE(collect_until(apps, c, [&] { return apps.apps() == 0 && apps.rings() == 0; }));
  const TraceSource* src = c.by_pid(static_cast<uint32_t>(app.pid()));
  REQUIRE(src);
  CHECK(c.count(src->id) == cap);
  CHECK(c.lost(src->id, TraceLossReason::kHostRingFull) == 5000 - cap);
}

TEST_CASE("host api: C scopes end on every way out, categories switch them, refusals are errors",
          "[host_api]") {
  TempDir dir("hostapi");
  HostApps apps(opts());
  FakeDaemon daemon(apps, dir.file("d.sock"));
  REQUIRE(daemon.listen());
  constexpr uint64_t kN = 1000;
  // PERFQ_CATEGORIES disables every category but "on".
  Child app({"/usr/bin/env", "PERFQ_CATEGORIES=-*,on", kTestApp, dir.file("d.sock"), "scopes", "1",
             std::to_string(kN)});
  REQUIRE(app.started());
  Collected c;
  REQUIRE(collect_until(apps, c, [&] { return !app.running(); }));
  INFO("stderr: " << app.err());
  REQUIRE(app.exit_code() == 0);  // 8: a refused call had no error or the wrong errno
  REQUIRE(collect_until(apps, c, [&] { return apps.apps() == 0 && apps.rings() == 0; }));
  const json r = json::parse(app.out(), nullptr, false);
  REQUIRE(r.is_object());
  // Two refused registrations, a refused category and a refused enable.
  CHECK(r["errors"] == 4);
  CHECK(r["recorded"] == 8 * kN);
  const TraceSource* src = c.by_pid(static_cast<uint32_t>(app.pid()));
  REQUIRE(src);
  // The refused registrations reached no dictionary: its 7 events (tick and
  // early of every mode, the 5 of this one), "span" still a span.
  CHECK(src->events.size() == 7);
  for (const auto& e : src->events)
    if (e.name == "span") CHECK(e.kind == PERFQ_KIND_BEGIN);
  const uint32_t span = c.event_id(src->id, "span"), on = c.event_id(src->id, "on_span"),
                 off = c.event_id(src->id, "off_span"), early = c.event_id(src->id, "early_return");
  REQUIRE(c.streams.size() == 1);
  const auto& v = c.streams.begin()->second;
  REQUIRE(v.size() == 8 * kN);
  CHECK(c.count(src->id, c.event_id(src->id, "off_tick")) == 0);
  auto is = [](const perfq_record& rec, uint32_t ev, unsigned kind, uint64_t arg) {
    return rec.event == ev && rec.flags == PERFQ_FLAGS(kind, PERFQ_CLOCK_HOST) && rec.arg == arg;
  };
  // Each iteration: scopes end in reverse order, the early return's too;
  // "off" records nothing until it is enabled, then begin and end.
  bool nested = true, switched = true;
  for (uint64_t i = 0; i < kN; ++i) {
    const perfq_record* p = &v[i * 6];
    nested &= is(p[0], span, PERFQ_KIND_BEGIN, i) && is(p[1], on, PERFQ_KIND_BEGIN, i) &&
              is(p[2], early, PERFQ_KIND_BEGIN, i) && is(p[3], early, PERFQ_KIND_END, i) &&
              is(p[4], on, PERFQ_KIND_END, i) && is(p[5], span, PERFQ_KIND_END, i);
    const perfq_record* q = &v[6 * kN + i * 2];
    switched &= is(q[0], off, PERFQ_KIND_BEGIN, kN + i) && is(q[1], off, PERFQ_KIND_END, kN + i);
  }
  CHECK(nested);
  CHECK(switched);
}

TEST_CASE("host api: C++ refusals say why, categories switch Scope", "[host_api]") {
  TempDir dir("hostapi");
  HostApps apps(opts());
  FakeDaemon daemon(apps, dir.file("d.sock"));
  REQUIRE(daemon.listen());
  REQUIRE(perfq_init("cxx-errors", dir.file("d.sock").c_str()) == 0);
  REQUIRE(perfq_wait_connected(10000) == 1);
  perfq_stats before{}, after{};
  perfq_get_stats(&before);

  const Event job{"job"};
  REQUIRE(job);
  CHECK(job.error() == 0);
  const Event again{"job", EventKind::kInstant};  // another kind
  CHECK_FALSE(again);
  CHECK(again.error() == EEXIST);
  // PERFQ_EVENT_NAME_LEN - 1 bytes is the longest name; one more is refused.
  const std::string longest(PERFQ_EVENT_NAME_LEN - 1, 'n');
  CHECK(Event(longest.c_str(), EventKind::kInstant));
  const Event too_long{(longest + "n").c_str(), EventKind::kInstant};
  CHECK(too_long.error() == ENAMETOOLONG);
  errno = 0;
  CHECK(perfq_event(nullptr, PERFQ_KIND_INSTANT) == 0);
  CHECK(errno == EINVAL);
  errno = 0;
  CHECK(perfq_event("k", 9) == 0);
  CHECK(errno == EINVAL);
  CHECK(perfq_event("job", PERFQ_KIND_BEGIN) == job.id());  // same name and kind: same id
  const Category bad{""};
  CHECK_FALSE(bad);
  CHECK(perfq_category_enable("", 1) == -EINVAL);
  CHECK_FALSE(bad);
  perfq_get_stats(&after);
  CHECK(after.errors - before.errors == 6);

  const Category cat{"cxx-test"};
  CHECK(cat);  // enabled unless PERFQ_CATEGORIES says otherwise
  perfq_stats s0{}, s1{};
  std::atomic<int> ring{-1}, switch_errors{0};
  std::atomic<bool> off_seen_on{false};
  std::thread([&] {
    ring = perfq_thread_init("cxx-scope");
    perfq_get_stats(&s0);
    { Scope s{cat, job, 1}; }
    switch_errors += perfq_category_enable("cxx-test", 0) != 0;
    off_seen_on = static_cast<bool>(cat);
    { Scope s{cat, job, 2}; }  // nothing
    { Scope s{job, 3}; }       // no category: always
    {
      switch_errors += perfq_category_enable("cxx-test", 1) != 0;
      Scope s{cat, job, 4};
      // Disabled inside: the begin was recorded, so the end comes too.
      switch_errors += perfq_category_enable("cxx-test", 0) != 0;
    }
    perfq_get_stats(&s1);
  }).join();
  REQUIRE(ring == 0);
  CHECK(switch_errors == 0);
  CHECK_FALSE(off_seen_on);
  CHECK(s1.recorded - s0.recorded == 6);
  Collected c;
  REQUIRE(collect_until(apps, c, [&] { return c.total >= 6; }));
  std::vector<uint64_t> args;
  for (const auto& [k, v] : c.streams)
    for (const auto& rec : v) args.push_back(rec.arg);
  CHECK(args == std::vector<uint64_t>{1, 1, 3, 3, 4, 4});
  perfq_shutdown();
}

TEST_CASE("host api: an event of two numbers brings their names to the daemon", "[host_api]") {
  TempDir dir("hostapi");
  HostApps apps(opts());
  FakeDaemon daemon(apps, dir.file("d.sock"));
  REQUIRE(daemon.listen());
  REQUIRE(perfq_init("two-args", dir.file("d.sock").c_str()) == 0);
  REQUIRE(perfq_wait_connected(10000) == 1);
  perfq_stats before{}, after{};
  perfq_get_stats(&before);

  const Event copy{"copy", EventKind::kSpan, "bytes", "queue"};
  REQUIRE(copy);
  CHECK(perfq_event2("copy", PERFQ_KIND_BEGIN, "bytes", "queue") == copy.id());
  // The same name as one number, or with other names: another event.
  CHECK(Event("copy", EventKind::kSpan).error() == EEXIST);
  CHECK(Event("copy", EventKind::kSpan, "bytes", "lane").error() == EEXIST);
  CHECK(Event("c2", EventKind::kCounter, "a", "b").error() == EINVAL);
  CHECK(Event("c3", EventKind::kInstant, "", "b").error() == EINVAL);
  errno = 0;
  CHECK(perfq_event2("c4", PERFQ_KIND_INSTANT, "a", nullptr) == 0);
  CHECK(errno == EINVAL);
  const std::string longest(PERFQ_ARG_NAME_LEN - 1, 'a');
  CHECK(Event("c5", EventKind::kInstant, longest.c_str(), "b"));
  CHECK(Event("c6", EventKind::kInstant, "a", (longest + "a").c_str()).error() == ENAMETOOLONG);
  perfq_get_stats(&after);
  CHECK(after.errors - before.errors == 6);

  std::thread([&] { Scope s{copy, arg2(4096, 3)}; }).join();
  Collected c;
  REQUIRE(collect_until(apps, c, [&] { return c.total >= 2; }));
  REQUIRE(c.sources.size() >= 1);
  const TraceSource* src = c.by_pid(static_cast<uint32_t>(getpid()));
  REQUIRE(src);
  const EventInfo* e = src->find_event(copy.id());
  REQUIRE(e);
  CHECK(e->args == std::vector<std::string>{"bytes", "queue"});
  for (const auto& [k, v] : c.streams)
    for (const auto& rec : v) CHECK(rec.arg == (uint64_t{4096} << 32 | 3));
  perfq_shutdown();
}

TEST_CASE("host api: an event whose one number is named (a byte count) brings its name",
          "[host_api]") {
  TempDir dir("hostapi");
  HostApps apps(opts());
  FakeDaemon daemon(apps, dir.file("d.sock"));
  REQUIRE(daemon.listen());
  REQUIRE(perfq_init("one-arg", dir.file("d.sock").c_str()) == 0);
  REQUIRE(perfq_wait_connected(10000) == 1);
  perfq_stats before{}, after{};
  perfq_get_stats(&before);

  const Event copy{"h2d", EventKind::kSpan, PERFQ_ARG_BYTES};
  REQUIRE(copy);
  CHECK(perfq_event_arg("h2d", PERFQ_KIND_BEGIN, "bytes") == copy.id());
  // Another arg name, none, or two: another event.
  CHECK(Event("h2d", EventKind::kSpan, "count").error() == EEXIST);
  CHECK(Event("h2d", EventKind::kSpan).error() == EEXIST);
  CHECK(Event("h2d", EventKind::kSpan, "bytes", "queue").error() == EEXIST);
  CHECK(Event("c1", EventKind::kCounter, PERFQ_ARG_BYTES).error() == EINVAL);
  CHECK(Event("c2", EventKind::kInstant, "").error() == EINVAL);
  errno = 0;
  CHECK(perfq_event_arg("c3", PERFQ_KIND_INSTANT, nullptr) == 0);
  CHECK(errno == EINVAL);
  const std::string longest(PERFQ_ARG_NAME_LEN - 1, 'a');
  CHECK(Event("c4", EventKind::kInstant, longest.c_str()));
  CHECK(Event("c5", EventKind::kInstant, (longest + "a").c_str()).error() == ENAMETOOLONG);
  perfq_get_stats(&after);
  CHECK(after.errors - before.errors == 7);

  std::thread([&] { Scope s{copy, 65536}; }).join();
  Collected c;
  REQUIRE(collect_until(apps, c, [&] { return c.total >= 2; }));
  const TraceSource* src = c.by_pid(static_cast<uint32_t>(getpid()));
  REQUIRE(src);
  const EventInfo* e = src->find_event(copy.id());
  REQUIRE(e);
  CHECK(e->args == std::vector<std::string>{"bytes"});
  CHECK(e->bytes() == EventInfo::Bytes::kWhole);
  for (const auto& [k, v] : c.streams)
    for (const auto& rec : v) CHECK(rec.arg == 65536);
  perfq_shutdown();
}

// A hand-written application speaking the protocol, badly.
class RawApp {
 public:
  explicit RawApp(const std::string& path) : fd_(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
    connected_ = ::connect(fd_.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    set_timeout(fd_.get(), 5000);
  }
  bool connected() const { return connected_; }
  void send(const std::string& s) {
    [[maybe_unused]] ssize_t n = ::send(fd_.get(), s.data(), s.size(), MSG_NOSIGNAL);
  }
  json request(const std::string& line, int* passed_fd = nullptr) {
    send(line + "\n");
    return json::parse(read_line_fd(fd_.get(), passed_fd), nullptr, false);
  }
  std::string read_line() { return read_line_fd(fd_.get()); }

 private:
  UniqueFd fd_;
  bool connected_ = false;
};

TEST_CASE("host api: malformed requests get errors and the registry carries on", "[host_api]") {
  TempDir dir("hostapi");
  HostApps apps(opts(256));
  FakeDaemon daemon(apps, dir.file("d.sock"));
  REQUIRE(daemon.listen());

  SECTION("bad hellos are refused") {
    for (const char* hello :
         {"garbage", "{\"cmd\":\"hello\"}", "{\"cmd\":\"app_hello\",\"version\":2,\"name\":\"x\"}",
          "{\"cmd\":\"app_hello\",\"version\":1}",
          "{\"cmd\":\"app_hello\",\"version\":1,\"name\":\"x\",\"events\":[{\"id\":0,"
          "\"name\":\"a\",\"kind\":3}]}",
          "{\"cmd\":\"app_hello\",\"version\":1,\"name\":\"x\",\"events\":[{\"id\":1,"
          "\"name\":\"a\",\"kind\":7}]}"}) {
      RawApp a(dir.file("d.sock"));
      REQUIRE(a.connected());
      const json r = a.request(hello);
      INFO(hello);
      REQUIRE(r.is_object());
      CHECK(r["ok"] == false);
      CHECK(r["error"].is_string());
      CHECK(a.read_line().empty());  // closed
    }
    // The handler counts after adopt() returns, the reply may come first.
    Collected c;
    CHECK(collect_until(apps, c, [&] { return daemon.refused() == 6; }));
    CHECK(apps.apps() == 0);
  }

  SECTION("bad requests, bad records and a corrupt ring are contained") {
    RawApp a(dir.file("d.sock"));
    REQUIRE(a.connected());
    json r = a.request(
        R"({"cmd":"app_hello","version":1,"pid":1,"name":"raw","events":[{"id":1,"name":"ok","kind":3}]})");
    REQUIRE(r["ok"] == true);
    const uint16_t source = r["source"].get<uint16_t>();
    CHECK(a.request("not json")["ok"] == false);
    CHECK(a.request("[1,2]")["ok"] == false);
    CHECK(a.request(R"({"cmd":"fly"})")["ok"] == false);
    CHECK(a.request(R"({"cmd":"events","events":[{"id":1,"name":"other","kind":3}]})")["ok"] ==
          false);  // id 1 is taken
    CHECK(a.request(R"({"cmd":"events","events":[{"id":2,"name":"two","kind":4}]})")["ok"] == true);
    // Arg names: one or two strings, none for a counter.
    for (const char* bad :
         {R"({"cmd":"events","events":[{"id":3,"name":"a","kind":3,"args":[]}]})",
          R"({"cmd":"events","events":[{"id":3,"name":"a","kind":3,"args":["a","b","c"]}]})",
          R"({"cmd":"events","events":[{"id":3,"name":"a","kind":3,"args":[7]}]})",
          R"({"cmd":"events","events":[{"id":3,"name":"a","kind":3,"args":"bytes"}]})",
          R"({"cmd":"events","events":[{"id":3,"name":"a","kind":4,"args":["bytes"]}]})"}) {
      INFO(bad);
      CHECK(a.request(bad)["ok"] == false);
    }
    CHECK(
        a.request(
            R"({"cmd":"events","events":[{"id":3,"name":"a","kind":3,"args":["bytes"]}]})")["ok"] ==
        true);
    int rfd = -1;
    r = a.request(R"({"cmd":"thread","tid":7,"name":"t7"})", &rfd);
    REQUIRE(r["ok"] == true);
    REQUIRE(rfd >= 0);
    UniqueFd ring_fd(rfd);
    struct stat st {};
    REQUIRE(::fstat(rfd, &st) == 0);
    // Sealed: the application cannot shrink the ring under the daemon.
    CHECK(::ftruncate(rfd, 4096) != 0);
    auto m = Mapping::map_shared(rfd, static_cast<size_t>(st.st_size), "ring");
    REQUIRE(m);
    auto* hdr = static_cast<perfq_app_ring_header*>(m->get());
    CHECK(hdr->magic == PERFQ_APP_RING_MAGIC);
    const uint16_t stream = hdr->stream;
    CHECK(stream == r["stream"].get<uint16_t>());
    CHECK(hdr->recording == 1);
    auto* spsc = reinterpret_cast<perfq_spsc_header*>(static_cast<uint8_t*>(m->get()) +
                                                      PERFQ_APP_RING_OFFSET_SPSC);
    auto* slots = reinterpret_cast<perfq_record*>(static_cast<uint8_t*>(m->get()) +
                                                  PERFQ_APP_RING_OFFSET_SLOTS);
    const uint16_t host_instant = PERFQ_FLAGS(PERFQ_KIND_INSTANT, PERFQ_CLOCK_HOST);
    slots[0] = {0, 1, stream, host_instant, 10, 1};                                    // good
    slots[1] = {1, 1, stream, PERFQ_FLAGS(PERFQ_KIND_LOST, PERFQ_CLOCK_HOST), 11, 2};  // kind
    slots[2] = {2, 1, stream, PERFQ_FLAGS(PERFQ_KIND_INSTANT, PERFQ_CLOCK_DEVICE), 12, 3};
    slots[3] = {3, 1, static_cast<uint16_t>(stream + 1), host_instant, 13, 4};      // stream
    slots[4] = {4, 9, stream, host_instant, 14, 5};                                 // event
    slots[5] = {5, 1, stream, static_cast<uint16_t>(host_instant | 0x100), 15, 6};  // reserved
    slots[6] = {6, 2, stream, PERFQ_FLAGS(PERFQ_KIND_COUNTER, PERFQ_CLOCK_HOST), 16, 7};  // good
    store_release(&spsc->tail, 7);
    Collected c;
    REQUIRE(collect_until(apps, c, [&] { return c.total == 2; }));
    CHECK(c.count(source) == 2);
    REQUIRE(collect_until(apps, c,
                          [&] { return c.lost(source, TraceLossReason::kInvalidRecord) == 5; }));
    // Now a tail far beyond head + capacity: the ring is retired, nothing read.
    store_release(&spsc->tail, 7 + 10000);
    REQUIRE(collect_until(apps, c, [&] { return apps.rings() == 0; }));
    CHECK(c.total == 2);
    // The connection still works; an oversized line ends it.
    CHECK(a.request(R"({"cmd":"fly"})")["ok"] == false);
    a.send(std::string(70 * 1024, 'x'));
    const json big = json::parse(a.read_line(), nullptr, false);
    REQUIRE(big.is_object());
    CHECK(big["ok"] == false);
    CHECK(a.read_line().empty());
    REQUIRE(collect_until(apps, c, [&] { return apps.apps() == 0; }));
  }

  // And a well-behaved application is served as ever.
  Child app({kTestApp, dir.file("d.sock"), "record", "1", "100"});
  Collected c;
  REQUIRE(collect_until(apps, c, [&] { return !app.running(); }));
  CHECK(app.exit_code() == 0);
  REQUIRE(collect_until(apps, c, [&] { return apps.rings() == 0; }));
  const TraceSource* src = c.by_pid(static_cast<uint32_t>(app.pid()));
  REQUIRE(src);
  CHECK(c.count(src->id) == 100);
}

// Source ids are 16 bits: a daemon that serves an application a second
// refused every application after 18 hours ("host source ids exhausted").
// Past the last fresh id, the ids of applications that ended are reused,
// but never within a recording that may list the one that had it.
TEST_CASE("host api: the ids of applications that ended are reused once the fresh ones run out",
          "[host_api]") {
  TempDir dir("hostapi");
  HostAppsOptions o = opts(256);
  o.recording = false;
  o.first_source_id = 0xfffe;  // two fresh ids
  HostApps apps(o);
  FakeDaemon daemon(apps, dir.file("d.sock"));
  REQUIRE(daemon.listen());
  const std::string hello = R"({"cmd":"app_hello","version":1,"pid":1,"name":"app"})";
  auto connect = [&] {
    auto a = std::make_unique<RawApp>(dir.file("d.sock"));
    REQUIRE(a->connected());
    const json r = a->request(hello);
    REQUIRE(r.is_object());
    return std::make_pair(std::move(a), r);
  };
  Collected c;
  // adopt() registers an application after its reply.
  auto wait_apps = [&](size_t n) {
    REQUIRE(collect_until(apps, c, [&] { return apps.apps() == n; }));
  };
  // The collector's drain drops an application that ended; take them.
  auto wait_gone = [&] {
    std::vector<uint16_t> gone;
    REQUIRE(collect_until(apps, c, [&] {
      for (uint16_t id : apps.take_gone_sources()) gone.push_back(id);
      return !gone.empty();
    }));
    return gone;
  };
  auto a = connect(), b = connect();
  REQUIRE(a.second["ok"] == true);
  REQUIRE(b.second["ok"] == true);
  CHECK(a.second["source"] == 0xfffe);
  CHECK(b.second["source"] == 0xffff);
  wait_apps(2);
  auto refused = connect();
  CHECK(refused.second["ok"] == false);
  CHECK(refused.second["error"].get<std::string>().find("host source ids exhausted") !=
        std::string::npos);
  refused.first.reset();

  // a ends while nothing records: its id is free once the collector took it
  // (until then the collector may still know it by that id).
  a.first.reset();
  CHECK(connect().second["ok"] == false);
  CHECK(wait_gone() == std::vector<uint16_t>{0xfffe});
  auto a2 = connect();
  REQUIRE(a2.second["ok"] == true);
  CHECK(a2.second["source"] == 0xfffe);
  wait_apps(2);

  // b ends during a recording: its id stays taken until the recording stops.
  apps.set_recording(true);
  b.first.reset();
  CHECK(wait_gone() == std::vector<uint16_t>{0xffff});
  CHECK(connect().second["ok"] == false);
  apps.set_recording(false);
  auto b2 = connect();
  REQUIRE(b2.second["ok"] == true);
  CHECK(b2.second["source"] == 0xffff);
  wait_apps(2);
}

TEST_CASE("host api: adopt refuses a bad hello on a socketpair", "[host_api]") {
  HostApps apps(opts());
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  UniqueFd mine(sv[0]);
  ucred peer{getpid(), getuid(), getgid()};
  const Status s = apps.adopt(UniqueFd(sv[1]), json::parse(R"({"cmd":"app_hello"})"), peer);
  CHECK_FALSE(s.is_ok());
  const json r = json::parse(read_line_fd(mine.get()), nullptr, false);
  REQUIRE(r.is_object());
  CHECK(r["ok"] == false);
  CHECK(apps.apps() == 0);
}

TEST_CASE("host api: perfq-demo-app records job_submit and job_complete of every job",
          "[host_api][process][jobs]") {
  TempDir dir("hostapi");
  TempShm shm("hostapi-jobs");
  HostApps apps(opts());
  FakeDaemon daemon(apps, dir.file("d.sock"));
  REQUIRE(daemon.listen());
  Child dev({kBin + "/perfq-devsim", "--region", shm.path(), "--create", "--rate", "0",
             "--job-workers", "2"});
  REQUIRE(dev.started());
  Region region = [&] {
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (true) {
      auto r = Region::open(shm.path());
      if (r.is_ok() && device_state(*r) != PERFQ_DEVICE_INIT) return std::move(r.value());
      REQUIRE(dev.running());
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      std::this_thread::sleep_for(5ms);
    }
  }();
  const uint64_t jobs = 300;
  Child app({kBin + "/perfq-demo-app", "--device", "shm:" + shm.path(), "--jobs",
             std::to_string(jobs), "--threads", "3", "--job-us", "20", "--socket",
             dir.file("d.sock"), "--connect-timeout", "10"});
  REQUIRE(app.started());
  DeviceDrain drain(region);  // keeps the device's ring from filling
  std::vector<perfq_record> device_records;
  Collected c;
  bool app_done = false;
  REQUIRE(collect_until(
      apps, c,
      [&] {
        (void)drain.poll(device_records);
        if (!app_done && !app.running()) {
          app_done = true;
          dev.signal(SIGTERM);
        }
        return app_done && apps.apps() == 0 && apps.rings() == 0;
      },
      60s));
  INFO("demo-app stderr: " << app.err());
  REQUIRE(app.exit_code() == 0);
  const json r = json::parse(app.out(), nullptr, false);
  REQUIRE(r.is_object());
  CHECK(r["completed"] == jobs);
  CHECK(r["host_events"]["recorded"] == 2 * jobs);
  CHECK(r["host_events"]["dropped"] == 0);
  CHECK(r["host_events"]["connected"] == true);
  const TraceSource* src = c.by_pid(static_cast<uint32_t>(app.pid()));
  REQUIRE(src);
  const uint32_t submit = c.event_id(src->id, "job_submit");
  const uint32_t complete = c.event_id(src->id, "job_complete");
  REQUIRE(submit != 0);
  REQUIRE(complete != 0);
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> when;  // corr id -> (submit, complete)
  std::map<uint64_t, int> seen;
  for (const auto& [k, v] : c.streams)
    for (const auto& rec : v) {
      if (rec.event == submit) when[rec.arg].first = rec.time;
      if (rec.event == complete) when[rec.arg].second = rec.time;
      ++seen[rec.arg];
    }
  CHECK(when.size() == jobs);
  uint64_t bad = 0;
  for (const auto& [corr, t] : when) bad += seen[corr] != 2 || t.first == 0 || t.second < t.first;
  CHECK(bad == 0);
  // The device stops once it has delivered what it holds.
  CHECK(collect_until(
      apps, c,
      [&] {
        (void)drain.poll(device_records);
        return drain.finished();
      },
      60s));
  // (perfq-devsim's own exit is checked by the devsim tests; the Child
  // destructor reaps it.)
}

}  // namespace
}  // namespace perfq
