// Tests of libperfq/src/core/region.h: create, open, validate, and refuse every kind
// of corrupt header with an error that names the field.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "core/region.h"
#include "test_util.h"

namespace perfq {
namespace {

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

void write_file(const std::string& path, const std::vector<uint8_t>& data) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
}

TEST_CASE("region: create then open from another mapping", "[region]") {
  TempShm shm("region");
  RegionGeometry g;
  g.ring_capacity = 1024;
  g.dict_capacity = 100;
  g.app_size = 10000;
  g.device_name = "test accelerator 0";
  g.device_clock_hz = 250'000'000;
  g.timer_hz = 19'200'000;
  g.features = PERFQ_FEAT_TIMER_REQRESP;
  auto dev = Region::create(shm.path(), g);
  REQUIRE(dev.is_ok());

  auto host = Region::open(shm.path());
  REQUIRE(host.is_ok());
  const auto& h = host->header();
  CHECK(h.abi_version == PERFQ_ABI_VERSION);
  CHECK(h.ring_capacity == 1024);
  CHECK(h.dict_capacity == 100);
  CHECK(h.device_clock_hz == 250'000'000);
  CHECK(h.timer_hz == 19'200'000);
  CHECK(h.features == PERFQ_FEAT_TIMER_REQRESP);
  CHECK(host->device_name() == "test accelerator 0");
  CHECK(host->app_area().size() == 12288);  // rounded up to pages
  CHECK(host->section_size(PERFQ_SECTION_RING) == 1024 * sizeof(perfq_record));
  CHECK(host->dict()->entry_size == sizeof(perfq_dict_entry));
  CHECK(h.region_size % PERFQ_PAGE_SIZE == 0);
  struct stat st;
  REQUIRE(stat(shm.path().c_str(), &st) == 0);
  CHECK(static_cast<uint64_t>(st.st_size) == h.region_size);

  // The control words of the two sides sit on separate pages.
  auto page = [&](const void* p) {
    return (static_cast<const uint8_t*>(p) - host->base()) / PERFQ_PAGE_SIZE;
  };
  CHECK(page(host->dev_ctrl()) != page(host->host_ctrl()));

  // A write on one side is seen through the other mapping.
  dev->app_area()[5] = 0xab;
  CHECK(host->app_area()[5] == 0xab);
}

TEST_CASE("region: format into memory someone else mapped, padded to a BAR size", "[region]") {
  std::vector<uint64_t> mem((1u << 20) / 8);
  RegionGeometry g;
  g.ring_capacity = 256;
  g.min_region_size = 1u << 20;
  auto r = Region::format(mem.data(), mem.size() * 8, g);
  REQUIRE(r.is_ok());
  CHECK(r->size() == (1u << 20));
  auto a = Region::attach(mem.data(), mem.size() * 8);
  REQUIRE(a.is_ok());
  CHECK(a->ring_capacity() == 256);
  // Too little memory for the geometry is an error, not an overflow.
  g.min_region_size = 0;
  g.ring_capacity = 1u << 20;
  auto small = Region::format(mem.data(), mem.size() * 8, g);
  REQUIRE_FALSE(small.is_ok());
  CHECK(small.status().message().find("needs") != std::string::npos);
}

TEST_CASE("region: bad geometries are refused when creating", "[region]") {
  RegionGeometry g;
  SECTION("capacity not a power of two") { g.ring_capacity = 1000; }
  SECTION("capacity too small") { g.ring_capacity = 1; }
  SECTION("empty name") { g.device_name = ""; }
  SECTION("name too long") { g.device_name = std::string(64, 'x'); }
  SECTION("unprintable name") { g.device_name = "dev\n"; }
  SECTION("zero clock rate") { g.timer_hz = 0; }
  SECTION("unknown feature") { g.features = 1ull << 40; }
  auto r = layout_region(g);
  REQUIRE_FALSE(r.is_ok());
  CHECK(r.status().code() == Errc::kInvalidArgument);
}

struct Field {
  std::string name;  // what the error must mention
  size_t offset;
  size_t size;
};

std::vector<Field> header_fields() {
  using H = perfq_region_header;
  std::vector<Field> f = {
      {"magic", offsetof(H, magic), 8},
      {"abi_version", offsetof(H, abi_version), 4},
      {"header_size", offsetof(H, header_size), 4},
      {"features", offsetof(H, features), 8},
      {"region_size", offsetof(H, region_size), 8},
      {"ring_capacity", offsetof(H, ring_capacity), 8},
      {"record_size", offsetof(H, record_size), 4},
      {"dict_capacity", offsetof(H, dict_capacity), 4},
      {"device_clock_hz", offsetof(H, device_clock_hz), 8},
      {"timer_hz", offsetof(H, timer_hz), 8},
      {"device_name", offsetof(H, device_name), PERFQ_DEVICE_NAME_LEN},
  };
  for (int s = 0; s < PERFQ_SECTION_COUNT; ++s) {
    std::string n = std::string("sections[") + section_name(s) + "]";
    f.push_back({n, offsetof(H, sections) + s * sizeof(perfq_section), 8});
    f.push_back({n, offsetof(H, sections) + s * sizeof(perfq_section) + 8, 8});
  }
  for (size_t i = 0; i < std::size(H{}.reserved); ++i)
    f.push_back({"reserved[" + std::to_string(i) + "]", offsetof(H, reserved) + i * 8, 8});
  return f;
}

TEST_CASE("region: every header field corrupted in turn is refused by name", "[region][hostile]") {
  TempShm shm("corrupt");
  RegionGeometry g;
  g.ring_capacity = 128;
  REQUIRE(Region::create(shm.path(), g).is_ok());
  const auto pristine = read_file(shm.path());
  REQUIRE(Region::open(shm.path()).is_ok());

  const auto fields = header_fields();
  // The fields cover the whole header, so no byte escapes the test.
  size_t covered = 0;
  for (const auto& f : fields) covered += f.size;
  REQUIRE(covered == sizeof(perfq_region_header));

  for (uint8_t pattern : {uint8_t{0xff}, uint8_t{0x5a}}) {
    for (const auto& f : fields) {
      auto bad = pristine;
      std::memset(bad.data() + f.offset, pattern, f.size);
      write_file(shm.path(), bad);
      auto r = Region::open(shm.path());
      INFO("field " << f.name << " filled with " << int(pattern));
      REQUIRE_FALSE(r.is_ok());
      CHECK(r.status().code() == Errc::kCorrupt);
      CHECK(r.status().message().find(f.name) != std::string::npos);
      CHECK(r.status().message().find(shm.path()) != std::string::npos);
    }
  }
}

TEST_CASE("region: structural corruption", "[region][hostile]") {
  TempShm shm("struct");
  RegionGeometry g;
  g.ring_capacity = 128;
  REQUIRE(Region::create(shm.path(), g).is_ok());
  auto bytes = read_file(shm.path());
  auto* h = reinterpret_cast<perfq_region_header*>(bytes.data());

  SECTION("overlapping sections") {
    h->sections[PERFQ_SECTION_APP].offset = h->sections[PERFQ_SECTION_DICT].offset;
    write_file(shm.path(), bytes);
    auto r = Region::open(shm.path());
    REQUIRE_FALSE(r.is_ok());
    CHECK(r.status().message().find("overlaps") != std::string::npos);
  }
  SECTION("ring section too small for its capacity") {
    h->ring_capacity = 1u << 20;
    write_file(shm.path(), bytes);
    auto r = Region::open(shm.path());
    REQUIRE_FALSE(r.is_ok());
    CHECK(r.status().message().find("sections[ring]") != std::string::npos);
  }
  SECTION("a section with an offset near 2^64 does not wrap around") {
    h->sections[PERFQ_SECTION_RING].offset = ~uint64_t{0} - 4095;
    write_file(shm.path(), bytes);
    auto r = Region::open(shm.path());
    REQUIRE_FALSE(r.is_ok());
    CHECK(r.status().message().find("runs past") != std::string::npos);
  }
  SECTION("file truncated below region_size") {
    bytes.resize(bytes.size() - PERFQ_PAGE_SIZE);
    write_file(shm.path(), bytes);
    auto r = Region::open(shm.path());
    REQUIRE_FALSE(r.is_ok());
    CHECK(r.status().message().find("region_size") != std::string::npos);
  }
  SECTION("file smaller than a header") {
    bytes.resize(100);
    write_file(shm.path(), bytes);
    auto r = Region::open(shm.path());
    REQUIRE_FALSE(r.is_ok());
    CHECK(r.status().message().find("100 bytes") != std::string::npos);
  }
  SECTION("a region not initialized yet") {
    std::fill(bytes.begin(), bytes.end(), 0);
    write_file(shm.path(), bytes);
    auto r = Region::open(shm.path());
    REQUIRE_FALSE(r.is_ok());
    CHECK(r.status().message().find("not initialized") != std::string::npos);
  }
}

TEST_CASE("region: a missing file is a clear error", "[region]") {
  auto r = Region::open("/dev/shm/perfq-test-does-not-exist");
  REQUIRE_FALSE(r.is_ok());
  CHECK(r.status().code() == Errc::kNotFound);
  CHECK(r.status().message().find("/dev/shm/perfq-test-does-not-exist") != std::string::npos);
}

TEST_CASE("region: the header copy is private", "[region][hostile]") {
  TempShm shm("toctou");
  RegionGeometry g;
  g.ring_capacity = 64;
  REQUIRE(Region::create(shm.path(), g).is_ok());
  auto host = Region::open(shm.path());
  REQUIRE(host.is_ok());
  // The device rewrites its header after the host validated it.
  auto* live = reinterpret_cast<perfq_region_header*>(host->base());
  live->ring_capacity = 1ull << 40;
  live->sections[PERFQ_SECTION_RING].offset = 0;
  CHECK(host->ring_capacity() == 64);
  CHECK(host->section_size(PERFQ_SECTION_RING) == PERFQ_PAGE_SIZE);
  CHECK(reinterpret_cast<uint8_t*>(host->ring_slots()) != host->base());
}

}  // namespace
}  // namespace perfq
