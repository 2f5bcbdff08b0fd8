#!/usr/bin/env bash
# Build perfq.ko against every kernel series perfq supports, with W=1 and
# sparse (C=1): any compiler warning or sparse finding fails.
#   scripts/check-driver.sh [OUT_DIR]    (default: build/driver-check)
# The series are Debian 12's 6.1 (linux-headers-amd64) and 6.12
# (linux-headers-6.12-amd64); for each, the newest installed headers in
# /lib/modules/V/build are used.  A missing series fails, naming the package.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$(realpath -m "${1:-$ROOT/build/driver-check}")
SERIES=("6.1:linux-headers-amd64" "6.12:linux-headers-6.12-amd64")

command -v sparse >/dev/null || { echo "check-driver: sparse is missing (apt-get install sparse; scripts/deps.sh)" >&2; exit 1; }

newest_of() {
  local s=$1 v
  for d in /lib/modules/"$s".*/build; do
    [ -d "$d" ] || continue
    v=$(basename "$(dirname "$d")")
    echo "$v"
  done | sort -V | tail -n 1
}

fail=0
for entry in "${SERIES[@]}"; do
  series=${entry%%:*}
  pkg=${entry#*:}
  kver=$(newest_of "$series")
  if [ -z "$kver" ]; then
    echo "check-driver: no $series kernel headers in /lib/modules/$series.*/build (install $pkg: scripts/deps.sh)" >&2
    fail=1
    continue
  fi
  dir=$OUT/$kver
  rm -rf "$dir"
  log=$OUT/$kver.log
  mkdir -p "$OUT"
  if ! make --no-print-directory -C "$ROOT/driver" KVER="$kver" O_DIR="$dir" W=1 C=1 >"$log" 2>&1; then
    cat "$log" >&2
    echo "check-driver: perfq.ko does not build against $kver" >&2
    fail=1
    continue
  fi
  # Everything sparse or the compiler says names a file and line.
  if grep -E '(warning|error):' "$log" >&2; then
    echo "check-driver: perfq.ko has warnings or sparse findings against $kver (W=1 C=1; $log)" >&2
    fail=1
    continue
  fi
  # Kbuild prints "CHECK perfq.c" when it runs sparse on it.
  grep -q 'CHECK .*perfq\.c' "$log" || { echo "check-driver: sparse did not run against $kver ($log)" >&2; fail=1; continue; }
  [ -s "$dir/perfq.ko" ] || { echo "check-driver: no perfq.ko for $kver" >&2; fail=1; continue; }
  echo "check-driver: $kver: perfq.ko builds with W=1, sparse clean"
done
exit $fail
