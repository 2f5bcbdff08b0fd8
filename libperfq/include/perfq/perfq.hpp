// perfq.hpp - the host instrumentation API for C++: the C API of perfq.h
// with event handles and scoped begin/end.
//
//   static const perfq::Event compute{"compute"};          // registers once
//   { perfq::Scope s{compute, job_id};  ... }               // begin ... end
//   perfq::instant(submit, job_id);
//   perfq::counter(queue_depth, depth);
//
// Same threading contract as perfq.h: everything may be called from any
// thread at any time; recording never blocks and never throws.
#pragma once

#include <cstdint>

#include "perfq/perfq.h"

namespace perfq {

enum class EventKind : int {
  kSpan = PERFQ_KIND_BEGIN,  // recorded with begin/end (Scope)
  kInstant = PERFQ_KIND_INSTANT,
  kCounter = PERFQ_KIND_COUNTER,
};

// A registered event name.  Construction registers it (a lock, maybe a
// message to the daemon): make it static or keep it around.  An invalid
// name gives id 0, which records nothing useful but is harmless.
class Event {
 public:
  explicit Event(const char* name, EventKind kind = EventKind::kSpan) noexcept
      : id_(perfq_event(name, static_cast<int>(kind))) {}
  uint32_t id() const noexcept { return id_; }
  explicit operator bool() const noexcept { return id_ != 0; }

 private:
  uint32_t id_;
};

inline void span_begin(const Event& e, uint64_t arg = 0) noexcept { perfq_begin(e.id(), arg); }
inline void span_end(const Event& e, uint64_t arg = 0) noexcept { perfq_end(e.id(), arg); }
inline void instant(const Event& e, uint64_t arg = 0) noexcept { perfq_instant(e.id(), arg); }
inline void counter(const Event& e, uint64_t value) noexcept { perfq_counter(e.id(), value); }

// Records begin now and end (same event, same arg) when it goes out of
// scope.
class Scope {
 public:
  explicit Scope(const Event& e, uint64_t arg = 0) noexcept : id_(e.id()), arg_(arg) {
    perfq_begin(id_, arg_);
  }
  ~Scope() { perfq_end(id_, arg_); }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  uint32_t id_;
  uint64_t arg_;
};

}  // namespace perfq
