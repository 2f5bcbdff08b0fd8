#include "core/region.h"
#include "perfq/perfq_device.h"
#include "perfq/perfq_region_check.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace perfq {
namespace {

constexpr uint64_t kPage = PERFQ_PAGE_SIZE;

perfq_dev_geometry sdk_geometry(const RegionGeometry& g) {
  perfq_dev_geometry s{};
  s.ring_capacity = g.ring_capacity;
  s.dict_capacity = g.dict_capacity;
  s.app_size = g.app_size;
  s.device_clock_hz = g.device_clock_hz;
  s.timer_hz = g.timer_hz;
  s.features = g.features;
  s.device_name = g.device_name.c_str();
  s.min_region_size = g.min_region_size;
  return s;
}

Status corrupt(std::string msg) { return Status(Errc::kCorrupt, "region header: " + msg); }

}  // namespace

const char* section_name(int id) { return perfq_section_name(id); }

Result<perfq_region_header> layout_region(const RegionGeometry& g) {
  if (!is_pow2(g.ring_capacity) || g.ring_capacity < PERFQ_RING_CAPACITY_MIN ||
      g.ring_capacity > PERFQ_RING_CAPACITY_MAX)
    return Status(Errc::kInvalidArgument,
                  fmt::format("ring capacity {} is not a power of two in [{}, {}]", g.ring_capacity,
                              PERFQ_RING_CAPACITY_MIN, PERFQ_RING_CAPACITY_MAX));
  if (g.device_name.empty() || g.device_name.size() >= PERFQ_DEVICE_NAME_LEN)
    return Status(Errc::kInvalidArgument,
                  fmt::format("device name must be 1..{} characters", PERFQ_DEVICE_NAME_LEN - 1));
  for (char c : g.device_name)
    if (c < 0x20 || c > 0x7e)
      return Status(Errc::kInvalidArgument, "device name must be printable ASCII");
  if (g.device_clock_hz == 0 || g.device_clock_hz > PERFQ_CLOCK_HZ_MAX || g.timer_hz == 0 ||
      g.timer_hz > PERFQ_CLOCK_HZ_MAX)
    return Status(Errc::kInvalidArgument,
                  fmt::format("clock rates must be 1..{} Hz", PERFQ_CLOCK_HZ_MAX));
  if (g.features & ~PERFQ_FEAT_ALL)
    return Status(Errc::kInvalidArgument,
                  fmt::format("unknown feature bits {:#x}", g.features & ~PERFQ_FEAT_ALL));

  // The layout itself is the device SDK's (one place for it).
  const perfq_dev_geometry sdk = sdk_geometry(g);
  perfq_region_header h;
  if (perfq_dev_layout(&sdk, &h) != PERFQ_DEV_OK)
    return Status(Errc::kInvalidArgument, "region geometry refused by the device SDK");
  return h;
}

// The rules are perfq_check_region_header()'s (the driver's too); the
// words are the host's.
Status validate_region_header(const perfq_region_header& h, uint64_t mapped_len) {
  const perfq_header_check c = perfq_check_region_header(&h, mapped_len);
  const char* n = perfq_section_name(c.index);
  switch (c.fault) {
    case PERFQ_HDR_OK:
      return Status::ok();
    case PERFQ_HDR_SHORT:
      return corrupt(
          fmt::format("region of {} bytes is smaller than its {}-byte header", c.a, c.b));
    case PERFQ_HDR_MAGIC:
      return corrupt(
          fmt::format("magic {:#018x} is not {:#018x} (not a perfq region, or not initialized yet)",
                      c.a, PERFQ_REGION_MAGIC));
    case PERFQ_HDR_ABI_VERSION:
      return corrupt(
          fmt::format("abi_version {} is not the supported version {}", c.a, PERFQ_ABI_VERSION));
    case PERFQ_HDR_HEADER_SIZE:
      return corrupt(fmt::format("header_size {} is not {}", c.a, sizeof(perfq_region_header)));
    case PERFQ_HDR_FEATURES:
      return corrupt(fmt::format("features {:#x} has unknown bits {:#x}", c.a, c.b));
    case PERFQ_HDR_REGION_SIZE:
      return corrupt(fmt::format("region_size {} is not a page multiple within the {} bytes mapped",
                                 c.a, c.b));
    case PERFQ_HDR_RECORD_SIZE:
      return corrupt(fmt::format("record_size {} is not {}", c.a, PERFQ_RECORD_SIZE));
    case PERFQ_HDR_RING_CAPACITY:
      return corrupt(fmt::format("ring_capacity {} is not a power of two in [{}, {}]", c.a,
                                 PERFQ_RING_CAPACITY_MIN, PERFQ_RING_CAPACITY_MAX));
    case PERFQ_HDR_DICT_CAPACITY:
      return corrupt(
          fmt::format("dict_capacity {} does not fit in the region of {} bytes", c.a, c.b));
    case PERFQ_HDR_DEVICE_CLOCK_HZ:
      return corrupt(fmt::format("device_clock_hz {} is outside 1..{}", c.a, PERFQ_CLOCK_HZ_MAX));
    case PERFQ_HDR_TIMER_HZ:
      return corrupt(fmt::format("timer_hz {} is outside 1..{}", c.a, PERFQ_CLOCK_HZ_MAX));
    case PERFQ_HDR_NAME_UNTERMINATED:
      return corrupt("device_name has no terminating NUL in its 64 bytes");
    case PERFQ_HDR_NAME_EMPTY:
      return corrupt("device_name is empty");
    case PERFQ_HDR_NAME_BYTE:
      return corrupt(
          fmt::format("device_name has a non-printable byte {:#04x} at offset {}", c.a, c.index));
    case PERFQ_HDR_NAME_TAIL:
      return corrupt(fmt::format(
          "device_name has a nonzero byte {:#04x} after its NUL at offset {}", c.a, c.index));
    case PERFQ_HDR_SECTION_ALIGN:
      return corrupt(
          fmt::format("sections[{}] offset {} size {} is not page aligned", n, c.a, c.b));
    case PERFQ_HDR_SECTION_BOUNDS:
      return corrupt(fmt::format("sections[{}] offset {} size {} runs past region_size {}", n, c.a,
                                 c.b, h.region_size));
    case PERFQ_HDR_SECTION_SMALL:
      return corrupt(fmt::format("sections[{}] size {} is smaller than the {} bytes it must hold",
                                 n, c.a, c.b));
    case PERFQ_HDR_HEADER_OFFSET:
      return corrupt(fmt::format("sections[header] offset {} is not 0", c.a));
    case PERFQ_HDR_SECTION_OVERLAP: {
      const perfq_section& x = h.sections[c.index];
      const perfq_section& y = h.sections[c.index2];
      return corrupt(fmt::format("sections[{}] [{}, {}) overlaps sections[{}] [{}, {})", n,
                                 x.offset, x.offset + x.size, perfq_section_name(c.index2),
                                 y.offset, y.offset + y.size));
    }
    case PERFQ_HDR_RESERVED:
      return corrupt(fmt::format("reserved[{}] is {:#x}, must be zero", c.index, c.a));
  }
  return corrupt(fmt::format("unknown fault {}", static_cast<int>(c.fault)));
}

