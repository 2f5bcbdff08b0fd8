// How the host reaches a device: one interface, one implementation per way
// the region is mapped.
//
//   shm:PATH     the region is a file (e.g. under /dev/shm, or the file
//                backing QEMU's ivshmem device) that the device also maps;
//                timer reads are the request/response exchange.
//   /dev/perfqN  the region comes from the perfq driver's mmap (each
//                section mapped by offset with the protection the driver
//                allows) and clock samples from its ioctl, taken by the
//                kernel with interrupts off.  When the device goes away its
//                mappings are revoked; the fault guard (fault_guard.h) turns
//                the SIGBUS into gone() == true.
//
// A transport hands the layers above the validated region (ring, control
// pages, sync page, dictionary) and bracketed reads of the timer register.
// Threading: clock_samples() is for one thread (the sync thread) at a time;
// region() and gone() may be used by any.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/mapping.h"
#include "core/region.h"
#include "perfq/perfq_abi.h"
#include "perfq/perfq_ioctl.h"
#include "perfq/status.h"

namespace perfq {

// When a sync round has read enough (DeviceTransport::clock_samples()):
// once `reads` of its reads each took at most `delay_ns` between their
// brackets (and at least kMinRoundSamples were read).
struct EnoughReads {
  size_t reads = 0;  // 0: read n
  uint64_t delay_ns = 0;
};

class DeviceTransport {
 public:
  virtual ~DeviceTransport() = default;

  // The spec the transport was opened with ("shm:/dev/shm/perfq0").
  virtual const std::string& spec() const = 0;
  virtual const Region& region() const = 0;

  // One sync round's host samples: n reads of R, each bracketed by host
  // CLOCK_MONOTONIC: {before = H1, value = R2, after = H2}.  Opens the
  // device's sync window of round `round` (nonzero) and closes it after; the
  // device then publishes its own samples of that round in the SYNC page.
  // `timeout` bounds each read.  A read that times out ends the round early
  // when it already has kMinRoundSamples (or n): the samples read so far
  // keep their brackets, and a round needs only its best few, so a device
  // that is away for a while costs the round its tail, not the round.  With
  // fewer, the round fails with kTimeout.  Slow reads that each answer in
  // time are all kept: whether such a round is worth fitting is the sync
  // gate's choice (by delay), not the transport's.
  //
  // `enough` may end the reads before n (EnoughReads).  The shm transport
  // stops there; the driver's ioctl reads n (with interrupts off, its reads
  // are tight, and cost the kernel, not this thread, their time).
  static constexpr size_t kMinRoundSamples = PERFQ_IOC_ROUND_MIN_SAMPLES;
  virtual Result<std::vector<perfq_clock_sample>> clock_samples(
      uint32_t round, size_t n, std::chrono::microseconds timeout = std::chrono::milliseconds(50),
      EnoughReads enough = {}) = 0;

  // When the next round's clock_samples() will come, counted from the end
  // of the last one: a device that polls may be awake for it, and then the
  // round neither wakes it nor waits for it (perfq_timer_page's
  // next_window_us).  A hint: a round at another time works as ever.  The
  // driver's ioctl reads with the device as it is: nothing to announce.
  virtual void announce_round(std::chrono::microseconds /*after_last*/) {}

  // True once the device is known to be gone (its mappings were revoked, or
  // the driver answered ENODEV).  The region then reads zeros, and
  // clock_samples() fails with Errc::kUnavailable "device gone".  Check it
  // after each poll and finish up.
  virtual bool gone() const { return false; }

  // One region, one consumer: takes the device for this process's consumer
  // (a daemon's recording, or perfqctl record) until the transport is
  // destroyed.  An exclusive flock(2) on the region's file or device node,
  // which the kernel drops when its holder exits, however it exits.  Fails
  // with Errc::kUnavailable naming the holder ("perfq-daemon, pid 1234") when
  // another consumer, in this process or another, holds it.  Readers that
  // only look (status, listing, a job submitter) do not claim.
  Status claim();
  bool claimed() const { return claim_.valid(); }

 private:
  UniqueFd claim_;
};

// The path of a spec's region file or device node ("shm:PATH": PATH).
std::string transport_path(const std::string& spec);

// Who holds an flock on the file at `path`: "COMM (pid N)", "this process
// (pid N)", or "" when the holder cannot be told (/proc/locks unreadable).
std::string flock_holder(const std::string& path);

// Open "shm:PATH" or "/dev/perfqN".  The error says what was wrong with the
// spec, the driver's answer or the region.
Result<std::unique_ptr<DeviceTransport>> open_transport(const std::string& spec);

}  // namespace perfq
