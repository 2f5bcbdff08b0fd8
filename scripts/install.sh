#!/usr/bin/env bash
# What `make install` does once the build folder is configured for PREFIX:
# cmake --install (DESTDIR honoured), then the list of installed files, with
# DESTDIR, that scripts/uninstall.sh reads (CMake's own manifest leaves
# DESTDIR out).
#   scripts/install.sh BUILD_DIR [LIST]   (LIST: BUILD_DIR/perfq-installed.txt)
set -euo pipefail
build=${1:?usage: scripts/install.sh BUILD_DIR [LIST]}
list=${2:-$build/perfq-installed.txt}
DESTDIR="${DESTDIR:-}" cmake --install "$build"
sed "s|^|${DESTDIR:-}|" "$build/install_manifest.txt" >"$list"
