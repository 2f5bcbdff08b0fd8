#!/usr/bin/env bash
# ctest qemu.rootfs_packages: the systemd scenario's Debian rootfs
# (qemu/build-rootfs.sh --packages) carries every package whose shared
# libraries perfq's installed programs link, so that `dpkg -i` of the
# project's .debs in the offline guest finds every dependency.  Checked in
# seconds here rather than found ten minutes into a QEMU boot.
#   tests/qemu/check-rootfs-packages.sh BIN_DIR
set -uo pipefail
bin=${1:?usage: check-rootfs-packages.sh BIN_DIR}
root=$(cd "$(dirname "$0")/../.." && pwd)
have=$("$root/qemu/build-rootfs.sh" --packages) || { echo "build-rootfs.sh --packages failed" >&2; exit 1; }
missing=0
checked=0
for prog in perfq-daemon perfqctl perfq-demo-app; do
  exe=$bin/$prog
  [ -x "$exe" ] || { echo "FAIL: $exe is not built" >&2; missing=1; continue; }
  # The library files ldd resolves outside the build tree.
  while read -r lib; do
    case $lib in "$bin"/*|*/build*/*) continue ;; esac
    real=$(readlink -f "$lib")
    pkg=$(dpkg -S "$lib" 2>/dev/null || dpkg -S "$real" 2>/dev/null)
    pkg=${pkg%%:*}
    if [ -z "$pkg" ]; then
      echo "FAIL: $prog links $lib, which no Debian package owns" >&2
      missing=1
      continue
    fi
    checked=$((checked + 1))
    if ! grep -qx "$pkg" <<<"$have"; then
      echo "FAIL: $prog links $lib from $pkg, which qemu/build-rootfs.sh does not install (add it to EXTRA)" >&2
      missing=1
    fi
  done < <(ldd "$exe" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }')
done
[ "$checked" -gt 0 ] || { echo "FAIL: ldd named no library at all" >&2; exit 1; }
[ "$missing" -eq 0 ] || exit 1
echo "every library of perfq-daemon, perfqctl and perfq-demo-app ($checked links) is in the rootfs's packages"
