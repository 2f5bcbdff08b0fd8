// The time sync buffer: the clock model and the sample batches of the SYNC
// section, each under its own sequence word (a seqlock, see perfq_abi.h).
//
// Protocol (one writer per structure, any number of readers):
//   writer: seq <- odd (relaxed); every field stored with release order,
//           so no field store becomes visible before the odd seq; then
//           seq <- next even (release), ordering the fields before it.
//   reader: s1 <- seq (acquire); every field loaded with acquire order, so
//           the re-read of seq cannot move before them; s2 <- seq.  The copy
//           is consistent iff s1 == s2 and s1 is even; otherwise retry.
// No standalone fences (TSan does not model them); on x86 the release stores
// and acquire loads are plain moves.
//
// Readers never trust what they read: a batch count above
// PERFQ_SYNC_MAX_SAMPLES or unknown model flags are reported as kCorrupt,
// a writer that never finishes as kTimeout after max_retries attempts.
//
// The protocol is implemented once, in the device SDK (perfq_dev_batch_*,
// perfq_dev_model_*); these are the host's C++ face of it.
//
// The writer does not trust the seq word it finds either: it derives the
// next odd value from it, so a scribbled seq still leaves odd-while-writing.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "perfq/perfq_abi.h"
#include "perfq/status.h"
#include "sync/sync.h"

namespace perfq {

inline constexpr uint32_t kSeqlockDefaultRetries = 10000;

// ---- Model ------------------------------------------------------------------------
// Writer: the host sync thread (mode A).  `m.seq` is ignored.
void write_sync_model(perfq_sync_model* dst, const perfq_sync_model& m) noexcept;
// A consistent copy (seq of the copy = the even seq it was read under).
Result<perfq_sync_model> read_sync_model(const perfq_sync_model* src,
                                         uint32_t max_retries = kSeqlockDefaultRetries);
// Read and validate into a ClockModel (valid = false when none published yet).
Result<ClockModel> read_clock_model(const perfq_sync_page* page,
                                    uint32_t max_retries = kSeqlockDefaultRetries);
void publish_clock_model(perfq_sync_page* page, const ClockModel& m) noexcept;

// ---- Sample batches ---------------------------------------------------------------
struct SampleBatch {
  uint64_t seq = 0;
  uint32_t round = 0;
  std::vector<perfq_clock_sample> samples;
};

// Writes min(samples.size(), PERFQ_SYNC_MAX_SAMPLES) samples; returns how many.
uint32_t write_sample_batch(perfq_sample_batch* dst, uint32_t round,
                            std::span<const perfq_clock_sample> samples) noexcept;
Result<SampleBatch> read_sample_batch(const perfq_sample_batch* src,
                                      uint32_t max_retries = kSeqlockDefaultRetries);

}  // namespace perfq
