# hot-unplug: the host removes the device (QMP device_del) while the daemon
# has the region mapped; the daemon sees the device gone and finishes the
# trace, the driver's remove runs and revokes the mappings (SIGBUS).
SOCK=/run/perfqd.sock
# perfq-demo-app (libperfq) finds the daemon here and sends its host records.
export PERFQ_SOCKET=$SOCK
insmod_perfq
check "/dev/perfq0 appears" wait_for 5 test -c /dev/perfq0
perfq-guest hold /dev/perfq0 60 >/tmp/hold.log 2>&1 &
holder=$!
check "a second process holds the region mapped" wait_for 5 grep -q 'hold: mapped' /tmp/hold.log
if [ -x /bin/perfq-daemon ]; then
  mode=daemon
  perfq-daemon --device /dev/perfq0 --socket $SOCK --log-level info >/tmp/daemon.log 2>&1 &
  daemon=$!
  check "perfq-daemon listens" wait_for 10 test -S $SOCK
  check "perfqctl start" perfqctl --socket $SOCK start -o /tmp/t.trace
else
  mode=record
  fail "no perfq-daemon in the guest (it is part of every build): recording with 'perfqctl record' to see the rest"
  perfqctl record --device /dev/perfq0 -o /tmp/t.trace >/tmp/daemon.log 2>&1 &
  daemon=$!
fi
perfq-demo-app --device /dev/perfq0 --jobs 300 --threads 2 >/tmp/demo.json 2>&1
check "jobs ran before the unplug" grep -q '"completed":300' /tmp/demo.json
host unplug
check "the driver's remove ran" wait_for 30 sh -c "dmesg | grep -q 'perfq0 removed'"
check "/dev/perfq0 is gone" wait_for 5 test ! -e /dev/perfq0
wait "$holder"; rc=$?
sed 's/^/hold: /' /tmp/hold.log
check "the mapping holder got SIGBUS and ENODEV" test "$rc" -eq 0
if [ "$mode" = daemon ]; then
  check "the daemon reports the device gone" wait_for 20 grep -qi 'gone' /tmp/daemon.log
  check "perfqctl stop finishes the trace" perfqctl --socket $SOCK stop
  kill "$daemon"; wait "$daemon"; rc=$?
  check "the daemon exits cleanly" test "$rc" -eq 0
else
  # perfqctl record does not watch gone() (the daemon does): its exit status
  # after the unplug is reported, not judged; the trace part needs the daemon.
  kill -INT "$daemon"; wait "$daemon"; rc=$?
  echo "note: without perfq-daemon only the driver side of the unplug is checked (perfqctl record exit $rc)"
fi
sed 's/^/daemon: /' /tmp/daemon.log | tail -n 30
if [ "$mode" = daemon ]; then
  check "the trace exists" test -s /tmp/t.trace
  send_file /tmp/t.trace t.trace
fi
check "rmmod after the unplug" rmmod perfq
