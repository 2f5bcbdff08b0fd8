#!/usr/bin/env bash
# tests/install/check-troubleshooting.sh BUILD_DIR: docs/troubleshooting.md
# shows the messages perfq prints, verbatim.  Runs what a user runs with the
# programs of BUILD_DIR/bin (perfqctl without a daemon, a daemon and
# perfq-devsim on a temporary socket and region, a device that is not
# there, a user outside the perfq group, kernel events without the
# privilege, a device that loses records, a daemon killed with kill -9) and
# checks that each message printed is a line of the page.  Numbers are
# compared as N (the page's are an example's), the temporary paths as the
# page's (/run/perfq/perfqd.sock, /dev/shm/perfq0, run.trace).  Messages no
# short run can provoke (sync that does not converge) are checked both ways
# by their fixed text: in the source and in the page.
# One line per check; exits 1 if any failed.
set -uo pipefail
build=$(realpath "${1:?usage: check-troubleshooting.sh BUILD_DIR}")
src=$(cd "$(dirname "$0")/../.." && pwd)
doc=$src/docs/troubleshooting.md
bin=$build/bin
failed=0
pass() { echo "ok   $*"; }
fail() { echo "FAIL $*"; failed=1; }
skip() { echo "skip $*"; }

tmp=$(mktemp -d /tmp/perfq-troubleshoot.XXXXXX)
chmod 755 "$tmp"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

# The form lines are compared in: numbers as N, the chunk kind and the
# errno text in parentheses (the kernel decides which) as words.
norm() {
  sed -E 's/[0-9]+/N/g; s/chunk N \([a-z ]+\)/chunk N (KIND)/g
          s/\((Operation not permitted|Permission denied|Invalid argument|No such file or directory|No such process|Operation not supported|Function not implemented|Bad address|Argument list too long)\)/(ERRNO)/g'
}
norm "$doc" >"$tmp/doc.txt" <"$doc"
# in_doc WHAT LINE: LINE (normalized) is part of a line of the page.
in_doc() {
  local what=$1 line=$2 n
  n=$(norm <<<"$line")
  if [[ -z $line ]]; then
    fail "$what: the program printed nothing"
  elif grep -qF -- "$n" "$tmp/doc.txt"; then
    pass "$what: '$line' is in docs/troubleshooting.md"
  else
    fail "$what: docs/troubleshooting.md lacks the message: $line"
  fi
}
# The temporary paths as the page writes them.
pagepaths() {
  sed -e "s|$tmp/perfqd.sock|/run/perfq/perfqd.sock|g" -e "s|$tmp/[a-z0-9]*region|/dev/shm/perfq0|g" \
      -e "s|$tmp/[a-z]*/*[a-z0-9]*\.trace|run.trace|g"
}

# --- No daemon: perfqctl on a socket nobody listens on.
out=$(PERFQ_SOCKET=$tmp/perfqd.sock "$bin/perfqctl" status 2>&1 >/dev/null)
rc=$?
[ $rc -eq 1 ] || fail "no daemon: perfqctl status exits 1, not $rc"
in_doc "no daemon" "$(pagepaths <<<"$out")"

# --- A daemon and a software device, on a socket and region of our own.
"$bin/perfq-devsim" --region "$tmp/region" --create --rate 2000 --duration 60 \
  >"$tmp/devsim.json" 2>"$tmp/devsim.err" &
pids+=($!)
"$bin/perfq-daemon" --config /dev/null --socket "$tmp/d.sock" --group perfq --log-target stderr \
  >"$tmp/daemon.log" 2>&1 &
daemon=$!
pids+=($daemon)
for _ in $(seq 100); do
  [ -S "$tmp/d.sock" ] && [ -s "$tmp/region" ] && break
  sleep 0.1
done
if [ ! -S "$tmp/d.sock" ]; then
  fail "perfq-daemon did not listen on $tmp/d.sock"
  sed 's/^/     | /' "$tmp/daemon.log"
  exit 1
fi
ctl() { "$bin/perfqctl" --socket "$tmp/d.sock" "$@"; }

# --- The device is not there.
out=$(ctl start -o "$tmp/nodev.trace" --device /dev/perfq97 2>&1 >/dev/null)
in_doc "device not there" "$(pagepaths <<<"$out" | sed 's|/dev/perfq97|/dev/perfq0|g')"
if ! ls /dev/perfq[0-9]* >/dev/null 2>&1; then
  out=$(ctl devices 2>/dev/null | grep 'bound to perfq')
  in_doc "perfqctl devices without perfq.ko" "$out"
else
  skip "perfqctl devices without perfq.ko: this machine has /dev/perfqN"
fi

# --- A software device whose perfq-devsim has exited.
"$bin/perfq-devsim" --region "$tmp/oldregion" --create --duration 0.2 >/dev/null 2>&1
out=$(ctl start -o "$tmp/old.trace" --device "shm:$tmp/oldregion" 2>&1 >/dev/null)
in_doc "stopped software device" "$(pagepaths <<<"$out")"

