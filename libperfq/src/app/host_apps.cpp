#include "app/host_apps.h"

#include "host/drain.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <unordered_map>
#include <utility>

#include "app/app_proto.h"
#include "core/spsc_ring.h"

namespace perfq {
namespace {

using json = nlohmann::json;

// An error reply as the line an application reads.
std::string error_line(const std::string& what) { return json_line(error_reply(what)); }

struct Ring {
  uint16_t source = 0, stream = 0;
  uint32_t pid = 0, tid = 0;
  std::string app, thread;
  uint64_t capacity = 0;
  Mapping mapping;
  perfq_app_ring_header* hdr = nullptr;
  perfq_spsc_header* spsc = nullptr;

  // Collector thread only.
  SpscConsumer<perfq_record> consumer;
  uint64_t lost_reported = 0;
  uint64_t invalid_reported = 0;
  uint64_t last_index = 0;
  uint64_t last_published = 0;  // the tail as the last pass saw it
  bool tail_still = false;      // it had not moved since the pass before
  bool retired = false;

  // Written by the collector, read by stats() (any thread).
  std::atomic<uint64_t> records{0}, discarded{0}, invalid{0}, lost_seen{0};
  std::atomic<bool> app_gone{false};  // set by the I/O thread
  std::string error;                  // under the registry mutex
};

struct App {
  uint16_t source = 0;
  uint32_t pid = 0;
  std::string name;
  UniqueFd fd;                       // I/O thread (and adopt, before the app is listed)
  LineBuffer in;                     // I/O thread
  bool connected = true;             // under mu
  bool changed = true;               // dictionary not yet taken; under mu
  std::vector<EventInfo> events;     // under mu
  std::vector<TraceThread> threads;  // every ring's thread so far; under mu
  // id -> registered; replaced (never modified) under mu, read by drain.
  std::shared_ptr<const std::vector<uint8_t>> known;
  std::vector<std::shared_ptr<Ring>> rings;  // under mu
  uint32_t next_stream = 0;                  // under mu
};

// What a recording's metadata says of an application (under mu).
TraceSource source_of(const App& a) {
  TraceSource s;
  s.id = a.source;
  s.kind = TraceSourceKind::kHost;
  s.name = a.name;
  s.pid = a.pid;
  s.events = a.events;
  s.threads = a.threads;
  return s;
}

}  // namespace

struct HostApps::Impl {
  explicit Impl(HostAppsOptions o) : opts(o), recording(o.recording) {}

  HostAppsOptions opts;
  mutable std::mutex mu;
  bool recording;                          // under mu
  std::vector<std::shared_ptr<App>> apps;  // under mu; connected or with rings left
  uint32_t next_source = 0;                // under mu
  std::vector<uint16_t> gone;              // under mu: sources of applications dropped
  // Under mu: ids of applications that ended, once the collector took them
  // (take_gone_sources()), for reuse after the fresh ids run out: free now,
  // or held until the recording that may list them stops.
  std::deque<uint16_t> free_ids;
  std::vector<uint16_t> held_ids;
  std::vector<TraceSource> departed;  // under mu: their changes not yet taken
  bool stopping = false;              // under mu
  UniqueFd wake;                      // eventfd: wakes the I/O thread
  std::thread io;

  // Collector thread only.
  std::vector<perfq_record> batch;
  std::vector<TraceLoss> pending_losses;  // of rings retired since take_losses

  void wake_io() {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake.get(), &one, sizeof(one));
  }

  // Add events to an app (under mu); error if an id is reused for another name.
  Status add_events_locked(App& app, const std::vector<EventInfo>& evs) {
    auto known =
        std::make_shared<std::vector<uint8_t>>(app.known ? *app.known : std::vector<uint8_t>{});
    std::vector<EventInfo> added;
    for (const auto& e : evs) {
      if (e.event < known->size() && (*known)[e.event]) {
        auto it = std::find_if(app.events.begin(), app.events.end(),
                               [&](const EventInfo& x) { return x.event == e.event; });
        if (it != app.events.end() && it->name != e.name)
          return Status(Errc::kInvalidArgument,
                        "event id " + std::to_string(e.event) + " already names " + it->name);
        continue;
      }
      if (known->size() <= e.event) known->resize(e.event + 1, 0);
      (*known)[e.event] = 1;
      added.push_back(e);
    }
    if (added.empty()) return Status::ok();
    app.events.insert(app.events.end(), added.begin(), added.end());
    app.known = std::move(known);
    app.changed = true;
    return Status::ok();
  }

