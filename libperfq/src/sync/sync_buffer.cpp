#include <fmt/format.h>

#include <thread>

#include "core/ring.h"
#include "sync/sync_buffer.h"

namespace perfq {
namespace {

// Field access inside a seqlocked structure.  See sync_buffer.h: release
// stores keep every field after the odd seq; acquire loads keep the second
// seq read after every field.
template <class T>
inline void put(T* p, T v) noexcept {
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
template <class T>
inline T get(const T* p) noexcept {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

// Begin a write: returns the even value to store when done.
inline uint64_t seq_begin(uint64_t* seq) noexcept {
  // Only we write seq; a scribbled value is tolerated (next odd after it).
  const uint64_t odd = (load_relaxed(seq) + 1) | 1;
  store_relaxed(seq, odd);
  return odd + 1;
}
inline void seq_end(uint64_t* seq, uint64_t even) noexcept {
  // Pairs with the reader's load_acquire of seq in seq_read_begin(): every
  // field store above is visible to a reader that sees this even value.
  store_release(seq, even);
}

void backoff(uint32_t attempt) {
  if ((attempt & 63) == 63) std::this_thread::yield();
}

}  // namespace

void write_sync_model(perfq_sync_model* dst, const perfq_sync_model& m) noexcept {
  const uint64_t done = seq_begin(&dst->seq);
  put(&dst->device_ref, m.device_ref);
  put(&dst->host_ref_ns, m.host_ref_ns);
  put(&dst->rate_ppb, m.rate_ppb);
  put(&dst->uncertainty_ns, m.uncertainty_ns);
  put(&dst->valid_from_device, m.valid_from_device);
  put(&dst->segment, m.segment);
  put(&dst->flags, m.flags);
  seq_end(&dst->seq, done);
}

Result<perfq_sync_model> read_sync_model(const perfq_sync_model* src, uint32_t max_retries) {
  perfq_sync_model m{};
  for (uint32_t i = 0; i <= max_retries; ++i) {
    // Pairs with store_release in seq_end(): fields written before this
    // even seq are visible below.
    const uint64_t s1 = load_acquire(&src->seq);
    if ((s1 & 1) == 0) {
      m.device_ref = get(&src->device_ref);
      m.host_ref_ns = get(&src->host_ref_ns);
      m.rate_ppb = get(&src->rate_ppb);
      m.uncertainty_ns = get(&src->uncertainty_ns);
      m.valid_from_device = get(&src->valid_from_device);
      m.segment = get(&src->segment);
      m.flags = get(&src->flags);
      // Ordered after the acquire loads above; a writer that started since
      // s1 has stored its odd seq before any field we may have seen.
      const uint64_t s2 = load_relaxed(&src->seq);
      if (s1 == s2) {
        m.seq = s1;
        return m;
      }
    }
    backoff(i);
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
  const uint64_t done = seq_begin(&dst->seq);
  put(&dst->count, n);
  put(&dst->round, round);
  for (uint32_t i = 0; i < n; ++i) {
    put(&dst->samples[i].before, samples[i].before);
    put(&dst->samples[i].value, samples[i].value);
    put(&dst->samples[i].after, samples[i].after);
    put(&dst->samples[i].reserved, uint64_t{0});
  }
  seq_end(&dst->seq, done);
  return n;
}

Result<SampleBatch> read_sample_batch(const perfq_sample_batch* src, uint32_t max_retries) {
  SampleBatch b;
  b.samples.reserve(PERFQ_SYNC_MAX_SAMPLES);
  for (uint32_t i = 0; i <= max_retries; ++i) {
    // Pairs with store_release in seq_end().
    const uint64_t s1 = load_acquire(&src->seq);
    if ((s1 & 1) == 0) {
      const uint32_t count = get(&src->count);
      const uint32_t round = get(&src->round);
      // A count read mid-write may be garbage: only judge it once the copy
      // is known consistent, but never index beyond the array.
      const uint32_t n = count < PERFQ_SYNC_MAX_SAMPLES ? count : PERFQ_SYNC_MAX_SAMPLES;
      b.samples.resize(n);
      for (uint32_t k = 0; k < n; ++k) {
        b.samples[k].before = get(&src->samples[k].before);
        b.samples[k].value = get(&src->samples[k].value);
        b.samples[k].after = get(&src->samples[k].after);
        b.samples[k].reserved = 0;
      }
      const uint64_t s2 = load_relaxed(&src->seq);
      if (s1 == s2) {
        if (count > PERFQ_SYNC_MAX_SAMPLES)
          return Status(Errc::kCorrupt,
                        fmt::format("sample batch: count {} exceeds the maximum {} (round {})",
                                    count, PERFQ_SYNC_MAX_SAMPLES, round));
        b.seq = s1;
        b.round = round;
        return b;
      }
    }
    backoff(i);
  }
  return Status(Errc::kTimeout,
                fmt::format("sample batch: no consistent copy after {} attempts (seq {})",
                            max_retries + 1, load_relaxed(&src->seq)));
}

}  // namespace perfq
