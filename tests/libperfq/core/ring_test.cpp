// Tests of libperfq/src/core/ring.h and spsc_ring.h: semantics, real threads, real
// processes over shared memory, and a hostile peer.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "core/mapping.h"
#include "core/region.h"
#include "core/ring.h"
#include "core/spsc_ring.h"
#include "test_util.h"

namespace perfq {
namespace {

perfq_record rec(uint64_t i) {
  return perfq_record{i,
                      static_cast<uint32_t>(i * 7),
                      static_cast<uint16_t>(i & 0xff),
                      PERFQ_FLAGS(PERFQ_KIND_INSTANT, PERFQ_CLOCK_HOST),
                      i * 3,
                      ~i};
}

bool same(const perfq_record& r, uint64_t i) {
  perfq_record e = rec(i);
  return std::memcmp(&r, &e, sizeof(r)) == 0;
}

TEST_CASE("ring: empty and full", "[ring]") {
  const uint64_t cap = GENERATE(2, 4, 64, 1024);
  HeapRing<perfq_record> ring(cap);
  auto p = ring.producer();
  auto c = ring.consumer();
  perfq_record out;

  REQUIRE(c.peek().empty());
  REQUIRE_FALSE(c.try_pop(&out));
  REQUIRE(p.free_slots() == cap);

  for (uint64_t i = 0; i < cap; ++i) REQUIRE(p.try_push(rec(i)));
  REQUIRE_FALSE(p.try_push(rec(cap)));  // full: refused at once
  REQUIRE(p.free_slots() == 0);
  REQUIRE(c.size_estimate() == cap);

  REQUIRE(c.try_pop(&out));
  REQUIRE(same(out, 0));
  REQUIRE(p.try_push(rec(cap)));  // one slot came back
  REQUIRE_FALSE(p.try_push(rec(cap + 1)));
  for (uint64_t i = 1; i <= cap; ++i) {
    REQUIRE(c.try_pop(&out));
    REQUIRE(same(out, i));
  }
  REQUIRE_FALSE(c.try_pop(&out));
  REQUIRE_FALSE(p.fault());
  REQUIRE_FALSE(c.fault());
}

TEST_CASE("ring: wrap-around many times", "[ring]") {
  const uint64_t cap = GENERATE(2, 8, 256);
  const uint64_t step = GENERATE(1, 3);
  HeapRing<perfq_record> ring(cap);
  auto p = ring.producer();
  auto c = ring.consumer();
  uint64_t next_in = 0, next_out = 0;
  const uint64_t total = cap * 1000 + 5;
  while (next_out < total) {
    for (uint64_t k = 0; k < step && next_in < total; ++k)
      if (p.try_push(rec(next_in))) ++next_in;
    perfq_record out;
    while (c.try_pop(&out)) {
      REQUIRE(same(out, next_out));
      ++next_out;
    }
  }
  REQUIRE(p.tail() == total);
  REQUIRE(c.head() == total);
}

TEST_CASE("ring: batches of every size up to capacity", "[ring]") {
  const uint64_t cap = GENERATE(2, 16, 128);
  HeapRing<perfq_record> ring(cap);
  auto p = ring.producer();
  auto c = ring.consumer();
  uint64_t seq = 0;
  // Start each batch at a different position so every split point is hit.
  for (uint64_t start_shift = 0; start_shift < cap; start_shift += (cap > 16 ? 7 : 1)) {
    for (size_t n = 1; n <= cap; ++n) {
      auto w = p.reserve(n);
      REQUIRE(w.size() == n);
      for (size_t i = 0; i < n; ++i) w[i] = rec(seq + i);
      REQUIRE(c.peek().empty());  // nothing visible before commit
      p.commit(n);
      auto r = c.peek(n + 5);
      REQUIRE(r.size() == n);
      std::vector<perfq_record> copy(n);
      r.copy_to(copy.data(), n);
      for (size_t i = 0; i < n; ++i) REQUIRE(same(copy[i], seq + i));
      c.release(n);
      seq += n;
    }
    // shift the start position by one
    REQUIRE(p.try_push(rec(seq)));
    perfq_record out;
    REQUIRE(c.try_pop(&out));
    REQUIRE(same(out, seq));
    ++seq;
  }
  // A reservation never exceeds the free space.
  for (uint64_t i = 0; i + 1 < cap; ++i) REQUIRE(p.try_push(rec(seq++)));
  REQUIRE(p.reserve(cap).size() == 1);
}

// One real producer thread and the test thread as consumer; every index is
// checked: none lost, none duplicated, all in order.
template <class MakeEnds>
void stress(uint64_t total, bool batched, MakeEnds make) {
  auto [prod, cons] = make();
  std::atomic<uint64_t> producer_full_spins{0};
  std::atomic<bool> producer_fault{false};
  std::thread producer([&, p = std::move(prod)]() mutable {
    uint64_t i = 0, spins = 0;
    std::mt19937_64 rng(42);
    while (i < total) {
      if (batched) {
        size_t want = 1 + rng() % 97;
        auto w = p.reserve(want);
        size_t n = std::min<uint64_t>(w.size(), total - i);
        for (size_t k = 0; k < n; ++k) w[k] = rec(i + k);
        p.commit(n);
        i += n;
        if (n == 0) ++spins;
      } else if (p.try_push(rec(i))) {
        ++i;
      } else {
        ++spins;
      }
      if (spins && (spins & 1023) == 0) std::this_thread::yield();
      if (p.fault()) {
        producer_fault = true;
        return;
      }
    }
    producer_full_spins = spins;
  });

  uint64_t next = 0, bad = 0, idle = 0;
  std::vector<perfq_record> buf(512);
  while (next < total && !producer_fault) {
    auto s = cons.peek(batched ? buf.size() : 1);
    if (cons.fault()) break;
    if (s.empty()) {
      if ((++idle & 1023) == 0) std::this_thread::yield();
      continue;
    }
    s.copy_to(buf.data(), s.size());
    for (size_t k = 0; k < s.size(); ++k)
      if (!same(buf[k], next + k)) ++bad;
    next += s.size();
    cons.release(s.size());
  }
  producer.join();
  REQUIRE_FALSE(producer_fault);
  REQUIRE_FALSE(cons.fault());
  REQUIRE(bad == 0);
  REQUIRE(next == total);
  REQUIRE(cons.peek().empty());
}

// Under a sanitizer each record costs 10-20 times more: a fifth of them
// still wraps the small ring tens of thousands of times.
constexpr uint64_t kStressScale = kSanitized ? 5 : 1;

TEST_CASE("ring: producer and consumer threads, millions of records", "[ring][stress]") {
  const bool batched = GENERATE(false, true);
  const uint64_t cap = GENERATE(64, 4096);
  HeapRing<perfq_record> ring(cap);
  stress((batched ? 3'000'000 : 2'000'000) / kStressScale, batched,
         [&] { return std::make_pair(ring.producer(), ring.consumer()); });
}

TEST_CASE("ring: threads over a shared region with mirrored control words",
          "[ring][region][stress]") {
  TempShm shm("ring-region");
  RegionGeometry g;
  g.ring_capacity = GENERATE(256, 65536);
  auto dev = Region::create(shm.path(), g);
  REQUIRE(dev.is_ok());
  // The host side either shares the device's mapping (so TSan sees both
  // sides' accesses to one address) or maps the file a second time.
  const bool second_mapping = GENERATE(false, true);
  auto host = second_mapping ? Region::open(shm.path()) : Region::attach(dev->base(), dev->size());
  REQUIRE(host.is_ok());
  constexpr uint64_t kTotal = 2'000'000 / kStressScale;
  stress(kTotal, true,
         [&] { return std::make_pair(dev->device_producer(), host->host_consumer()); });
  // Both copies of each control word agree once the stream is drained.
  REQUIRE(load_acquire(&dev->dev_ctrl()->tail) == kTotal);
  REQUIRE(load_acquire(&host->host_ctrl()->tail_mirror) == kTotal);
  REQUIRE(load_acquire(&host->host_ctrl()->head) == kTotal);
  REQUIRE(load_acquire(&dev->dev_ctrl()->head_mirror) == kTotal);
}

// Consume `total` records in the parent while a forked child produces them.
void consume_from_child(pid_t child, SpscConsumer<perfq_record>& cons, uint64_t total) {
  uint64_t next = 0, bad = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  int status = 0;
  bool reaped = false;
  while (next < total) {
    auto s = cons.peek(256);
    if (cons.fault()) FAIL("consumer fault: " << cons.fault().describe());
    if (s.empty()) {
      if (!reaped && waitpid(child, &status, WNOHANG) == child) reaped = true;
      if (reaped && cons.peek().empty()) break;  // child gone and nothing left
      if (std::chrono::steady_clock::now() > deadline) break;
      std::this_thread::yield();
      continue;
    }
    for (size_t k = 0; k < s.size(); ++k)
      if (!same(s[k], next + k)) ++bad;
    next += s.size();
    cons.release(s.size());
  }
  if (!reaped) REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  REQUIRE(bad == 0);
  REQUIRE(next == total);
}

void produce_and_exit(SpscProducer<perfq_record> p, uint64_t total) {
  uint64_t i = 0;
  while (i < total) {
    if (p.fault()) _exit(3);
    if (p.try_push(rec(i)))
      ++i;
    else
      sched_yield();
  }
  _exit(0);
}

TEST_CASE("ring: two processes over a memfd", "[ring][process]") {
  const uint64_t cap = 1024, total = 2'000'000;
  UniqueFd fd(memfd_create("perfq-ring-test", MFD_CLOEXEC));
  REQUIRE(fd.valid());
  const size_t len = SpscRingMemory<perfq_record>::bytes_for(cap);
  REQUIRE(ftruncate(fd.get(), static_cast<off_t>(len)) == 0);
  auto map = Mapping::map_shared(fd.get(), len, "memfd");
  REQUIRE(map.is_ok());
  REQUIRE(SpscRingMemory<perfq_record>::init(map->get(), len, cap).is_ok());

  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // The child maps the memfd again, as another process would.
    auto m = Mapping::map_shared(fd.get(), len, "memfd");
    if (!m) _exit(2);
    auto r = SpscRingMemory<perfq_record>::attach(m->get(), len);
    if (!r) _exit(2);
    produce_and_exit(r->producer(), total);
  }
  auto ring = SpscRingMemory<perfq_record>::attach(map->get(), len);
  REQUIRE(ring.is_ok());
  auto cons = ring->consumer();
  consume_from_child(child, cons, total);
}

TEST_CASE("ring: two processes over a /dev/shm region", "[ring][region][process]") {
  TempShm shm("region-proc");
  RegionGeometry g;
  g.ring_capacity = 4096;
  REQUIRE(Region::create(shm.path(), g).is_ok());
  const uint64_t total = 2'000'000;
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    auto dev = Region::open(shm.path());
    if (!dev) _exit(2);
    produce_and_exit(dev->device_producer(), total);
  }
  auto host = Region::open(shm.path());
  REQUIRE(host.is_ok());
  auto cons = host->host_consumer();
  consume_from_child(child, cons, total);
}