  // I/O thread: one ring for a thread of app.  Returns the memfd to pass.
  Result<UniqueFd> create_ring(const std::shared_ptr<App>& app, uint32_t tid,
                               const std::string& thread_name, uint16_t* stream_out) {
    const uint64_t cap = opts.ring_records;
    size_t bytes = PERFQ_APP_RING_OFFSET_SLOTS + cap * sizeof(perfq_record);
    bytes = (bytes + PERFQ_PAGE_SIZE - 1) / PERFQ_PAGE_SIZE * PERFQ_PAGE_SIZE;
    UniqueFd fd(::memfd_create("perfq-app-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!fd.valid()) return Status::from_errno("memfd_create");
    if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0)
      return Status::from_errno("ftruncate");
    // The application can neither shrink the file under our mapping (SIGBUS) nor grow it.
    if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
      return Status::from_errno("seal memfd");
    auto m = Mapping::map_shared(fd.get(), bytes, "app ring");
    if (!m) return m.status();
    auto* base = static_cast<uint8_t*>(m->get());
    auto mem = SpscRingMemory<perfq_record>::init(base + PERFQ_APP_RING_OFFSET_SPSC,
                                                  bytes - PERFQ_APP_RING_OFFSET_SPSC, cap);
    if (!mem) return mem.status();
    auto ring = std::make_shared<Ring>();
    ring->capacity = cap;
    ring->hdr = reinterpret_cast<perfq_app_ring_header*>(base);
    ring->spsc = mem->header();
    ring->consumer = mem->consumer();
    ring->mapping = std::move(*m);
    ring->tid = tid;
    ring->thread = thread_name;
    std::lock_guard l(mu);
    if (!app->connected) return Status(Errc::kUnavailable, "application gone");
    size_t live = 0;
    for (const auto& r : app->rings) live += r->retired ? 0 : 1;
    if (live >= opts.max_threads_per_app)
      return Status(Errc::kInvalidArgument,
                    "too many threads (max " + std::to_string(opts.max_threads_per_app) + ")");
    if (app->next_stream > 0xffff)
      return Status(Errc::kInvalidArgument, "stream ids of this application exhausted");
    ring->source = app->source;
    ring->stream = static_cast<uint16_t>(app->next_stream++);
    ring->pid = app->pid;
    app->threads.push_back({ring->stream, tid, thread_name});
    app->changed = true;
    ring->app = app->name;
    ring->hdr->version = PERFQ_ABI_VERSION;
    ring->hdr->stream = ring->stream;
    store_relaxed(&ring->hdr->recording, recording ? 1 : 0);
    // Pairs with the application's load_acquire of the magic.
    store_release(&ring->hdr->magic, PERFQ_APP_RING_MAGIC);
    app->rings.push_back(ring);
    *stream_out = ring->stream;
    return fd;
  }

  // I/O thread: serve one request line; false ends the connection.
  bool handle_line(const std::shared_ptr<App>& app, const std::string& line) {
    const json req = json::parse(line, nullptr, false);
    if (req.is_discarded() || !req.is_object() || !req.contains("cmd") || !req["cmd"].is_string())
      return send_line(app->fd.get(), error_line("malformed request: expected a JSON object "
                                                 "with a \"cmd\""))
          .is_ok();
    const std::string cmd = req["cmd"].get<std::string>();
    if (cmd == "thread") {
      const uint32_t tid = req.contains("tid") && req["tid"].is_number_unsigned()
                               ? static_cast<uint32_t>(req["tid"].get<uint64_t>())
                               : 0;
      const std::string name = req.contains("name") && req["name"].is_string()
                                   ? clean_name(req["name"].get<std::string>(), 64)
                                   : "tid " + std::to_string(tid);
      uint16_t stream = 0;
      auto fd = create_ring(app, tid, name, &stream);
      if (!fd) return send_line(app->fd.get(), error_line(fd.status().message())).is_ok();
      return send_line(app->fd.get(),
                       json_line({{"ok", true},
                                  {"stream", stream},
                                  {"ring_records", opts.ring_records},
                                  {"bytes", PERFQ_APP_RING_OFFSET_SLOTS +
                                                opts.ring_records * sizeof(perfq_record)}}),
                       fd->get())
          .is_ok();
    }
    if (cmd == "events") {
      std::vector<EventInfo> evs;
      Status s = parse_events(req.contains("events") ? req["events"] : json(),
                              opts.max_events_per_app, &evs);
      if (s) {
        std::lock_guard l(mu);
        s = add_events_locked(*app, evs);
      }
      return send_line(app->fd.get(), s ? json_line({{"ok", true}}) : error_line(s.message()))
          .is_ok();
    }
    return send_line(app->fd.get(), error_line("unknown command \"" + clean_name(cmd, 32) + "\""))
        .is_ok();
  }

  // I/O thread: read what the app sent; false when the connection ends.
  bool serve(const std::shared_ptr<App>& app) {
    for (int chunk = 0; chunk < 16; ++chunk) {
      const long n = recv_chunk(app->fd.get(), app->in, nullptr);
      if (n == -EAGAIN || n == -EWOULDBLOCK) return true;
      if (n <= 0) return false;
      while (auto line = app->in.next_line()) {
        if (line->size() > kAppMaxLine) {
          (void)send_line(app->fd.get(), error_line("request longer than 64 KiB"));
          return false;
        }
        if (!handle_line(app, *line)) return false;
      }
      if (app->in.overflow()) {
        (void)send_line(app->fd.get(), error_line("request longer than 64 KiB"));
        return false;
      }
    }
    return true;
  }

  void disconnect(const std::shared_ptr<App>& app) {
    std::lock_guard l(mu);
    app->connected = false;
    for (auto& r : app->rings) r->app_gone.store(true, std::memory_order_release);
    app->fd.reset();
  }

  void io_main() {
    std::vector<pollfd> pfds;
    std::vector<std::shared_ptr<App>> polled;
    while (true) {
      pfds.clear();
      polled.clear();
      {
        std::lock_guard l(mu);
        if (stopping) return;
        for (auto& a : apps)
          if (a->connected) polled.push_back(a);
      }
      pfds.push_back({wake.get(), POLLIN, 0});
      for (auto& a : polled) pfds.push_back({a->fd.get(), POLLIN, 0});
      if (::poll(pfds.data(), pfds.size(), -1) < 0 && errno != EINTR) return;
      if (pfds[0].revents & POLLIN) {
        uint64_t v;
        [[maybe_unused]] ssize_t n = ::read(wake.get(), &v, sizeof(v));
      }
      for (size_t i = 0; i < polled.size(); ++i) {
        if (!pfds[i + 1].revents) continue;
        bool ok = true;
        try {
          ok = serve(polled[i]);
        } catch (...) {
          ok = false;  // out of memory serving one app: drop it, not the daemon
        }
        if (!ok) disconnect(polled[i]);
      }
    }
  }

  // Collector: drain one ring; returns records handed over.
  size_t drain_ring(Ring& r, const std::vector<uint8_t>* known, bool rec, const Sink& sink,
                    size_t max) {
    if (r.retired) return 0;
    // Read the end markers before peeking: pairs with the application's
    // store_release of `finished` after its last tail (and the process being
    // gone after EOF); an empty ring after this is empty for good.
    const bool gone =
        r.app_gone.load(std::memory_order_acquire) || load_acquire(&r.hdr->finished) != 0;
    size_t handed = 0;
    // The application publishes its tail per chunk (perfq_abi.h, "Chunks"):
    // what it wrote past it is taken through `written` once the tail has
    // stood still for a pass (a quiet thread), or for good (it ended, a
    // stop's full pass); never while the tail moves, so this thread does not
    // read the lines a busy application is writing.
    const bool take_written = gone || max == SIZE_MAX || r.tail_still;
    auto s = take_written ? r.consumer.peek_written(&r.spsc->written, max) : r.consumer.peek(max);
    r.tail_still = r.consumer.published() == r.last_published;
    r.last_published = r.consumer.published();
    if (r.consumer.fault()) {
      std::lock_guard l(mu);
      r.error = "ring fault: " + r.consumer.fault().describe();
      retire(r);
      return 0;
    }
    if (!s.empty()) {
      batch.clear();
      uint64_t invalid = 0;
      for (size_t i = 0; i < s.size(); ++i) {
        const perfq_record rec_i = s[i];  // one copy: the app may be rewriting it
        if (!validate_record(rec_i, RecordOrigin::kHostApp).empty() || rec_i.stream != r.stream ||
            !known || rec_i.event >= known->size() || !(*known)[rec_i.event]) {
          ++invalid;
          continue;
        }
        batch.push_back(rec_i);
        r.last_index = rec_i.index;
      }
      r.consumer.release(s.size());
      if (invalid)
        r.invalid.store(r.invalid.load(std::memory_order_relaxed) + invalid,
                        std::memory_order_relaxed);
      r.records.store(r.records.load(std::memory_order_relaxed) + batch.size(),
                      std::memory_order_relaxed);
      if (!rec) {
        r.discarded.store(r.discarded.load(std::memory_order_relaxed) + batch.size(),
                          std::memory_order_relaxed);
      } else if (!batch.empty()) {
        sink(r.source, std::span<const perfq_record>(batch.data(), batch.size()));
        handed = batch.size();
      }
      return handed;
    }
    if (gone) {
      std::lock_guard l(mu);
      retire(r);
    }
    return 0;
  }

  // Collector, under mu: the ring is done; its last losses stay pending.
  void retire(Ring& r) {
    if (r.retired) return;
    collect_losses(r, 0, &pending_losses);
    r.retired = true;
  }

  void collect_losses(Ring& r, int64_t now_ns, std::vector<TraceLoss>* out) {
    const uint64_t lost = load_relaxed(&r.spsc->lost);
    // An application could write anything here: only growth counts.
    if (lost > r.lost_reported) {
      out->push_back({r.source, r.stream, TraceLossReason::kHostRingFull, lost - r.lost_reported,
                      now_ns, r.last_index});
      r.lost_reported = lost;
      r.lost_seen.store(lost, std::memory_order_relaxed);
    }
    const uint64_t invalid = r.invalid.load(std::memory_order_relaxed);
    if (invalid > r.invalid_reported) {
      out->push_back({r.source, r.stream, TraceLossReason::kInvalidRecord,
                      invalid - r.invalid_reported, now_ns, r.last_index});
      r.invalid_reported = invalid;
    }
  }
};

HostApps::HostApps(HostAppsOptions options) : impl_(std::make_unique<Impl>(options)) {
  if (!is_pow2(impl_->opts.ring_records) || impl_->opts.ring_records < PERFQ_RING_CAPACITY_MIN ||
      impl_->opts.ring_records > (1ull << 26))
    throw std::invalid_argument("HostAppsOptions.ring_records must be a power of two, 2..2^26");
  impl_->next_source = impl_->opts.first_source_id;
  impl_->wake.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!impl_->wake.valid()) throw std::system_error(errno, std::generic_category(), "eventfd");
  impl_->io = std::thread([this] { impl_->io_main(); });
}

