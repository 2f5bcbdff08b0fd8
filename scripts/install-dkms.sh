#!/usr/bin/env bash
# perfq.ko through DKMS, from this source tree (what the perfq-dkms package
# does with its postinst):
#   scripts/install-dkms.sh            copy the source to /usr/src/perfq-VERSION,
#                                      dkms add, build and install it for every
#                                      installed kernel that has headers
#   scripts/install-dkms.sh --remove   dkms remove --all, delete the source
# DESTDIR set: only stage the source under it.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
version=$(sed -n 's/^PACKAGE_VERSION="\(.*\)"/\1/p' "$ROOT/driver/dkms.conf")
src=${DESTDIR:-}/usr/src/perfq-$version
if [ "${1:-}" = --remove ]; then
  if dkms status -m perfq -v "$version" 2>/dev/null | grep -q .; then
    dkms remove "perfq/$version" --all
  fi
  rm -rf -- "$src"
  echo "perfq dkms: removed perfq/$version"
  exit 0
fi
rm -rf -- "$src"
# The files are those of the perfq-dkms package (debian/perfq-dkms.install,
# "SOURCE usr/src/perfq-${env:DEB_VERSION_UPSTREAM}/FOLDER/"), and dkms.conf.
while read -r file dest; do
  [ -n "$file" ] || continue
  dest=${dest#usr/src/perfq-\$\{env:DEB_VERSION_UPSTREAM\}/}
  install -D -m 0644 "$ROOT/$file" "$src/$dest$(basename "$file")"
done <"$ROOT/debian/perfq-dkms.install"
install -D -m 0644 "$ROOT/driver/dkms.conf" "$src/dkms.conf"
echo "perfq dkms: source in $src"
[ -z "${DESTDIR:-}" ] || exit 0
command -v dkms >/dev/null || { echo "perfq dkms: dkms is not installed (apt-get install dkms)" >&2; exit 1; }
dkms status -m perfq -v "$version" 2>/dev/null | grep -q . || dkms add "perfq/$version"
built=0
for build in /lib/modules/*/build; do
  [ -d "$build" ] || continue
  kver=$(basename "$(dirname "$build")")
  dkms install "perfq/$version" -k "$kver"
  built=$((built + 1))
done
[ $built -gt 0 ] || { echo "perfq dkms: no kernel with headers (install linux-headers-amd64)" >&2; exit 1; }
echo "perfq dkms: perfq.ko built and installed for $built kernel(s); modprobe perfq"