TEST_CASE("ring: hostile producer writes garbage tails", "[ring][hostile]") {
  TempShm shm("hostile-tail");
  RegionGeometry g;
  g.ring_capacity = 64;
  auto region = Region::create(shm.path(), g);
  REQUIRE(region.is_ok());
  auto prod = region->device_producer();
  auto cons = region->host_consumer();
  uint64_t* tail = &region->host_ctrl()->tail_mirror;

  // A real producer thread delivers 40 records mid-stream, then stops.
  std::thread t([&] {
    for (uint64_t i = 0; i < 40;)
      if (prod.try_push(rec(i))) ++i;
  });
  t.join();
  auto s = cons.peek(10);
  REQUIRE(s.size() == 10);
  cons.release(10);  // head 10, tail 40

  SECTION("tail more than capacity ahead of head") {
    store_release(tail, 10 + 64 + 1);
    REQUIRE(cons.peek().empty());
    REQUIRE(cons.fault().kind == RingFault::Kind::kTailTooFarAhead);
    REQUIRE(cons.fault().seen == 75);
    REQUIRE(cons.fault().describe().find("75") != std::string::npos);
  }
  SECTION("tail behind the head") {
    store_release(tail, 3);
    REQUIRE(cons.peek().empty());
    REQUIRE(cons.fault().kind == RingFault::Kind::kTailBehindHead);
    REQUIRE(cons.fault().own == 10);
  }
  SECTION("tail moving backwards") {
    store_release(tail, 20);
    REQUIRE(cons.peek().empty());
    REQUIRE(cons.fault().kind == RingFault::Kind::kTailMovedBackwards);
    REQUIRE(cons.fault().previous == 40);
  }
  SECTION("a fault is sticky until cleared, then a valid tail is accepted") {
    store_release(tail, ~0ull);
    REQUIRE(cons.peek().empty());
    store_release(tail, 40);
    REQUIRE(cons.peek().empty());  // still faulted
    REQUIRE(cons.clear_fault());
    REQUIRE(cons.peek().size() == 30);
  }
  SECTION("random garbage never yields an out-of-bounds span") {
    std::mt19937_64 rng(7);
    for (int i = 0; i < 20000; ++i) {
      uint64_t v = rng();
      if (i % 3 == 0) v = cons.head() + (v % 200);  // near-plausible values too
      store_release(tail, v);
      cons.clear_fault();
      auto sp = cons.peek();
      REQUIRE(sp.size() <= cons.capacity());
      if (!sp.empty()) {
        REQUIRE(v - cons.head() <= cons.capacity());
        volatile uint64_t sink = 0;
        for (size_t k = 0; k < sp.size(); ++k) sink = sink + sp[k].index;  // ASan checks bounds
      }
    }
  }
}

