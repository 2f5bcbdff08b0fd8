// A standalone SPSC ring in one block of memory: a perfq_spsc_header
// followed by `capacity` elements.  Host application rings live in a memfd
// laid out this way (the application produces, the daemon consumes); device
// worker queues live on the heap the same way.
//
// SpscRingMemory is a view: it does not own the memory.  HeapRing owns an
// aligned heap block.  Both are non-copyable; producer() and consumer() each
// return the one handle for their side.
#pragma once

#include <cstdlib>
#include <memory>
#include <new>
#include <stdexcept>

#include "core/ring.h"
#include "perfq/perfq_abi.h"
#include "perfq/status.h"

namespace perfq {

template <class T>
class SpscRingMemory {
 public:
  static constexpr size_t bytes_for(uint64_t capacity) {
    return sizeof(perfq_spsc_header) + capacity * sizeof(T);
  }

  // Lay out a new, empty ring in mem (len bytes, 64-byte aligned).
  static Result<SpscRingMemory> init(void* mem, size_t len, uint64_t capacity) {
    if (!is_pow2(capacity))
      return Status(Errc::kInvalidArgument,
                    "ring capacity " + std::to_string(capacity) + " is not a power of two");
    if (len < bytes_for(capacity))
      return Status(Errc::kInvalidArgument, "ring memory of " + std::to_string(len) +
                                                " bytes is too small for " +
                                                std::to_string(capacity) + " elements");
    auto* h = static_cast<perfq_spsc_header*>(mem);
    std::memset(h, 0, sizeof(*h));
    h->version = PERFQ_ABI_VERSION;
    h->element_size = sizeof(T);
    h->capacity = capacity;
    // Pairs with load_acquire(magic) in attach(): the geometry above is
    // visible to whoever sees the magic.
    store_release(&h->magic, PERFQ_SPSC_MAGIC);
    return SpscRingMemory(h);
  }

  // Validate a ring someone else laid out (a memfd from another process).
  static Result<SpscRingMemory> attach(void* mem, size_t len) {
    if (len < sizeof(perfq_spsc_header))
      return Status(Errc::kCorrupt, "ring memory of " + std::to_string(len) +
                                        " bytes is smaller than the ring header");
    auto* h = static_cast<perfq_spsc_header*>(mem);
    if (load_acquire(&h->magic) != PERFQ_SPSC_MAGIC)
      return Status(Errc::kCorrupt, "ring header: bad magic");
    if (h->version != PERFQ_ABI_VERSION)
      return Status(Errc::kCorrupt, "ring header: ABI version " + std::to_string(h->version) +
                                        ", expected " + std::to_string(PERFQ_ABI_VERSION));
    if (h->element_size != sizeof(T))
      return Status(Errc::kCorrupt, "ring header: element_size " + std::to_string(h->element_size) +
                                        ", expected " + std::to_string(sizeof(T)));
    const uint64_t cap = h->capacity;
    if (!is_pow2(cap) || cap > PERFQ_RING_CAPACITY_MAX || len < bytes_for(cap))
      return Status(Errc::kCorrupt, "ring header: capacity " + std::to_string(cap) +
                                        " is not a power of two that fits in " +
                                        std::to_string(len) + " bytes");
    return SpscRingMemory(h, cap);
  }

  SpscRingMemory(SpscRingMemory&&) noexcept = default;
  SpscRingMemory& operator=(SpscRingMemory&&) noexcept = default;
  SpscRingMemory(const SpscRingMemory&) = delete;
  SpscRingMemory& operator=(const SpscRingMemory&) = delete;

  uint64_t capacity() const noexcept { return capacity_; }
  perfq_spsc_header* header() const noexcept { return h_; }
  T* slots() const noexcept { return reinterpret_cast<T*>(h_ + 1); }

  SpscProducer<T> producer() const noexcept {
    return SpscProducer<T>(slots(), capacity_, {&h_->tail, nullptr, &h_->head});
  }
  // Publishes its tail once per `chunk` elements (a power of two <= capacity)
  // and keeps the header's `written` after every element.
  ChunkedProducer<T> chunked_producer(uint64_t chunk) const noexcept {
    return ChunkedProducer<T>(slots(), capacity_, chunk, {&h_->tail, &h_->written, &h_->head});
  }
  SpscConsumer<T> consumer() const noexcept {
    return SpscConsumer<T>(slots(), capacity_, {&h_->tail, &h_->head, nullptr});
  }

  // Losses are counted by the producer side only.  Release: what the
  // producer stored about a drop before counting it (DeviceQueue's drop
  // time) is seen by a reader of the count (the acquire in lost()).
  void count_lost(uint64_t n = 1) const noexcept {
    store_release(&h_->lost, load_relaxed(&h_->lost) + n);
  }
  uint64_t lost() const noexcept { return load_acquire(&h_->lost); }

 private:
  explicit SpscRingMemory(perfq_spsc_header* h) : h_(h), capacity_(h->capacity) {}
  SpscRingMemory(perfq_spsc_header* h, uint64_t cap) : h_(h), capacity_(cap) {}

  perfq_spsc_header* h_;
  uint64_t capacity_;  // our copy: a peer rewriting the header changes nothing
};

// An SPSC ring that owns its (cache-line aligned) heap memory.
template <class T>
class HeapRing {
 public:
  explicit HeapRing(uint64_t capacity)
      : mem_(alloc(capacity)),
        ring_(SpscRingMemory<T>::init(mem_.get(), SpscRingMemory<T>::bytes_for(capacity), capacity)
                  .value()) {}

  SpscRingMemory<T>& memory() noexcept { return ring_; }
  const SpscRingMemory<T>& memory() const noexcept { return ring_; }
  uint64_t capacity() const noexcept { return ring_.capacity(); }
  SpscProducer<T> producer() const noexcept { return ring_.producer(); }
  SpscConsumer<T> consumer() const noexcept { return ring_.consumer(); }

 private:
  struct Free {
    void operator()(void* p) const noexcept { std::free(p); }
  };
  static void* alloc(uint64_t capacity) {
    if (!is_pow2(capacity)) throw std::invalid_argument("ring capacity must be a power of two");
    size_t bytes = SpscRingMemory<T>::bytes_for(capacity);
    bytes = (bytes + PERFQ_CACHELINE - 1) / PERFQ_CACHELINE * PERFQ_CACHELINE;
    void* p = std::aligned_alloc(PERFQ_CACHELINE, bytes);
    if (!p) throw std::bad_alloc();
    std::memset(p, 0, bytes);
    return p;
  }

  std::unique_ptr<void, Free> mem_;
  SpscRingMemory<T> ring_;
};

}  // namespace perfq
