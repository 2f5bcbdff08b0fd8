# end to end: perfq-daemon records /dev/perfq0 while perfq-demo-app submits
# jobs through the region's job queue; the host side (perfq-devsim) stops
# when asked, the trace is finished and sent to the host, which checks it.
SOCK=/run/perfqd.sock
# perfq-demo-app (libperfq) finds the daemon here and sends its host records.
export PERFQ_SOCKET=$SOCK
insmod_perfq
check "/dev/perfq0 appears" wait_for 5 test -c /dev/perfq0
if [ -x /bin/perfq-daemon ]; then
  mode=daemon
  perfq-daemon --device /dev/perfq0 --socket $SOCK --log-level info >/tmp/daemon.log 2>&1 &
  daemon=$!
  check "perfq-daemon listens" wait_for 10 test -S $SOCK
  # PCI facts: /dev/perfq0 is QEMU's ivshmem (1af4:1110) behind the root
  # port, bus 1.  The host checks the JSON field by field (devices*.json).
  perfqctl --socket $SOCK devices --json >/tmp/devices.json 2>/tmp/devices.err
  check "perfqctl devices --json" test -s /tmp/devices.json
  perfqctl --socket $SOCK devices --all --json >/tmp/devices-all.json 2>>/tmp/devices.err
  check "perfqctl devices --all --json" test -s /tmp/devices-all.json
  perfqctl --socket $SOCK devices --all 2>&1 | sed 's/^/devices: /'
  sed 's/^/devices: /' /tmp/devices.err
  for f in '"address":"0000:01:00.0"' '"vendor_id":"1af4"' '"device_id":"1110"' \
           '"driver":"perfq"' '"device_name":"Inter-VM shared memory"' '"vendor_name":"Red Hat, Inc."'; do
    check "perfqctl devices lists the ivshmem device bound to perfq: $f" grep -qF "$f" /tmp/devices.json
  done
  send_file /tmp/devices.json devices.json
  send_file /tmp/devices-all.json devices-all.json
  # Kernel events too: the guest's Debian kernel has BTF, the BPF program
  # was built against the build machine's (CO-RE relocates it).
  check "perfqctl start" perfqctl --socket $SOCK start -o /tmp/t.trace --kernel-events sched,syscalls \
    --uprobe /bin/perfq-demo-app:perfq_demo_submit 2>/tmp/start.err
  sed 's/^/start: /' /tmp/start.err
  check "kernel events load in the guest kernel" test ! -s /tmp/start.err
else
  mode=record
  fail "no perfq-daemon in the guest (it is part of every build): recording with 'perfqctl record' to see the rest"
  perfqctl record --device /dev/perfq0 -o /tmp/t.trace >/tmp/record.log 2>&1 &
  recorder=$!
  usleep 300000
fi
# The sync rounds the daemon has made so far (0 without the daemon).
sync_rounds() {
  r=$(perfqctl --socket $SOCK status --json 2>/dev/null | sed -n 's/.*"rounds":\([0-9]*\).*/\1/p' | head -n 1)
  echo "${r:-0}"
}
rounds_at_least() { [ "$(sync_rounds)" -ge "$1" ]; }
# Causality of every job needs a clock model that covers the jobs: sync
# rounds before the first job and after the last, not an extrapolation.
if [ "$mode" = daemon ]; then
  check "the daemon made 5 sync rounds before the jobs" wait_for 30 rounds_at_least 5
fi
perfq-demo-app --device /dev/perfq0 --jobs ${PERFQ_JOBS:-2000} --threads 2 >/tmp/demo.json 2>/tmp/demo.err; rc=$?
echo "demo-app: $(cat /tmp/demo.json) $(cat /tmp/demo.err)"
check "perfq-demo-app ran its jobs through /dev/perfq0" test "$rc" -eq 0
if [ "$mode" = daemon ]; then
  after=$(( $(sync_rounds) + 5 ))
  check "the daemon made 5 more sync rounds after the jobs" wait_for 30 rounds_at_least $after
fi
if [ "$mode" = daemon ]; then
  check "perfq-demo-app sent its host records to the daemon" grep -q '"connected":true' /tmp/demo.json
fi
host stop-devsim
check "the device reports it stopped (its tail is final)" perfq-guest wait-state /dev/perfq0 2 30
if [ "$mode" = daemon ]; then
  check "perfqctl stop" perfqctl --socket $SOCK stop
  perfqctl --socket $SOCK status --json 2>&1 | sed 's/^/status: /'
  kill "$daemon"; wait "$daemon"; echo "daemon exit: $?"
  sed 's/^/daemon: /' /tmp/daemon.log | tail -n 30
else
  wait "$recorder"; rc=$?
  sed 's/^/record: /' /tmp/record.log | tail -n 20
  check "perfqctl record finished when the device stopped" test "$rc" -eq 0
fi
check "the trace exists" test -s /tmp/t.trace
ls -l /tmp/t.trace
send_file /tmp/t.trace t.trace
send_file /tmp/demo.json demo.json
check "rmmod" rmmod perfq
