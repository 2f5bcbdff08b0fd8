// A synthetic trace with known, constructed timings: the fixture of the
// report and export tests, and a sample file for trying the viewers
// (`perfqctl` itself never needs it).
//
// Sources: 0 = host application "synth-app" (events job_submit,
// job_complete [INSTANT], work [BEGIN] / work_done [END], queue_depth
// [COUNTER], h2d_copy [BEGIN, bytes]), 1 = device "synth-dev" (job_start
// [BEGIN], job_end [END], dma_bytes [COUNTER], dma_write [INSTANT, bytes]).  Job i is submitted at
// start_ns + i * period_ns on host stream i % 2 and takes submit_to_start[i % n], start_to_end[i %
// n], end_to_complete[i % n] (cycling through the lists); the device records it on stream i % 3
// with raw times D = H - device_offset_ns.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "perfq/status.h"
#include "perfq/trace.h"

namespace perfq {

struct SynthTraceOptions {
  uint64_t jobs = 100;
  int64_t start_ns = 1'000'000'000;
  int64_t period_ns = 100'000;
  std::vector<int64_t> submit_to_start = {2'000};
  std::vector<int64_t> start_to_end = {10'000};
  std::vector<int64_t> end_to_complete = {1'000};
  int64_t device_offset_ns = 5'000'000'000;  // H - D
  // Error of the model the "daemon" used to convert device times: recorded
  // device host times are off by this much (--resync removes it).
  int64_t model_error_ns = 0;
  uint64_t sync_samples = 16;  // spread over the recording, bracket 400 ns
  // Every drop_every-th device record on stream 0 is dropped (an index gap);
  // 0 = none.  Plus one LOST record of lost_record_count on host stream 1,
  // and one loss chunk of loss_chunk_count on host stream 0 (0 = none).
  uint64_t drop_every = 0;
  uint64_t lost_record_count = 0;
  uint64_t loss_chunk_count = 0;
  bool work_pairs = true;  // a host work begin/end (duration 500 ns) per job
  // Byte counts (cycled through per job; none when empty): the host copies
  // them before each submit, an h2d_copy range (event 7, its arg declared
  // "bytes") from submit - 90 to submit - 10 ns, and the device records a
  // dma_write instant (event 4, "bytes") of the same count at start + 2.
  std::vector<uint64_t> transfer_bytes;
  // The device's PCI facts in the metadata (its pci_address and link follow
  // them); none by default.
  std::optional<PciDevice> device_pci;
};

// Writes the trace; returns the records written.
Result<uint64_t> write_synthetic_trace(const std::string& path, const SynthTraceOptions& options,
                                       const TraceWriterOptions& writer = {});

}  // namespace perfq
