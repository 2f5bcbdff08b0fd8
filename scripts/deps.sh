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
  zlib1g-dev
  babeltrace2
  protobuf-compiler
  # perfqctl report --html inlines Chart.js into its page; the test loads
  # the page in headless Chromium.
  libjs-chart.js
  chromium
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
  # ...and the 6.12 series (Debian 12 carries it beside 6.1, the kernel of
  # Debian 13): the module builds and the scenarios boot on both; sparse
  # checks the module (scripts/check-driver.sh, ctest driver.kernels).
  linux-image-6.12-amd64
  linux-headers-6.12-amd64
  sparse
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
  # The device SDK on other instruction sets: the example device built with
  # Debian's cross compilers and run under qemu-user, and bare-metal
  # toolchains for the freestanding check (make test).
  gcc-riscv64-linux-gnu
  gcc-aarch64-linux-gnu
  # ...and their C libraries: only Recommended by the compilers, so
  # --no-install-recommends leaves them out (bits/wordsize.h missing).
  libc6-dev-riscv64-cross
  libc6-dev-arm64-cross
  qemu-user-static
  gcc-riscv64-unknown-elf
  gcc-arm-none-eabi
)

missing=()
for p in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [ "$status" = installed ] || missing+=("$p")
done
# npm installs speedscope for the Chrome JSON test (into the build tree).
# Any npm will do: Debian's package only where none is on the PATH (a
# Node.js from elsewhere brings its own, and Debian's would conflict).
command -v npm >/dev/null 2>&1 || missing+=(npm)

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
