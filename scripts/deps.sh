#!/usr/bin/env bash
# Install the Debian packages perfq needs, only those missing.
#   scripts/deps.sh          install what is missing (apt-get update first)
#   scripts/deps.sh --check  exit 1 and list what is missing, install nothing
set -euo pipefail

# Build and test toolchain, and the libraries perfq builds on.
PACKAGES=(
  build-essential
  cmake
  ninja-build
  pkg-config
  catch2
  libbenchmark-dev
  libfmt-dev
  nlohmann-json3-dev
  libcli11-dev
  libzstd-dev
  babeltrace2
  protobuf-compiler
  # The LTTng-UST baseline of make bench (perfq_lttng_bench, a private
  # lttng-sessiond).
  liblttng-ust-dev
  lttng-tools
  libspdlog-dev
  libsystemd-dev
  # perfq-daemon --metrics: prometheus-cpp (registry and pull exposer); the
  # Prometheus server that tests/daemon/prometheus_test.sh scrapes it with.
  prometheus-cpp-dev
  prometheus
  # PCI facts (perfqctl devices, trace metadata): libpci and the names it
  # looks up; the QEMU guest gets a copy of pci.ids too.
  libpci-dev
  pci.ids
  # Host kernel events in perfq-daemon: a CO-RE BPF program (clang -target
  # bpf), its libbpf skeleton (bpftool) and libbpf.
  clang
  # The C++ style (.clang-format; ctest's `format` checks the tree).
  clang-format
  bpftool
  libbpf-dev
  # The driver and its QEMU scenarios: the guest kernel, its headers, the
  # emulator and what the initramfs is built from.
  linux-image-amd64
  linux-headers-amd64
  qemu-system-x86
  busybox-static
  cpio
  kmod
  python3
  # Man pages and shell completion: scdoc builds the pages from man/*.scd,
  # man-db and groff-base render them (tests/install/check-docs.sh), and
  # bash-completion loads the installed perfqctl completion on first use.
  scdoc
  man-db
  groff-base
  bash-completion
  # The systemd QEMU scenario: a Debian rootfs (qemu/build-rootfs.sh) made
  # into an ext4 image (mkfs.ext4 -d) per run.
  debootstrap
  e2fsprogs
  # The Debian packages (make deb): debhelper, dh_dkms, and lintian to check
  # them; dkms builds perfq.ko from them (make install-dkms).
  debhelper
  dh-dkms
  lintian
  dkms
)

missing=()
for p in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [ "$status" = installed ] || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "${1:-}" = "--check" ]; then
  echo "missing Debian packages: ${missing[*]}" >&2
  exit 1
fi

echo "perfq: installing missing Debian packages: ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
  else
    echo "perfq: need root (or sudo) to install: ${missing[*]}" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
