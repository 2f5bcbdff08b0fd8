#!/usr/bin/env bash
# tests/install/check-install.sh BUILD_DIR: what `make install` puts under
# DESTDIR is complete and usable, and `make uninstall` takes it all away.
#   - programs, unit (its ExecStart names the installed daemon and config),
#     sysusers.d, tmpfiles.d, udev rule, config, man pages, completion;
#   - libperfq.so with SONAME libperfq.so.<major>, and libperfq.a;
#   - another project builds against it three ways and the programs run:
#     CMake find_package(perfq) with perfq::perfq (shared) and
#     perfq::perfq_static, and a C program with pkg-config's flags;
#   - the installed example (share/doc/perfq/examples/app, perfq(3)) builds
#     with its CMakeLists.txt and its Makefile and runs with no
#     LD_LIBRARY_PATH;
#   - the uninstall leaves no file behind.
# One line per check; exits 1 if any failed.
set -euo pipefail
build=$(realpath "${1:?usage: check-install.sh BUILD_DIR}")
src=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d /tmp/perfq-install-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
dest=$work/dest
failed=0
pass() { echo "ok   $*"; }
fail() { echo "FAIL $*"; failed=1; }
check() { local what=$1; shift; if "$@" >"$work/out" 2>&1; then pass "$what"; else fail "$what"; sed 's/^/     | /' "$work/out" | tail -n 20; fi; }

prefix=$(sed -n 's/^CMAKE_INSTALL_PREFIX:PATH=//p' "$build/CMakeCache.txt")
libdir=$(sed -n 's/^CMAKE_INSTALL_LIBDIR:PATH=//p' "$build/CMakeCache.txt")
# What make install does, into DESTDIR (the list of files goes to our own
# file, not the build folder's).
DESTDIR=$dest "$src/scripts/install.sh" "$build" "$work/installed.txt" >"$work/install.log" 2>&1 || {
  cat "$work/install.log"; echo "FAIL scripts/install.sh"; exit 1; }
root=$dest$prefix
echo "     installed $(wc -l <"$work/installed.txt") files under $root"

etc=$prefix/etc
[ "$prefix" = /usr ] && etc=/etc
for f in bin/perfq-daemon bin/perfqctl bin/perfq-devsim bin/perfq-demo-app \
         "$libdir/libperfq.a" "$libdir/pkgconfig/perfq.pc" "$libdir/cmake/perfq/perfqConfig.cmake" \
         include/perfq/perfq.h include/perfq/perfq_abi.h \
         share/man/man1/perfqctl.1 share/man/man8/perfq-daemon.8 share/man/man1/perfq-devsim.1 \
         share/man/man1/perfq-demo-app.1 share/man/man3/perfq.3 \
         share/doc/perfq/examples/app/app.c share/doc/perfq/examples/app/CMakeLists.txt \
         share/doc/perfq/examples/app/Makefile \
         share/bash-completion/completions/perfqctl; do
  check "installed: $prefix/$f" test -s "$root/$f"
done
check "installed: $etc/perfq/perfq-daemon.conf" test -s "$dest$etc/perfq/perfq-daemon.conf"
unit=$(grep -E '/perfq-daemon\.service$' "$work/installed.txt" || true)
sysusers=$(grep -E '/sysusers\.d/perfq\.conf$' "$work/installed.txt" || true)
tmpfiles=$(grep -E '/tmpfiles\.d/perfq\.conf$' "$work/installed.txt" || true)
udev=$(grep -E '/udev/rules\.d/60-perfq\.rules$' "$work/installed.txt" || true)
check "installed: the unit (${unit#"$dest"})" test -s "$unit"
check "installed: the sysusers.d entry creates the perfq group" grep -qE '^g perfq ' "$sysusers"
check "installed: the tmpfiles.d entry makes /run/perfq" grep -qE '^d /run/perfq ' "$tmpfiles"
check "installed: the udev rule gives /dev/perfqN to the perfq group" grep -q 'GROUP="perfq"' "$udev"
exec_start=$(sed -n 's/^ExecStart=//p' "$unit")
read -r daemon_path _ config_path <<<"$exec_start"
check "the unit runs the installed daemon ($daemon_path)" test -x "$dest$daemon_path"
check "the unit names the installed config ($config_path)" test -s "$dest$config_path"
check "the unit is Type=notify" grep -qx 'Type=notify' "$unit"
if command -v systemd-analyze >/dev/null; then
  # systemd-analyze looks for the ExecStart program on this system: point it
  # at the staged one.
  sed "s|^ExecStart=$daemon_path --config $config_path|ExecStart=$dest$daemon_path --config $dest$config_path|" \
    "$unit" >"$work/perfq-daemon.service"
  check "systemd-analyze verify accepts the unit" \
    env SYSTEMD_LOG_LEVEL=err systemd-analyze verify --man=no "$work/perfq-daemon.service"
