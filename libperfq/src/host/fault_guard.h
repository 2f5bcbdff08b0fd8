// Surviving the revocation of a device mapping.
//
// When a perfq device goes away (hot-unplug, driver unbind) the driver
// revokes every user mapping of its region: the next access raises SIGBUS.
// The fault guard is a process-wide SIGBUS handler that turns this into a
// flag.  A SIGBUS whose address lies in a registered range sets the range's
// `gone` flag, maps anonymous zero memory over the whole range (MAP_FIXED)
// and returns, so the faulting access retries harmlessly and reads zeros.
// A thread that reads zeros there and then checks `gone` finds it set: a
// check after each read tells the device's words from the guard's zeros.  Any other SIGBUS goes to
// the handler installed before ours, or kills the process with the default action.
//
// Threading: install_fault_guard() and the registration calls may be made
// from any thread.  The handler reads the registration table lock-free.
// A range must be unregistered before it is unmapped.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace perfq {

// Install the handler (once per process; later calls do nothing).
void install_fault_guard() noexcept;

// How many faults the guard has absorbed, all ranges together.
uint64_t fault_guard_hits() noexcept;

// Registers [addr, addr + len) while alive; installs the handler if needed.
// `gone` must outlive the registration.  valid() is false when the table
// (64 ranges) is full: the range is then unguarded.
class FaultGuardRange {
 public:
  FaultGuardRange() = default;
  FaultGuardRange(void* addr, size_t len, std::atomic<bool>* gone) noexcept;
  ~FaultGuardRange() { reset(); }
  FaultGuardRange(FaultGuardRange&& o) noexcept : slot_(o.slot_) { o.slot_ = -1; }
  FaultGuardRange& operator=(FaultGuardRange&& o) noexcept {
    if (this != &o) {
      reset();
      slot_ = o.slot_;
      o.slot_ = -1;
    }
    return *this;
  }
  FaultGuardRange(const FaultGuardRange&) = delete;
  FaultGuardRange& operator=(const FaultGuardRange&) = delete;

  bool valid() const { return slot_ >= 0; }
  void reset() noexcept;

 private:
  int slot_ = -1;
};

}  // namespace perfq
