// HostApps: the daemon's registry of instrumented host applications and
// their per-thread rings (the host "second queues").
//
// The daemon's control-socket handler reads an application's first line
// ({"cmd":"app_hello",...}), checks the peer's credentials and hands the
// connection over with adopt().  From then on HostApps owns it: it replies
// to the hello, and its own I/O thread serves every later request of the
// application (new event names, one ring per thread: a sealed memfd passed
// with SCM_RIGHTS) until the connection ends.  The protocol is described in
// libperfq/src/app/app_proto.h and perfq_abi.h ("Host application rings").
//
// The daemon's host collector thread calls drain() to move records out of
// every ring, take_changed_sources() for new or grown event dictionaries,
// and take_losses() for ring-full losses.  Rings of threads that exited
// (ring marked finished) or of applications that are gone (EOF on the
// connection, e.g. SIGKILL) are drained to the end and then retired.
//
// Applications are untrusted.  Everything read from a ring is validated:
// the tail (never more than capacity ahead of the head, never backwards),
// each record (kind begin/end/instant/counter, host clock domain, no
// reserved flag bits, the ring's own stream id, a registered event id).
// Invalid records are counted and dropped; a ring with a corrupt tail is
// retired with an error in its stats; a malformed request gets an error
// reply; an oversized one (over 64 KiB) ends that application's connection.
// Nothing an application does crashes the daemon or touches another
// application's data: its memfds are sealed against shrinking.
//
// Threading contract:
//   - adopt(), set_recording(), stats(), apps(): any thread, concurrently;
//   - drain(), take_changed_sources(), take_losses(): ONE collector thread
//     (the same one for all three);
//   - the destructor: once no other call is in progress.
// stats() figures of live rings are estimates (the rings keep moving).
#pragma once

#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>
#include <vector>

#include "core/mapping.h"
#include "perfq/perfq_abi.h"
#include "perfq/status.h"
#include "perfq/trace.h"

namespace perfq {

struct HostAppsOptions {
  uint64_t ring_records = 1 << 16;  // records per thread ring, a power of two (2 MiB)
  // Sources are numbered from here up; past 0xffff, the ids of applications
  // that ended are reused (take_gone_sources()), never within a recording
  // that may list the one that had it.
  uint16_t first_source_id = 256;
  size_t max_apps = 1024;             // connected applications at a time
  size_t max_threads_per_app = 1024;  // live rings of one application
  size_t max_events_per_app = 65535;  // event ids 1..max_events_per_app
  bool recording = false;             // initial set_recording() state
};

class HostApps {
 public:
  explicit HostApps(HostAppsOptions options = {});
  ~HostApps();  // stops the I/O thread, closes connections, unmaps rings
  HostApps(const HostApps&) = delete;
  HostApps& operator=(const HostApps&) = delete;

  // Take over an application's connection after its hello line.  Validates
  // the hello (cmd "app_hello", version 1, name, events), replies
  // {"ok":true,"source":S,...} and serves the connection from then on.  On
  // error the reply is {"ok":false,"error":...}, the connection is closed,
  // and the Status says why.  peer.pid is the application's pid.  Any thread.
  Status adopt(UniqueFd conn, const nlohmann::json& hello, const struct ucred& peer);

  // On: applications record (each ring's `recording` word is set) and
  // drain() hands records to its sink.  Off (the default): applications
  // skip recording, and records drained anyway are discarded and counted.
  void set_recording(bool on);
  bool recording() const;
  // Tell the applications to stop recording (each ring's `recording` word)
  // while drain() still hands what their rings hold to the sink: the first
  // step of stopping a recording without losing what was stored before it.
  // The next set_recording() sets the words again.  Any thread.
  void pause_applications();

  // Collector thread: move up to max_per_ring records out of every ring;
  // sink(source id, valid records in ring order, one thread's stream).
  // Returns records handed to the sink.
  using Sink = std::function<void(uint16_t source, std::span<const perfq_record>)>;
  size_t drain(const Sink& sink, size_t max_per_ring = 4096);

  // Collector thread: applications that connected, or registered more
  // events, since the last call (kind kHost, id, pid, name, all events).
  std::vector<TraceSource> take_changed_sources();
  // Collector thread: the sources of applications that ended and whose
  // rings were emptied, since the last call: a new recording must not list
  // them.  Their ids may be given to new applications from then on (once
  // the fresh ones ran out), or, taken during a recording, once it stops.
  std::vector<uint16_t> take_gone_sources();

  // Collector thread: records the applications could not record because a
  // ring was full (reason kHostRingFull, from the ring header's `lost`) and
  // records drain() refused as invalid (kInvalidRecord), since the last call.
  std::vector<TraceLoss> take_losses(int64_t now_ns);

  struct StreamStats {
    uint16_t source = 0;
    uint16_t stream = 0;
    uint32_t pid = 0;
    uint32_t tid = 0;
    std::string app, thread;
    uint64_t records = 0;    // drained and valid (handed over or discarded)
    uint64_t discarded = 0;  // of those, drained while not recording
    uint64_t lost = 0;       // ring full in the application (ring header)
    uint64_t invalid = 0;    // records refused by validation
    uint64_t fill = 0, capacity = 0;
    bool alive = false;  // thread and application still running
    std::string error;   // why the ring was retired early, if it was
  };
  std::vector<StreamStats> stats() const;  // any thread; live rings only
  size_t apps() const;                     // connected applications
  size_t rings() const;                    // rings not yet retired

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace perfq
