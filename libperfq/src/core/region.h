// The shared region: create, open and validate it, and get the two ends of
// its record ring (the shared queue) with the mirrored control-word protocol.
//
// The device side creates a region (Region::create / Region::format), the
// host side opens one (Region::open / Region::attach).  Opening validates
// the header once (magic, ABI version, features, geometry, every section's
// bounds and overlaps) and keeps a private copy: whatever the peer writes
// into the header afterwards, this process never uses a geometry it has not
// checked.  See perfq_abi.h for the layout.
//
// Threading: a Region is immutable after construction and may be shared by
// threads; each ring end it hands out belongs to one thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "core/mapping.h"
#include "core/ring.h"
#include "perfq/perfq_abi.h"
#include "perfq/status.h"

namespace perfq {

struct RegionGeometry {
  uint64_t ring_capacity = 1u << 16;  // records, a power of two
  uint32_t dict_capacity = 255;       // event dictionary entries
  uint64_t app_size = 64 * 1024;      // application area bytes (rounded up to pages)
  uint64_t device_clock_hz = 1'000'000'000;
  uint64_t timer_hz = 1'000'000'000;
  uint64_t features = 0;
  std::string device_name = "perfq-device";
  uint64_t min_region_size = 0;  // pad the region to at least this (e.g. a BAR size)
};

// The header a device writes for this geometry (magic included), with the
// default section layout.  Fails on a geometry a reader would refuse.
Result<perfq_region_header> layout_region(const RegionGeometry& g);

// Check a header (a private copy) against the length of the memory it came
// from.  The error names the field and the values seen.
Status validate_region_header(const perfq_region_header& h, uint64_t mapped_len);

// Names of the sections, for messages ("ring", "dev_ctrl", ...).
const char* section_name(int id);

class Region {
 public:
  // Create (or replace) the region file at path, e.g. under /dev/shm.
  static Result<Region> create(const std::string& path, const RegionGeometry& g);
  // Lay a new region out in memory mapped by someone else (ivshmem BAR file).
  static Result<Region> format(void* base, uint64_t len, const RegionGeometry& g);
  // Open and validate an existing region file.
  static Result<Region> open(const std::string& path);
  // Validate a region in memory mapped by someone else (driver mmap).
  static Result<Region> attach(void* base, uint64_t len);

  Region(Region&&) noexcept = default;
  Region& operator=(Region&&) noexcept = default;
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  const perfq_region_header& header() const { return hdr_; }
  uint64_t size() const { return hdr_.region_size; }
  uint64_t ring_capacity() const { return hdr_.ring_capacity; }
  std::string device_name() const;
  uint8_t* base() const { return base_; }
  // Bytes mapped at base(): the whole file for a region Region::open()
  // mapped, the region itself for one attached to memory mapped elsewhere.
  uint64_t mapped_size() const { return map_.get() != nullptr ? map_.size() : hdr_.region_size; }

  template <class T>
  T* section(perfq_section_id id) const {
    return reinterpret_cast<T*>(base_ + hdr_.sections[id].offset);
  }
  uint64_t section_size(perfq_section_id id) const { return hdr_.sections[id].size; }

  perfq_dev_ctrl* dev_ctrl() const { return section<perfq_dev_ctrl>(PERFQ_SECTION_DEV_CTRL); }
  perfq_host_ctrl* host_ctrl() const { return section<perfq_host_ctrl>(PERFQ_SECTION_HOST_CTRL); }
  perfq_timer_page* timer() const { return section<perfq_timer_page>(PERFQ_SECTION_TIMER); }
  perfq_sync_page* sync() const { return section<perfq_sync_page>(PERFQ_SECTION_SYNC); }
  perfq_dict_header* dict() const { return section<perfq_dict_header>(PERFQ_SECTION_DICT); }
  std::span<uint8_t> app_area() const {
    return {section<uint8_t>(PERFQ_SECTION_APP), section_size(PERFQ_SECTION_APP)};
  }
  perfq_record* ring_slots() const { return section<perfq_record>(PERFQ_SECTION_RING); }

  // The device collector's end: writes records, publishes the tail to
  // DEV_CTRL.tail and HOST_CTRL.tail_mirror, reads DEV_CTRL.head_mirror.
  SpscProducer<perfq_record> device_producer() const;
  // The host drain thread's end: polls HOST_CTRL.tail_mirror, publishes the
  // head to HOST_CTRL.head and DEV_CTRL.head_mirror.
  SpscConsumer<perfq_record> host_consumer() const;

 private:
  Region(Mapping map, uint8_t* base, const perfq_region_header& hdr)
      : map_(std::move(map)), base_(base), hdr_(hdr) {}
  static Status write_layout(uint8_t* base, uint64_t len, const RegionGeometry& g,
                             perfq_region_header* out);

  Mapping map_;  // empty when the memory belongs to someone else
  uint8_t* base_ = nullptr;
  perfq_region_header hdr_{};  // the validated private copy
};

}  // namespace perfq
