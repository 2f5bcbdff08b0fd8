#include "perfq/region.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace perfq {
namespace {

constexpr uint64_t kPage = PERFQ_PAGE_SIZE;

constexpr uint64_t round_up_page(uint64_t v) { return (v + kPage - 1) / kPage * kPage; }

const char* const kSectionNames[PERFQ_SECTION_COUNT] = {
    "header", "dev_ctrl", "host_ctrl", "timer", "sync", "dict", "app", "ring",
};

// The smallest size a reader accepts for each section of header h.
uint64_t min_section_size(const perfq_region_header& h, int id) {
  switch (id) {
    case PERFQ_SECTION_HEADER: return sizeof(perfq_region_header);
    case PERFQ_SECTION_DEV_CTRL: return sizeof(perfq_dev_ctrl);
    case PERFQ_SECTION_HOST_CTRL: return sizeof(perfq_host_ctrl);
    case PERFQ_SECTION_TIMER: return sizeof(perfq_timer_page);
    case PERFQ_SECTION_SYNC: return sizeof(perfq_sync_page);
    case PERFQ_SECTION_DICT:
      return sizeof(perfq_dict_header) + uint64_t{h.dict_capacity} * sizeof(perfq_dict_entry);
    case PERFQ_SECTION_APP: return 0;
    case PERFQ_SECTION_RING: return h.ring_capacity * uint64_t{PERFQ_RECORD_SIZE};
  }
  return 0;
}

Status corrupt(std::string msg) { return Status(Errc::kCorrupt, "region header: " + msg); }

}  // namespace

const char* section_name(int id) {
  return id >= 0 && id < PERFQ_SECTION_COUNT ? kSectionNames[id] : "unknown";
}

Result<perfq_region_header> layout_region(const RegionGeometry& g) {
  if (!is_pow2(g.ring_capacity) || g.ring_capacity < PERFQ_RING_CAPACITY_MIN ||
      g.ring_capacity > PERFQ_RING_CAPACITY_MAX)
    return Status(Errc::kInvalidArgument,
                  fmt::format("ring capacity {} is not a power of two in [{}, {}]",
                              g.ring_capacity, PERFQ_RING_CAPACITY_MIN, PERFQ_RING_CAPACITY_MAX));
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
    return Status(Errc::kInvalidArgument, fmt::format("unknown feature bits {:#x}",
                                                      g.features & ~PERFQ_FEAT_ALL));

  perfq_region_header h;
  std::memset(&h, 0, sizeof(h));
  h.magic = PERFQ_REGION_MAGIC;
  h.abi_version = PERFQ_ABI_VERSION;
  h.header_size = sizeof(perfq_region_header);
  h.features = g.features;
  h.ring_capacity = g.ring_capacity;
  h.record_size = PERFQ_RECORD_SIZE;
  h.dict_capacity = g.dict_capacity;
  h.device_clock_hz = g.device_clock_hz;
  h.timer_hz = g.timer_hz;
  std::memcpy(h.device_name, g.device_name.data(), g.device_name.size());

  uint64_t off = 0;
  for (int id = 0; id < PERFQ_SECTION_COUNT; ++id) {
    uint64_t size = id == PERFQ_SECTION_APP ? g.app_size : min_section_size(h, id);
    size = round_up_page(std::max<uint64_t>(size, id == PERFQ_SECTION_APP ? 0 : 1));
    h.sections[id] = perfq_section{off, size};
    off += size;
  }
  h.region_size = std::max(off, round_up_page(g.min_region_size));
  return h;
}

