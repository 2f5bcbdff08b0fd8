#!/usr/bin/env bash
# make demo: the software device, the daemon, a recording, a workload, and
# the analysis.  No root needed: the socket lives under the build folder.
#
#   perfq-devsim     the device: synthetic workers, job workers, collector,
#                    timer register, on a region under /dev/shm; its clock
#                    runs with an offset and a drift the host must find
#   perfq-daemon     drains the device and the instrumented applications,
#                    synchronizes the clocks, writes the merged trace
#   perfqctl start   starts a recording (with the host kernel's events of the
#                    app, when run as root); perfqctl stop ends it
#   perfq-demo-app   submits jobs to the device's job queue from two threads,
#                    recording job_submit / job_complete through libperfq, and
#                    an h2d_copy range of each job's 64 KiB payload (a byte count)
#   perfqctl report  the analysis of the merged trace
#
# Every process it starts is stopped on exit, whatever happens.
set -euo pipefail

BUILD=${1:-build}
BIN=$BUILD/bin
OUT=$BUILD/demo
DURATION=${PERFQ_DEMO_SECONDS:-4}
mkdir -p "$OUT"
REGION=/dev/shm/perfq-demo-$$
SOCKET=$OUT/perfqd.sock
TRACE=$OUT/demo.trace
pids=()

cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -f "$REGION" "$SOCKET"
}
trap cleanup EXIT INT TERM

step() { printf '\n== %s\n' "$*"; }

step "starting the software device (its clock 1.5 s ahead of the host, running 25 ppm fast)"
"$BIN/perfq-devsim" --region "$REGION" --create --workers 2 --rate 20000 --job-workers 2 \
  --clock-offset-ns 1500000000 --clock-drift-ppm 25 --device-name "perfq demo accelerator" --wait-host \
  >"$OUT/devsim.json" 2>"$OUT/devsim.log" &
devsim=$!
pids+=($devsim)

step "starting perfq-daemon (socket $SOCKET, log $OUT/daemon.log)"
"$BIN/perfq-daemon" --socket "$SOCKET" --config /dev/null --device "shm:$REGION" \
  2>"$OUT/daemon.log" &
pids+=($!)
for _ in $(seq 100); do
  [ -S "$SOCKET" ] && break
  sleep 0.05
done
"$BIN/perfqctl" --socket "$SOCKET" devices

# Host kernel events too (BPF: needs root; otherwise perfqctl says so and
# the recording goes on without them): the app's threads' switches and
# syscalls, and a uprobe on the function it submits jobs through.
# --force: the trace of an earlier run of the demo is replaced.
step "perfqctl start -o $TRACE --force --kernel-events sched,syscalls --uprobe perfq-demo-app:perfq_demo_submit"
"$BIN/perfqctl" --socket "$SOCKET" start -o "$TRACE" --force --kernel-events sched,syscalls \
  --uprobe "$BIN/perfq-demo-app:perfq_demo_submit"

step "running the demo application: jobs from two host threads (a few seconds)"
"$BIN/perfq-demo-app" --device "shm:$REGION" --socket "$SOCKET" --jobs $((DURATION * 4000)) \
  --threads 2 --job-us 100 --inflight 2 --copy-bytes 65536

step "perfqctl status"
"$BIN/perfqctl" --socket "$SOCKET" status

# Stop the device first: the daemon then reads everything it published, so
# its accounting and the trace's agree record for record.
kill "$devsim" 2>/dev/null || true
wait "$devsim" 2>/dev/null || true
step "perfqctl stop"
"$BIN/perfqctl" --socket "$SOCKET" stop
step "device accounting (perfq-devsim)"
cat "$OUT/devsim.json"

step "analysis (perfqctl report $TRACE)"
"$BIN/perfqctl" report "$TRACE"

# Compressed, as a long recording would be exported (perfqctl(1), --compress).
"$BIN/perfqctl" export "$TRACE" --format perfetto --compress -o "$OUT/demo.perfetto-trace" >/dev/null
"$BIN/perfqctl" export "$TRACE" --format chrome-json -o "$OUT/demo.json" >/dev/null
step "perfqctl report $TRACE --html $OUT/report.html"
"$BIN/perfqctl" report "$TRACE" --html "$OUT/report.html"
echo "$OUT/report.html"
step "open $OUT/report.html in a browser, $OUT/demo.perfetto-trace in ui.perfetto.dev, or $OUT/demo.json in chrome://tracing"
