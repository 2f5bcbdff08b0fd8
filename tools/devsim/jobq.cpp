#include "jobq.h"

#include "perfq/perfq_device.h"

#include <fmt/format.h>
#include <signal.h>

#include <cerrno>
#include <cstring>

namespace perfq {
namespace {

static_assert(sizeof(perfq_job) == 32 && sizeof(perfq_job_completion) == 32);

bool owner_alive(uint64_t token) {
  if (token == 0) return false;
  if (token > static_cast<uint64_t>(INT32_MAX)) return true;  // not a pid: never steal
  return ::kill(static_cast<pid_t>(token), 0) == 0 || errno == EPERM;
}

}  // namespace

HostJobChannel::HostJobChannel(HostJobChannel&& o) noexcept
    : ch_(std::exchange(o.ch_, nullptr)),
      index_(o.index_),
      token_(o.token_),
      submit_(std::move(o.submit_)),
      complete_(std::move(o.complete_)) {}

HostJobChannel::~HostJobChannel() {
  if (!ch_) return;
  uint64_t expected = token_;
  __atomic_compare_exchange_n(&ch_->owner, &expected, 0, false, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
}

bool HostJobChannel::submit(const perfq_job& job) noexcept {
  if (!submit_.try_push(job)) return false;
  store_relaxed(&ch_->submitted, load_relaxed(&ch_->submitted) + 1);
  return true;
}

bool HostJobChannel::poll_completion(perfq_job_completion* out) noexcept {
  return complete_.try_pop(out);
}

Result<JobQueue> JobQueue::format(std::span<uint8_t> app, uint32_t max_channels) {
  // The device's side of the job queue is the SDK's (perfq_device.h).
  perfq_dev_jobq q;
  if (perfq_dev_jobq_format(&q, app.data(), app.size(), max_channels) != PERFQ_DEV_OK)
    return Status(Errc::kInvalidArgument,
                  fmt::format("job queue: application area of {} bytes is too small for {} "
                              "channel(s) of 16 jobs",
                              app.size(), max_channels));
  return JobQueue(app.data(), q.channels, q.capacity, q.offset, q.stride);
}

Result<JobQueue> JobQueue::attach(std::span<uint8_t> app) {
  if (app.size() < sizeof(perfq_jobq_header))
    return Status(Errc::kCorrupt, "job queue: no application area in this region");
  auto* h = reinterpret_cast<perfq_jobq_header*>(app.data());
  if (load_acquire(&h->magic) != PERFQ_JOBQ_MAGIC)
    return Status(Errc::kCorrupt,
                  "job queue: bad magic (this device has no job queue, or it is not ready)");
  perfq_jobq_header c;
  std::memcpy(&c, h, sizeof(c));
  if (c.version != PERFQ_ABI_VERSION)
    return Status(Errc::kCorrupt,
                  fmt::format("job queue: version {} is not {}", c.version, PERFQ_ABI_VERSION));
  if (c.channels == 0 || c.channels > 1024 || !is_pow2(c.ring_capacity) ||
      c.ring_capacity > (1u << 20))
    return Status(Errc::kCorrupt, fmt::format("job queue: {} channels of capacity {} is invalid",
                                              c.channels, c.ring_capacity));
  const uint64_t need =
      sizeof(perfq_jobq_channel) + 2 * (sizeof(perfq_spsc_header) + c.ring_capacity * 32);
  if (c.channel_offset < sizeof(perfq_jobq_header) || c.channel_offset % 64 != 0 ||
      c.channel_stride < need || c.channel_stride % 64 != 0 ||
      c.channel_offset + c.channel_stride * c.channels > app.size())
    return Status(
        Errc::kCorrupt,
        fmt::format("job queue: channel offset {} stride {} x {} does not fit in {} bytes",
                    c.channel_offset, c.channel_stride, c.channels, app.size()));
  JobQueue q(app.data(), c.channels, c.ring_capacity, c.channel_offset, c.channel_stride);
  for (uint32_t i = 0; i < c.channels; ++i) {
    auto s = SpscRingMemory<perfq_job>::attach(q.submit_ring(i), q.ring_bytes());
    auto k = SpscRingMemory<perfq_job_completion>::attach(q.complete_ring(i), q.ring_bytes());
    if (!s || !k || s->capacity() != c.ring_capacity || k->capacity() != c.ring_capacity)
      return Status(Errc::kCorrupt, fmt::format("job queue: channel {} rings are invalid", i));
  }
  return q;
}

Result<HostJobChannel> JobQueue::claim(uint64_t token) const {
  if (token == 0) return Status(Errc::kInvalidArgument, "job queue: claim token must be nonzero");
  for (uint32_t i = 0; i < channels_; ++i) {
    perfq_jobq_channel* ch = channel(i);
    uint64_t owner = __atomic_load_n(&ch->owner, __ATOMIC_ACQUIRE);
    if (owner != 0 && owner_alive(owner)) continue;
    if (!__atomic_compare_exchange_n(&ch->owner, &owner, token, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_RELAXED))
      continue;
    SpscProducer<perfq_job> submit(reinterpret_cast<perfq_job*>(submit_ring(i) + 1), capacity_,
                                   {&submit_ring(i)->tail, nullptr, &submit_ring(i)->head});
    SpscConsumer<perfq_job_completion> complete(
        reinterpret_cast<perfq_job_completion*>(complete_ring(i) + 1), capacity_,
        {&complete_ring(i)->tail, &complete_ring(i)->head, nullptr});
    // Completions left over from a dead owner are not ours: skip them.
    while (true) {
      auto s = complete.peek();
      if (s.empty()) break;
      complete.release(s.size());
    }
    return HostJobChannel(ch, i, token, std::move(submit), std::move(complete));
  }
  return Status(
      Errc::kUnavailable,
      fmt::format("job queue: all {} channels are claimed by running processes", channels_));
}

perfq_dev_jobq JobQueue::device() const {
  return perfq_dev_jobq{base_, channels_, capacity_, offset_, stride_};
}

}  // namespace perfq