TEST_CASE("ring: hostile consumer writes garbage heads", "[ring][hostile]") {
  TempShm shm("hostile-head");
  RegionGeometry g;
  g.ring_capacity = 16;
  auto region = Region::create(shm.path(), g);
  REQUIRE(region.is_ok());
  auto prod = region->device_producer();
  for (uint64_t i = 0; i < 16; ++i) REQUIRE(prod.try_push(rec(i)));
  std::vector<perfq_record> before(region->ring_slots(), region->ring_slots() + 16);

  const uint64_t bad_head = GENERATE(17ull, ~0ull, 1ull << 40);
  store_release(&region->dev_ctrl()->head_mirror, bad_head);
  REQUIRE_FALSE(prod.try_push(rec(99)));
  REQUIRE(prod.fault().kind == RingFault::Kind::kHeadAheadOfTail);
  REQUIRE(prod.fault().seen == bad_head);
  REQUIRE(prod.reserve(8).empty());
  // Nothing unread was overwritten.
  REQUIRE(std::memcmp(before.data(), region->ring_slots(), 16 * sizeof(perfq_record)) == 0);
}

TEST_CASE("ring: a head that moves backwards stops the producer", "[ring][hostile]") {
  HeapRing<perfq_record> ring(8);
  auto p = ring.producer();
  auto c = ring.consumer();
  for (uint64_t i = 0; i < 8; ++i) REQUIRE(p.try_push(rec(i)));
  perfq_record out;
  for (int i = 0; i < 4; ++i) REQUIRE(c.try_pop(&out));
  REQUIRE(p.try_push(rec(8)));  // producer caches head 4
  store_release(&ring.memory().header()->head, 2);
  for (int i = 0; i < 4; ++i) (void)p.try_push(rec(9));
  REQUIRE(p.fault().kind == RingFault::Kind::kHeadMovedBackwards);
}

