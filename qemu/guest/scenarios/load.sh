# load/unload: insmod, /dev/perfq0 and sysfs appear, the ioctls answer;
# rmmod is refused while the device is held open; rmmod and a second
# insmod/rmmod cycle work once it is closed.
S=/sys/class/perfq/perfq0
insmod_perfq
check "/dev/perfq0 appears" wait_for 5 test -c /dev/perfq0
for a in abi_version ring_capacity region_size records_seen device_name link_speed link_width memory; do
  if [ -r "$S/$a" ]; then ok "sysfs $a = $(cat "$S/$a")"; else fail "sysfs $a missing"; fi
done
check "sysfs abi_version is 1" test "$(cat $S/abi_version)" = 1
check "sysfs device_name is the devsim's" test "$(cat $S/device_name)" = perfq-qemu
# devsim does not declare its region system memory: the safe default, every
# page uncached (dmesg says so too).
check "sysfs memory: device memory by the header" test "$(cat $S/memory)" = "device (region header)"
check "PERFQ_IOC_INFO answers" perfq-guest info /dev/perfq0
perfq-guest info /dev/perfq0 | sed 's/^/info: /'
check "PERFQ_IOC_CLOCK_SAMPLES: 16 rounds of 64 samples" perfq-guest clock /dev/perfq0 64 1 16
perfq-guest clock /dev/perfq0 64 100 16 | sed 's/^/measure: /'

perfq-guest hold /dev/perfq0 60 >/tmp/hold.log 2>&1 &
holder=$!
check "a process holds /dev/perfq0 mapped" wait_for 5 grep -q 'hold: mapped' /tmp/hold.log
if rmmod perfq 2>/tmp/rmmod.err; then
  fail "rmmod succeeded while /dev/perfq0 was open and mapped"
else
  ok "rmmod refused while held: $(cat /tmp/rmmod.err)"
fi
check "the module is still loaded" grep -q '^perfq ' /proc/modules
check "the holder still reads the region" grep -q 'hold: mapped' /tmp/hold.log
kill "$holder"; wait "$holder" 2>/dev/null
check "rmmod once closed" rmmod perfq
check "/dev/perfq0 is gone" wait_for 5 test ! -e /dev/perfq0
check "the class is gone" test ! -e /sys/class/perfq
for i in 1 2 3; do
  insmod /lib/modules/perfq.ko && wait_for 5 test -c /dev/perfq0 && perfq-guest info /dev/perfq0 >/dev/null &&
    rmmod perfq || { fail "insmod/rmmod cycle $i"; break; }
done
ok "3 more insmod/use/rmmod cycles"
# The write-back path: the region declared system memory by the module
# parameter (ivshmem's BAR is host RAM); the timer page stays uncached.
insmod_perfq system_memory=1
check "/dev/perfq0 appears (system_memory=1)" wait_for 5 test -c /dev/perfq0
check "sysfs memory: system memory by the module parameter" test "$(cat $S/memory)" = "system (module parameter)"
check "PERFQ_IOC_CLOCK_SAMPLES on the write-back mapping: 4 rounds of 64" perfq-guest clock /dev/perfq0 64 300 4
perfq-guest hold /dev/perfq0 60 >/tmp/hold.log 2>&1 &
holder=$!
check "the write-back mapping reads the region" wait_for 5 grep -q 'hold: mapped' /tmp/hold.log
kill "$holder"; wait "$holder" 2>/dev/null
check "rmmod (system_memory=1)" rmmod perfq