HostApps::~HostApps() {
  {
    std::lock_guard l(impl_->mu);
    impl_->stopping = true;
  }
  impl_->wake_io();
  impl_->io.join();
}

Status HostApps::adopt(UniqueFd conn, const nlohmann::json& hello, const struct ucred& peer) {
  auto refuse = [&](Status s) {
    (void)send_line(conn.get(), error_line(s.message()));
    return s;
  };
  try {
    if (!hello.is_object() || hello.value("cmd", std::string()) != "app_hello")
      return refuse(Status(Errc::kInvalidArgument, "expected {\"cmd\":\"app_hello\",...}"));
    if (!hello.contains("version") || !hello["version"].is_number_integer() ||
        hello["version"].get<int64_t>() != kAppProtoVersion)
      return refuse(Status(Errc::kInvalidArgument, "unsupported app protocol version (need 1)"));
    if (!hello.contains("name") || !hello["name"].is_string() ||
        hello["name"].get<std::string>().empty())
      return refuse(Status(Errc::kInvalidArgument, "app_hello needs a name"));
    std::vector<EventInfo> evs;
    if (Status s = parse_events(hello.contains("events") ? hello["events"] : json::array(),
                                impl_->opts.max_events_per_app, &evs);
        !s)
      return refuse(s);
    auto app = std::make_shared<App>();
    app->pid = static_cast<uint32_t>(peer.pid);
    app->name = clean_name(hello["name"].get<std::string>(), 64);
    {
      std::lock_guard l(impl_->mu);
      size_t connected = 0;
      for (const auto& a : impl_->apps) connected += a->connected ? 1 : 0;
      if (connected >= impl_->opts.max_apps)
        return refuse(Status(Errc::kUnavailable, "too many applications connected (max " +
                                                     std::to_string(impl_->opts.max_apps) + ")"));
      if (impl_->next_source > 0xffff && impl_->free_ids.empty())
        return refuse(Status(
            Errc::kUnavailable,
            "host source ids exhausted: all " +
                std::to_string(0x10000 - impl_->opts.first_source_id) +
                " are applications connected, or that ended during the current recording (their "
                "ids are free again once it stops)"));
      if (Status s = impl_->add_events_locked(*app, evs); !s) return refuse(s);
      if (impl_->next_source <= 0xffff) {
        app->source = static_cast<uint16_t>(impl_->next_source++);
      } else {
        app->source = impl_->free_ids.front();
        impl_->free_ids.pop_front();
      }
    }
    const int fl = ::fcntl(conn.get(), F_GETFL);
    if (fl < 0 || ::fcntl(conn.get(), F_SETFL, fl | O_NONBLOCK) != 0)
      return Status::from_errno("fcntl O_NONBLOCK");
    bool rec;
    {
      std::lock_guard l(impl_->mu);
      rec = impl_->recording;
    }
    // Reply before the I/O thread sees the connection: the app sends nothing
    // before it has read this line.
    if (Status s = send_line(conn.get(), json_line({{"ok", true},
                                                    {"source", app->source},
                                                    {"ring_records", impl_->opts.ring_records},
                                                    {"recording", rec}}));
        !s)
      return s;
    app->fd = std::move(conn);
    {
      std::lock_guard l(impl_->mu);
      impl_->apps.push_back(app);
    }
    impl_->wake_io();
    return Status::ok();
  } catch (const std::exception& e) {
    return refuse(Status(Errc::kInvalidArgument, std::string("bad app_hello: ") + e.what()));
  }
}

