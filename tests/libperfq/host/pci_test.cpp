// Tests of perfq/pci.h and host/pci_scan.h: link ceilings, the fixture bus
// (tests/fixtures/pci-dump.txt, read through libpci's dump method) field by
// field, the JSON form, errors on bad dumps, this machine's real bus, and
// /dev/perfqN -> PCI address through sysfs.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "host/pci_scan.h"
#include "perfq/pci.h"
#include "test_util.h"

#ifndef PERFQ_TEST_FIXTURES_DIR
#error "PERFQ_TEST_FIXTURES_DIR must name tests/fixtures"
#endif

namespace perfq {
namespace {

const std::string kDump = std::string(PERFQ_TEST_FIXTURES_DIR) + "/pci-dump.txt";
const std::string kIds = "/usr/share/misc/pci.ids";

PciScan fixture() {
  PciScanOptions o;
  o.dump_file = kDump;
  o.ids_file = kIds;
  auto scan = scan_pci(o);
  INFO(scan.status().message());
  REQUIRE(scan.is_ok());
  return std::move(scan.value());
}

const PciDevice& find(const PciScan& s, const std::string& address) {
  for (const auto& d : s.devices)
    if (d.address == address) return d;
  FAIL("no device " << address << " in the scan");
  throw std::logic_error("unreachable");
}

PciLink link(double gts, uint32_t width) {
  return PciLink{static_cast<uint32_t>(gts * 1000), width};
}

// Bytes per second, checked to a millionth.
bool near(double got, double want) { return std::fabs(got - want) <= want * 1e-6; }

TEST_CASE("pci: link ceilings are speed x width x encoding efficiency / 8", "[pci]") {
  // 8b/10b up to 5 GT/s.
  CHECK(pcie_link_ceiling_bytes_per_s(2500, 1) == 250e6);
  CHECK(pcie_link_ceiling_bytes_per_s(2500, 16) == 4e9);
  CHECK(pcie_link_ceiling_bytes_per_s(5000, 4) == 2e9);
  CHECK(pcie_link_ceiling_bytes_per_s(5000, 16) == 8e9);
  // 128b/130b from 8 GT/s.
  CHECK(near(pcie_link_ceiling_bytes_per_s(8000, 1), 8e9 / 8 * 128 / 130));
  CHECK(near(pcie_link_ceiling_bytes_per_s(8000, 8), 7.876923077e9));
  CHECK(near(pcie_link_ceiling_bytes_per_s(16000, 16), 31.50769231e9));
  CHECK(near(pcie_link_ceiling_bytes_per_s(32000, 16), 63.01538462e9));
  CHECK(near(pcie_link_ceiling_bytes_per_s(64000, 16), 126.0307692e9));
  CHECK(pcie_link_ceiling_bytes_per_s(16000, 0) == 0);
  // Every speed at every width: linear in the width.
  for (uint32_t mtps : kPcieSpeedsMtps)
    for (uint32_t w : {1u, 2u, 4u, 8u, 12u, 16u, 32u})
      CHECK(
          near(pcie_link_ceiling_bytes_per_s(mtps, w), w * pcie_link_ceiling_bytes_per_s(mtps, 1)));

  CHECK(pcie_speed_mtps(1) == 2500u);
  CHECK(pcie_speed_mtps(6) == 64000u);
  CHECK_FALSE(pcie_speed_mtps(0));
  CHECK_FALSE(pcie_speed_mtps(7));
  CHECK_FALSE(pcie_speed_mtps(15));
  CHECK(pcie_generation(2500) == 1);
  CHECK(pcie_generation(32000) == 5);
  CHECK(pcie_generation(1234) == 0);
  CHECK(pci_link_text(link(16, 16)) == "Gen4 x16 (16 GT/s, 31.51 GB/s)");
  CHECK(pci_link_text(link(2.5, 1)) == "Gen1 x1 (2.5 GT/s, 0.25 GB/s)");
}

TEST_CASE("pci: the fixture bus, field by field", "[pci]") {
  const PciScan s = fixture();
  CHECK(s.method == "dump");
  INFO("warnings: " << s.warnings.size());
  CHECK(s.warnings.empty());
  std::vector<std::string> order;
  for (const auto& d : s.devices) order.push_back(d.address);
  // Sorted by domain, bus, slot, function.
  CHECK(order == std::vector<std::string>{
                     "0000:00:03.0", "0000:00:1c.0", "0000:00:1f.3", "0000:01:00.0", "0000:02:00.0",
                     "0000:03:00.0", "0000:04:00.0", "0000:05:00.0", "0000:06:00.0", "0000:07:00.0",
                     "0000:08:00.0", "0000:0b:00.0", "0001:0a:00.0"});
  for (const auto& d : s.devices) {
    INFO(d.address);
    CHECK(d.error.empty());
    // A dump has config space only.
    CHECK_FALSE(d.driver);
    CHECK_FALSE(d.numa_node);
    CHECK_FALSE(d.iommu_group);
  }

  // One expected PCIe endpoint: IDs, names, sizes, links and ceilings.
  struct Want {
    std::string address;
    uint16_t vendor, device, svendor, sdevice, cls;
    std::string vendor_name, device_name, subsystem_name, class_name;
    uint32_t mps_sup, mps, mrrs;
    PciLink max, cur;
    double max_ceiling, cur_ceiling;
    bool below;
  };
  const std::vector<Want> endpoints = {
      {"0000:01:00.0", 0x8086, 0x10d3, 0x8086, 0xa01f, 0x0200, "Intel Corporation",
       "82574L Gigabit Network Connection", "Gigabit CT Desktop Adapter", "Ethernet controller",
       256, 128, 512, link(2.5, 1), link(2.5, 1), 250e6, 250e6, false},
      {"0000:02:00.0", 0x8086, 0x1521, 0x8086, 0x0001, 0x0200, "Intel Corporation",
       "I350 Gigabit Network Connection", "Ethernet Server Adapter I350-T4", "Ethernet controller",
       512, 256, 512, link(5, 4), link(5, 4), 2e9, 2e9, false},
      {"0000:03:00.0", 0x15b3, 0x1015, 0x15b3, 0x0003, 0x0200, "Mellanox Technologies",
       "MT27710 Family [ConnectX-4 Lx]",
       "Stand-up ConnectX-4 Lx EN, 25GbE dual-port SFP28, PCIe3.0 x8, MCX4121A-ACAT",
       "Ethernet controller", 512, 256, 4096, link(8, 8), link(8, 8), 7.876923077e9, 7.876923077e9,
       false},
      {"0000:04:00.0", 0x10de, 0x20b0, 0x10de, 0x134f, 0x0302, "NVIDIA Corporation",
       "GA100 [A100 SXM4 40GB]", "", "3D controller", 256, 256, 512, link(16, 16), link(16, 16),
       31.50769231e9, 31.50769231e9, false},
      {"0000:05:00.0", 0x10de, 0x2330, 0x10de, 0x16c1, 0x0302, "NVIDIA Corporation",
       "GH100[H100 SXM5 80GB]", "", "3D controller", 256, 256, 512, link(32, 16), link(32, 16),
       63.01538462e9, 63.01538462e9, false},
      {"0000:06:00.0", 0x144d, 0xa80a, 0x144d, 0xa801, 0x0108, "Samsung Electronics Co Ltd",
       "NVMe SSD Controller PM9A1/PM9A3/980PRO", "", "Non-Volatile memory controller", 256, 256,
       512, link(16, 4), link(8, 4), 7.876923077e9, 3.938461538e9, true},
      {"0000:07:00.0", 0x1002, 0x73bf, 0x1002, 0x0e3a, 0x0300,
       "Advanced Micro Devices, Inc. [AMD/ATI]", "Navi 21 [Radeon RX 6800/6800 XT / 6900 XT]",
       "Radeon RX 6900 XT", "VGA compatible controller", 256, 256, 512, link(16, 16), link(16, 8),
       31.50769231e9, 15.75384615e9, true},
  };
  for (const auto& w : endpoints) {
    const PciDevice& d = find(s, w.address);
    INFO(w.address);
    CHECK(d.vendor_id == w.vendor);
    CHECK(d.device_id == w.device);
    CHECK(d.subsystem_vendor_id == w.svendor);
    CHECK(d.subsystem_id == w.sdevice);
    CHECK(d.device_class == w.cls);
    CHECK(d.vendor_name == w.vendor_name);
    CHECK(d.device_name == w.device_name);
    CHECK(d.subsystem_vendor_name == w.vendor_name);
    if (w.subsystem_name.empty())
      CHECK_FALSE(d.subsystem_name);  // not listed in pci.ids
    else
      CHECK(d.subsystem_name == w.subsystem_name);
    CHECK(d.class_name == w.class_name);
    CHECK(d.config_readable);
    REQUIRE(d.pcie);
    CHECK(d.pcie->port_type == 0);
    CHECK(std::string(d.pcie->port_type_name()) == "endpoint");
    CHECK(d.pcie->max_payload_supported == w.mps_sup);
    CHECK(d.pcie->max_payload == w.mps);
    CHECK(d.pcie->max_read_request == w.mrrs);
    REQUIRE(d.pcie->link_max);
    REQUIRE(d.pcie->link_current);
    CHECK(*d.pcie->link_max == w.max);
    CHECK(*d.pcie->link_current == w.cur);
    CHECK(near(d.pcie->link_max->ceiling_bytes_per_s(), w.max_ceiling));
    CHECK(near(d.pcie->link_current->ceiling_bytes_per_s(), w.cur_ceiling));
    CHECK(d.pcie->trained_below_max() == w.below);
  }
  CHECK(find(s, "0000:01:00.0").pcie->version == 1);
  CHECK(find(s, "0000:02:00.0").pcie->version == 2);

  SECTION("conventional PCI: no PCIe capability, so no link figures at all") {
    const PciDevice& ivshmem = find(s, "0000:08:00.0");
    CHECK(ivshmem.ids_text() == "1af4:1110");
    CHECK(ivshmem.display_name() == "Red Hat, Inc. Inter-VM shared memory");
    CHECK(ivshmem.subsystem_vendor_id == 0x1af4);
    CHECK(ivshmem.subsystem_id == 0x1100);
    CHECK(ivshmem.subsystem_name == "QEMU Virtual Machine");
    CHECK(ivshmem.class_name == "RAM memory");
    CHECK(ivshmem.config_readable);
    CHECK_FALSE(ivshmem.pcie);
    const PciDevice& e1000 = find(s, "0000:00:03.0");  // a PM capability only
    CHECK(e1000.device_name == "82540EM Gigabit Ethernet Controller");
    CHECK(e1000.subsystem_name == "PRO/1000 MT Desktop Adapter");
    CHECK(e1000.config_readable);
    CHECK_FALSE(e1000.pcie);
  }
  SECTION("a root port: type 1 header without a subsystem, Gen5 x16") {
    const PciDevice& rp = find(s, "0000:00:1c.0");
    CHECK(rp.device_name == "QEMU PCIe Root port");
    CHECK(rp.class_name == "PCI bridge");
    CHECK_FALSE(rp.subsystem_vendor_id);
    CHECK_FALSE(rp.subsystem_name);
    REQUIRE(rp.pcie);
    CHECK(std::string(rp.pcie->port_type_name()) == "root port");
    CHECK(rp.pcie->link_max == link(32, 16));
    CHECK(rp.pcie->link_current == link(32, 16));
  }
  SECTION("a root complex integrated endpoint has a PCIe capability but no link") {
    const PciDevice& rcie = find(s, "0000:00:1f.3");
    REQUIRE(rcie.pcie);
    CHECK(rcie.pcie->port_type == 9);
    CHECK_FALSE(rcie.pcie->link_max);
    CHECK_FALSE(rcie.pcie->link_current);
    CHECK_FALSE(rcie.pcie->trained_below_max());
    CHECK(rcie.pcie->max_payload == 128u);
  }
  SECTION("odd values: unknown IDs, a link that is down, reserved size encodings") {
    const PciDevice& odd = find(s, "0001:0a:00.0");
    CHECK(odd.domain == 1);
    CHECK(odd.bus == 0x0a);
    CHECK(odd.vendor_id == 0x7fff);
    CHECK_FALSE(odd.vendor_name);
    CHECK_FALSE(odd.device_name);
    CHECK(odd.display_name() == "device 7fff:0001");
    CHECK_FALSE(odd.subsystem_vendor_id);
    CHECK(odd.class_name == "Processing accelerators");
    REQUIRE(odd.pcie);
    CHECK(odd.pcie->link_max == link(8, 4));
    CHECK_FALSE(odd.pcie->link_current);  // down, not "0 GT/s x0"
    CHECK_FALSE(odd.pcie->trained_below_max());
    CHECK_FALSE(odd.pcie->max_payload_supported);  // reserved encoding 6
    CHECK(odd.pcie->max_payload == 128u);
    CHECK_FALSE(odd.pcie->max_read_request);  // reserved encoding 7
  }
  SECTION("a 64-byte dump: the capabilities are unknown, not absent") {
    const PciDevice& short_dump = find(s, "0000:0b:00.0");
    CHECK(short_dump.device_name == "NVMe DC SSD [3DNAND, Sentinel Rock Controller]");
    CHECK_FALSE(short_dump.config_readable);
    CHECK_FALSE(short_dump.pcie);
  }
}

TEST_CASE("pci: JSON writes absent facts as null and reads back what it wrote", "[pci]") {
  const PciScan s = fixture();
  for (const auto& d : s.devices) {
    INFO(d.address);
    const nlohmann::json j = pci_device_to_json(d);
    auto back = pci_device_from_json(j);
    REQUIRE(back.is_ok());
    CHECK(back.value() == d);
    CHECK(nlohmann::json::parse(j.dump()) == j);
  }
  const auto nvme = pci_device_to_json(find(s, "0000:06:00.0"));
  CHECK(nvme["address"] == "0000:06:00.0");
  CHECK(nvme["vendor_id"] == "144d");
  CHECK(nvme["device_id"] == "a80a");
  CHECK(nvme["class"] == "0108");
  CHECK(nvme["driver"].is_null());
  CHECK(nvme["numa_node"].is_null());
  CHECK(nvme["pcie"]["link_max"]["speed_gt_s"] == 16.0);
  CHECK(nvme["pcie"]["link_max"]["width"] == 4);
  CHECK(nvme["pcie"]["link_max"]["generation"] == 4);
  CHECK(nvme["pcie"]["link_current"]["speed_gt_s"] == 8.0);
  CHECK(nvme["pcie"]["trained_below_max"] == true);
  CHECK(nvme["pcie"]["max_read_request"] == 512);
  CHECK(pci_device_to_json(find(s, "0000:08:00.0"))["pcie"].is_null());
  CHECK(pci_device_to_json(find(s, "0001:0a:00.0"))["pcie"]["link_current"].is_null());
  CHECK(pci_device_to_json(find(s, "0001:0a:00.0"))["pcie"]["max_read_request"].is_null());

  auto bad = pci_device_from_json({{"address", "0000:00:00.0"}, {"vendor_id", 32902}});
  REQUIRE_FALSE(bad.is_ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("vendor_id"));
  CHECK_FALSE(pci_device_from_json(nlohmann::json::array()).is_ok());
}

TEST_CASE("pci: dumps that cannot be read or parsed fail with the file's name", "[pci]") {
  TempDir dir("pci");
  auto scan_of = [](const std::string& path) {
    PciScanOptions o;
    o.dump_file = path;
    return scan_pci(o);
  };
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir.file(name)) << text;
    return dir.file(name);
  };
  SECTION("missing") {
    auto r = scan_of(dir.file("nope.txt"));
    REQUIRE_FALSE(r.is_ok());
    CHECK_THAT(r.status().message(), Catch::Contains(dir.file("nope.txt")));
    CHECK_THAT(r.status().message(), Catch::Contains("No such file"));
  }
  SECTION("a malformed config line") {
    const auto path = write("bad.txt", "00:01.0 Something\n00: 86 80 zz 10\n");
    auto r = scan_of(path);
    REQUIRE_FALSE(r.is_ok());
    CHECK(r.status().code() == Errc::kCorrupt);
    CHECK_THAT(r.status().message(), Catch::Contains(path));
    CHECK_THAT(r.status().message(), Catch::Contains("Malformed line"));
  }
  SECTION("no device in it") {
    const auto path = write("empty.txt", "this is not lspci output\n");
    auto r = scan_of(path);
    REQUIRE_FALSE(r.is_ok());
    CHECK_THAT(r.status().message(), Catch::Contains(path));
    CHECK_THAT(r.status().message(), Catch::Contains("lspci -xxx"));
  }
  SECTION("a directory") {
    auto r = scan_of(dir.file(""));
    REQUIRE_FALSE(r.is_ok());
    CHECK_THAT(r.status().message(), Catch::Contains(dir.file("")));
  }
  SECTION("an over-long line") {
    const auto path = write("long.txt", "00:01.0 " + std::string(400, 'x') + "\n");
    auto r = scan_of(path);
    REQUIRE_FALSE(r.is_ok());
    CHECK_THAT(r.status().message(), Catch::Contains(path));
  }
  SECTION("a missing pci.ids file") {
    PciScanOptions o;
    o.dump_file = kDump;
    o.ids_file = dir.file("pci.ids");
    auto r = scan_pci(o);
    REQUIRE_FALSE(r.is_ok());
    CHECK_THAT(r.status().message(), Catch::Contains(dir.file("pci.ids")));
  }
  SECTION("an empty pci.ids leaves devices unnamed") {
    PciScanOptions o;
    o.dump_file = kDump;
    o.ids_file = write("pci.ids", "");  // empty: nothing to name them with
    auto r = scan_pci(o);
    REQUIRE(r.is_ok());
    for (const auto& d : r->devices) CHECK_FALSE(d.vendor_name);
  }
  SECTION("address and perfq filters") {
    PciScanOptions o;
    o.dump_file = kDump;
    o.address = "0000:06:00.0";
    auto r = scan_pci(o);
    REQUIRE(r.is_ok());
    REQUIRE(r->devices.size() == 1);
    CHECK(r->devices[0].device_id == 0xa80a);
    o.address.clear();
    o.only_perfq = true;  // a dump knows no drivers
    r = scan_pci(o);
    REQUIRE(r.is_ok());
    CHECK(r->devices.empty());
  }
}