TEST_CASE("spsc ring memory: attach validates the header", "[ring][hostile]") {
  std::vector<uint64_t> mem(SpscRingMemory<perfq_record>::bytes_for(64) / 8);
  const size_t len = mem.size() * 8;
  REQUIRE(SpscRingMemory<perfq_record>::init(mem.data(), len, 64).is_ok());
  REQUIRE(SpscRingMemory<perfq_record>::attach(mem.data(), len).is_ok());
  auto* h = reinterpret_cast<perfq_spsc_header*>(mem.data());

  SECTION("too small") { REQUIRE_FALSE(SpscRingMemory<perfq_record>::attach(mem.data(), 100)); }
  SECTION("bad magic") {
    h->magic ^= 1;
    auto r = SpscRingMemory<perfq_record>::attach(mem.data(), len);
    REQUIRE(r.status().message().find("magic") != std::string::npos);
  }
  SECTION("capacity larger than the memory") {
    h->capacity = 128;
    auto r = SpscRingMemory<perfq_record>::attach(mem.data(), len);
    REQUIRE(r.status().message().find("capacity 128") != std::string::npos);
  }
  SECTION("capacity not a power of two") {
    h->capacity = 48;
    REQUIRE_FALSE(SpscRingMemory<perfq_record>::attach(mem.data(), len));
  }
  SECTION("wrong element size") {
    h->element_size = 16;
    REQUIRE_FALSE(SpscRingMemory<perfq_record>::attach(mem.data(), len));
  }
  SECTION("init refuses a capacity that is not a power of two") {
    REQUIRE_FALSE(SpscRingMemory<perfq_record>::init(mem.data(), len, 48));
  }
}

