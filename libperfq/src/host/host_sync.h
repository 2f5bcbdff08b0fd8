// The host's side of a sync round, as the daemon's sync thread runs it.
//
// One round: open the device's sync window for round r, read the timer
// register n times with host brackets (H1, R2, H2), close the window, wait
// for the device's own samples (R1, D, R1) of round r in the SYNC page, and
// combine them into one observation for the ClockSync model.  Then
//   mode A: publish the model in the time sync buffer (the device may read
//           it; the host converts device times itself);
//   mode B: post the host samples in the mailbox; the device computes the
//           same model and converts its records before they cross the bus.
// Every round's raw samples are kept so the trace can re-synchronize
// offline.  Threading: one thread (the sync thread) drives a HostSync.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <vector>

#include "host/transport.h"
#include "perfq/perfq_abi.h"
#include "perfq/status.h"
#include "sync/sync.h"

namespace perfq {

struct HostSyncOptions {
  perfq_sync_mode mode = PERFQ_SYNC_MODE_A;
  size_t samples = 48;  // host reads per round (<= PERFQ_SYNC_MAX_SAMPLES)
  // A round ends its reads once this many were tight: each within the
  // selection's margin (max(margin_ns, margin_frac x it)) of the lower
  // quartile of the last 64 rounds' tightest read, once there are 16 (0:
  // always `samples`).  The observation averages the reads within that
  // margin of the round's tightest, so on a quiet machine the rest of the 48
  // cost CPU (0.8 us a read) for nothing; a busy round still reads all 48 for
  // the few tight ones.  The driver's ioctl reads all `samples`.
  size_t enough_reads = 12;
  std::chrono::microseconds read_timeout{std::chrono::milliseconds(50)};
  std::chrono::milliseconds device_timeout{200};  // for the device's batch
  uint64_t batch_spin_ns = 20'000;                // spin this long for the batch before sleeping
  SyncConfig sync;
  SelectionConfig selection;
  // Which rounds the online model fits (the others are kOutlier, or step
  // witnesses, and stay in rounds() for the offline fit).  A device in mode
  // B applies the same rule with its defaults.
  GateConfig gate;
  // rounds() keeps at least this many of the last rounds (and at most
  // twice as many).  A recorder that writes each round's samples to its
  // trace needs only the last: keeping them all costs about 1.6 KB per
  // round, 58 MB per hour at the default interval.
  size_t keep_rounds = SIZE_MAX;
};

struct RoundResult {
  ClockSync::Verdict verdict = ClockSync::Verdict::kInvalid;  // kOutlier when gated
  SyncObservation observation;
  uint64_t cpu_ns = 0;  // host CPU time the round cost this thread
};

class HostSync {
 public:
  HostSync(DeviceTransport& device, HostSyncOptions opts = {});

  // Run one round.  A device that does not answer is an error (kTimeout)
  // and leaves the model as it was.
  Result<RoundResult> round();
  // The next round() comes about `in` from now: the device may be awake
  // for it (DeviceTransport::announce_round()), which saves the round a
  // wakeup and a nap.  A hint: a round at another time works as ever.
  // Zero or less: not known.
  void next_round_in(std::chrono::microseconds in);

  const ClockSync& sync() const { return sync_; }
  const ClockRates& rates() const { return rates_; }
  // The completed rounds' raw samples, oldest first: every round, or the
  // last ones (HostSyncOptions::keep_rounds).
  const std::vector<SyncRound>& rounds() const { return rounds_; }
  uint32_t rounds_done() const { return next_round_ - 1; }
  // The gate the rounds go through (how many it took, how tight they are).
  const RoundGate& gate() const { return gate_; }

 private:
  DeviceTransport& device_;
  HostSyncOptions opts_;
  ClockRates rates_;
  ClockSync sync_;
  std::vector<SyncRound> rounds_;
  RoundGate gate_;
  uint32_t next_round_ = 1;
  uint64_t reads_ended_ns_ = 0;  // monotonic_ns() once the last round's reads ended
  // The tightest host read of each of the last rounds (enough_reads).
  std::array<uint64_t, 64> tightest_{};
  size_t tightest_n_ = 0;
  EnoughReads enough() const;
};

}  // namespace perfq