TEST_CASE("pci: this machine's bus agrees with sysfs", "[pci]") {
  if (access("/sys/bus/pci/devices", R_OK) != 0) {
    WARN("no /sys/bus/pci here: nothing to compare");
    return;
  }
  auto scan = scan_pci();
  INFO(scan.status().message());
  REQUIRE(scan.is_ok());
  std::map<std::string, std::filesystem::path> sys;
  for (const auto& e : std::filesystem::directory_iterator("/sys/bus/pci/devices"))
    sys[e.path().filename().string()] = e.path();
  CHECK(scan->devices.size() == sys.size());
  for (const auto& d : scan->devices) {
    INFO(d.address);
    REQUIRE(sys.count(d.address));
    const auto& p = sys[d.address];
    CHECK(std::stoul(slurp(p / "vendor"), nullptr, 16) == d.vendor_id);
    CHECK(std::stoul(slurp(p / "device"), nullptr, 16) == d.device_id);
    std::error_code ec;
    const auto drv = std::filesystem::read_symlink(p / "driver", ec);
    if (ec)
      CHECK_FALSE(d.driver);
    else
      CHECK(d.driver == drv.filename().string());
    CHECK(d.error.empty());
    // Serializes and reads back, whatever the device.
    auto back = pci_device_from_json(pci_device_to_json(d));
    REQUIRE(back.is_ok());
    CHECK(back.value() == d);
  }
  // Nothing here is bound to perfq.ko (no module on this kernel)... unless it is.
  PciScanOptions only;
  only.only_perfq = true;
  auto bound = scan_pci(only);
  REQUIRE(bound.is_ok());
  for (const auto& d : bound->devices) CHECK(d.driver == "perfq");
}