TEST_CASE("spsc ring memory: losses are counted by the producer", "[ring]") {
  HeapRing<perfq_record> ring(4);
  auto p = ring.producer();
  uint64_t refused = 0;
  for (uint64_t i = 0; i < 10; ++i)
    if (!p.try_push(rec(i))) {
      ring.memory().count_lost();
      ++refused;
    }
  REQUIRE(refused == 6);
  REQUIRE(ring.memory().lost() == 6);
}

// ---- Chunked publishing (host application rings) ---------------------------------------

TEST_CASE("ring: a chunked producer publishes whole chunks, and `written` gives the rest",
          "[ring][chunk]") {
  HeapRing<perfq_record> ring(1024);
  auto p = ring.memory().chunked_producer(64);
  auto c = ring.consumer();
  const uint64_t* written = &ring.memory().header()->written;
  uint64_t next = 0, pushed = 0;
  auto push = [&](uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) REQUIRE(p.try_push(rec(pushed++)));
  };
  auto take = [&](RingSpan<const perfq_record> s) {
    for (size_t k = 0; k < s.size(); ++k) CHECK(same(s[k], next + k));
    next += s.size();
    c.release(s.size());
    return s.size();
  };
  push(10);
  CHECK(c.peek().empty());  // a chunk in progress is not published
  CHECK(load_acquire(written) == 10);
  CHECK(load_acquire(&ring.memory().header()->tail) == 0);
  CHECK(take(c.peek_written(written)) == 10);
  push(54);  // completes the first chunk: the tail is published (64)
  CHECK(take(c.peek()) == 54);
  push(5);  // read through `written`, ahead of the published tail
  CHECK(c.peek().empty());
  CHECK(take(c.peek_written(written, 3)) == 3);  // at most max
  CHECK(take(c.peek_written(written)) == 2);
  push(59);  // the second chunk: tail 128, behind which the head (69) was
  CHECK(take(c.peek()) == 59);
  push(3);
  p.flush();  // a thread that ends publishes its partial chunk
  CHECK(take(c.peek()) == 3);
  CHECK_FALSE(c.fault());
  // Full: the producer refuses, whatever the consumer took through `written`.
  push(1024);
  CHECK_FALSE(p.try_push(rec(pushed)));
  CHECK(take(c.peek_written(written)) == 1024);
  CHECK(next == pushed);
  CHECK_FALSE(c.fault());
  CHECK_FALSE(p.fault());
}