void HostApps::set_recording(bool on) {
  std::lock_guard l(impl_->mu);
  impl_->recording = on;
  if (!on) {
    impl_->free_ids.insert(impl_->free_ids.end(), impl_->held_ids.begin(), impl_->held_ids.end());
    impl_->held_ids.clear();
  }
  for (auto& a : impl_->apps)
    for (auto& r : a->rings)
      if (!r->retired) store_relaxed(&r->hdr->recording, on ? 1 : 0);
}

void HostApps::pause_applications() {
  std::lock_guard l(impl_->mu);
  for (auto& a : impl_->apps)
    for (auto& r : a->rings)
      if (!r->retired) store_relaxed(&r->hdr->recording, 0);
}

bool HostApps::recording() const {
  std::lock_guard l(impl_->mu);
  return impl_->recording;
}

size_t HostApps::drain(const Sink& sink, size_t max_per_ring) {
  struct Item {
    std::shared_ptr<Ring> ring;
    std::shared_ptr<const std::vector<uint8_t>> known;
  };
  std::vector<Item> items;
  bool rec;
  {
    std::lock_guard l(impl_->mu);
    rec = impl_->recording;
    for (auto& a : impl_->apps)
      for (auto& r : a->rings)
        if (!r->retired) items.push_back({r, a->known});
  }
  if (max_per_ring == 0) max_per_ring = 1;
  size_t moved = 0;
  bool any_retired = false;
  for (auto& it : items) {
    moved += impl_->drain_ring(*it.ring, it.known.get(), rec, sink, max_per_ring);
    any_retired |= it.ring->retired;
  }
  if (any_retired) {
    std::lock_guard l(impl_->mu);
    for (auto& a : impl_->apps)
      a->rings.erase(std::remove_if(a->rings.begin(), a->rings.end(),
                                    [](const std::shared_ptr<Ring>& r) { return r->retired; }),
                     a->rings.end());
  }
  {
    std::lock_guard l(impl_->mu);
    impl_->apps.erase(std::remove_if(impl_->apps.begin(), impl_->apps.end(),
                                     [&](const std::shared_ptr<App>& a) {
                                       if (a->connected || !a->rings.empty()) return false;
                                       // Its last change still reaches the recording.
                                       if (a->changed) impl_->departed.push_back(source_of(*a));
                                       impl_->gone.push_back(a->source);
                                       return true;
                                     }),
                      impl_->apps.end());
  }
  return moved;
}

