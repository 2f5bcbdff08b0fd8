#!/usr/bin/env bash
# Format perfq's C++ and C with the root .clang-format (clang-format 14,
# Debian 12's).
#   scripts/format.sh           reformat the tracked files in place
#   scripts/format.sh --check   list the files that are not formatted; exit 1 if any
# Kernel-style C is left to the kernel's checkpatch: the driver, the headers
# it shares with the kernel and the device, the BPF program, and the C test
# programs written in that style.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
CLANG_FORMAT=${CLANG_FORMAT:-$(command -v clang-format-14 || command -v clang-format || true)}
[ -n "$CLANG_FORMAT" ] || { echo "format.sh: clang-format is not installed (apt-get install clang-format)" >&2; exit 1; }
KERNEL_STYLE='^(driver/|qemu/guest/perfq-guest\.c$|daemon/bpf/|libperfq/include/perfq/perfq_(abi|ioctl|region_check|device)\.h$|libperfq/include/perfq/perfq_device\.c$|tools/device-example/.*\.c$|tests/libperfq/device/.*\.c$|libperfq/include/perfq/perfq\.h$|tests/tools/perfq_test_app\.c$|tests/libperfq/core/abi_c11\.c$)'
mapfile -t files < <(git ls-files '*.c' '*.h' '*.cpp' '*.hpp' | grep -Ev "$KERNEL_STYLE")
if [ "${1:-}" = --check ]; then
  bad=()
  for f in "${files[@]}"; do
    "$CLANG_FORMAT" --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
  done
  if [ ${#bad[@]} -gt 0 ]; then
    printf 'not formatted (scripts/format.sh fixes them): %s\n' "${bad[@]}" >&2
    exit 1
  fi
  echo "format.sh: ${#files[@]} files formatted"
  exit 0
fi
"$CLANG_FORMAT" -i "${files[@]}"
echo "format.sh: formatted ${#files[@]} files"