Status Region::write_layout(uint8_t* base, uint64_t len, const RegionGeometry& g,
                            perfq_region_header* out) {
  auto h = layout_region(g);
  if (!h) return h.status();
  if (h->region_size > len)
    return Status(
        Errc::kInvalidArgument,
        fmt::format("the region needs {} bytes, only {} are available", h->region_size, len));
  const perfq_dev_geometry sdk = sdk_geometry(g);
  if (perfq_dev_region_init(base, len, &sdk, out) != PERFQ_DEV_OK)
    return Status(Errc::kInvalidArgument, "region layout refused by the device SDK");
  perfq_dev_region_publish(base);
  return validate_region_header(*out, len);
}

Result<Region> Region::create(const std::string& path, const RegionGeometry& geometry) {
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0660));
  if (!fd.valid()) return Status::from_errno("create region " + path);
  // Never shrink an existing file: QEMU may map all of it as a BAR.
  RegionGeometry g = geometry;
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return Status::from_errno("stat region " + path);
  if (static_cast<uint64_t>(st.st_size) > g.min_region_size &&
      static_cast<uint64_t>(st.st_size) % kPage == 0)
    g.min_region_size = static_cast<uint64_t>(st.st_size);
  auto h = layout_region(g);
  if (!h) return h.status();
  if (::ftruncate(fd.get(), static_cast<off_t>(h->region_size)) != 0)
    return Status::from_errno("resize region " + path);
  auto map = Mapping::map_shared(fd.get(), h->region_size, "region " + path);
  if (!map) return map.status();
  auto* base = static_cast<uint8_t*>(map->get());
  perfq_region_header hdr;
  if (Status s = write_layout(base, h->region_size, g, &hdr); !s) return s;
  return Region(std::move(map.value()), base, hdr);
}

Result<Region> Region::format(void* base, uint64_t len, const RegionGeometry& g) {
  perfq_region_header hdr;
  if (Status s = write_layout(static_cast<uint8_t*>(base), len, g, &hdr); !s) return s;
  return Region(Mapping(), static_cast<uint8_t*>(base), hdr);
}

Result<Region> Region::open(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd.valid()) return Status::from_errno("open region " + path);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return Status::from_errno("stat region " + path);
  const auto len = static_cast<uint64_t>(st.st_size);
  if (len < sizeof(perfq_region_header))
    return Status(
        Errc::kCorrupt,
        fmt::format("region {}: file of {} bytes is smaller than a region header", path, len));
  auto map = Mapping::map_shared(fd.get(), len, "region " + path);
  if (!map) return map.status();
  auto r = attach(map->get(), len);
  if (!r) return Status(r.status().code(), "region " + path + ": " + r.status().message());
  r->map_ = std::move(map.value());
  return r;
}

Result<Region> Region::attach(void* base, uint64_t len) {
  if (len < sizeof(perfq_region_header))
    return Status(Errc::kCorrupt,
                  fmt::format("region of {} bytes is smaller than its header", len));
  auto* hdr = static_cast<perfq_region_header*>(base);
  perfq_region_header copy;
  // Pairs with the device's store_release of the magic (write_layout).
  copy.magic = load_acquire(&hdr->magic);
  std::memcpy(reinterpret_cast<uint8_t*>(&copy) + 8, reinterpret_cast<uint8_t*>(hdr) + 8,
              sizeof(copy) - 8);
  if (Status s = validate_region_header(copy, len); !s) return s;
  return Region(Mapping(), static_cast<uint8_t*>(base), copy);
}

std::string Region::device_name() const {
  const auto* n = reinterpret_cast<const char*>(hdr_.device_name);
  return std::string(n, strnlen(n, PERFQ_DEVICE_NAME_LEN));
}

SpscProducer<perfq_record> Region::device_producer() const {
  return SpscProducer<perfq_record>(
      ring_slots(), hdr_.ring_capacity,
      {&dev_ctrl()->tail, &host_ctrl()->tail_mirror, &dev_ctrl()->head_mirror});
}

SpscConsumer<perfq_record> Region::host_consumer() const {
  return SpscConsumer<perfq_record>(
      ring_slots(), hdr_.ring_capacity,
      {&host_ctrl()->tail_mirror, &host_ctrl()->head, &dev_ctrl()->head_mirror});
}

}  // namespace perfq
