#include "device/device.h"

#include "sync/sync_buffer.h"

#include <time.h>

#include <algorithm>
#include <cstring>
#include <thread>

namespace perfq {

DeviceQueue::DeviceQueue(uint16_t stream, uint64_t queue_capacity, const DeviceClock& clock)
    : stream_(stream),
      clock_(clock),
      ring_(queue_capacity),
      producer_(ring_.producer()),
      consumer_(ring_.consumer()) {}

DeviceCollector::DeviceCollector(const Region& region, std::vector<DeviceQueue*> streams,
                                 const DeviceClock& clock, CollectorOptions opts)
    : region_(region),
      streams_(std::move(streams)),
      clock_(clock),
      opts_(opts),
      producer_(region.device_producer()),
      delivery_(streams_.size()),
      mode_b_(ClockRates{region.header().device_clock_hz, region.header().timer_hz}),
      device_now_((region.header().features & PERFQ_FEAT_DEVICE_NOW) != 0) {}

void DeviceCollector::poll_mailbox() {
  const perfq_sync_page* page = region_.sync();
  if (__atomic_load_n(&page->mode, __ATOMIC_ACQUIRE) != PERFQ_SYNC_MODE_B) {
    converting_ = false;
    return;
  }
  auto host = read_sample_batch(&page->mailbox);
  if (!host || host->round == mailbox_round_ || host->samples.empty()) return;
  // Our own samples of the same round (the timer server published them).
  auto own = read_sample_batch(&page->device_samples);
  if (!own || own->round != host->round) return;
  mailbox_round_ = host->round;
  const ClockSync& cs = mode_b_.sync();
  auto obs = make_observation(host->samples, own->samples, cs.rates(),
                              selection_for({}, cs.current(), cs.rates()), host->round);
  if (obs) (void)mode_b_.add(*obs);
  converting_ = mode_b_.ready();
}

size_t DeviceCollector::pass() {
  if (opts_.mode_b) {
    const uint64_t now = monotonic_ns();
    if (now >= next_mailbox_poll_) {
      poll_mailbox();
      next_mailbox_poll_ = now + static_cast<uint64_t>(opts_.mailbox_poll.count()) * 1'000'000ull;
    }
  }
  size_t moved = 0;
  for (size_t i = 0; i < streams_.size(); ++i) {
    DeviceQueue& s = *streams_[i];
    StreamDelivery& d = delivery_[i];
    size_t room = producer_.free_slots();
    if (room == 0) break;  // keep the oldest data: stop reading the queues

    // Report the drops since the last report before anything newer.
    const uint64_t dropped = s.dropped();
    if (dropped > d.lost_reported) {
      // Stamped with the time of the newest drop it reports, not of its
      // sending: drops from before a recording started (a full ring nobody
      // read) are the host's to tell from those of the recording.
      perfq_record lost{s.emitted(),
                        PERFQ_EVENT_LOST,
                        s.id(),
                        PERFQ_FLAGS(PERFQ_KIND_LOST, PERFQ_CLOCK_DEVICE),
                        s.last_drop_time(),
                        dropped - d.lost_reported};
      if (converting_) (void)mode_b_.convert_record(&lost);
      if (!producer_.try_push(lost)) break;
      d.lost_reported = dropped;
      ++moved;
      if (--room == 0) break;
    }

    auto src = s.consumer_.peek(std::min(room, opts_.batch));
    if (src.empty()) continue;
    auto dst = producer_.reserve(src.size());
    const size_t n = dst.size();  // == src.size(): room was checked
    for (size_t k = 0; k < n; ++k) dst[k] = src[k];
    if (converting_)
      for (size_t k = 0; k < n; ++k) (void)mode_b_.convert_record(&dst[k]);
    // D after every record it publishes was stamped: posted before the tail
    // (whose release store orders it for the host's acquire of the tail).
    if (device_now_) store_relaxed(&region_.host_ctrl()->device_now, clock_.now());
    producer_.commit(n);
    s.consumer_.release(n);
    d.delivered += n;
    moved += n;
  }
  // Posted write: tells the host the collector is alive.
  store_relaxed(&region_.host_ctrl()->heartbeat, ++heartbeat_);
  return moved;
}

bool DeviceCollector::drained() const {
  for (size_t i = 0; i < streams_.size(); ++i) {
    DeviceQueue& s = *streams_[i];
    if (s.dropped() > delivery_[i].lost_reported) return false;
    if (s.consumer_.size_estimate() != 0) return false;
  }
  return true;
}

void DeviceCollector::run(const std::atomic<bool>& stop) {
  Backoff idle(opts_.max_sleep);
  while (!stop.load(std::memory_order_acquire)) {
    if (pass() > 0)
      idle.reset();
    else
      idle.wait();
    if (producer_.fault()) break;  // the host wrote a head that makes no sense
  }
  // Deliver what is still queued, as long as the host makes room.
  const auto deadline = std::chrono::steady_clock::now() + opts_.shutdown_timeout;
  idle.reset();
  while (!producer_.fault() && !drained() && std::chrono::steady_clock::now() < deadline) {
    if (pass() > 0)
      idle.reset();
    else
      idle.wait();
  }
  // What could not be delivered is dropped; say so in the accounting.
  for (size_t i = 0; i < streams_.size(); ++i) {
    DeviceQueue& s = *streams_[i];
    delivery_[i].undelivered = s.consumer_.size_estimate();
  }
  set_device_state(region_, PERFQ_DEVICE_STOPPED);
}

Status publish_dictionary(const Region& region, const std::vector<EventInfo>& events) {
  perfq_dict_header* dict = region.dict();
  const uint32_t cap = region.header().dict_capacity;
  if (events.size() > cap)
    return Status(Errc::kInvalidArgument, "dictionary of " + std::to_string(events.size()) +
                                              " events exceeds the region's capacity of " +
                                              std::to_string(cap));
  auto* entries = reinterpret_cast<perfq_dict_entry*>(dict + 1);
  for (size_t i = 0; i < events.size(); ++i) {
    const EventInfo& e = events[i];
    if (e.name.empty() || e.name.size() >= PERFQ_EVENT_NAME_LEN)
      return Status(Errc::kInvalidArgument, "event name '" + e.name + "' must be 1.." +
                                                std::to_string(PERFQ_EVENT_NAME_LEN - 1) +
                                                " characters");
    perfq_dict_entry entry{};
    entry.event = e.event;
    entry.kind = e.kind;
    std::memcpy(entry.name, e.name.data(), e.name.size());
    entries[i] = entry;
  }
  dict->entry_size = sizeof(perfq_dict_entry);
  // Pairs with the acquire load of count in read_dictionary().
  __atomic_store_n(&dict->count, static_cast<uint32_t>(events.size()), __ATOMIC_RELEASE);
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
    out.push_back({e.event, e.kind, std::string(name, len)});
  }
  return out;
}

void set_device_state(const Region& region, perfq_device_state state) noexcept {
  __atomic_store_n(&region.host_ctrl()->device_state, static_cast<uint32_t>(state),
                   __ATOMIC_RELEASE);
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
