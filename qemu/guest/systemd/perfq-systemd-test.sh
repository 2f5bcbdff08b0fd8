#!/bin/bash
# perfq `systemd` scenario, in a Debian 12 guest booted from a disk image
# with systemd as PID 1 (qemu/run-scenarios.py systemd [--debs FILE...]).
# Started by perfq-systemd-test.service once multi-user.target is reached.
#
# Protocol with the host runner (as in qemu/guest/scenarios/lib.sh): one
# "ok: ..." or "FAIL: ..." line per check on the console (ttyS0), requests
# as "PERFQ-HOST ...", files back over ttyS1 (send_file), and last
# "PERFQ-RESULT systemd PASS|FAIL ...", then isa-debug-exit carries the
# result out as QEMU's exit status (33 pass, 35 fail).
#
# The steps are in three parts: 1. the system, 2. the perfq packages (only
# when perfq is installed), 3. the result.  Add package checks to part 2.
scenario=systemd
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export SYSTEMD_PAGER= SYSTEMD_COLORS=0

# ---- helpers
fails=0
ok() { echo "ok: $*"; }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
info() { echo "info: $*"; }
# check DESC CMD...: run CMD, ok when it exits 0
check() { local d=$1; shift; if "$@"; then ok "$d"; else fail "$d"; fi; }
# show LABEL CMD...: run CMD, its output on the console as "info: LABEL| ..."
show() { local l=$1; shift; "$@" 2>&1 | sed "s/^/info: $l| /"; }
# Ask the host runner for something (stop-devsim, unplug).
host() { echo "PERFQ-HOST $*"; }
# send_file PATH NAME: the file to the host over ttyS1, base64.
send_file() {
  stty -F /dev/ttyS1 raw -echo 2>/dev/null
  { echo "PERFQ-FILE-BEGIN $2"; base64 "$1"; echo "PERFQ-FILE-END $2"; } >/dev/ttyS1
}
# QEMU exits with (CODE << 1) | 1 through isa-debug-exit at port 0xf4.
debug_exit() {
  printf "\\$(printf '%03o' "$1")" | dd of=/dev/port bs=1 seek=244 count=1 status=none
}

echo "PERFQ-BOOTED $scenario (uptime $(cut -d' ' -f1 /proc/uptime) s)"

# ---- 1. the system: systemd is PID 1 and the boot finished
pid1=$(cat /proc/1/comm)
info "PID 1 is $pid1 ($(ps -p 1 -o comm= 2>&1))"
check "systemd is PID 1" [ "$pid1" = systemd ]
state=$(systemctl is-system-running --wait 2>&1)
info "systemctl is-system-running --wait: $state"
case $state in
  running) ok "the boot finished: $state" ;;
  *) fail "the boot finished: $state"; show failed systemctl --failed --no-legend ;;
esac
show boot systemd-analyze time
info "kernel $(uname -r), $(nproc) CPUs"
info "perfq packages: $(dpkg-query -W -f='${Package} ${Version}; ' 'perfq*' 2>/dev/null || echo none)"

# ---- 2. the perfq packages, when installed
if command -v perfqctl >/dev/null; then
  if command -v dkms >/dev/null; then show dkms sh -c 'dkms status 2>/dev/null'; fi
  check "systemctl start perfq-daemon" systemctl start perfq-daemon
  active=$(systemctl is-active perfq-daemon)
  check "perfq-daemon is active ($active)" [ "$active" = active ]
  show lsmod sh -c 'lsmod | grep perfq'
  check "perfq.ko is loaded" sh -c 'lsmod | grep -q "^perfq "'
  show dev ls -l /dev/perfq*
  check "/dev/perfq0 exists" [ -c /dev/perfq0 ]
  show journal sh -c 'journalctl -u perfq-daemon --no-pager | tail'
  # More package checks go here (perfqctl start/stop, perfq-demo-app, a
  # trace sent back with send_file, host stop-devsim ...).
else
  info "perfq is not installed (no perfqctl): only the system was checked"
fi

# ---- 3. the result
journalctl -b --no-pager >/tmp/journal.txt 2>&1 && send_file /tmp/journal.txt journal.txt
if dmesg | grep -E 'BUG|Oops|WARNING|refcount|Call Trace|general protection' >/tmp/dmesg-bad; then
  fail "dmesg has kernel errors:"; sed 's/^/  dmesg: /' /tmp/dmesg-bad
else
  ok "dmesg has no BUG/Oops/WARNING/refcount"
fi
dmesg | grep -E 'perfq' | sed 's/^/dmesg: /'
if [ "$fails" -eq 0 ]; then
  echo "PERFQ-RESULT $scenario PASS"
  debug_exit 16
else
  echo "PERFQ-RESULT $scenario FAIL $fails check(s) failed"
  debug_exit 17
fi
# Without isa-debug-exit: the unit's SuccessAction/FailureAction powers off.
exit 1
