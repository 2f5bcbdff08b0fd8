// Tests of libperfq/src/sync/sync_buffer.h: the seqlocked model and sample batches
// of the time sync buffer, with a real writer thread against a reader, and
// a hostile peer.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "sync/sync.h"
#include "sync/sync_buffer.h"

namespace perfq {
namespace {

// A model whose every field derives from one counter.
perfq_sync_model model_of(uint64_t k) {
  perfq_sync_model m{};
  m.device_ref = k * 3 + 1;
  m.host_ref_ns = -static_cast<int64_t>(k * 5 + 2);
  m.rate_ppb = static_cast<int64_t>(k % 2001) - 1000;
  m.uncertainty_ns = k * 7;
  m.valid_from_device = k * 11;
  m.segment = static_cast<uint32_t>(k);
  m.flags = PERFQ_SYNC_MODEL_VALID;
  return m;
}

bool consistent(const perfq_sync_model& m, uint64_t* k_out) {
  const uint64_t k = m.segment;
  *k_out = k;
  // segment is u32: compare the low bits of the u64-derived fields.
  perfq_sync_model e = model_of(k);
  const uint64_t hi = (m.device_ref - 1) / 3;
  e = model_of(hi);
  return (hi & 0xffffffffu) == k && m.device_ref == e.device_ref &&
         m.host_ref_ns == e.host_ref_ns && m.rate_ppb == e.rate_ppb &&
         m.uncertainty_ns == e.uncertainty_ns && m.valid_from_device == e.valid_from_device &&
         m.flags == e.flags;
}

TEST_CASE("sync buffer: model round trip", "[sync]") {
  auto page = std::make_unique<perfq_sync_page>();
  std::memset(page.get(), 0, sizeof(*page));
  auto empty = read_clock_model(page.get());
  REQUIRE(empty.is_ok());
  CHECK_FALSE(empty->valid);

  perfq_sync_model m = model_of(42);
  write_sync_model(&page->model, m);
  auto r = read_sync_model(&page->model);
  REQUIRE(r.is_ok());
  CHECK(r->seq == 2);
  uint64_t k;
  CHECK(consistent(r.value(), &k));
  CHECK(k == 42);
  write_sync_model(&page->model, model_of(43));
  CHECK(read_sync_model(&page->model)->seq == 4);

  ClockModel c;
  c.device_ref = 1000;
  c.host_ref = 5'000'000'000ULL;
  c.ns_per_tick = 4.0L * (1 + 12e-6L);  // 250 MHz, +12 ppm
  c.uncertainty_ns = 12.3;
  c.segment = 2;
  c.valid = true;
  publish_clock_model(page.get(), c);
  auto back = read_clock_model(page.get());
  REQUIRE(back.is_ok());
  CHECK(back->valid);
  CHECK(back->segment == 2);
  CHECK(back->uncertainty_ns == 13);
  CHECK(back->to_host(1000 + 250'000'000) == c.to_host(1000 + 250'000'000));
}

TEST_CASE("sync buffer: a writer that never finishes times out", "[sync]") {
  auto page = std::make_unique<perfq_sync_page>();
  std::memset(page.get(), 0, sizeof(*page));
  page->model.seq = 7;  // odd forever
  auto r = read_sync_model(&page->model, 100);
  REQUIRE_FALSE(r.is_ok());
  CHECK(r.status().code() == Errc::kTimeout);
  page->device_samples.seq = 1;
  auto b = read_sample_batch(&page->device_samples, 100);
  REQUIRE_FALSE(b.is_ok());
  CHECK(b.status().code() == Errc::kTimeout);
  // The writer recovers from a scribbled odd seq.
  write_sync_model(&page->model, model_of(1));
  CHECK(page->model.seq % 2 == 0);
  CHECK(read_sync_model(&page->model).is_ok());
}

TEST_CASE("sync buffer: corrupt values are refused", "[sync]") {
  auto page = std::make_unique<perfq_sync_page>();
  std::memset(page.get(), 0, sizeof(*page));
  SECTION("count beyond the array") {
    page->device_samples.count = PERFQ_SYNC_MAX_SAMPLES + 1;
    auto b = read_sample_batch(&page->device_samples);
    REQUIRE_FALSE(b.is_ok());
    CHECK(b.status().code() == Errc::kCorrupt);
    page->device_samples.count = 0xffffffffu;
    CHECK(read_sample_batch(&page->device_samples).status().code() == Errc::kCorrupt);
  }
  SECTION("unknown model flags") {
    perfq_sync_model m = model_of(3);
    m.flags = 0x80;
    write_sync_model(&page->model, m);
    auto c = read_clock_model(page.get());
    REQUIRE_FALSE(c.is_ok());
    CHECK(c.status().code() == Errc::kCorrupt);
  }
  SECTION("a rate that is not a rate") {
    perfq_sync_model m = model_of(3);
    m.rate_ppb = -1'000'000'000LL;
    write_sync_model(&page->model, m);
    CHECK(read_clock_model(page.get()).status().code() == Errc::kCorrupt);
  }
  SECTION("too many samples are truncated by the writer") {
    std::vector<perfq_clock_sample> s(PERFQ_SYNC_MAX_SAMPLES + 10, perfq_clock_sample{1, 2, 3, 0});
    CHECK(write_sample_batch(&page->mailbox, 9, s) == PERFQ_SYNC_MAX_SAMPLES);
    auto b = read_sample_batch(&page->mailbox);
    REQUIRE(b.is_ok());
    CHECK(b->round == 9);
    CHECK(b->samples.size() == PERFQ_SYNC_MAX_SAMPLES);
  }
}

TEST_CASE("sync buffer: reader never sees a torn model", "[sync]") {
  auto page = std::make_unique<perfq_sync_page>();
  std::memset(page.get(), 0, sizeof(*page));
  write_sync_model(&page->model, model_of(0));
  std::atomic<bool> stop{false};
  constexpr uint64_t kWrites = 200'000;
  std::thread writer([&] {
    for (uint64_t k = 1; k <= kWrites; ++k) {
      write_sync_model(&page->model, model_of(k));
      if (k % 64 == 0) std::this_thread::yield();  // let the reader in now and then
    }
    stop.store(true, std::memory_order_release);
  });
  uint64_t reads = 0, torn = 0, backwards = 0, failed = 0, last = 0;
  while (!stop.load(std::memory_order_acquire) || reads == 0) {
    auto r = read_sync_model(&page->model);
    if (!r) {
      // A writer writing back to back can starve a reader (seqlocks favour
      // the writer); that is a timeout, never a torn copy.
      failed += r.status().code() != Errc::kTimeout;
      continue;
    }
    uint64_t k;
    if (!consistent(r.value(), &k)) ++torn;
    if (k < last) ++backwards;
    last = k;
    ++reads;
  }
  writer.join();
  CHECK(torn == 0);
  CHECK(backwards == 0);
  CHECK(failed == 0);
  CHECK(reads > 0);
  uint64_t k;
  auto fin = read_sync_model(&page->model);
  REQUIRE(fin.is_ok());
  CHECK(consistent(fin.value(), &k));
  CHECK(k == kWrites);
}

TEST_CASE("sync buffer: reader never sees a torn sample batch", "[sync]") {
  auto page = std::make_unique<perfq_sync_page>();
  std::memset(page.get(), 0, sizeof(*page));
  std::atomic<bool> stop{false};
  constexpr uint32_t kRounds = 20'000;
  std::thread writer([&] {
    std::vector<perfq_clock_sample> s;
    for (uint32_t r = 1; r <= kRounds; ++r) {
      const uint32_t n = 1 + r % PERFQ_SYNC_MAX_SAMPLES;
      s.resize(n);
      for (uint32_t i = 0; i < n; ++i)
        s[i] = perfq_clock_sample{r * 1000ULL + i, r * 2000ULL + i, r * 3000ULL + i, 0};
      write_sample_batch(&page->device_samples, r, s);
      if (r % 16 == 0) std::this_thread::yield();  // let the reader in now and then
    }
    stop.store(true, std::memory_order_release);
  });
  uint64_t reads = 0, torn = 0, failed = 0;
  while (!stop.load(std::memory_order_acquire) || reads == 0) {
    auto b = read_sample_batch(&page->device_samples);
    if (!b) {
      failed += b.status().code() != Errc::kTimeout;
      continue;
    }
    ++reads;
    const uint32_t r = b->round;
    if (r == 0) {
      if (!b->samples.empty()) ++torn;
      continue;
    }
    if (b->samples.size() != 1 + r % PERFQ_SYNC_MAX_SAMPLES) ++torn;
    for (size_t i = 0; i < b->samples.size(); ++i) {
      const auto& s = b->samples[i];
      if (s.before != r * 1000ULL + i || s.value != r * 2000ULL + i || s.after != r * 3000ULL + i)
        ++torn;
    }
  }
  writer.join();
  CHECK(torn == 0);
  CHECK(failed == 0);
  CHECK(reads > 0);
}

}  // namespace
}  // namespace perfq