std::vector<TraceSource> HostApps::take_changed_sources() {
  std::lock_guard l(impl_->mu);
  std::vector<TraceSource> out = std::exchange(impl_->departed, {});
  for (auto& a : impl_->apps) {
    if (!a->changed) continue;
    a->changed = false;
    out.push_back(source_of(*a));
  }
  return out;
}

std::vector<uint16_t> HostApps::take_gone_sources() {
  std::lock_guard l(impl_->mu);
  std::vector<uint16_t> out = std::exchange(impl_->gone, {});
  // Free once the collector forgot them (a reused id taken before would be
  // forgotten with the application that had it), and not within a
  // recording that may list them.
  if (impl_->recording)
    impl_->held_ids.insert(impl_->held_ids.end(), out.begin(), out.end());
  else
    impl_->free_ids.insert(impl_->free_ids.end(), out.begin(), out.end());
  return out;
}

std::vector<TraceLoss> HostApps::take_losses(int64_t now_ns) {
  std::vector<TraceLoss> out;
  out.swap(impl_->pending_losses);
  for (auto& l : out) l.time_ns = now_ns;
  std::vector<std::shared_ptr<Ring>> rings;
  {
    std::lock_guard l(impl_->mu);
    for (auto& a : impl_->apps)
      for (auto& r : a->rings)
        if (!r->retired) rings.push_back(r);
  }
  for (auto& r : rings) impl_->collect_losses(*r, now_ns, &out);
  return out;
}

