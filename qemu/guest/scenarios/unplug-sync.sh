# hot-unplug while a sync round waits: the device stops answering (the host
# stops perfq-devsim), a process sits in PERFQ_IOC_CLOCK_SAMPLES waiting for
# it, and the host removes the device (QMP device_del).  The driver's remove
# must not wait behind the sleeping ioctl (<= 100 ms), the ioctl gets
# ENODEV, the mapping SIGBUS, and the kernel logs nothing bad.
insmod_perfq
check "/dev/perfq0 appears" wait_for 5 test -c /dev/perfq0
perfq-guest hold /dev/perfq0 120 >/tmp/hold.log 2>&1 &
holder=$!
check "a process holds the region mapped" wait_for 5 grep -q 'hold: mapped' /tmp/hold.log
host stop-devsim
# devsim answers the timer for up to 2 s after it stops: wait until a round
# times out (the device is silent).
silent() { ! perfq-guest clock /dev/perfq0 4 500 1 >/dev/null 2>&1; }
check "the device is silent (a clock round times out)" wait_for 30 silent
perfq-guest sync-until-gone /dev/perfq0 120 >/tmp/sync.log 2>&1 &
syncer=$!
check "a clock-samples ioctl waits for the silent device" wait_for 5 grep -q 'sync: waiting' /tmp/sync.log
# Let it settle into a round, then ask for the unplug.
usleep 300000
host unplug
check "the driver's remove ran" wait_for 60 sh -c "dmesg | grep -q 'perfq0 removed'"
wait "$syncer"; rc=$?
sed 's/^/sync: /' /tmp/sync.log
check "the waiting ioctl ended with ENODEV" test "$rc" -eq 0
us=$(dmesg | sed -n 's/.*perfq0 removed in \([0-9]*\) us.*/\1/p' | tail -n 1)
echo "measure: remove took ${us:-?} us with a clock-samples ioctl waiting"
check "remove took <= 100 ms (${us:-?} us)" test -n "$us" -a "${us:-0}" -le 100000
check "/dev/perfq0 is gone" wait_for 5 test ! -e /dev/perfq0
wait "$holder"; rc=$?
sed 's/^/hold: /' /tmp/hold.log
check "the mapping holder got SIGBUS and ENODEV" test "$rc" -eq 0
check "rmmod after the unplug" rmmod perfq
