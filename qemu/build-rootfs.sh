#!/usr/bin/env bash
# Build (once, then reuse) the root filesystem of the `systemd` QEMU
# scenario: Debian 12 (bookworm, debootstrap --variant=minbase) with systemd
# as PID 1, udev, dbus, the host's exact Debian kernel (linux-image and
# linux-headers, so DKMS can build perfq.ko in the guest and the host's
# /boot/vmlinuz-* matches), what DKMS needs (dkms gcc make libc6-dev), and
# the runtime libraries perfq's binaries link, so that `dpkg -i` of the
# project's .debs needs nothing from the network.
#
# Usage: qemu/build-rootfs.sh [--cache DIR] | --packages
#   --packages prints the packages the rootfs gets (one a line) and exits;
#   ctest's qemu.rootfs_packages checks they cover what perfq's binaries link.
#   DIR defaults to ${XDG_CACHE_HOME:-$HOME/.cache}/perfq/rootfs
# The last line on stdout is the rootfs directory, DIR/rootfs-KEY, where KEY
# hashes the package list, the kernel version, and this script.  It is built
# in DIR/.tmp-KEY-PID and renamed when complete, so an interrupted build is
# never reused.  Downloaded packages are kept in DIR/debs (not in the rootfs).
# Needs root (debootstrap, chroot, mounts).  PERFQ_DEBIAN_MIRROR and
# PERFQ_DEBIAN_SECURITY override the mirrors read from the host's apt sources.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SELF="$ROOT/qemu/build-rootfs.sh"
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/perfq/rootfs
PRINT_PACKAGES=
while [ $# -gt 0 ]; do
  case $1 in
    --cache) CACHE=$2; shift 2 ;;
    --cache=*) CACHE=${1#--cache=}; shift ;;
    --packages) PRINT_PACKAGES=1; shift ;;
    -h|--help) sed -n '2,20p' "$SELF"; exit 0 ;;
    *) echo "perfq rootfs: unknown argument $1" >&2; exit 2 ;;
  esac
done
# What debootstrap installs (from SUITE alone): PID 1 and the basics.
BASE=(systemd systemd-sysv udev dbus kmod procps coreutils initramfs-tools)
# What apt installs after it, from SUITE, SUITE-updates and SUITE-security:
# the host's kernel (below), DKMS and its compiler, and the libraries
# perfq's binaries link (ldd perfq-daemon perfqctl perfq-demo-app, mapped
# with dpkg -S; ctest's qemu.rootfs_packages checks this list against the
# build), pci.ids for the device names.
EXTRA=(dkms gcc make libc6-dev
       libc6 libstdc++6 libgcc-s1 libsystemd0 libudev1 libzstd1 libpci3 pci.ids
       libbpf1 libelf1 libfmt9 libspdlog1.10 libgcrypt20 liblz4-1 libcap2
       libgpg-error0 liblzma5 zlib1g
       libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libcivetweb1)
if [ -n "$PRINT_PACKAGES" ]; then
  printf '%s\n' "${BASE[@]}" "${EXTRA[@]}"
  exit 0
fi

say() { echo "perfq rootfs: $*" >&2; }
die() { say "$*"; exit 1; }

[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, chroot)"
command -v debootstrap >/dev/null || die "debootstrap missing (scripts/deps.sh installs it)"
SUITE=bookworm

# The host's Debian kernel: the guest gets the very same package version.
# PERFQ_ROOTFS_KVER (run-scenarios.py sets it for each guest kernel), by
# default the newest 6.1, Debian 12's own.
KVER=${PERFQ_ROOTFS_KVER:-$(make -s -C "$ROOT/driver" kver KSERIES=6.1)}
[ -n "$KVER" ] && [ -r "/boot/vmlinuz-$KVER" ] ||
  die "no Debian kernel on the host (install linux-image-amd64 linux-headers-amd64)"
kver_of() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || true; }
KPKGVER=$(kver_of "linux-image-$KVER")
# The series' meta packages (linux-image-amd64 for 6.1, linux-image-6.12-amd64
# for 6.12): the installed one that depends on this very kernel.
FLAVOUR=
for m in amd64 6.12-amd64; do
  if dpkg-query -W -f='${Depends}' "linux-image-$m" 2>/dev/null | grep -q "linux-image-$KVER "; then
    FLAVOUR=$m
  fi
