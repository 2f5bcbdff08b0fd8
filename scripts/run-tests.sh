#!/usr/bin/env bash
# Run ctest in each build folder given, then print one closing line with the
# totals of all of them: "perfq: N passed, M failed".
#   --results FILE  also count a results file of "PASS name" / "FAIL name"
#                   lines (the QEMU scenarios); a missing file is one failure.
#   --beside CMD    (between build folders) from there on, run CMD in the
#                   background at the lowest CPU and I/O priority (nice 19,
#                   ionice idle): it takes only the CPU the tests leave idle
#                   (the end-to-end tests run alone within their tree and
#                   mostly wait).  Its output is printed after the tests; it
#                   is waited for before the results files are counted, so
#                   it may write one.
set -uo pipefail

total_pass=0
total_fail=0
rc=0
results=()
failed_names=()  # every failure by name, repeated after the totals
while [ "${1:-}" = --results ]; do
  results+=("$2")
  shift 2
done

beside_pid=
beside_log=
while [ $# -gt 0 ]; do
  if [ "$1" = --beside ]; then
    [ $# -ge 2 ] || { echo "run-tests.sh: --beside needs a command" >&2; exit 2; }
    [ -z "$beside_pid" ] || { echo "run-tests.sh: one --beside at a time" >&2; exit 2; }
    beside_log=$(mktemp)
    echo "=== beside the tests that follow, at the lowest priority: $2 (its output after them) ==="
    io=(ionice -c 3)  # where the idle I/O class is not allowed, without it
    "${io[@]}" true 2>/dev/null || io=()
    nice -n 19 "${io[@]}" bash -c "$2" >"$beside_log" 2>&1 &
    beside_pid=$!
    shift 2
    continue
  fi
  dir=$1
  shift
  echo "=== ctest in $dir ==="
  log=$(mktemp)
  ctest --test-dir "$dir" --output-on-failure --schedule-random -j "$(nproc)" 2>&1 | tee "$log"
  status=${PIPESTATUS[0]}
  line=$(grep -E '[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -n 1)
  while IFS= read -r l; do failed_names+=("$dir: $l"); done \
    < <(sed -n '/tests failed out of/,$s/^[[:space:]]*\([0-9]\+ - .*\)$/\1/p' "$log")
  rm -f "$log"
  if [ -z "$line" ]; then
    echo "perfq: ctest in $dir printed no summary" >&2
    failed_names+=("$dir: ctest printed no summary")
    rc=1
    continue
  fi
  failed=$(sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\1/' <<<"$line")
  out_of=$(sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\2/' <<<"$line")
  total_pass=$((total_pass + out_of - failed))
  total_fail=$((total_fail + failed))
  [ "$status" -eq 0 ] || rc=1
done

if [ -n "$beside_pid" ]; then
  if kill -0 "$beside_pid" 2>/dev/null; then
    echo "=== the tests are done; waiting for what ran beside them ==="
  fi
  wait "$beside_pid"
  echo "=== what ran beside the tests (exit status $?) ==="
  cat "$beside_log"
  rm -f "$beside_log"
fi

for file in "${results[@]}"; do
  if [ ! -s "$file" ]; then
    echo "perfq: no results in $file" >&2
    failed_names+=("$file: no results")
    total_fail=$((total_fail + 1))
    rc=1
    continue
  fi
  p=$(grep -c '^PASS ' "$file")
  f=$(grep -c '^FAIL ' "$file")
  echo "=== $file: $p passed, $f failed ==="
  while IFS= read -r l; do failed_names+=("$file: $l"); done < <(grep '^FAIL ' "$file")
  total_pass=$((total_pass + p))
  total_fail=$((total_fail + f))
  [ "$f" -eq 0 ] || rc=1
done
echo
if [ "${#failed_names[@]}" -gt 0 ]; then
  echo "perfq: what failed:"
  printf '  %s\n' "${failed_names[@]}"
fi
echo "perfq: $total_pass passed, $total_fail failed"
exit $rc
