// perfq.hpp - the host instrumentation API for C++: the C API of perfq.h
// with event handles and scoped begin/end.
//
//   static const perfq::Event compute{"compute"};          // registers once
//   { perfq::Scope s{compute, job_id};  ... }               // begin ... end
//   perfq::instant(submit, job_id);
//   perfq::counter(queue_depth, depth);
//
//   static const perfq::Category gpu{"gpu"};                // PERFQ_CATEGORIES
//   { perfq::Scope s{gpu, compute, job_id}; ... }           // only if gpu is on
//   if (gpu) perfq::instant(submit, job_id);
//
// Same threading contract as perfq.h: everything may be called from any
// thread at any time; recording never blocks and never throws.  With
// PERFQ_DISABLE defined, every call is nothing (perfq.h).
#pragma once

#include <cerrno>
#include <cstdint>

#include "perfq/perfq.h"

namespace perfq {

enum class EventKind : int {
  kSpan = PERFQ_KIND_BEGIN,  // recorded with begin/end (Scope)
  kInstant = PERFQ_KIND_INSTANT,
  kCounter = PERFQ_KIND_COUNTER,
};

// A registered event name.  Construction registers it (a lock, maybe a
// message to the daemon): make it static or keep it around.  A refused
// registration (perfq_event()'s errors) gives id 0, false, and error() says
// why (an errno value, counted in perfq_stats.errors); recording it is
// harmless.
class Event {
 public:
  explicit Event(const char* name, EventKind kind = EventKind::kSpan) noexcept
      : id_(perfq_event(name, static_cast<int>(kind))), error_(id_ ? 0 : errno) {}
  // An event whose arg is one number named arg (perfq_event_arg()):
  // PERFQ_ARG_BYTES declares a byte count.
  Event(const char* name, EventKind kind, const char* arg) noexcept
      : id_(perfq_event_arg(name, static_cast<int>(kind), arg)), error_(id_ ? 0 : errno) {}
  // An event whose arg is two 32-bit numbers named arg_hi and arg_lo
  // (perfq_event2()): record it with arg2(hi, lo).
  Event(const char* name, EventKind kind, const char* arg_hi, const char* arg_lo) noexcept
      : id_(perfq_event2(name, static_cast<int>(kind), arg_hi, arg_lo)), error_(id_ ? 0 : errno) {}
  uint32_t id() const noexcept { return id_; }
  int error() const noexcept { return error_; }
  explicit operator bool() const noexcept { return id_ != 0; }

 private:
  uint32_t id_;
  int error_;
};

// A category (perfq_category()): true while enabled.  Testing it is one
// relaxed load.  An invalid name gives a category that is always disabled.
class Category {
 public:
  explicit Category(const char* name) noexcept : c_(perfq_category(name)) {}
  bool enabled() const noexcept { return perfq_category_enabled(c_) != 0; }
  explicit operator bool() const noexcept { return enabled(); }
  const struct perfq_category* get() const noexcept { return c_; }

 private:
  const struct perfq_category* c_;
};

// The arg of an event of two numbers: PERFQ_ARG2(hi, lo).
constexpr uint64_t arg2(uint32_t hi, uint32_t lo) noexcept { return uint64_t{hi} << 32 | lo; }

inline void span_begin(const Event& e, uint64_t arg = 0) noexcept { perfq_begin(e.id(), arg); }
inline void span_end(const Event& e, uint64_t arg = 0) noexcept { perfq_end(e.id(), arg); }
inline void instant(const Event& e, uint64_t arg = 0) noexcept { perfq_instant(e.id(), arg); }
inline void counter(const Event& e, uint64_t value) noexcept { perfq_counter(e.id(), value); }

// Records begin now and end (same event, same arg) when it goes out of
// scope: PERFQ_SCOPE() of C.  With a category, only if the category is
// enabled at the begin (then the end is recorded too): PERFQ_SCOPE_IN().
class Scope {
 public:
  explicit Scope(const Event& e, uint64_t arg = 0) noexcept
      : s_(perfq_scope_begin(nullptr, e.id(), arg)) {}
  Scope(const Category& c, const Event& e, uint64_t arg = 0) noexcept
      : s_(perfq_scope_begin(c.get(), e.id(), arg)) {}
  ~Scope() { perfq_scope_end(&s_); }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  perfq_scope s_;
};

}  // namespace perfq