std::vector<HostApps::StreamStats> HostApps::stats() const {
  std::vector<StreamStats> out;
  std::lock_guard l(impl_->mu);
  for (const auto& a : impl_->apps)
    for (const auto& r : a->rings) {
      StreamStats s;
      s.source = r->source;
      s.stream = r->stream;
      s.pid = r->pid;
      s.tid = r->tid;
      s.app = r->app;
      s.thread = r->thread;
      s.records = r->records.load(std::memory_order_relaxed);
      s.discarded = r->discarded.load(std::memory_order_relaxed);
      s.invalid = r->invalid.load(std::memory_order_relaxed);
      s.lost = std::max(r->lost_seen.load(std::memory_order_relaxed), load_relaxed(&r->spsc->lost));
      // Written or published (a chunk in progress is in the ring too).
      const uint64_t tail = std::max(load_acquire(&r->spsc->tail), load_acquire(&r->spsc->written));
      const uint64_t head = load_acquire(&r->spsc->head);
      s.fill = tail >= head ? std::min(tail - head, r->capacity) : 0;
      s.capacity = r->capacity;
      s.alive = !r->retired && !r->app_gone.load(std::memory_order_relaxed) &&
                load_relaxed(&r->hdr->finished) == 0;
      s.error = r->error;
      out.push_back(std::move(s));
    }
  return out;
}

size_t HostApps::apps() const {
  std::lock_guard l(impl_->mu);
  size_t n = 0;
  for (const auto& a : impl_->apps) n += a->connected ? 1 : 0;
  return n;
}

size_t HostApps::rings() const {
  std::lock_guard l(impl_->mu);
  size_t n = 0;
  for (const auto& a : impl_->apps) n += a->rings.size();
  return n;
}

}  // namespace perfq
