# bad input: a device whose region has a bad magic is refused at probe with
# a clear dmesg line; bad ioctls and mmaps fail cleanly; a fuzz loop.
insmod_perfq
check "/dev/perfq0 appears for the good device" wait_for 5 test -c /dev/perfq0
check "no second device node for the bad one" test ! -e /dev/perfq1
if dmesg | grep -q 'perfq.*magic .* is not .*device refused'; then
  ok "bad magic refused: $(dmesg | grep 'perfq.*magic' | head -n 1 | sed 's/^\[[^]]*\] //')"
else
  fail "no dmesg line refusing the bad-magic device"
fi
perfq-guest badinput /dev/perfq0 >/tmp/bad.log 2>&1; rc=$?
cat /tmp/bad.log
grep -q '^FAIL' /tmp/bad.log && fails=$((fails + 1))
check "every bad ioctl and mmap failed cleanly" test "$rc" -eq 0
perfq-guest fuzz /dev/perfq0 4000 ${PERFQ_SEED:-12345} >/tmp/fuzz.log 2>&1; rc=$?
cat /tmp/fuzz.log
check "fuzz: 4000 random ioctls and mmaps, every one answered cleanly" test "$rc" -eq 0
check "the device still answers after the fuzz" perfq-guest clock /dev/perfq0 8 1
check "rmmod after the fuzz" rmmod perfq
