#!/usr/bin/env bash
# tests/libperfq/app/check-disable.sh CC CXX INCLUDE_DIR: with PERFQ_DISABLE
# defined, a C and a C++ program using every call and macro of perfq.h and
# perfq.hpp compile with every warning as an error, link without libperfq,
# reference no perfq_ symbol and run.  One line per check; exits 1 if any
# failed.
set -euo pipefail
cc=${1:?usage: check-disable.sh CC CXX INCLUDE_DIR} cxx=${2:?} inc=${3:?}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/perfq-disable-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
failed=0
check() { local what=$1; shift; if "$@" >"$work/out" 2>&1; then echo "ok   $what"; else echo "FAIL $what"; sed 's/^/     | /' "$work/out" | tail -n 20; failed=1; fi; }

for lang in c cxx; do
  if [ $lang = c ]; then
    compile=("$cc" -std=c11 "$here/disable_test.c")
  else
    compile=("$cxx" -std=c++20 "$here/disable_test.cpp")
  fi
  for opt in -O0 -O2; do
    bin=$work/disabled_$lang$opt
    check "$lang $opt: compiles and links with -DPERFQ_DISABLE and no libperfq" \
      "${compile[@]}" "$opt" -DPERFQ_DISABLE -Wall -Wextra -Werror -pedantic -I"$inc" -o "$bin"
    [ -x "$bin" ] || continue
    check "$lang $opt: it references no perfq_ symbol" sh -c "! nm '$bin' | grep -E ' (U|T|W) perfq_[a-z]'"
    check "$lang $opt: it runs" sh -c "'$bin' | grep -qx 'disabled ok'"
  done
done
[ $failed -eq 0 ] && echo "check-disable: all passed"
exit $failed
