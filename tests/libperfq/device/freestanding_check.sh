#!/usr/bin/env bash
# The device SDK builds as bare-metal firmware: perfq_device.c and a small
# firmware on it (baremetal_firmware.c), compiled with a bare-metal
# toolchain (-ffreestanding -nostdlib -Wall -Wextra -Werror -std=c11) and
# linked into one relocatable object with no C library (the compiler's own
# runtime, libgcc, only: 64-bit division on 32-bit cores).  The only
# undefined symbols left may be the port layer's (board_device_now,
# board_timer_read) and memcpy/memset (documented in perfq_device.h).
#   freestanding_check.sh TARGET   TARGET: riscv64 | arm | arm_soft_float
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
target=${1:?usage: freestanding_check.sh riscv64|arm|arm_soft_float}
case "$target" in
  riscv64) cc=riscv64-unknown-elf-gcc; flags=(-march=rv64gc -mabi=lp64d -mcmodel=medany) ;;
  # Cortex-R5 (a SmartNIC or SSD controller's real-time core): double-precision FPU.
  arm) cc=arm-none-eabi-gcc; flags=(-mcpu=cortex-r5 -mfpu=vfpv3-d16 -mfloat-abi=hard) ;;
  # A core without a floating-point unit: mode B (the one floating-point
  # part) left out, so nothing calls the soft-float runtime.
  arm_soft_float) cc=arm-none-eabi-gcc; flags=(-mcpu=cortex-a7 -mfloat-abi=soft -DPERFQ_DEVICE_NO_MODE_B) ;;
  *) echo "freestanding_check.sh: unknown target '$target'" >&2; exit 2 ;;
esac
command -v "$cc" >/dev/null || { echo "freestanding_check.sh: $cc is not installed (make deps)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(-std=c11 -ffreestanding -nostdlib -fno-math-errno -O2 -Wall -Wextra -Werror
        -I"$ROOT/libperfq/include" "${flags[@]}")
"$cc" "${common[@]}" -c "$ROOT/libperfq/include/perfq/perfq_device.c" -o "$work/sdk.o"
"$cc" "${common[@]}" -c "$ROOT/tests/libperfq/device/baremetal_firmware.c" -o "$work/fw.o"
"$cc" "${common[@]}" -Wl,-r -o "$work/firmware.o" "$work/fw.o" "$work/sdk.o" -lgcc
prefix=${cc%gcc}
undefined=$("${prefix}nm" -u "$work/firmware.o" | awk '{print $2}' | sort | tr '\n' ' ')
allowed="board_device_now board_timer_read memcpy memset"
bad=""
for s in $undefined; do
  case " $allowed " in *" $s "*) ;; *) bad="$bad $s" ;; esac
done
"${prefix}size" "$work/sdk.o" | tail -1 | awk -v t="$target" '{printf "perfq_device.c on %s: text %d data %d bss %d bytes\n", t, $1, $2, $3}'
echo "undefined symbols: ${undefined:-none}"
if [ -n "$bad" ]; then
  echo "FAIL: undefined symbols outside the port layer and memcpy/memset:$bad" >&2
  exit 1
fi
echo "ok: $target firmware links with no C library"
