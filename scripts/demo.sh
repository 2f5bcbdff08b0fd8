#!/usr/bin/env bash
# make demo: the software device, a recording, a workload, and the analysis.
#
#   perfq-devsim     the device: synthetic workers, job workers, collector,
#                    timer register, on a region under /dev/shm; its clock
#                    runs with an offset and a drift the host must find
#   perfqctl record  drains the device, synchronizes its clock, writes the trace
#   perfq-demo-app   submits jobs to the device's job queue from two threads
#   perfqctl report  the analysis of the merged trace
#
# Every process it starts is stopped on exit, whatever happens.
set -euo pipefail

BUILD=${1:-build}
BIN=$BUILD/bin
OUT=$BUILD/demo
DURATION=${PERFQ_DEMO_SECONDS:-5}
mkdir -p "$OUT"
REGION=/dev/shm/perfq-demo-$$
TRACE=$OUT/demo.trace
pids=()

cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -f "$REGION"
}
trap cleanup EXIT INT TERM

step() { printf '\n== %s\n' "$*"; }

step "starting the software device (clock offset 1.5 s, drift +25 ppm)"
"$BIN/perfq-devsim" --region "$REGION" --create --workers 2 --rate 20000 --job-workers 2 \
  --clock-offset-ns 1500000000 --clock-drift-ppm 25 --device-name "perfq demo accelerator" \
  >"$OUT/devsim.json" 2>"$OUT/devsim.log" &
pids+=($!)

step "recording for $DURATION s into $TRACE"
"$BIN/perfqctl" record --device "shm:$REGION" -o "$TRACE" --duration "$DURATION" &
record=$!
pids+=($record)

sleep 0.5
step "running the demo application: jobs submitted from two host threads"
"$BIN/perfq-demo-app" --device "shm:$REGION" --jobs 2000 --threads 2 --job-us 100 --inflight 2

wait "$record"
kill "${pids[0]}" 2>/dev/null || true
wait "${pids[0]}" 2>/dev/null || true
step "device accounting (perfq-devsim)"
cat "$OUT/devsim.json"

step "analysis (perfqctl report $TRACE)"
"$BIN/perfqctl" report "$TRACE"

"$BIN/perfqctl" export "$TRACE" --format perfetto -o "$OUT/demo.perfetto-trace" >/dev/null
"$BIN/perfqctl" export "$TRACE" --format chrome-json -o "$OUT/demo.json" >/dev/null
step "open $OUT/demo.perfetto-trace in ui.perfetto.dev, or $OUT/demo.json in chrome://tracing"