fi

so=$(readlink "$root/$libdir/libperfq.so")
soname=$(readelf -d "$root/$libdir/$so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
major=$(sed -n 's/^CMAKE_PROJECT_VERSION_MAJOR:STATIC=//p' "$build/CMakeCache.txt")
check "libperfq.so -> $so has SONAME $soname (libperfq.so.$major)" test "$soname" = "libperfq.so.$major"

# The installed headers are the public ones only (libperfq/CMakeLists.txt's
# PERFQ_PUBLIC_HEADERS): what an application, a device or a trace reader uses.
headers=$(cd "$root/include/perfq" && ls | sort | tr '\n' ' ')
want="event_info.h export.h filter.h pci.h perfq.h perfq.hpp perfq_abi.h perfq_device.h perfq_ioctl.h perfq_region_check.h progress.h report.h status.h trace.h "
check "installed headers are the public ones ($headers)" test "$headers" = "$want"

# The device SDK as a firmware project takes it: the installed header and
# source, compiled freestanding with nothing else.
check "the installed device SDK compiles freestanding (share/perfq/perfq_device.c)" \
  cc -std=c11 -ffreestanding -Wall -Wextra -Werror -I"$root/include/perfq" -c \
  "$root/share/perfq/perfq_device.c" -o "$work/perfq_device.o"

# A program of another project: records an event with no daemon running
# (recording is then a counted no-op) and reports the library's count.
cat >"$work/app.c" <<'C'
#include <perfq/perfq.h>
#include <stdio.h>
int main(void) {
  if (perfq_init("install-test", "/nonexistent/perfqd.sock") != 0) return 2;
  uint32_t ev = perfq_event("installed", PERFQ_KIND_INSTANT);
  for (int i = 0; i < 3; i++) perfq_instant(ev, (uint64_t)i);
  struct perfq_stats st;
  perfq_get_stats(&st);
  perfq_shutdown();
  printf("events %llu\n", (unsigned long long)(st.recorded + st.dropped + st.not_recording + st.lost));
  return 0;
}
C
mkdir -p "$work/consumer"
cp "$work/app.c" "$work/consumer/app.c"
cat >"$work/consumer/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.25)
project(consumer C CXX)
find_package(perfq 0.1 REQUIRED)
add_executable(app_shared app.c)
target_link_libraries(app_shared PRIVATE perfq::perfq)
add_executable(app_static app.c)
target_link_libraries(app_static PRIVATE perfq::perfq_static)
# libperfq.a is C++ inside: link with the C++ driver.
set_target_properties(app_static PROPERTIES LINKER_LANGUAGE CXX)
# A trace reader: every installed header, with nothing but perfq's package
# (its dependencies come with it).
add_executable(reader reader.cpp)
target_compile_features(reader PRIVATE cxx_std_20)
target_link_libraries(reader PRIVATE perfq::perfq)
CM
cat >"$work/consumer/reader.cpp" <<'CPP'
#include <perfq/event_info.h>
#include <perfq/export.h>
#include <perfq/pci.h>
#include <perfq/perfq.hpp>
#include <perfq/perfq_abi.h>
#include <perfq/perfq_ioctl.h>
#include <perfq/report.h>
#include <perfq/status.h>
#include <perfq/trace.h>
#include <cstdio>
int main(int argc, char** argv) {
  auto f = perfq::parse_export_format("csv");
  if (!f) return 2;
  if (argc > 1) {
    auto r = perfq::analyze_trace(argv[1], {});
    if (!r) { std::fprintf(stderr, "%s\n", r.status().message().c_str()); return 1; }
    std::printf("records %llu\n", static_cast<unsigned long long>(r->records_host + r->records_device));
  }
  std::printf("ioctl %lu\n", static_cast<unsigned long>(PERFQ_IOC_INFO));
  return 0;
}
CPP
check "find_package(perfq) configures another project" \
  cmake -S "$work/consumer" -B "$work/consumer/b" -G Ninja -DCMAKE_PREFIX_PATH="$root"
check "it builds against perfq::perfq and perfq::perfq_static" cmake --build "$work/consumer/b"

# The installed example, as a user copies and builds it, run with no
# LD_LIBRARY_PATH and no daemon (its records are counted as dropped):
# 1000 copies (begin, end), instants and counters, 2000 fewer with the
# copies' category off.  CMake links it with a RUNPATH to the library it
# found; the Makefile's build gets one from LDFLAGS here, because a library
# staged in a DESTDIR is where no dynamic loader looks (installed in /usr,
# it needs none).
ex=$root/share/doc/perfq/examples/app
runex="env -u LD_LIBRARY_PATH PERFQ_SOCKET='$work/nodaemon.sock'"
cp -r "$ex" "$work/example-cmake"
cp -r "$ex" "$work/example-make"
check "the example configures with find_package(perfq)" \
  cmake -S "$work/example-cmake" -B "$work/example-cmake/b" -G Ninja -DCMAKE_PREFIX_PATH="$root" \
  -DCMAKE_C_FLAGS="-Wall -Wextra -Werror"
check "the example builds with CMake" cmake --build "$work/example-cmake/b"
check "the example built with make and pkg-config" \
  env PKG_CONFIG_PATH="$root/$libdir/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$dest" \
  make -C "$work/example-make" CFLAGS="-O2 -Wall -Wextra -Werror" LDFLAGS="-Wl,-rpath,$root/$libdir"
for how in cmake/b make; do
  bin=$work/example-${how}/perfq-example
  check "example ($how) loads the installed libperfq.so.$major" \
    sh -c "env -u LD_LIBRARY_PATH ldd '$bin' | grep -q 'libperfq.so.$major => $root/$libdir/'"
  check "example ($how) runs: 4000 events, no error" \
    sh -c "$runex '$bin' | grep -qx 'events 4000 recorded 0 errors 0'"
  check "example ($how) with PERFQ_CATEGORIES=-io: 2000 events" \
    sh -c "$runex PERFQ_CATEGORIES=-io '$bin' | grep -qx 'events 2000 recorded 0 errors 0'"
done

export LD_LIBRARY_PATH=$root/$libdir
check "app_shared runs: 3 events counted" sh -c "'$work/consumer/b/app_shared' | grep -qx 'events 3'"
check "app_shared needs libperfq.so.$major" sh -c "readelf -d '$work/consumer/b/app_shared' | grep -q 'NEEDED.*libperfq.so.$major'"
check "app_static runs without libperfq.so: 3 events counted" \
  sh -c "! readelf -d '$work/consumer/b/app_static' | grep -q libperfq && '$work/consumer/b/app_static' | grep -qx 'events 3'"
check "a trace reader built on the installed headers runs" "$work/consumer/b/reader"
pc() { PKG_CONFIG_PATH=$root/$libdir/pkgconfig PKG_CONFIG_SYSROOT_DIR=$dest pkg-config "$@"; }
check "pkg-config knows perfq $(pc --modversion perfq 2>/dev/null)" pc --exists perfq
# shellcheck disable=SC2046
check "a C program builds with \$(pkg-config --cflags --libs perfq)" \
  cc -std=c11 -Wall -Werror -o "$work/app_pc" "$work/app.c" $(pc --cflags --libs perfq)
check "it runs: 3 events counted" sh -c "'$work/app_pc' | grep -qx 'events 3'"
# shellcheck disable=SC2046
check "a C++ trace reader builds with \$(pkg-config --cflags --libs perfq)" \
  c++ -std=c++20 -Wall -Werror -o "$work/reader_pc" "$work/consumer/reader.cpp" $(pc --cflags --libs perfq)

# make uninstall, from the list.
check "uninstall" "$src/scripts/uninstall.sh" "$work/installed.txt"
left=$(find "$dest" -type f -o -type l | head -n 5)
check "nothing installed is left${left:+: $left}" test -z "$left"
left_dirs=$(find "$dest" -type d -name perfq | head -n 5)
check "no perfq folder is left${left_dirs:+: $left_dirs}" test -z "$left_dirs"

[ $failed -eq 0 ] && echo "check-install: all passed"
exit $failed