# --- Permission denied: a user outside the group (needs root to be one).
if [ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null; then
  out=$(setpriv --reuid=65534 --regid=65534 --clear-groups \
          "$bin/perfqctl" --socket "$tmp/d.sock" start -o /tmp/perfq-refused.trace 2>&1 >/dev/null)
  in_doc "permission denied" "${out%% (you are *}"
  grep -q 'refused start from .*: not root nor in group perfq' "$tmp/daemon.log" &&
    grep -qF 'refused start from uid 1000 (...): not root' "$doc" ||
    fail "permission denied: the daemon's log line is not the page's"
else
  skip "permission denied: needs root (a user outside the perfq group is made with setpriv)"
fi

# --- Kernel events without the privilege: a daemon without CAP_BPF.
kdir=$tmp/k
mkdir -m 777 "$kdir"
if [ "$(id -u)" -eq 0 ]; then
  as_user=(setpriv --reuid=65534 --regid=65534 --clear-groups)
else
  as_user=()
fi
"${as_user[@]}" "$bin/perfq-daemon" --config /dev/null --socket "$kdir/d.sock" --log-target stderr \
  >"$tmp/kdaemon.log" 2>&1 &
kdaemon=$!
pids+=($kdaemon)
for _ in $(seq 100); do [ -S "$kdir/d.sock" ] && break; sleep 0.1; done
out=$("$bin/perfqctl" --socket "$kdir/d.sock" start -o "$kdir/k.trace" --kernel-events sched \
        --duration 0.3 2>&1 >/dev/null | grep 'warning: kernel events')
in_doc "kernel events unavailable" "$out"
kill "$kdaemon" 2>/dev/null

# --- Losses: a device with tiny queues at 2 M events/s.
"$bin/perfq-devsim" --region "$tmp/lossregion" --create --ring-records 64 --queue-records 64 \
  --rate 2000000 --duration 20 >/dev/null 2>&1 &
lossy=$!
pids+=($lossy)
for _ in $(seq 50); do [ -s "$tmp/lossregion" ] && break; sleep 0.1; done
sleep 0.3
ctl start -o "$tmp/loss.trace" --device "shm:$tmp/lossregion" --duration 1 >"$tmp/loss.txt" 2>&1
kill "$lossy" 2>/dev/null
out=$(grep -E '^  device .*: [0-9]+ records, [0-9]+ lost' "$tmp/loss.txt" | sed -E 's/( lost),.*/\1/')
in_doc "losses: the stop summary" "$(pagepaths <<<"$out")"
"$bin/perfqctl" report "$tmp/loss.trace" >"$tmp/loss-report.txt" 2>&1
out=$(grep -E '^lost ' "$tmp/loss-report.txt")
in_doc "losses: the report's totals" "$out"
out=$(grep -E '^  .* stream [0-9]+ +lost [0-9]+ \(reported' "$tmp/loss-report.txt" | head -n 1)
in_doc "losses: the report's stream line" "$out"

# --- A torn trace: the daemon killed with kill -9 while recording, and a
# complete trace cut in the middle.
ctl start -o "$tmp/full.trace" --device "shm:$tmp/region" --duration 1 >/dev/null 2>&1
ctl start -o "$tmp/killed.trace" --device "shm:$tmp/region" >/dev/null 2>&1
sleep 1.5
kill -9 "$daemon"
wait "$daemon" 2>/dev/null
"$bin/perfqctl" report "$tmp/killed.trace" >"$tmp/killed.txt" 2>&1
rc=$?
out=$(grep -E '^(perfqctl: report: trace damaged|WARNING: trace ends early|note: no end chunk)' \
        "$tmp/killed.txt")
if [ -z "$out" ]; then
  fail "kill -9: perfqctl report said nothing of the missing end: $(head -c 300 "$tmp/killed.txt")"
fi
while IFS= read -r l; do
  [ -n "$l" ] && in_doc "kill -9 (report exit $rc)" "$(pagepaths <<<"$l")"
done <<<"$out"
size=$(stat -c %s "$tmp/full.trace")
head -c $((size / 2)) "$tmp/full.trace" >"$tmp/cut.trace"
"$bin/perfqctl" report "$tmp/cut.trace" >"$tmp/cut.txt" 2>"$tmp/cut.err"
rc=$?
[ $rc -eq 1 ] || fail "a cut trace: perfqctl report exits 1 (damaged), not $rc"
in_doc "a cut trace: standard error" "$(pagepaths <"$tmp/cut.err")"
in_doc "a cut trace: the report's warning" "$(grep '^WARNING: trace ends early' "$tmp/cut.txt" | pagepaths)"

# --- Sync that does not converge: the fixed text of each message, in the
# source and in the page ({} is a number).
fixed() {  # fixed FILE TEXT
  local file=$1 text=$2
  if ! grep -qF -- "$text" "$src/$file"; then
    fail "sync: '$text' is no longer in $file (update docs/troubleshooting.md and this test)"
  elif ! grep -qF -- "$(sed 's/{}/N/g' <<<"$text" | norm)" "$tmp/doc.txt"; then
    fail "sync: docs/troubleshooting.md lacks '$text' ($file)"
  else
    pass "sync: '$text' ($file) is in docs/troubleshooting.md"
  fi
}
fixed tools/perfqctl/control_cmd.cpp '    sync: not synchronized yet'
fixed daemon/sync_thread.cpp ': sync round failed ({} so far): '
fixed daemon/drain_thread.cpp ' device records could not be converted (no clock model for their time: '
fixed daemon/drain_thread.cpp 'too few sync rounds'
fixed daemon/drain_thread.cpp '); they are not in the trace'
fixed tools/perfqctl/control_cmd.cpp '    error: '
fixed libperfq/src/analysis/report_text.cpp 'not synchronized (no clock model)  samples {}'
fixed libperfq/src/analysis/report_text.cpp 'UNSYNCHRONIZED: {} records have no bound (no sync round vouched for '

if ((failed)); then
  echo "check-troubleshooting: FAILED"
  exit 1
fi
echo "check-troubleshooting: all passed"
