#include "device/device.h"

#include "sync/sync_buffer.h"

#include <time.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <thread>

namespace perfq {

DeviceQueue::DeviceQueue(uint16_t stream, uint64_t queue_capacity, const DeviceClock& clock)
    : clock_(clock) {
  if (!is_pow2(queue_capacity) || queue_capacity < 2)
    throw std::invalid_argument("device queue capacity " + std::to_string(queue_capacity) +
                                " is not a power of two >= 2");
  const size_t bytes = queue_capacity * sizeof(perfq_record);
  slots_.reset(static_cast<perfq_record*>(std::aligned_alloc(PERFQ_CACHELINE, bytes)));
  if (!slots_) throw std::bad_alloc();
  std::memset(slots_.get(), 0, bytes);
  (void)perfq_dev_queue_init(&q_, stream, slots_.get(), queue_capacity);
}

DeviceCollector::DeviceCollector(const Region& region, std::vector<DeviceQueue*> streams,
                                 const DeviceClock& clock, CollectorOptions opts)
    : region_(region),
      streams_(std::move(streams)),
      opts_(opts),
      port_(device_port(clock)),
      delivery_(streams_.size()) {
  for (DeviceQueue* s : streams_) queues_.push_back(s->sdk());
  (void)perfq_dev_collector_init(&c_, region_.base(), &region_.header(), queues_.data(),
                                 delivery_.data(), static_cast<uint32_t>(queues_.size()), &port_);
  c_.batch = static_cast<uint32_t>(std::clamp<size_t>(opts_.batch, 1, UINT32_MAX));
  if (opts_.mode_b) {
    mode_b_ = std::make_unique<perfq_dev_mode_b>();
    perfq_dev_mode_b_init(mode_b_.get(), region_.base(), &region_.header());
    const perfq_dev_converter conv{perfq_dev_mode_b_poll, perfq_dev_mode_b_convert, mode_b_.get()};
    perfq_dev_collector_set_converter(&c_, &conv);
  }
}

RingFault DeviceCollector::fault() const {
  RingFault f;
  switch (perfq_dev_collector_fault(&c_)) {
    case PERFQ_DEV_FAULT_NONE:
      return f;
    case PERFQ_DEV_FAULT_HEAD_AHEAD:
      f.kind = RingFault::Kind::kHeadAheadOfTail;
      break;
    case PERFQ_DEV_FAULT_HEAD_BACKWARDS:
      f.kind = RingFault::Kind::kHeadMovedBackwards;
      break;
    case PERFQ_DEV_FAULT_HEAD_TOO_FAR:
      f.kind = RingFault::Kind::kHeadTooFarBehind;
      break;
  }
  f.seen = c_.fault_seen;
  f.own = c_.fault_tail;
  f.previous = c_.fault_prev;
  f.capacity = region_.ring_capacity();
  return f;
}

void DeviceCollector::run(const std::atomic<bool>& stop) {
  Backoff idle(opts_.max_sleep);
  while (!stop.load(std::memory_order_acquire)) {
    // A full batch: go on at once.  Less: a steady trickle, taken in
    // batches of max_sleep's worth, not chased record by record (a
    // collector on the workers' heels reads each cache line of their
    // queues while they are still writing it, and every record pays).
    const size_t moved = pass();
    if (moved >= c_.batch)
      idle.reset();
    else if (moved > 0)
      idle.steady();
    else
      idle.wait();
    if (perfq_dev_collector_fault(&c_)) break;  // the host wrote a head that makes no sense
  }
  // Deliver what is still queued, as long as the host makes room.
  const auto deadline = std::chrono::steady_clock::now() + opts_.shutdown_timeout;
  idle.reset();
  while (!perfq_dev_collector_fault(&c_) && !perfq_dev_collector_drained(&c_) &&
         std::chrono::steady_clock::now() < deadline) {
    if (pass() > 0)
      idle.reset();
    else
      idle.wait();
  }
  // What could not be delivered is dropped: the accounting says so.
  perfq_dev_collector_finish(&c_, region_.base(), &region_.header());
}

Status publish_dictionary(const Region& region, const std::vector<EventInfo>& events) {
  const uint32_t cap = region.header().dict_capacity;
  if (events.size() > cap)
    return Status(Errc::kInvalidArgument, "dictionary of " + std::to_string(events.size()) +
                                              " events exceeds the region's capacity of " +
                                              std::to_string(cap));
  std::vector<perfq_dev_event> sdk;
  sdk.reserve(events.size());
  for (const EventInfo& e : events) {
    if (e.name.empty() || e.name.size() >= PERFQ_EVENT_NAME_LEN)
      return Status(Errc::kInvalidArgument, "event name '" + e.name + "' must be 1.." +
                                                std::to_string(PERFQ_EVENT_NAME_LEN - 1) +
                                                " characters");
    // A one-number arg named "bytes" is the one the region can declare.
    const bool bytes = e.bytes() == EventInfo::Bytes::kWhole;
    if (!e.args.empty() && !bytes)
      return Status(Errc::kInvalidArgument,
                    "event '" + e.name + "': a device's arg can be named only \"" +
                        std::string(kArgBytes) + "\" (PERFQ_DEV_ARG_BYTES)");
    sdk.push_back({e.event, static_cast<uint16_t>(e.kind | (bytes ? PERFQ_DEV_ARG_BYTES : 0u)),
                   e.name.c_str()});
  }
  if (perfq_dev_dictionary_write(region.base(), &region.header(), sdk.data(),
                                 static_cast<uint32_t>(sdk.size())) != PERFQ_DEV_OK)
    return Status(Errc::kInvalidArgument,
                  "event dictionary: a name is not printable ASCII, a kind is not valid or a "
                  "counter's arg is declared a byte count");
  return Status::ok();
}

Result<std::vector<EventInfo>> read_dictionary(const Region& region) {
  const perfq_dict_header* dict = region.dict();
  const uint32_t count = __atomic_load_n(&dict->count, __ATOMIC_ACQUIRE);
  const uint32_t cap = region.header().dict_capacity;
  if (count > cap)
    return Status(Errc::kCorrupt, "device dictionary: count " + std::to_string(count) +
                                      " exceeds capacity " + std::to_string(cap));
  const auto* entries = reinterpret_cast<const perfq_dict_entry*>(dict + 1);
  std::vector<EventInfo> out;
  out.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    perfq_dict_entry e;
    std::memcpy(&e, &entries[i], sizeof(e));  // private copy, then validate
    const char* name = reinterpret_cast<const char*>(e.name);
    const size_t len = strnlen(name, PERFQ_EVENT_NAME_LEN);
    const std::string where = "device dictionary entry " + std::to_string(i);
    if (len == 0 || len == PERFQ_EVENT_NAME_LEN)
      return Status(Errc::kCorrupt, where + ": name is empty or not NUL-terminated");
    for (size_t k = 0; k < len; ++k)
      if (name[k] < 0x20 || name[k] > 0x7e)
        return Status(Errc::kCorrupt, where + ": name has a non-printable byte");
    if (e.kind == PERFQ_KIND_INVALID || e.kind > PERFQ_KIND_MAX)
      return Status(Errc::kCorrupt, where + " (" + std::string(name, len) + "): kind " +
                                        std::to_string(e.kind) + " is not valid");
    // Flags this host does not know are ignored (the ABI's promise).
    std::vector<std::string> args;
    if ((e.flags & PERFQ_DICT_ARG_BYTES) && e.kind != PERFQ_KIND_COUNTER)
      args.emplace_back(kArgBytes);
    out.push_back({e.event, e.kind, std::string(name, len), std::move(args)});
  }
  return out;
}

void set_device_state(const Region& region, perfq_device_state state) noexcept {
  perfq_dev_set_state(region.base(), &region.header(), state);
}

perfq_device_state device_state(const Region& region) noexcept {
  return static_cast<perfq_device_state>(
      __atomic_load_n(&region.host_ctrl()->device_state, __ATOMIC_ACQUIRE));
}

void Backoff::wait() noexcept {
  if (idle_ < spins_) {
    ++idle_;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
    return;
  }
  timespec ts{static_cast<time_t>(sleep_us_ / 1000000),
              static_cast<long>(sleep_us_ % 1000000 * 1000)};
  nanosleep(&ts, nullptr);
  slept_us_ += sleep_us_;
  const uint64_t ceiling = slept_us_ >= deep_after_us_ ? deep_sleep_us_ : max_sleep_us_;
  sleep_us_ = std::min(sleep_us_ * 2, ceiling);
}

}  // namespace perfq
