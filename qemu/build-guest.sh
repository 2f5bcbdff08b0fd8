#!/usr/bin/env bash
# Build the QEMU guest for the perfq scenarios:
#   - perfq.ko against the installed Debian kernel's headers (driver/Makefile)
#   - perfq-guest, the static helper (qemu/guest/perfq-guest.c)
#   - an initramfs: busybox-static, the module, the helper, the project's
#     binaries from BUILD/bin with their shared libraries (found with ldd:
#     libpci.so.3 among them) and pci.ids
# Usage: qemu/build-guest.sh [BUILD_DIR [KVER]]   (default: build, the newest
#        installed kernel with headers; qemu/run-scenarios.py picks each series)
# Outputs under BUILD_DIR/qemu/guest-KVER: driver/perfq.ko, initramfs.cpio, kernel
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(realpath -m "${1:-$ROOT/build}")
KVER=${2:-$(make -s -C "$ROOT/driver" kver)}
OUT=$BUILD/qemu/guest-$KVER
mkdir -p "$OUT"

if [ -z "$KVER" ] || [ ! -r "/boot/vmlinuz-$KVER" ]; then
  echo "perfq qemu: no guest kernel with headers (install linux-image-amd64 linux-headers-amd64)" >&2
  exit 1
fi
for tool in busybox cpio gcc; do
  command -v "$tool" >/dev/null || [ -x /bin/busybox ] || { echo "perfq qemu: $tool missing" >&2; exit 1; }
done

# The module: zero warnings (Kbuild passes -Werror).
make -s -C "$ROOT/driver" O_DIR="$OUT/driver" KVER="$KVER" >"$OUT/driver-build.log" 2>&1 || {
  cat "$OUT/driver-build.log" >&2; exit 1; }
if grep -qi 'warning:' "$OUT/driver-build.log"; then
  cat "$OUT/driver-build.log" >&2; echo "perfq qemu: the module built with warnings" >&2; exit 1
fi

gcc -static -O2 -std=gnu11 -Wall -Wextra -Werror -I"$ROOT/libperfq/include" \
  "$ROOT/qemu/guest/perfq-guest.c" -o "$OUT/perfq-guest"

root=$OUT/root
rm -rf "$root"
mkdir -p "$root"/{bin,dev,proc,sys,tmp,run,etc,lib/modules,scenarios}
cp /bin/busybox "$root/bin/busybox"
cp "$OUT/driver/perfq.ko" "$root/lib/modules/perfq.ko"
cp "$OUT/perfq-guest" "$root/bin/perfq-guest"
cp "$ROOT/qemu/guest/init" "$root/init"
cp "$ROOT/qemu/guest/scenarios/"*.sh "$root/scenarios/"
chmod +x "$root/init"

# Project binaries and the shared libraries they need, at the same paths.
copy_with_libs() {
  local bin=$1
  # Without debug info: a small initramfs unpacks fast under TCG.
  strip --strip-debug -o "$root/bin/$(basename "$bin")" "$bin"
  ldd "$bin" | awk '/=> \// {print $3} /^\t\/lib/ {print $1}' | while read -r lib; do
    [ -e "$root$lib" ] && continue
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
}
for b in perfq-daemon perfqctl perfq-demo-app; do
  if [ -x "$BUILD/bin/$b" ]; then copy_with_libs "$BUILD/bin/$b"; fi
done
# pci.ids: the names `perfqctl devices` and the trace metadata give devices
# (libpci reads it from here).
PCI_IDS=/usr/share/misc/pci.ids
[ -r "$PCI_IDS" ] || { echo "perfq qemu: $PCI_IDS missing (install pci.ids)" >&2; exit 1; }
mkdir -p "$root/usr/share/misc"
cp "$PCI_IDS" "$root/usr/share/misc/pci.ids"
# The dynamic loader at its canonical path.
mkdir -p "$root/lib64"
[ -e "$root/lib64/ld-linux-x86-64.so.2" ] || cp -L /lib64/ld-linux-x86-64.so.2 "$root/lib64/"

(cd "$root" && find . -print0 | cpio --null -o -H newc --quiet) >"$OUT/initramfs.cpio.tmp"
mv "$OUT/initramfs.cpio.tmp" "$OUT/initramfs.cpio"
echo "/boot/vmlinuz-$KVER" >"$OUT/kernel"
echo "perfq qemu: guest for $KVER in $OUT ($(du -h "$OUT/initramfs.cpio" | cut -f1) initramfs)"
