// PCI facts: link arithmetic, names and the JSON form (perfq/pci.h).
#include "perfq/pci.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

namespace perfq {

using nlohmann::json;

std::optional<uint32_t> pcie_speed_mtps(unsigned code) {
  if (code < 1 || code > std::size(kPcieSpeedsMtps)) return std::nullopt;
  return kPcieSpeedsMtps[code - 1];
}

int pcie_generation(uint32_t speed_mtps) {
  for (size_t i = 0; i < std::size(kPcieSpeedsMtps); ++i)
    if (kPcieSpeedsMtps[i] == speed_mtps) return static_cast<int>(i + 1);
  return 0;
}

double pcie_link_ceiling_bytes_per_s(uint32_t speed_mtps, uint32_t width) {
  // 8b/10b carries 8 bits in 10 up to 5 GT/s; 128b/130b from 8 GT/s.
  const double efficiency = speed_mtps <= 5000 ? 8.0 / 10.0 : 128.0 / 130.0;
  return static_cast<double>(speed_mtps) * 1e6 * width * efficiency / 8.0;
}

std::string pci_link_text(const PciLink& l) {
  const int gen = l.generation();
  return fmt::format("{}x{} ({:g} GT/s, {:.2f} GB/s)", gen ? fmt::format("Gen{} ", gen) : "",
                     l.width, l.speed_gts(), l.ceiling_bytes_per_s() / 1e9);
}

std::string pci_link_name(const PciLink& l) {
  const int gen = l.generation();
  return gen ? fmt::format("Gen{} x{}", gen, l.width)
             : fmt::format("{:g} GT/s x{}", l.speed_gts(), l.width);
}

bool PcieInfo::trained_below_max() const {
  if (!link_max || !link_current) return false;
  return link_current->speed_mtps < link_max->speed_mtps || link_current->width < link_max->width;
}

const char* PcieInfo::port_type_name() const {
  switch (port_type) {
    case 0x0:
      return "endpoint";
    case 0x1:
      return "legacy endpoint";
    case 0x4:
      return "root port";
    case 0x5:
      return "upstream switch port";
    case 0x6:
      return "downstream switch port";
    case 0x7:
      return "pcie-to-pci bridge";
    case 0x8:
      return "pci-to-pcie bridge";
    case 0x9:
      return "root complex integrated endpoint";
    case 0xa:
      return "root complex event collector";
    default:
      return "unknown";
  }
}

std::string PciDevice::ids_text() const {
  return fmt::format("{:04x}:{:04x}", vendor_id, device_id);
}

std::string PciDevice::display_name() const {
  if (vendor_name && device_name) return *vendor_name + " " + *device_name;
  if (vendor_name) return fmt::format("{} device {:04x}", *vendor_name, device_id);
  return fmt::format("device {}", ids_text());
}

std::string pci_link_summary(const PciDevice& d) {
  if (!d.config_readable)
    return "capabilities not readable (config space past 64 bytes needs root, or the dump is "
           "short): link unknown";
  if (!d.pcie) return "no PCIe capability (conventional PCI): no link figures";
  const PcieInfo& p = *d.pcie;
  if (!p.link_max && !p.link_current) return fmt::format("PCIe {}: no link", p.port_type_name());
  if (!p.link_current) return "link down, max " + pci_link_text(*p.link_max);
  if (!p.link_max) return "link " + pci_link_text(*p.link_current);
  if (p.trained_below_max())
    return "link " + pci_link_text(*p.link_current) + " of max " + pci_link_text(*p.link_max) +
           ": trained below its capability";
  return "link " + pci_link_text(*p.link_current) + ", its maximum";
}

std::string pci_payload_summary(const PciDevice& d) {
  if (!d.pcie) return "";
  const PcieInfo& p = *d.pcie;
  std::string s;
  if (p.max_payload) {
    s = fmt::format("max payload {} B", *p.max_payload);
    if (p.max_payload_supported) s += fmt::format(" (supports {} B)", *p.max_payload_supported);
  }
  if (p.max_read_request)
    s += fmt::format("{}max read request {} B", s.empty() ? "" : ", ", *p.max_read_request);
  return s;
}

namespace {

std::string hex4(uint16_t v) { return fmt::format("{:04x}", v); }

template <class T>
json opt(const std::optional<T>& v) {
  return v ? json(*v) : json(nullptr);
}

json link_json(const std::optional<PciLink>& l) {
  if (!l) return nullptr;
  return {{"speed_gt_s", l->speed_gts()},
          {"width", l->width},
          {"generation", l->generation()},
          {"ceiling_bytes_per_s", l->ceiling_bytes_per_s()}};
}

// Readers of one field each; they throw std::runtime_error naming it.
[[noreturn]] void bad(const std::string& field, const std::string& why) {
  throw std::runtime_error("pci." + field + ": " + why);
}

uint16_t hex_field(const json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_string()) bad(key, "missing or not a hex string");
  const std::string s = j[key].get<std::string>();
  if (s.empty() || s.size() > 4 ||
      s.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
    bad(key, "'" + s + "' is not a 16-bit hex number");
  return static_cast<uint16_t>(std::stoul(s, nullptr, 16));
}

std::optional<uint16_t> opt_hex(const json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  return hex_field(j, key);
}

std::optional<std::string> opt_string(const json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  if (!j[key].is_string()) bad(key, "not a string");
  return j[key].get<std::string>();
}

template <class T>
std::optional<T> opt_number(const json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  if (!j[key].is_number_integer()) bad(key, "not an integer");
  return j[key].get<T>();
}

template <class T>
T number(const json& j, const char* key, T fallback) {
  return opt_number<T>(j, key).value_or(fallback);
}

std::optional<PciLink> link_from(const json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  const json& l = j[key];
  if (!l.is_object() || !l.contains("speed_gt_s") || !l["speed_gt_s"].is_number())
    bad(key, "not a link object with speed_gt_s");
  PciLink link;
  link.speed_mtps = static_cast<uint32_t>(l["speed_gt_s"].get<double>() * 1000.0 + 0.5);
  link.width = number<uint32_t>(l, "width", 0);
  if (!pcie_generation(link.speed_mtps)) bad(key, "speed is not a PCIe link speed");
  return link;
}

}  // namespace

json pci_device_to_json(const PciDevice& d) {
  json j = {
      {"address", d.address},
      {"domain", d.domain},
      {"bus", d.bus},
      {"slot", d.dev},
      {"function", d.func},
      {"vendor_id", hex4(d.vendor_id)},
      {"device_id", hex4(d.device_id)},
      {"class", hex4(d.device_class)},
      {"subsystem_vendor_id", d.subsystem_vendor_id ? json(hex4(*d.subsystem_vendor_id)) : json()},
      {"subsystem_id", d.subsystem_id ? json(hex4(*d.subsystem_id)) : json()},
      {"vendor_name", opt(d.vendor_name)},
      {"device_name", opt(d.device_name)},
      {"subsystem_vendor_name", opt(d.subsystem_vendor_name)},
      {"subsystem_name", opt(d.subsystem_name)},
      {"class_name", opt(d.class_name)},
      {"driver", opt(d.driver)},
      {"numa_node", opt(d.numa_node)},
      {"iommu_group", opt(d.iommu_group)},
      {"config_readable", d.config_readable}};
  if (d.pcie) {
    const PcieInfo& p = *d.pcie;
    j["pcie"] = {{"version", p.version},
                 {"port_type", p.port_type_name()},
                 {"port_type_code", p.port_type},
                 {"max_payload_supported", opt(p.max_payload_supported)},
                 {"max_payload", opt(p.max_payload)},
                 {"max_read_request", opt(p.max_read_request)},
                 {"link_max", link_json(p.link_max)},
                 {"link_current", link_json(p.link_current)},
                 {"trained_below_max", p.trained_below_max()}};
  } else {
    j["pcie"] = nullptr;
  }
  if (!d.error.empty()) j["error"] = d.error;
  return j;
}

Result<PciDevice> pci_device_from_json(const json& j) {
  if (!j.is_object()) return Status(Errc::kCorrupt, "pci: not a JSON object");
  try {
    PciDevice d;
    d.address = opt_string(j, "address").value_or("");
    if (d.address.empty()) bad("address", "missing");
    d.domain = number<uint32_t>(j, "domain", 0);
    d.bus = number<uint8_t>(j, "bus", 0);
    d.dev = number<uint8_t>(j, "slot", 0);
    d.func = number<uint8_t>(j, "function", 0);
    d.vendor_id = hex_field(j, "vendor_id");
    d.device_id = hex_field(j, "device_id");
    d.device_class = opt_hex(j, "class").value_or(0);
    d.subsystem_vendor_id = opt_hex(j, "subsystem_vendor_id");
    d.subsystem_id = opt_hex(j, "subsystem_id");
    d.vendor_name = opt_string(j, "vendor_name");
    d.device_name = opt_string(j, "device_name");
    d.subsystem_vendor_name = opt_string(j, "subsystem_vendor_name");
    d.subsystem_name = opt_string(j, "subsystem_name");
    d.class_name = opt_string(j, "class_name");
    d.driver = opt_string(j, "driver");
    d.numa_node = opt_number<int>(j, "numa_node");
    d.iommu_group = opt_number<int>(j, "iommu_group");
    d.config_readable = j.value("config_readable", false);
    if (j.contains("pcie") && !j["pcie"].is_null()) {
      const json& p = j["pcie"];
      if (!p.is_object()) bad("pcie", "not an object");
      PcieInfo info;
      info.version = number<unsigned>(p, "version", 0);
      info.port_type = number<unsigned>(p, "port_type_code", 0);
      info.max_payload_supported = opt_number<uint32_t>(p, "max_payload_supported");
      info.max_payload = opt_number<uint32_t>(p, "max_payload");
      info.max_read_request = opt_number<uint32_t>(p, "max_read_request");
      info.link_max = link_from(p, "link_max");
      info.link_current = link_from(p, "link_current");
      d.pcie = info;
    }
    d.error = opt_string(j, "error").value_or("");
    return d;
  } catch (const std::exception& e) {
    return Status(Errc::kCorrupt, e.what());
  }
}

}  // namespace perfq
