// The PCI bus through libpci (host/pci_scan.h).
//
// libpci reports a fatal error by calling pci_access::error, which must not
// return (its default prints and calls exit(1)).  Ours formats the message
// and longjmp()s back to the guarded call that entered libpci.  Only libpci's
// C frames and the guarded lambda lie between setjmp and longjmp, and the
// lambdas touch nothing with a destructor, so nothing is skipped but
// libpci's own cleanup (it may leak a little on such an error; it never
// happens on a healthy bus).
#include "host/pci_scan.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csetjmp>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <tuple>

extern "C" {
#include <pci/pci.h>
}

namespace perfq {
namespace {

// The guarded call in progress on this thread, and the last error.
thread_local std::jmp_buf* t_jump = nullptr;
thread_local char t_error[512];
thread_local std::vector<std::string>* t_warnings = nullptr;

// GNU noreturn, not [[noreturn]]: libpci's error hook has it in its type (clang checks).
__attribute__((noreturn)) void on_error(char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(t_error, sizeof t_error, fmt, ap);
  va_end(ap);
  if (t_jump) std::longjmp(*t_jump, 1);
  // libpci was entered outside guarded(): a bug here.  Abort, as exit()
  // from a library would be worse.
  std::fprintf(stderr, "perfq: libpci error outside a guarded call: %s\n", t_error);
  std::abort();
}

void on_warning(char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (t_warnings && t_warnings->size() < 32) t_warnings->push_back(std::string("libpci: ") + buf);
}

void on_debug(char*, ...) {}

// Runs f (calls into libpci only); false with `error` set when libpci
// raised an error.
template <class F>
bool guarded(F&& f, std::string& error) {
  std::jmp_buf jump;
  std::jmp_buf* const outer = t_jump;
  t_jump = &jump;
  if (setjmp(jump) != 0) {
    t_jump = outer;
    error = t_error;
    return false;
  }
  f();
  t_jump = outer;
  return true;
}

struct AccessDeleter {
  void operator()(pci_access* a) const {
    std::string ignored;
    guarded([a] { pci_cleanup(a); }, ignored);
  }
};
using Access = std::unique_ptr<pci_access, AccessDeleter>;

std::string address_of(const pci_dev* d) {
  char s[32];
  std::snprintf(s, sizeof s, "%04x:%02x:%02x.%d", static_cast<unsigned>(d->domain), d->bus, d->dev,
                d->func);
  return s;
}

// One lookup in pci.ids; absent when the IDs are not listed.
template <class... Ids>
std::optional<std::string> lookup(pci_access* a, int flags, Ids... ids) {
  char buf[256];
  char* name = nullptr;
  std::string err;
  if (!guarded(
          [&] {
            name = pci_lookup_name(a, buf, sizeof buf, flags | PCI_LOOKUP_NO_NUMBERS, ids...);
          },
          err) ||
      !name || !*name)
    return std::nullopt;
  return std::string(name);
}

// Payload and read request sizes: 128 << code for codes 0..5 (4096 bytes).
std::optional<uint32_t> size_code(unsigned code) {
  if (code > 5) return std::nullopt;
  return 128u << code;
}

std::optional<PciLink> link_of(unsigned speed_code, unsigned width) {
  auto speed = pcie_speed_mtps(speed_code);
  if (!speed || width == 0 || width > 32) return std::nullopt;
  return PciLink{*speed, width};
}

// The PCIe capability of d, read from config space.
struct ExpRegs {
  bool found = false;
  int where = 0;
  uint16_t flags = 0, devctl = 0, lnksta = 0;
  uint32_t devcap = 0, lnkcap = 0;
};

PcieInfo decode_pcie(const ExpRegs& r) {
  PcieInfo p;
  p.version = r.flags & PCI_EXP_FLAGS_VERS;
  p.port_type = (r.flags & PCI_EXP_FLAGS_TYPE) >> 4;
  p.max_payload_supported = size_code(r.devcap & PCI_EXP_DEVCAP_PAYLOAD);
  p.max_payload = size_code((r.devctl & PCI_EXP_DEVCTL_PAYLOAD) >> 5);
  p.max_read_request = size_code((r.devctl & PCI_EXP_DEVCTL_READRQ) >> 12);
  // Root complex integrated endpoints and event collectors have no link
  // (lspci skips the link registers for them too).
  if (p.port_type != PCI_EXP_TYPE_ROOT_INT_EP && p.port_type != PCI_EXP_TYPE_ROOT_EC) {
    p.link_max = link_of(r.lnkcap & PCI_EXP_LNKCAP_SPEED, (r.lnkcap & PCI_EXP_LNKCAP_WIDTH) >> 4);
    p.link_current =
        link_of(r.lnksta & PCI_EXP_LNKSTA_SPEED, (r.lnksta & PCI_EXP_LNKSTA_WIDTH) >> 4);
  }
  return p;
}

PciDevice describe(pci_access* a, pci_dev* d, bool live) {
  PciDevice out;
  out.address = address_of(d);
  out.domain = static_cast<uint32_t>(d->domain);
  out.bus = d->bus;
  out.dev = d->dev;
  out.func = d->func;

  int want = PCI_FILL_IDENT | PCI_FILL_CLASS | PCI_FILL_SUBSYS;
  if (live) want |= PCI_FILL_NUMA_NODE | PCI_FILL_IOMMU_GROUP | PCI_FILL_DRIVER;
  int known = 0;
  std::string err;
  if (!guarded([&] { known = pci_fill_info(d, want); }, err)) {
    out.error = err;
    return out;
  }
  out.vendor_id = d->vendor_id;
  out.device_id = d->device_id;
  if (known & PCI_FILL_CLASS) out.device_class = d->device_class;
  if ((known & PCI_FILL_SUBSYS) && d->subsys_vendor_id != 0 && d->subsys_vendor_id != 0xffff) {
    out.subsystem_vendor_id = d->subsys_vendor_id;
    out.subsystem_id = d->subsys_id;
  }
  if (live) {
    if ((known & PCI_FILL_NUMA_NODE) && d->numa_node >= 0) out.numa_node = d->numa_node;
    if (known & PCI_FILL_IOMMU_GROUP) {
      const char* g = pci_get_string_property(d, PCI_FILL_IOMMU_GROUP);
      char* end = nullptr;
      const long n = g ? std::strtol(g, &end, 10) : -1;
      if (g && *g && end && !*end && n >= 0) out.iommu_group = static_cast<int>(n);
    }
    if (known & PCI_FILL_DRIVER) {
      const char* drv = pci_get_string_property(d, PCI_FILL_DRIVER);
      if (drv && *drv) out.driver = drv;
    }
  }

  out.vendor_name = lookup(a, PCI_LOOKUP_VENDOR, out.vendor_id);
  out.device_name = lookup(a, PCI_LOOKUP_DEVICE, out.vendor_id, out.device_id);
  if (out.subsystem_vendor_id) {
    out.subsystem_vendor_name =
        lookup(a, PCI_LOOKUP_SUBSYSTEM | PCI_LOOKUP_VENDOR, *out.subsystem_vendor_id);
    out.subsystem_name = lookup(a, PCI_LOOKUP_SUBSYSTEM | PCI_LOOKUP_DEVICE, out.vendor_id,
                                out.device_id, *out.subsystem_vendor_id, *out.subsystem_id);
  }
  if (known & PCI_FILL_CLASS) out.class_name = lookup(a, PCI_LOOKUP_CLASS, out.device_class);

  // Config space past the standard header holds the capabilities.  If it
  // cannot be read (not root on sysfs, an `lspci -x` dump) they are
  // unknown, which is not the same as absent: say so.
  uint8_t probe[4];
  int readable = 0;
  if (!guarded([&] { readable = pci_read_block(d, 0x40, probe, sizeof probe); }, err)) {
    out.error = err;
    return out;
  }
  out.config_readable = readable != 0;
  if (!out.config_readable) return out;

  ExpRegs r;
  if (!guarded(
          [&] {
            pci_cap* cap = pci_find_cap(d, PCI_CAP_ID_EXP, PCI_CAP_NORMAL);
            if (!cap) return;
            r.found = true;
            r.where = cap->addr;
            r.flags = pci_read_word(d, r.where + PCI_EXP_FLAGS);
            r.devcap = pci_read_long(d, r.where + PCI_EXP_DEVCAP);
            r.devctl = pci_read_word(d, r.where + PCI_EXP_DEVCTL);
            r.lnkcap = pci_read_long(d, r.where + PCI_EXP_LNKCAP);
            r.lnksta = pci_read_word(d, r.where + PCI_EXP_LNKSTA);
          },
          err)) {
    out.error = err;
    return out;
  }
  if (r.found) out.pcie = decode_pcie(r);
  return out;
}

bool is_address(const std::string& s) {
  unsigned dom, bus, dev, fn;
  char tail;
  return s.size() >= 12 &&
         std::sscanf(s.c_str(), "%x:%x:%x.%u%c", &dom, &bus, &dev, &fn, &tail) == 4 && bus < 256 &&
         dev < 32 && fn < 8;
}

}  // namespace

Result<PciScan> scan_pci(const PciScanOptions& o) {
  PciScan scan;
  const std::string what = o.dump_file.empty() ? "PCI bus" : "PCI dump " + o.dump_file;
  if (!o.dump_file.empty()) {
    // libpci would say "Cannot open"; say which file and why ourselves.
    std::ifstream f(o.dump_file);
    if (!f) return Status::from_errno(what + ": cannot read it");
  }
  if (!o.ids_file.empty() && access(o.ids_file.c_str(), R_OK) != 0)
    return Status::from_errno("pci.ids file " + o.ids_file);

  // libpci keeps a pointer to the pci.ids path: these outlive the handle.
  std::string ids = o.ids_file;
  std::string dump = o.dump_file;
  t_warnings = &scan.warnings;
  struct ResetWarnings {
    ~ResetWarnings() { t_warnings = nullptr; }
  } reset_warnings;

  std::string err;
  pci_access* raw = nullptr;
  if (!guarded([&] { raw = pci_alloc(); }, err) || !raw)
    return Status(Errc::kUnavailable, what + ": libpci: " + (err.empty() ? "out of memory" : err));
  raw->error = on_error;
  raw->warning = on_warning;
  raw->debug = on_debug;
  Access a(raw);
  // Names from pci.ids only: no DNS, no udev hwdb (the same names on every
  // machine with the same pci.ids, and none hang on a network).
  a->id_lookup_mode = PCI_LOOKUP_NO_HWDB;
  if (!ids.empty()) pci_set_name_list_path(a.get(), ids.data(), 0);
  if (!dump.empty()) {
    a->method = PCI_ACCESS_DUMP;
    char param[] = "dump.name";
    if (pci_set_param(a.get(), param, dump.data()) != 0)
      return Status(Errc::kUnavailable, what + ": this libpci has no dump access method");
  }
  if (!guarded([&] { pci_init(a.get()); }, err))
    return Status(dump.empty() ? Errc::kUnavailable : Errc::kCorrupt, what + ": libpci: " + err);
  if (!guarded([&] { pci_scan_bus(a.get()); }, err))
    return Status(Errc::kUnavailable, what + ": libpci: " + err);
  const char* method = pci_get_method_name(static_cast<int>(a->method));
  scan.method = method ? method : "";

  const bool live = dump.empty();
  size_t seen = 0;
  for (pci_dev* d = a->devices; d; d = d->next) {
    ++seen;
    if (!o.address.empty() && address_of(d) != o.address) continue;
    PciDevice dev = describe(a.get(), d, live);
    if (o.only_perfq && dev.driver != "perfq") continue;
    scan.devices.push_back(std::move(dev));
  }
  if (!dump.empty() && seen == 0)
    return Status(Errc::kCorrupt,
                  what +
                      ": no device in it (expected the output of `lspci -xxx`: a line "
                      "\"BB:DD.F ...\" or \"DDDD:BB:DD.F ...\" per device, then \"00: xx xx ...\" "
                      "lines of config space)");
  if (a->id_load_failed)
    scan.warnings.push_back("cannot read pci.ids (" +
                            std::string(a->id_file_name ? a->id_file_name : "?") +
                            "): devices are shown without names; install Debian's pci.ids package");
  std::sort(scan.devices.begin(), scan.devices.end(), [](const PciDevice& x, const PciDevice& y) {
    return std::tie(x.domain, x.bus, x.dev, x.func) < std::tie(y.domain, y.bus, y.dev, y.func);
  });
  return scan;
}

Result<std::string> perfq_device_pci_address(const std::string& dev,
                                             const std::string& sysfs_root) {
  const std::string name = std::filesystem::path(dev).filename().string();
  if (dev.rfind("/dev/perfq", 0) != 0 || name.size() <= 5 ||
      name.find_first_not_of("0123456789", 5) != std::string::npos)
    return Status(Errc::kInvalidArgument, "'" + dev + "' is not /dev/perfqN");
  const std::string link = sysfs_root + "/class/perfq/" + name + "/device";
  std::error_code ec;
  const auto target = std::filesystem::read_symlink(link, ec);
  if (ec)
    return Status(ec == std::errc::no_such_file_or_directory ? Errc::kNotFound : Errc::kIo,
                  link + ": " + ec.message() + " (is perfq.ko loaded and " + name + " bound?)");
  const std::string address = target.filename().string();
  if (!is_address(address))
    return Status(Errc::kCorrupt,
                  link + " points to '" + target.string() + "', not a PCI device (DDDD:BB:DD.F)");
  return address;
}

Result<std::optional<PciDevice>> pci_device_for_spec(const std::string& spec) {
  if (spec.rfind("/dev/perfq", 0) != 0) return std::optional<PciDevice>();
  auto address = perfq_device_pci_address(spec);
  if (!address) return address.status();
  PciScanOptions o;
  o.address = address.value();
  auto scan = scan_pci(o);
  if (!scan) return scan.status();
  if (scan->devices.empty())
    return Status(Errc::kNotFound, spec + ": PCI device " + o.address + " is not on the bus");
  return std::optional<PciDevice>(scan->devices.front());
}

}  // namespace perfq
