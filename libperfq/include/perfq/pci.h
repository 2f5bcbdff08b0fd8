// What perfq knows about a device's place on the PCI bus: its address, IDs
// and names, the driver bound to it, NUMA node and IOMMU group, and from the
// PCIe capability the link it trained at, the link it could train at, and
// its payload sizes.  These are plain facts: this header neither reads the
// bus nor needs libpci (host/pci_scan.h does that); the trace metadata and
// the report use it to store and show the facts.
//
// Absent means absent: a conventional PCI device has no `pcie`, a link that
// is down has no `link_current`, a field libpci could not learn (a dump has
// no driver) is std::nullopt, and the JSON form writes null.  Never zero.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>

#include "perfq/status.h"

namespace perfq {

// PCIe link speeds, MT/s per lane (the Link Capabilities/Status encodings
// 1..6: 2.5, 5, 8, 16, 32, 64 GT/s).
inline constexpr uint32_t kPcieSpeedsMtps[] = {2500, 5000, 8000, 16000, 32000, 64000};

// The speed of a Link Capabilities / Link Status "link speed" code, or
// std::nullopt for 0 and reserved codes.
std::optional<uint32_t> pcie_speed_mtps(unsigned code);
// 1 for 2.5 GT/s ... 6 for 64 GT/s, 0 for a speed that is none of those.
int pcie_generation(uint32_t speed_mtps);

// The theoretical ceiling of a link in bytes/s, each direction:
// transfers/s x lanes x encoding efficiency / 8 bits, with 8b/10b up to
// 5 GT/s and 128b/130b from 8 GT/s.  (64 GT/s links use FLIT mode, whose
// overhead is larger; 128b/130b keeps this an upper bound.)  0 for a speed
// or width of 0.
double pcie_link_ceiling_bytes_per_s(uint32_t speed_mtps, uint32_t width);

struct PciLink {
  uint32_t speed_mtps = 0;  // one of kPcieSpeedsMtps
  uint32_t width = 0;       // lanes, 1..32
  bool operator==(const PciLink&) const = default;

  double speed_gts() const { return speed_mtps / 1000.0; }
  int generation() const { return pcie_generation(speed_mtps); }
  double ceiling_bytes_per_s() const { return pcie_link_ceiling_bytes_per_s(speed_mtps, width); }
};

// "Gen4 x16 (16 GT/s, 31.51 GB/s)"
std::string pci_link_text(const PciLink& link);
// "Gen4 x16" (TraceSource::link)
std::string pci_link_name(const PciLink& link);

// The PCIe capability (PCI_CAP_ID_EXP) of a device.
struct PcieInfo {
  unsigned version = 0;    // capability version (Express Capabilities, bits 3:0)
  unsigned port_type = 0;  // device/port type (bits 7:4): 0 endpoint, 4 root port...
  // Link Capabilities and Link Status.  No link at all for root complex
  // integrated endpoints and event collectors; no current link when it is
  // down (speed or width 0); absent too for a reserved speed code.
  std::optional<PciLink> link_max;
  std::optional<PciLink> link_current;
  // Device Capabilities and Device Control, bytes (128..4096; absent for a
  // reserved encoding).
  std::optional<uint32_t> max_payload_supported;
  std::optional<uint32_t> max_payload;
  std::optional<uint32_t> max_read_request;
  bool operator==(const PcieInfo&) const = default;

  // The link trained at a lower speed or width than both ends allow... as
  // far as this end knows: true when current < max in speed or width.
  bool trained_below_max() const;
  const char* port_type_name() const;  // "endpoint", "root port", ...
};

struct PciDevice {
  std::string address;  // "0000:01:00.0" (domain:bus:device.function)
  uint32_t domain = 0;
  uint8_t bus = 0, dev = 0, func = 0;
  uint16_t vendor_id = 0, device_id = 0;
  uint16_t device_class = 0;  // base class << 8 | subclass
  std::optional<uint16_t> subsystem_vendor_id, subsystem_id;
  // From pci.ids (libpci's lookup); absent when the IDs are not listed.
  std::optional<std::string> vendor_name, device_name;
  std::optional<std::string> subsystem_vendor_name, subsystem_name;
  std::optional<std::string> class_name;
  // The driver bound ("perfq"); absent when none is or it is unknown (dumps).
  std::optional<std::string> driver;
  std::optional<int> numa_node;
  std::optional<int> iommu_group;
  // The configuration space past the 64-byte header could be read (false:
  // the capabilities are unknown, e.g. a non-root reader or `lspci -x`).
  bool config_readable = false;
  std::optional<PcieInfo> pcie;  // absent: conventional PCI, or unreadable
  std::string error;             // what could not be read about this device
  bool operator==(const PciDevice&) const = default;

  // "Red Hat, Inc. Inter-VM shared memory", falling back to the IDs.
  std::string display_name() const;
  std::string ids_text() const;  // "1af4:1110"
};

// One line about the link, for people:
//   "link Gen3 x4 (8 GT/s, 3.94 GB/s) of max Gen4 x4 (16 GT/s, 7.88 GB/s):
//    trained below its capability"
//   "link Gen4 x16 (16 GT/s, 31.51 GB/s), its maximum"
//   "no PCIe capability (conventional PCI): no link figures"
//   "capabilities not readable (config space past 64 bytes needs root): link unknown"
std::string pci_link_summary(const PciDevice& d);
// "max payload 256 B (supports 512 B), max read request 512 B", or "".
std::string pci_payload_summary(const PciDevice& d);

// JSON form (trace metadata, the daemon's `devices` reply, the report):
//   {"address":"0000:01:00.0","domain":0,"bus":1,"slot":0,"function":0,
//    "vendor_id":"1af4","device_id":"1110","class":"0500",
//    "subsystem_vendor_id":"1af4","subsystem_id":"1100",
//    "vendor_name":"Red Hat, Inc.","device_name":"Inter-VM shared memory",
//    "subsystem_vendor_name":..., "subsystem_name":..., "class_name":"RAM memory",
//    "driver":"perfq","numa_node":null,"iommu_group":null,
//    "config_readable":true,
//    "pcie":null | {"version":2,"port_type":"endpoint",
//       "max_payload_supported":256,"max_payload":128,"max_read_request":512,
//       "link_max":{"speed_gt_s":16.0,"width":16,"generation":4,
//                   "ceiling_bytes_per_s":31507692307.69}|null,
//       "link_current":{...}|null,"trained_below_max":false},
//    "error":"..." (only when something could not be read)}
// IDs are 4-digit lowercase hex strings, as lspci prints them.
nlohmann::json pci_device_to_json(const PciDevice& d);
// Reads what pci_device_to_json wrote; kCorrupt naming the field when the
// JSON is not that shape.
Result<PciDevice> pci_device_from_json(const nlohmann::json& j);

}  // namespace perfq
