#!/usr/bin/env bash
# The libFuzzer harnesses of tests/fuzz, built in a clang tree and run.
#   scripts/fuzz.sh [--build DIR] [--seconds N | --runs N] [--results FILE] [NAME...]
#   NAME: trace, trace_export, region, app_events, control, sync, app_ring
#         (default: all of them)
#   --seconds N  run each fuzzer for N seconds (make test: 30)
#   --runs N     run each fuzzer for N inputs (make fuzz: 10000000)
#   --results F  append "PASS fuzz NAME: ..." / "FAIL fuzz NAME: ..." lines
#   --build DIR  the clang tree (default build-fuzz)
#   --jobs N     run N fuzzers at once (default: the number of CPUs; each
#                fuzzer is one process on one CPU, so each still gets its
#                seconds or runs in full)
# Each fuzzer starts from the seeds perfq_fuzz_seeds makes (real traces, a
# region, an application hello, control requests, sync rounds, an app ring) and from its corpus kept in DIR/corpus/NAME
# between runs; first it reruns every input in tests/fuzz/regressions/NAME
# (each crash ever found, kept as a regression test).  A crash leaves its
# input in DIR/crashes/ and fails the run; copy it into
# tests/fuzz/regressions/NAME/ once fixed.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$ROOT/build-fuzz
SECONDS_EACH=
RUNS=
RESULTS=
JOBS=$(nproc)
NAMES=()
while [ $# -gt 0 ]; do
  case $1 in
    --build) BUILD=$2; shift 2 ;;
    --seconds) SECONDS_EACH=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --results) RESULTS=$2; shift 2 ;;
    --jobs) JOBS=$2; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) NAMES+=("$1"); shift ;;
  esac
done
[ ${#NAMES[@]} -gt 0 ] || NAMES=(trace trace_export region app_events control sync app_ring)
[ -n "$SECONDS_EACH$RUNS" ] || SECONDS_EACH=30
case $JOBS in '' | *[!0-9]* | 0) echo "fuzz.sh: --jobs $JOBS is not a positive number" >&2; exit 2 ;; esac
for n in "${NAMES[@]}"; do
  case $n in trace|trace_export|region|app_events|control|sync|app_ring) ;; *) echo "fuzz.sh: no fuzzer named '$n' (trace, trace_export, region, app_events, control, sync, app_ring)" >&2; exit 2 ;; esac
done
result() {
  echo "fuzz: $1"
  [ -z "$RESULTS" ] || echo "$1" >>"$RESULTS"
}

echo "fuzz: building the fuzzers in $BUILD (clang, libFuzzer + ASan + UBSan)"
mkdir -p "$BUILD"
if ! { CC=clang CXX=clang++ cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
         -DPERFQ_SANITIZE=fuzzer >"$BUILD/build.log" 2>&1 &&
       cmake --build "$BUILD" -j "$(nproc)" --target perfq_fuzzers >>"$BUILD/build.log" 2>&1; }; then
  tail -n 30 "$BUILD/build.log" >&2
  result "FAIL fuzz build: the fuzzers did not build (log $BUILD/build.log)"
  exit 1
fi
SEEDS=$BUILD/seeds
rm -rf "$SEEDS"
"$BUILD/bin/perfq_fuzz_seeds" "$SEEDS" || { result "FAIL fuzz seeds: perfq_fuzz_seeds failed"; exit 1; }

# One fuzzer: its regressions, then its run; the exit status is its verdict.
fuzz_one() {
  local n=$1
  local bin=$BUILD/bin/perfq_fuzz_$n
  local seeds=$SEEDS/$n
  [ "$n" != trace_export ] || seeds=$SEEDS/trace
  local corpus=$BUILD/corpus/$n
  local crashes=$BUILD/crashes
  mkdir -p "$corpus" "$crashes"
  local log=$BUILD/fuzz-$n.log
  # Every crash found so far, first.
  local reg=$ROOT/tests/fuzz/regressions/$n
  if [ -d "$reg" ] && [ -n "$(ls -A "$reg")" ]; then
    if ! "$bin" "$reg"/* >"$log" 2>&1; then
      tail -n 40 "$log" >&2
      result "FAIL fuzz $n: a regression input crashes again (tests/fuzz/regressions/$n; log $log)"
      return 1
    fi
  fi
  local limit=(-max_total_time="$SECONDS_EACH")
  [ -z "$RUNS" ] || limit=(-runs="$RUNS")
  local start
  start=$(date +%s)
  "$bin" "${limit[@]}" -timeout=20 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
    -artifact_prefix="$crashes/$n-" "$corpus" "$seeds" >"$log" 2>&1
  local status=$?
  local secs=$(($(date +%s) - start))
  local inputs
  inputs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  if [ "$status" -ne 0 ]; then
    tail -n 40 "$log" >&2
    local art
    art=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)
    result "FAIL fuzz $n: exit $status after ${inputs:-?} inputs; input ${art:-not saved} (log $log)"
    return 1
  fi
  result "PASS fuzz $n: ${inputs:-?} inputs in $secs s, corpus $(ls "$corpus" | wc -l) files"
}

# JOBS at a time (each a single process); every one is waited for, and any
# failure fails the run.
rc=0
running=0
for n in "${NAMES[@]}"; do
  if [ "$running" -ge "$JOBS" ]; then
    wait -n || rc=1
    running=$((running - 1))
  fi
  fuzz_one "$n" &
  running=$((running + 1))
done
while [ "$running" -gt 0 ]; do
  wait -n || rc=1
  running=$((running - 1))
done
exit $rc
