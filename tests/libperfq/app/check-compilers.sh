#!/usr/bin/env bash
# tests/libperfq/app/check-compilers.sh INCLUDE_DIR: C programs using every
# macro of perfq.h (PERFQ_SCOPE, PERFQ_SCOPE_IN, PERFQ_ARG2) compile with
# every warning as an error under GCC and Clang, C11 and GNU C11: an
# application built with -Werror by either must not fail on our macros.
# One line per check; exits 1 if any failed, 77 if no Clang (only GCC
# checked then, and said so).
set -euo pipefail
inc=${1:?usage: check-compilers.sh INCLUDE_DIR}
src=$(cd "$(dirname "$0")/../../.." && pwd)
failed=0
skipped=0
for compiler in gcc clang; do
  if ! command -v "$compiler" >/dev/null; then
    echo "skip $compiler: not installed (apt-get install $compiler)"
    skipped=1
    continue
  fi
  for std in c11 gnu11; do
    for f in examples/app/app.c tests/tools/perfq_test_app.c; do
      if out=$("$compiler" -std=$std -Wall -Wextra -Werror -pedantic -I"$inc" -fsyntax-only \
               "$src/$f" 2>&1); then
        echo "ok   $compiler -std=$std: $f"
      else
        echo "FAIL $compiler -std=$std: $f"
        sed 's/^/     | /' <<<"$out" | head -n 20
        failed=1
      fi
    done
  done
done
[ $failed -eq 0 ] || exit 1
[ $skipped -eq 0 ] || exit 77
echo "check-compilers: all passed"
