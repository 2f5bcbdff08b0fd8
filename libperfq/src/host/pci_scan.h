// Reading the PCI bus through libpci (pciutils): every device, or those
// bound to perfq.ko, with the facts of perfq/pci.h.  In the separate
// library perfq::pci (links libpci), so instrumented applications that link
// libperfq do not depend on libpci.
//
// By default libpci picks its access method (on Linux /sys/bus/pci; the
// capabilities past the first 64 bytes of config space need root there).
// Tests and offline analysis read an `lspci -xxx` dump instead (libpci's
// `dump` method): such a dump has config space only, so driver, NUMA node
// and IOMMU group are absent.  Names come from pci.ids (Debian's package
// `pci.ids`, /usr/share/misc/pci.ids), never from the network or udev's
// hardware database, so they are the same everywhere the file is.
//
// Threading: each call uses its own libpci handle; calls from several
// threads at once are fine.  libpci reports fatal errors through a callback
// that must not return; perfq turns them into a Status (no exit()).
#pragma once

#include <string>
#include <vector>

#include "perfq/pci.h"
#include "perfq/status.h"

namespace perfq {

struct PciScanOptions {
  // Only devices whose driver is perfq (perfq.ko's PCI driver name).
  bool only_perfq = false;
  // Only the device at this address ("0000:01:00.0"); empty: every device.
  std::string address;
  // Read this `lspci -xxx` dump (PCI_ACCESS_DUMP) instead of the live bus.
  std::string dump_file;
  // The pci.ids file to name devices from; empty: libpci's default.
  std::string ids_file;
};

struct PciScan {
  std::vector<PciDevice> devices;  // in address order
  std::string method;              // libpci's access method: "linux-sysfs", "dump"...
  // Things worth telling the user that did not stop the scan ("no pci.ids
  // at PATH: devices are unnamed", libpci warnings).
  std::vector<std::string> warnings;
};

// Enumerates the bus.  Fails (with a message naming the file or the method)
// when libpci cannot start: a dump that cannot be read, a malformed dump or
// one without a single device, no access method.  A device that cannot be
// read completely is listed with what was read and PciDevice::error.
Result<PciScan> scan_pci(const PciScanOptions& options = {});

// The PCI address of /dev/perfqN, from /sys/class/perfq/perfqN/device (a
// link to the PCI device the driver bound).  kInvalidArgument when `dev` is
// not /dev/perfqN, kNotFound when sysfs does not know it.
Result<std::string> perfq_device_pci_address(const std::string& dev,
                                             const std::string& sysfs_root = "/sys");

// PCI facts of a device spec: std::nullopt for shm:PATH (not a PCI
// device), the device behind /dev/perfqN otherwise.
Result<std::optional<PciDevice>> pci_device_for_spec(const std::string& spec);

}  // namespace perfq