done
META=$([ -n "$FLAVOUR" ] && kver_of "linux-image-$FLAVOUR")
[ -n "$KPKGVER" ] && [ -n "$META" ] ||
  die "linux-image-$KVER, or the meta package that depends on it, is not installed"
[ "$(kver_of "linux-headers-$KVER")" = "$KPKGVER" ] ||
  die "linux-headers-$KVER $KPKGVER not installed on the host"

# Mirrors: the first http(s) URI the host's apt sources give for SUITE and
# for SUITE-security (one-line and deb822 formats).
host_uri() {
  local suite=$1
  {
    cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
      awk -v s="$suite" '$1 == "deb" { i = 2; if ($2 ~ /^\[/) while (i <= NF && $(i - 1) !~ /\]$/) i++;
                                        if ($(i + 1) == s) print $i }'
    cat /etc/apt/sources.list.d/*.sources 2>/dev/null |
      awk -v s="$suite" 'BEGIN { RS = ""; FS = "\n" }
        { uri = ""; ok = 0
          for (i = 1; i <= NF; i++) {
            if ($i ~ /^URIs:/) { split($i, a, " "); uri = a[2] }
            if ($i ~ /^Suites:/) { n = split($i, b, " "); for (j = 2; j <= n; j++) if (b[j] == s) ok = 1 }
          }
          if (ok && uri != "") print uri }'
  } | grep -E '^https?://' | head -n1
}
MIRROR=${PERFQ_DEBIAN_MIRROR:-$(host_uri "$SUITE")}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SECURITY=${PERFQ_DEBIAN_SECURITY:-$(host_uri "$SUITE-security")}
SECURITY=${SECURITY:-http://deb.debian.org/debian-security}

# Modules the initrd needs to find the root disk (virtio-blk, AHCI) and
# mount ext4: MODULES=list keeps the initrd small (it unpacks under TCG).
INITRD_MODULES=(virtio_pci virtio_blk ahci sd_mod ext4 crc32c_generic)

# The host's kernel, the very same package versions.
EXTRA=("linux-image-$KVER=$KPKGVER" "linux-headers-$KVER=$KPKGVER"
       "linux-image-$FLAVOUR=$META" "linux-headers-$FLAVOUR=$META" "${EXTRA[@]}")

KEY=$({ printf '%s\n' "$SUITE" "${BASE[@]}" "${EXTRA[@]}" "${INITRD_MODULES[@]}"; cat "$SELF"; } |
  sha256sum | cut -c1-16)
OUT=$CACHE/rootfs-$KEY
mkdir -p "$CACHE/debs"
# One build at a time per cache (make test starts one early, in the
# background; the scenario's own call then waits for it and reuses it).
exec 9>"$CACHE/.lock"
if ! flock -n 9; then
  say "waiting for another build of this cache to finish"
  flock 9
fi
# Leftovers of interrupted builds (their process gone): never reused, removed.
for old in "$CACHE"/.tmp-*; do
  [ -d "$old" ] || continue
  pid=${old##*-}
  if ! kill -0 "$pid" 2>/dev/null; then
    awk '{print $2}' /proc/mounts | grep -F "$old/" | sort -r | xargs -r -n1 umount -l || true
    rm -rf --one-file-system "$old"
  fi
done
if [ -f "$OUT/.perfq-rootfs-complete" ]; then
  say "cached: $OUT"
  echo "$OUT"
  exit 0
fi


TMP=$CACHE/.tmp-$KEY-$$
MOUNTS=()
cleanup() {
  local i
  for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do
    umount "${MOUNTS[i]}" 2>/dev/null || umount -l "${MOUNTS[i]}" 2>/dev/null || true
  done
  MOUNTS=()
  if [ -n "${TMP:-}" ] && [ -d "$TMP" ]; then rm -rf --one-file-system "$TMP"; fi
}
trap cleanup EXIT
# apt and dpkg finish what they do on Ctrl-C and may then exit 0, and bash
# runs no trap for a child that did not die of the signal: remember it, and
# check after each step (a half-installed rootfs is never kept).
interrupted=
trap 'interrupted=1' INT TERM
step_done() { [ -z "$interrupted" ] || die "interrupted"; say "$1 after $(($(date +%s) - start)) s"; }
mnt() { mount "$@"; MOUNTS+=("${!#}"); }

start=$(date +%s)
say "building $OUT: Debian $SUITE from $MIRROR (+ $SECURITY), kernel $KVER $KPKGVER"
include=$(IFS=,; echo "${BASE[*]}")
debootstrap --variant=minbase --include="$include" --cache-dir="$CACHE/debs" \
  "$SUITE" "$TMP" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 || {
  tail -n 30 "$CACHE/debootstrap.log" >&2; [ -f "$TMP/debootstrap/debootstrap.log" ] &&
    tail -n 30 "$TMP/debootstrap/debootstrap.log" >&2; die "debootstrap failed"; }
step_done "debootstrap done"

cat >"$TMP/etc/apt/sources.list" <<EOF
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb $SECURITY $SUITE-security main
EOF
# No docs, man pages or translations from here on: a smaller image.
cat >"$TMP/etc/dpkg/dpkg.cfg.d/perfq-nodoc" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/info/*
EOF
mkdir -p "$TMP/etc/initramfs-tools"
sed -i 's/^MODULES=.*/MODULES=list/' "$TMP/etc/initramfs-tools/initramfs.conf"
printf '%s\n' "${INITRD_MODULES[@]}" >>"$TMP/etc/initramfs-tools/modules"
# Nothing starts services inside the chroot.
printf '#!/bin/sh\nexit 101\n' >"$TMP/usr/sbin/policy-rc.d"
chmod +x "$TMP/usr/sbin/policy-rc.d"

mnt -t proc proc "$TMP/proc"
mnt -t sysfs sysfs "$TMP/sys"
mnt --bind /dev "$TMP/dev"
mnt --bind /dev/pts "$TMP/dev/pts"
mnt --bind "$CACHE/debs" "$TMP/var/cache/apt/archives"
in_root() { chroot "$TMP" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
  DEBIAN_FRONTEND=noninteractive LC_ALL=C "$@"; }
in_root apt-get update -qq >"$CACHE/apt.log" 2>&1 || { cat "$CACHE/apt.log" >&2; die "apt-get update failed"; }
in_root apt-get install -y -q --no-install-recommends "${EXTRA[@]}" >>"$CACHE/apt.log" 2>&1 || {
  tail -n 40 "$CACHE/apt.log" >&2; die "apt-get install failed"; }
! grep -q 'interrupted' "$CACHE/apt.log" || die "apt-get was interrupted"
half=$(chroot "$TMP" dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' | grep -v '^ii ' || true)
[ -z "$half" ] || die "packages not fully installed: $half"
step_done "packages installed"
for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do umount "${MOUNTS[i]}"; done
MOUNTS=()

# The guest, offline: no package lists, no policy-rc.d, root without a
# password on the console, a hostname, the root disk in fstab.
rm -rf "$TMP"/var/lib/apt/lists/* "$TMP"/var/cache/apt/*.bin "$TMP/usr/sbin/policy-rc.d"
chroot "$TMP" passwd -dq root
echo perfq-guest >"$TMP/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 perfq-guest\n' >"$TMP/etc/hosts"
echo '/dev/vda / ext4 rw,errors=remount-ro 0 0' >"$TMP/etc/fstab"
ln -sf /lib/systemd/system/multi-user.target "$TMP/etc/systemd/system/default.target"
[ -r "$TMP/boot/vmlinuz-$KVER" ] && [ -r "$TMP/boot/initrd.img-$KVER" ] ||
  die "no /boot/vmlinuz-$KVER and initrd.img-$KVER in the rootfs"
[ -d "$TMP/lib/modules/$KVER/build" ] || die "no headers for $KVER in the rootfs"
echo "$KVER" >"$TMP/.perfq-kver"

step_done "rootfs configured"
touch "$TMP/.perfq-rootfs-complete"
rm -rf --one-file-system "$OUT"
mv -T "$TMP" "$OUT"
TMP=
say "built in $(($(date +%s) - start)) s: $OUT ($(du -sh "$OUT" | cut -f1))"
echo "$OUT"
