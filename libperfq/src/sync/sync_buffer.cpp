#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include "core/ring.h"
#include "perfq/perfq_device.h"
#include "sync/sync_buffer.h"

namespace perfq {

// The protocol itself is the device SDK's (perfq/perfq_device.h): one
// implementation for the device's side and the host's.

void write_sync_model(perfq_sync_model* dst, const perfq_sync_model& m) noexcept {
  perfq_dev_model_write(dst, &m);
}

Result<perfq_sync_model> read_sync_model(const perfq_sync_model* src, uint32_t max_retries) {
  perfq_sync_model m{};
  for (uint32_t i = 0; i <= max_retries; i += 64) {
    if (perfq_dev_model_read(src, &m, std::min<uint32_t>(64, max_retries + 1 - i)) == PERFQ_DEV_OK)
      return m;
    std::this_thread::yield();
  }
  return Status(Errc::kTimeout,
                fmt::format("sync model: no consistent copy after {} attempts (seq {})",
                            max_retries + 1, load_relaxed(&src->seq)));
}

Result<ClockModel> read_clock_model(const perfq_sync_page* page, uint32_t max_retries) {
  auto m = read_sync_model(&page->model, max_retries);
  if (!m) return m.status();
  return ClockModel::from_abi(m.value());
}

void publish_clock_model(perfq_sync_page* page, const ClockModel& m) noexcept {
  write_sync_model(&page->model, m.to_abi());
}

uint32_t write_sample_batch(perfq_sample_batch* dst, uint32_t round,
                            std::span<const perfq_clock_sample> samples) noexcept {
  const uint32_t n = samples.size() < PERFQ_SYNC_MAX_SAMPLES ? static_cast<uint32_t>(samples.size())
                                                             : PERFQ_SYNC_MAX_SAMPLES;
  perfq_dev_batch_write(dst, round, samples.data(), n);
  return n;
}

Result<SampleBatch> read_sample_batch(const perfq_sample_batch* src, uint32_t max_retries) {
  SampleBatch b;
  b.samples.resize(PERFQ_SYNC_MAX_SAMPLES);
  for (uint32_t i = 0; i <= max_retries; i += 64) {
    uint32_t count = 0;
    const int rc = perfq_dev_batch_read(src, b.samples.data(), &count, &b.round, &b.seq,
                                        std::min<uint32_t>(64, max_retries + 1 - i));
    if (rc == PERFQ_DEV_ECORRUPT)
      return Status(
          Errc::kCorrupt,
          fmt::format("sample batch: count {} exceeds the maximum {} (round {})",
                      __atomic_load_n(&src->count, __ATOMIC_RELAXED), PERFQ_SYNC_MAX_SAMPLES,
                      __atomic_load_n(&src->round, __ATOMIC_RELAXED)));
    if (rc == PERFQ_DEV_OK) {
      b.samples.resize(count);
      return b;
    }
    std::this_thread::yield();
  }
  return Status(Errc::kTimeout,
                fmt::format("sample batch: no consistent copy after {} attempts (seq {})",
                            max_retries + 1, load_relaxed(&src->seq)));
}

}  // namespace perfq
