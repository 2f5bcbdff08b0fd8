# Helpers for the guest scenarios (busybox sh).  Every check prints one
# "ok: ..." or "FAIL: ..." line; finish() checks dmesg and prints the result.
fails=0
ok() { echo "ok: $*"; }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
# check DESC CMD...: run CMD, ok when it exits 0
check() { d=$1; shift; if "$@"; then ok "$d"; else fail "$d"; fi; }
# wait_for SECS CMD...: poll CMD every 50 ms until it succeeds
wait_for() {
  n=$(($1 * 20)); shift
  while [ "$n" -gt 0 ]; do "$@" && return 0; usleep 50000; n=$((n - 1)); done
  return 1
}
# Ask the host runner for something and wait for nothing: the guest
# observes the effect itself (device state, removal).
host() { echo "PERFQ-HOST $*"; }
dmesg_clean() {
  if dmesg | grep -E 'BUG|Oops|WARNING|refcount|Call Trace|general protection|lockdep|possible circular locking|blocked for more than' >/tmp/dmesg-bad; then
    fail "dmesg has kernel errors:"; sed 's/^/  dmesg: /' /tmp/dmesg-bad; return 1
  fi
  ok "dmesg has no BUG/Oops/WARNING/refcount/lockdep splat"
}
insmod_perfq() {
  insmod /lib/modules/perfq.ko "$@" || { fail "insmod perfq.ko"; return 1; }
  ok "insmod perfq.ko"
}
# Send a file to the host over the second serial port (ttyS1), base64.
send_file() {
  stty -F /dev/ttyS1 raw -echo 2>/dev/null
  { echo "PERFQ-FILE-BEGIN $2"; base64 "$1"; echo "PERFQ-FILE-END $2"; } >/dev/ttyS1
}
finish() {
  dmesg_clean
  dmesg | grep -E 'perfq' | sed 's/^/dmesg: /'
  if [ "$fails" -eq 0 ]; then echo "PERFQ-RESULT $scenario PASS"; return 0; fi
  echo "PERFQ-RESULT $scenario FAIL $fails check(s) failed"; return 1
}