TEST_CASE("pci: /dev/perfqN maps to its PCI address through sysfs", "[pci]") {
  TempDir dir("pcisys");
  const std::string root = dir.file("sys");
  const std::filesystem::path cls = root + "/class/perfq";
  std::filesystem::create_directories(cls / "perfq0");
  std::filesystem::create_directories(cls / "perfq1");
  std::filesystem::create_symlink("../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0",
                                  cls / "perfq0" / "device");
  std::filesystem::create_symlink("../../../devices/virtual/misc", cls / "perfq1" / "device");

  auto a = perfq_device_pci_address("/dev/perfq0", root);
  INFO(a.status().message());
  REQUIRE(a.is_ok());
  CHECK(a.value() == "0000:01:00.0");
  auto missing = perfq_device_pci_address("/dev/perfq7", root);
  REQUIRE_FALSE(missing.is_ok());
  CHECK(missing.status().code() == Errc::kNotFound);
  CHECK_THAT(missing.status().message(), Catch::Contains("perfq7"));
  auto not_pci = perfq_device_pci_address("/dev/perfq1", root);
  REQUIRE_FALSE(not_pci.is_ok());
  CHECK(not_pci.status().code() == Errc::kCorrupt);
  CHECK(perfq_device_pci_address("/dev/perfqX", root).status().code() == Errc::kInvalidArgument);
  CHECK(perfq_device_pci_address("shm:/dev/shm/x", root).status().code() == Errc::kInvalidArgument);

  auto shm = pci_device_for_spec("shm:/dev/shm/perfq0");
  REQUIRE(shm.is_ok());
  CHECK_FALSE(shm.value());
}

}  // namespace
}  // namespace perfq