Status validate_region_header(const perfq_region_header& h, uint64_t mapped_len) {
  if (mapped_len < sizeof(perfq_region_header))
    return corrupt(fmt::format("region of {} bytes is smaller than its {}-byte header",
                               mapped_len, sizeof(perfq_region_header)));
  if (h.magic != PERFQ_REGION_MAGIC)
    return corrupt(fmt::format(
        "magic {:#018x} is not {:#018x} (not a perfq region, or not initialized yet)", h.magic,
        PERFQ_REGION_MAGIC));
  if (h.abi_version != PERFQ_ABI_VERSION)
    return corrupt(fmt::format("abi_version {} is not the supported version {}", h.abi_version,
                               PERFQ_ABI_VERSION));
  if (h.header_size != sizeof(perfq_region_header))
    return corrupt(fmt::format("header_size {} is not {}", h.header_size,
                               sizeof(perfq_region_header)));
  if (h.features & ~PERFQ_FEAT_ALL)
    return corrupt(fmt::format("features {:#x} has unknown bits {:#x}", h.features,
                               h.features & ~PERFQ_FEAT_ALL));
  if (h.region_size % kPage != 0 || h.region_size < kPage || h.region_size > mapped_len)
    return corrupt(fmt::format(
        "region_size {} is not a page multiple within the {} bytes mapped", h.region_size,
        mapped_len));
  if (h.record_size != PERFQ_RECORD_SIZE)
    return corrupt(fmt::format("record_size {} is not {}", h.record_size, PERFQ_RECORD_SIZE));
  if (!is_pow2(h.ring_capacity) || h.ring_capacity < PERFQ_RING_CAPACITY_MIN ||
      h.ring_capacity > PERFQ_RING_CAPACITY_MAX)
    return corrupt(fmt::format("ring_capacity {} is not a power of two in [{}, {}]",
                               h.ring_capacity, PERFQ_RING_CAPACITY_MIN,
                               PERFQ_RING_CAPACITY_MAX));
  if (uint64_t{h.dict_capacity} * sizeof(perfq_dict_entry) > h.region_size)
    return corrupt(fmt::format("dict_capacity {} does not fit in the region of {} bytes",
                               h.dict_capacity, h.region_size));
  if (h.device_clock_hz == 0 || h.device_clock_hz > PERFQ_CLOCK_HZ_MAX)
    return corrupt(fmt::format("device_clock_hz {} is outside 1..{}", h.device_clock_hz,
                               PERFQ_CLOCK_HZ_MAX));
  if (h.timer_hz == 0 || h.timer_hz > PERFQ_CLOCK_HZ_MAX)
    return corrupt(fmt::format("timer_hz {} is outside 1..{}", h.timer_hz, PERFQ_CLOCK_HZ_MAX));

  const auto* name = h.device_name;
  const auto* nul = static_cast<const uint8_t*>(std::memchr(name, 0, PERFQ_DEVICE_NAME_LEN));
  if (!nul) return corrupt("device_name has no terminating NUL in its 64 bytes");
  if (nul == name) return corrupt("device_name is empty");
  for (const uint8_t* p = name; p < nul; ++p)
    if (*p < 0x20 || *p > 0x7e)
      return corrupt(fmt::format("device_name has a non-printable byte {:#04x} at offset {}", *p,
                                 p - name));
  for (const uint8_t* p = nul; p < name + PERFQ_DEVICE_NAME_LEN; ++p)
    if (*p != 0)
      return corrupt(fmt::format("device_name has a nonzero byte {:#04x} after its NUL at offset {}",
                                 *p, p - name));

  for (int id = 0; id < PERFQ_SECTION_COUNT; ++id) {
    const perfq_section& s = h.sections[id];
    const char* n = kSectionNames[id];
    if (s.offset % kPage != 0 || s.size % kPage != 0)
      return corrupt(fmt::format("sections[{}] offset {} size {} is not page aligned", n, s.offset,
                                 s.size));
    if (s.offset > h.region_size || s.size > h.region_size - s.offset)
      return corrupt(fmt::format("sections[{}] offset {} size {} runs past region_size {}", n,
                                 s.offset, s.size, h.region_size));
    const uint64_t min = min_section_size(h, id);
    if (s.size < min)
      return corrupt(fmt::format("sections[{}] size {} is smaller than the {} bytes it must hold",
                                 n, s.size, min));
  }
  if (h.sections[PERFQ_SECTION_HEADER].offset != 0)
    return corrupt(fmt::format("sections[header] offset {} is not 0",
                               h.sections[PERFQ_SECTION_HEADER].offset));
  for (int a = 0; a < PERFQ_SECTION_COUNT; ++a) {
    for (int b = a + 1; b < PERFQ_SECTION_COUNT; ++b) {
      const perfq_section& x = h.sections[a];
      const perfq_section& y = h.sections[b];
      if (x.size == 0 || y.size == 0) continue;
      if (x.offset < y.offset + y.size && y.offset < x.offset + x.size)
        return corrupt(fmt::format("sections[{}] [{}, {}) overlaps sections[{}] [{}, {})",
                                   kSectionNames[a], x.offset, x.offset + x.size, kSectionNames[b],
                                   y.offset, y.offset + y.size));
    }
  }
  for (size_t i = 0; i < std::size(h.reserved); ++i)
    if (h.reserved[i] != 0)
      return corrupt(fmt::format("reserved[{}] is {:#x}, must be zero", i, h.reserved[i]));
  return Status::ok();
}

Status Region::write_layout(uint8_t* base, uint64_t len, const RegionGeometry& g,
                            perfq_region_header* out) {
  auto h = layout_region(g);
  if (!h) return h.status();
  if (h->region_size > len)
    return Status(Errc::kInvalidArgument,
                  fmt::format("the region needs {} bytes, only {} are available", h->region_size,
                              len));
  std::memset(base, 0, h->region_size);
  auto* hdr = reinterpret_cast<perfq_region_header*>(base);
  perfq_region_header copy = *h;
  copy.magic = 0;
  std::memcpy(hdr, &copy, sizeof(copy));
  auto* dict = reinterpret_cast<perfq_dict_header*>(base + h->sections[PERFQ_SECTION_DICT].offset);
  dict->entry_size = sizeof(perfq_dict_entry);
  // Pairs with the load_acquire of the magic when a reader opens the region:
  // every field above is visible to whoever sees the magic.
  store_release(&hdr->magic, PERFQ_REGION_MAGIC);
  *out = *h;
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
    return Status(Errc::kCorrupt,
                  fmt::format("region {}: file of {} bytes is smaller than a region header", path,
                              len));
  auto map = Mapping::map_shared(fd.get(), len, "region " + path);
  if (!map) return map.status();
  auto r = attach(map->get(), len);
  if (!r) return Status(r.status().code(), "region " + path + ": " + r.status().message());
  r->map_ = std::move(map.value());
  return r;
}

Result<Region> Region::attach(void* base, uint64_t len) {
  if (len < sizeof(perfq_region_header))
    return Status(Errc::kCorrupt, fmt::format("region of {} bytes is smaller than its header", len));
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
