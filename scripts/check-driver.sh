#!/usr/bin/env bash
# Build perfq.ko the way DKMS does, against every kernel series perfq
# supports, with W=1 and sparse (C=1): any compiler warning or sparse
# finding fails.
#   scripts/check-driver.sh [OUT_DIR]    (default: build/driver-check)
# The series are Debian 12's 6.1 (linux-headers-amd64) and 6.12
# (linux-headers-6.12-amd64); for each, the newest installed headers in
# /lib/modules/V/build are used (driver/Makefile's `kver KSERIES=`).  A missing series fails, naming the package.
# The source tree is staged as the perfq-dkms package installs it
# (debian/perfq-dkms.install) and built with dkms.conf's own MAKE command,
# so this is also the DKMS build of both kernels.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$(realpath -m "${1:-$ROOT/build/driver-check}")
SERIES=("6.1:linux-headers-amd64" "6.12:linux-headers-6.12-amd64")

command -v sparse >/dev/null || { echo "check-driver: sparse is missing (apt-get install sparse; scripts/deps.sh)" >&2; exit 1; }

newest_of() { make -s -C "$ROOT/driver" kver KSERIES="$1"; }

# dkms.conf's MAKE[0] for kernel $1, with dkms_tree $2.
dkms_make() {
  (
    kernel_source_dir=/lib/modules/$1/build
    dkms_tree=$2
    # shellcheck disable=SC1091
    . "$ROOT/driver/dkms.conf"
    echo "${MAKE[0]}"
  )
}

# The files of perfq-dkms at their installed paths under $1 (/usr/src/perfq-V).
stage() {
  local dest=$1 src target
  while read -r src target; do
    [ -n "$src" ] || continue
    target=${target#usr/src/perfq-\$\{env:DEB_VERSION_UPSTREAM\}/}
    mkdir -p "$dest/$target"
    cp "$ROOT/$src" "$dest/$target"
  done <"$ROOT/debian/perfq-dkms.install"
}

version=$(sed -n 's/^PACKAGE_VERSION="\(.*\)"/\1/p' "$ROOT/driver/dkms.conf")
fail=0
mkdir -p "$OUT"
for entry in "${SERIES[@]}"; do
  series=${entry%%:*}
  pkg=${entry#*:}
  kver=$(newest_of "$series")
  if [ -z "$kver" ]; then
    echo "check-driver: no $series kernel headers in /lib/modules/$series.*/build (install $pkg: scripts/deps.sh)" >&2
    fail=1
    continue
  fi
  tree=$OUT/$kver
  rm -rf "$tree"
  build=$tree/perfq/$version/build
  mkdir -p "$build"
  stage "$build"
  log=$OUT/$kver.log
  # shellcheck disable=SC2046
  if ! $(dkms_make "$kver" "$tree") W=1 C=1 >"$log" 2>&1; then
    cat "$log" >&2
    echo "check-driver: perfq.ko does not build against $kver (the DKMS build; $log)" >&2
    fail=1
    continue
  fi
  # Everything the compiler or sparse says names a file and line.
  if grep -E '(warning|error):' "$log" >&2; then
    echo "check-driver: perfq.ko has warnings or sparse findings against $kver (W=1 C=1; $log)" >&2
    fail=1
    continue
  fi
  # Kbuild prints "CHECK .../perfq.c" when it runs sparse on it.
  if ! grep -q 'CHECK .*perfq\.c' "$log"; then
    echo "check-driver: sparse did not run against $kver ($log)" >&2
    fail=1
    continue
  fi
  [ -s "$build/perfq.ko" ] || { echo "check-driver: no perfq.ko for $kver" >&2; fail=1; continue; }
  echo "check-driver: $kver: perfq.ko builds as DKMS builds it, W=1 and sparse clean"
done
exit $fail