TEST_CASE("ring: a `written` word that lies", "[ring][chunk][hostile]") {
  HeapRing<perfq_record> ring(64);
  auto c = ring.consumer();
  uint64_t* written = &ring.memory().header()->written;
  for (uint64_t i = 0; i < 8; ++i) ring.memory().slots()[i] = rec(i);
  store_release(written, 0);  // not kept (a producer that publishes every element)
  CHECK(c.peek_written(written).empty());
  CHECK_FALSE(c.fault());
  store_release(written, 8);
  auto s = c.peek_written(written);
  REQUIRE(s.size() == 8);
  c.release(8);
  store_release(written, 5);  // behind what was taken: nothing new, no harm
  CHECK(c.peek_written(written).empty());
  CHECK_FALSE(c.fault());
  store_release(written, 8 + 65);  // more than capacity ahead of the head
  CHECK(c.peek_written(written).empty());
  REQUIRE(c.fault());
  CHECK(c.fault().kind == RingFault::Kind::kTailTooFarAhead);
  CHECK(c.fault().seen == 73);
}

TEST_CASE("ring: a chunked producer and a consumer that takes `written` when the tail stands still",
          "[ring][chunk][stress]") {
  const uint64_t cap = GENERATE(64, 4096);
  const uint64_t chunk = GENERATE(1, 8, 64);
  if (chunk > cap) return;
  HeapRing<perfq_record> ring(cap);
  auto p = ring.memory().chunked_producer(chunk);
  auto c = ring.consumer();
  const uint64_t* written = &ring.memory().header()->written;
  constexpr uint64_t kTotal = 2'000'000 / kStressScale;
  std::atomic<bool> fault{false};
  std::thread producer([&] {
    std::mt19937_64 rng(7);
    uint64_t i = 0, spins = 0;
    while (i < kTotal) {
      if (p.try_push(rec(i))) {
        ++i;
        // Now and then a pause: the partial chunk waits for the consumer.
        if ((rng() & 0xffff) == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
      } else if ((++spins & 1023) == 0) {
        std::this_thread::yield();
      }
      if (p.fault()) {
        fault = true;
        return;
      }
    }
    p.flush();
  });
  uint64_t next = 0, bad = 0, idle = 0, via_written = 0, last_tail = ~0ull;
  while (next < kTotal && !fault) {
    // As the daemon does: `written` once the tail stood still for a look.
    const bool still = c.published() == last_tail;
    last_tail = c.published();
    const uint64_t before = next;
    auto s = still ? c.peek_written(written, 512) : c.peek(512);
    if (c.fault()) break;
    for (size_t k = 0; k < s.size(); ++k)
      if (!same(s[k], next + k)) ++bad;
    next += s.size();
    c.release(s.size());
    if (still && next > before && c.published() < next) ++via_written;
    if (s.empty() && (++idle & 255) == 0) std::this_thread::yield();
  }
  producer.join();
  INFO("cap " << cap << " chunk " << chunk << ": " << via_written
              << " takes reached past the published tail");
  REQUIRE_FALSE(fault);
  REQUIRE_FALSE(c.fault());
  CHECK(bad == 0);
  CHECK(next == kTotal);
  if (chunk > 1) CHECK(via_written > 0);
}

}  // namespace
}  // namespace perfq
