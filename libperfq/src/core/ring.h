// Lock-free single-producer/single-consumer rings over any mapped memory.
//
// The ring's slots and its control words may live anywhere: on the heap, in
// a memfd shared between two processes, in a file under /dev/shm, or in a
// PCI BAR.  Positions are free-running u64 counters (slot = pos & mask,
// capacity a power of two).  The producer owns `tail`, the consumer owns
// `head`.  Each may publish its position to a second, remote copy (the
// mirrored control words of the shared region, see perfq_abi.h); each side
// only ever *reads* its local copy of the peer's position.
//
// Threading contract:
//   - exactly one thread uses a SpscProducer, exactly one a SpscConsumer;
//   - neither ever blocks: a push into a full ring fails at once (the caller
//     counts the loss), a peek of an empty ring returns an empty span;
//   - the consumer validates every tail it reads: a tail behind the head,
//     more than `capacity` ahead of it, or moving backwards is reported as a
//     RingFault with the values seen, and nothing outside the slots is read.
//   - the producer validates the head the same way; a bad head makes the
//     ring refuse writes (never overwrite unread data) and is reported.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "perfq/perfq_abi.h"

namespace perfq {

// ---- Ordering helpers ------------------------------------------------------
// Every cross-thread access to a position goes through one of these.  The
// comments at each call site name the matching barrier on the other side.

// Load a position published by the peer; pairs with the peer's store_release.
inline uint64_t load_acquire(const uint64_t* p) noexcept {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
// Publish our own position; pairs with the peer's load_acquire.
inline void store_release(uint64_t* p, uint64_t v) noexcept {
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
// Read a word only we write (or a statistic that needs no ordering).
inline uint64_t load_relaxed(const uint64_t* p) noexcept {
  return __atomic_load_n(p, __ATOMIC_RELAXED);
}
inline void store_relaxed(uint64_t* p, uint64_t v) noexcept {
  __atomic_store_n(p, v, __ATOMIC_RELAXED);
}

inline constexpr bool is_pow2(uint64_t v) noexcept { return v != 0 && (v & (v - 1)) == 0; }

// ---- Faults -----------------------------------------------------------------

// What a side saw when the peer's position made no sense.
struct RingFault {
  enum class Kind : uint8_t {
    kNone = 0,
    kTailBehindHead,      // consumer: tail < head
    kTailTooFarAhead,     // consumer: tail - head > capacity
    kTailMovedBackwards,  // consumer: tail < a tail seen before
    kHeadAheadOfTail,     // producer: head > tail
    kHeadTooFarBehind,    // producer: tail - head > capacity
    kHeadMovedBackwards,  // producer: head < a head seen before
  };
  Kind kind = Kind::kNone;
  uint64_t seen = 0;      // the peer position that was read
  uint64_t own = 0;       // our own position at that moment
  uint64_t previous = 0;  // the last valid peer position we had
  uint64_t capacity = 0;

  explicit operator bool() const { return kind != Kind::kNone; }
  // "tail 5000 is more than capacity 1024 ahead of head 100 (previous tail 120)"
  std::string describe() const;
};

// ---- Spans --------------------------------------------------------------------

// Up to two contiguous pieces of slots (the second one after a wrap).
template <class T>
struct RingSpan {
  T* first = nullptr;
  size_t first_len = 0;
  T* second = nullptr;
  size_t second_len = 0;

  size_t size() const noexcept { return first_len + second_len; }
  bool empty() const noexcept { return size() == 0; }
  T& operator[](size_t i) const noexcept {
    return i < first_len ? first[i] : second[i - first_len];
  }
  // Copy the first n elements out (n <= size()).
  void copy_to(std::remove_const_t<T>* out, size_t n) const noexcept {
    size_t a = n < first_len ? n : first_len;
    std::memcpy(out, first, a * sizeof(T));
    if (n > a) std::memcpy(out + a, second, (n - a) * sizeof(T));
  }
};

template <class T>
inline RingSpan<T> make_span(T* slots, uint64_t mask, uint64_t pos, size_t n) noexcept {
  const uint64_t idx = pos & mask;
  const uint64_t to_end = mask + 1 - idx;
  RingSpan<T> s;
  s.first = slots + idx;
  s.first_len = n < to_end ? n : static_cast<size_t>(to_end);
  s.second = slots;
  s.second_len = n - s.first_len;
  return s;
}

// ---- Producer -------------------------------------------------------------------

// What every producer has: its slots, its position, the consumer's position
// as last read, and the check of that position.
template <class T>
class ProducerBase {
  static_assert(std::is_trivially_copyable_v<T>, "ring elements are copied as bytes");

 public:
  uint64_t capacity() const noexcept { return mask_ + 1; }
  uint64_t tail() const noexcept { return tail_; }
  const RingFault& fault() const noexcept { return fault_; }

 protected:
  ProducerBase() = default;
  // capacity must be a power of two; the caller has validated it.
  ProducerBase(T* slots, uint64_t capacity, const uint64_t* tail, const uint64_t* head) noexcept
      : slots_(slots), mask_(capacity - 1), head_word_(head) {
    tail_ = load_relaxed(tail);
    head_cache_ = load_acquire(head);
  }

  // Re-read the consumer's position; false when the ring is still full or
  // the head is invalid (then fault_ says why, and nothing is written).
  bool refresh_head() noexcept {
    // Pairs with store_release of the head in SpscConsumer::release(): the
    // consumer has finished reading every slot below the head we see.
    const uint64_t h = load_acquire(head_word_);
    if (h > tail_) {
      set_fault(RingFault::Kind::kHeadAheadOfTail, h);
      return false;
    }
    if (h < head_cache_) {
      // A head that moved backwards would let us overwrite unread slots.
      set_fault(RingFault::Kind::kHeadMovedBackwards, h);
      return false;
    }
    if (tail_ - h > capacity()) {
      set_fault(RingFault::Kind::kHeadTooFarBehind, h);
      return false;
    }
    head_cache_ = h;
    return tail_ - h < capacity();
  }
  void set_fault(RingFault::Kind k, uint64_t seen) noexcept {
    if (!fault_) fault_ = RingFault{k, seen, tail_, head_cache_, capacity()};
  }
  // Room for one more element (re-reading the head when the cache says full).
  bool room_for_one() noexcept { return tail_ - head_cache_ <= mask_ || refresh_head(); }

  T* slots_ = nullptr;
  uint64_t mask_ = 0;
  const uint64_t* head_word_ = nullptr;
  uint64_t tail_ = 0;
  uint64_t head_cache_ = 0;
  RingFault fault_;
};

template <class T>
class SpscProducer : public ProducerBase<T> {
  using B = ProducerBase<T>;

 public:
  struct Words {
    uint64_t* tail = nullptr;         // our position (local copy)
    uint64_t* tail_mirror = nullptr;  // optional remote copy of our position
    const uint64_t* head = nullptr;   // the consumer's position (our local copy)
  };

  SpscProducer() = default;
  // capacity must be a power of two; the caller has validated it.
  SpscProducer(T* slots, uint64_t capacity, Words w) noexcept
      : B(slots, capacity, w.tail, w.head), words_(w) {}
  SpscProducer(const SpscProducer&) = delete;
  SpscProducer& operator=(const SpscProducer&) = delete;
  SpscProducer(SpscProducer&&) noexcept = default;
  SpscProducer& operator=(SpscProducer&&) noexcept = default;

  // Push one element; false when the ring is full (or the head is corrupt).
  [[nodiscard]] bool try_push(const T& v) noexcept {
    if (!B::room_for_one()) return false;
    B::slots_[B::tail_ & B::mask_] = v;
    ++B::tail_;
    publish();
    return true;
  }

  // Free slots, from the cached head; refreshed when that says full.
  size_t free_slots() noexcept {
    uint64_t used = B::tail_ - B::head_cache_;
    if (used > B::mask_) {
      if (!B::refresh_head()) return 0;
      used = B::tail_ - B::head_cache_;
    }
    return static_cast<size_t>(B::capacity() - used);
  }

  // Reserve up to n slots to fill in place; the span may be shorter (or
  // empty when the ring is full).  Nothing is visible before commit().
  [[nodiscard]] RingSpan<T> reserve(size_t n) noexcept {
    uint64_t avail = B::capacity() - (B::tail_ - B::head_cache_);
    if (avail < n && B::refresh_head()) avail = B::capacity() - (B::tail_ - B::head_cache_);
    if (B::fault_) avail = 0;
    return make_span(B::slots_, B::mask_, B::tail_, n < avail ? n : static_cast<size_t>(avail));
  }
  // Make n reserved slots visible to the consumer.
  void commit(size_t n) noexcept {
    B::tail_ += n;
    publish();
  }

 private:
  void publish() noexcept {
    // Pairs with load_acquire of the tail in SpscConsumer::refresh_tail():
    // the slot writes above are visible before the new tail.
    store_release(words_.tail, B::tail_);
    if (words_.tail_mirror) store_release(words_.tail_mirror, B::tail_);
  }

  Words words_;
};

// ---- Chunked producer ---------------------------------------------------------------

// A producer that publishes its tail once per chunk of `chunk` elements (a
// power of two), and its position after every element in a word of its own
// (`written`, perfq_spsc_header): the consumer, polling the tail, never
// reads the cache lines the producer is writing, and the tail's line moves
// between them once per chunk instead of once per element.  A consumer
// takes a partly filled chunk through `written` when the tail stands still
// (SpscConsumer::peek_written()); flush() publishes it.  The fast path is
// one slot store, two counter stores and a test: no configuration branch.
template <class T>
class ChunkedProducer : public ProducerBase<T> {
  using B = ProducerBase<T>;

 public:
  struct Words {
    uint64_t* tail = nullptr;        // published once per chunk
    uint64_t* written = nullptr;     // published after every element
    const uint64_t* head = nullptr;  // the consumer's position
  };

  ChunkedProducer() = default;
  // capacity and chunk: powers of two, chunk <= capacity.
  ChunkedProducer(T* slots, uint64_t capacity, uint64_t chunk, Words w) noexcept
      : B(slots, capacity, w.tail, w.head), chunk_mask_(chunk - 1), words_(w) {}
  ChunkedProducer(const ChunkedProducer&) = delete;
  ChunkedProducer& operator=(const ChunkedProducer&) = delete;
  ChunkedProducer(ChunkedProducer&&) noexcept = default;
  ChunkedProducer& operator=(ChunkedProducer&&) noexcept = default;

  // B::tail(): the position written, published or not.
  [[nodiscard]] bool try_push(const T& v) noexcept {
    if (!B::room_for_one()) return false;
    B::slots_[B::tail_ & B::mask_] = v;
    ++B::tail_;
    // Pairs with the consumer's load_acquire of `written`: the slot first.
    store_release(words_.written, B::tail_);
    // Pairs with the consumer's load_acquire of the tail.
    if ((B::tail_ & chunk_mask_) == 0) store_release(words_.tail, B::tail_);
    return true;
  }

  // Publish a partly filled chunk (the thread ends, the ring is given up).
  void flush() noexcept {
    if (words_.tail) store_release(words_.tail, B::tail_);
  }

 private:
  uint64_t chunk_mask_ = 0;
  Words words_;
};

// ---- Consumer -------------------------------------------------------------------

template <class T>
class SpscConsumer {
  static_assert(std::is_trivially_copyable_v<T>, "ring elements are copied as bytes");

 public:
  struct Words {
    const uint64_t* tail = nullptr;   // the producer's position (our local copy)
    uint64_t* head = nullptr;         // our position (local copy)
    uint64_t* head_mirror = nullptr;  // optional remote copy of our position
  };

  SpscConsumer() = default;
  SpscConsumer(const T* slots, uint64_t capacity, Words w) noexcept
      : slots_(slots), mask_(capacity - 1), words_(w) {
    head_ = load_relaxed(w.head);
    tail_cache_ = head_;
    published_ = head_;
  }
  SpscConsumer(const SpscConsumer&) = delete;
  SpscConsumer& operator=(const SpscConsumer&) = delete;
  SpscConsumer(SpscConsumer&&) noexcept = default;
  SpscConsumer& operator=(SpscConsumer&&) noexcept = default;

  uint64_t capacity() const noexcept { return mask_ + 1; }
  uint64_t head() const noexcept { return head_; }
  uint64_t published() const noexcept { return published_; }  // the newest tail read
  // How many times the tail was read (one that was sound): a caller that
  // must know whether a peek() read it anew compares this before and after.
  uint64_t tail_loads() const noexcept { return tail_loads_; }
  const RingFault& fault() const noexcept { return fault_; }

  // Elements readable now, up to max.  The tail is re-read only when the
  // cached one offers fewer than max.  On a corrupt tail the span is empty
  // and fault() says what was seen; the consumer stays where it was.
  [[nodiscard]] RingSpan<const T> peek(size_t max = SIZE_MAX) noexcept {
    uint64_t avail = tail_cache_ - head_;
    if (avail < max) {
      if (!refresh_tail()) return {};
      avail = tail_cache_ - head_;
    }
    return make_span(slots_, mask_, head_, max < avail ? max : static_cast<size_t>(avail));
  }

  // As peek(), and also what a chunked producer (ChunkedProducer) has
  // written but not published yet: up to its `written` word, which it keeps
  // after every element (0: not kept, ignored).  For a producer whose tail
  // stands still, or that has ended.  A `written` more than capacity ahead
  // of the head is a fault (kTailTooFarAhead); one behind what was already
  // seen says nothing new.
  [[nodiscard]] RingSpan<const T> peek_written(const uint64_t* written,
                                               size_t max = SIZE_MAX) noexcept {
    auto s = peek(max);
    if (fault_ || s.size() >= max) return s;
    // Pairs with the producer's store_release of `written` after the slot.
    const uint64_t w = load_acquire(written);
    if (w == 0 || w <= tail_cache_) return s;
    if (w - head_ > capacity()) {
      fault_ = RingFault{RingFault::Kind::kTailTooFarAhead, w, head_, tail_cache_, capacity()};
      return {};
    }
    tail_cache_ = w;
    const uint64_t avail = tail_cache_ - head_;
    return make_span(slots_, mask_, head_, max < avail ? max : static_cast<size_t>(avail));
  }

  // Hand n peeked slots back to the producer.
  void release(size_t n) noexcept {
    head_ += n;
    // Pairs with load_acquire of the head in SpscProducer::refresh_head():
    // our reads of the released slots happen before the producer reuses them.
    store_release(words_.head, head_);
    if (words_.head_mirror) store_release(words_.head_mirror, head_);
  }

  // Convenience: copy one element out.
  [[nodiscard]] bool try_pop(T* out) noexcept {
    auto s = peek(1);
    if (s.empty()) return false;
    *out = s[0];
    release(1);
    return true;
  }

  // Fill level as last seen (an estimate while the producer runs).
  uint64_t size_estimate() noexcept {
    refresh_tail();
    return tail_cache_ - head_;
  }

  // Forget a fault and accept the producer's current tail as the new
  // reference (after the caller has reported the fault).  Returns false if
  // the tail is still invalid.
  bool clear_fault() noexcept {
    fault_ = RingFault{};
    tail_cache_ = head_;
    published_ = 0;
    return refresh_tail();
  }

 private:
  bool refresh_tail() noexcept {
    if (fault_) return false;
    // Pairs with store_release of the tail in SpscProducer::publish(): every
    // slot below the tail we see has been written.
    const uint64_t t = load_acquire(words_.tail);
    RingFault::Kind k = RingFault::Kind::kNone;
    // The head may be ahead of the published tail: what peek_written() took
    // (a chunked producer publishes it later, or never).
    if (t < published_)
      k = t < head_ ? RingFault::Kind::kTailBehindHead : RingFault::Kind::kTailMovedBackwards;
    else if (t > head_ && t - head_ > capacity())
      k = RingFault::Kind::kTailTooFarAhead;
    if (k != RingFault::Kind::kNone) {
      fault_ = RingFault{k, t, head_, tail_cache_, capacity()};
      return false;
    }
    published_ = t;
    ++tail_loads_;
    if (t > tail_cache_) tail_cache_ = t;
    return true;
  }

  const T* slots_ = nullptr;
  uint64_t mask_ = 0;
  Words words_;
  uint64_t head_ = 0;
  uint64_t tail_cache_ = 0;  // readable up to here (the tail, or `written`)
  uint64_t published_ = 0;   // the newest tail read
  uint64_t tail_loads_ = 0;
  RingFault fault_;
};

}  // namespace perfq
