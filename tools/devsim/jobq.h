// The software device's job queue in the region's application area (see
// perfq_jobq_header in perfq_abi.h): host threads claim a channel each and
// submit jobs; device job workers run them and post completions.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "core/ring.h"
#include "core/spsc_ring.h"
#include "perfq/perfq_abi.h"
#include "perfq/perfq_device.h"
#include "perfq/status.h"

namespace perfq {

class JobQueue;

// A host thread's claimed channel: produce jobs, consume completions.
// Releasing (destruction) frees the channel for another thread.
class HostJobChannel {
 public:
  HostJobChannel(HostJobChannel&& o) noexcept;
  HostJobChannel& operator=(HostJobChannel&&) = delete;
  HostJobChannel(const HostJobChannel&) = delete;
  ~HostJobChannel();

  uint32_t index() const { return index_; }
  [[nodiscard]] bool submit(const perfq_job& job) noexcept;
  [[nodiscard]] bool poll_completion(perfq_job_completion* out) noexcept;
  const RingFault& fault() const { return complete_.fault(); }

 private:
  friend class JobQueue;
  HostJobChannel(perfq_jobq_channel* ch, uint32_t index, uint64_t token,
                 SpscProducer<perfq_job> submit, SpscConsumer<perfq_job_completion> complete)
      : ch_(ch),
        index_(index),
        token_(token),
        submit_(std::move(submit)),
        complete_(std::move(complete)) {}
  perfq_jobq_channel* ch_;
  uint32_t index_;
  uint64_t token_;
  SpscProducer<perfq_job> submit_;
  SpscConsumer<perfq_job_completion> complete_;
};

class JobQueue {
 public:
  // Device: lay out the queue in the application area, as many channels
  // (up to max_channels) with rings of as many elements as fit.
  static Result<JobQueue> format(std::span<uint8_t> app, uint32_t max_channels = 8);
  // Host: validate a queue the device laid out.
  static Result<JobQueue> attach(std::span<uint8_t> app);

  uint32_t channels() const { return channels_; }
  uint64_t ring_capacity() const { return capacity_; }

  // Host: claim a free channel (or one whose owner process has died).
  // token identifies the owner: the claiming process id.
  Result<HostJobChannel> claim(uint64_t token) const;
  // Device: the SDK's view, for its job workers (perfq_dev_jobq_take(),
  // perfq_dev_jobq_complete()).
  perfq_dev_jobq device() const;

 private:
  JobQueue(uint8_t* base, uint32_t channels, uint64_t capacity, uint64_t offset, uint64_t stride)
      : base_(base), channels_(channels), capacity_(capacity), offset_(offset), stride_(stride) {}
  perfq_jobq_channel* channel(uint32_t i) const {
    return reinterpret_cast<perfq_jobq_channel*>(base_ + offset_ + i * stride_);
  }
  perfq_spsc_header* submit_ring(uint32_t i) const {
    return reinterpret_cast<perfq_spsc_header*>(channel(i) + 1);
  }
  perfq_spsc_header* complete_ring(uint32_t i) const {
    return reinterpret_cast<perfq_spsc_header*>(reinterpret_cast<uint8_t*>(submit_ring(i)) +
                                                ring_bytes());
  }
  uint64_t ring_bytes() const { return sizeof(perfq_spsc_header) + capacity_ * 32; }

  uint8_t* base_;
  uint32_t channels_;
  uint64_t capacity_;
  uint64_t offset_;
  uint64_t stride_;
};

}  // namespace perfq
