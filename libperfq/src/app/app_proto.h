// Internal: the application side of the control socket, as both ends speak
// it (client.cpp in the application, host_apps.cpp in the daemon).
//
// Line-delimited JSON over a Unix stream socket, one object per
// '\n'-terminated line of at most kAppMaxLine bytes.  Every request of the
// application gets exactly one reply line; the daemon never sends anything
// unasked, and the application sends nothing before it has read the reply
// to its previous request.
//
//   app -> daemon                                  daemon -> app
//   {"cmd":"app_hello","version":1,"pid":P,        {"ok":true,"source":S,"ring_records":C,
//    "name":"...","events":[{"id":1,                "recording":true}
//    "name":"job_submit","kind":3},...]}
//   {"cmd":"events","events":[{"id":..,            {"ok":true}
//    "name":..,"kind":..}]}
//   {"cmd":"thread","tid":T,"name":"worker-1"}     {"ok":true,"stream":N,"ring_records":C,
//                                                   "bytes":B}  + the ring's memfd (SCM_RIGHTS)
//   anything else, malformed, oversized            {"ok":false,"error":"..."}
//
// An oversized line also ends the connection.  Thread exit is not a message:
// the thread marks its ring finished (perfq_app_ring_header.finished);
// process exit is the connection's EOF.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>
#include <vector>

#include "app/json_lines.h"
#include "core/mapping.h"
#include "core/spsc_ring.h"
#include "perfq/event_info.h"
#include "perfq/perfq.h"
#include "perfq/status.h"

namespace perfq {

inline constexpr int kAppProtoVersion = 1;
// The longest name of one of an event's two args (perfq_event2()).
inline constexpr size_t kArgNameMax = PERFQ_ARG_NAME_LEN - 1;

// Printable ASCII, at most max bytes: names from applications end up in
// logs, status output and trace metadata.
std::string clean_name(const std::string& s, size_t max);

// One event as the "events" arrays carry it: {"id":..,"name":..,"kind":..},
// and "args":[name] for an event whose one number is named, [hi,lo] for one
// whose arg packs two 32-bit numbers.
nlohmann::json event_to_json(const EventInfo& e);
// An "events" array into *out, with the limits applied (ids 1..max_id,
// kinds BEGIN..COUNTER, names of 1 to PERFQ_EVENT_NAME_LEN - 1 bytes, no
// args or one or two of 1 to kArgNameMax bytes, none for a counter).
Status parse_events(const nlohmann::json& arr, size_t max_id, std::vector<EventInfo>* out);

// A thread's ring as the application maps it from the daemon's reply to
// "thread" and the memfd that came with it.
struct AppRing {
  Mapping mapping;
  perfq_app_ring_header* hdr = nullptr;
  perfq_spsc_header* spsc = nullptr;
  ChunkedProducer<perfq_record> producer;
  uint16_t stream = 0;
};
// Records an application publishes its tail per (perfq_abi.h, "Chunks"):
// PERFQ_APP_RING_CHUNK, or capacity / 8 in a smaller ring (at least 1).
constexpr uint64_t app_ring_chunk(uint64_t capacity) {
  return capacity / 8 >= PERFQ_APP_RING_CHUNK ? PERFQ_APP_RING_CHUNK
                                              : (capacity / 8 ? capacity / 8 : 1);
}
// Checked as an application must check what any daemon hands it: a stream
// id that fits, a power-of-two capacity within PERFQ_RING_CAPACITY_MAX, a
// memfd sealed against shrinking (else it could be cut short under the
// mapping: SIGBUS in the application's own record call) and large enough
// for that capacity, and a ring header (magic, version, stream) and SPSC
// header that agree with the reply.  Errc::kCorrupt for a reply or memfd
// that breaks the protocol (the client answers -EPROTO), another code when
// mapping it failed.  (tests/fuzz/fuzz_app_ring.cpp feeds it any bytes.)
Result<AppRing> attach_app_ring(int fd, const nlohmann::json& reply);

}  // namespace perfq
