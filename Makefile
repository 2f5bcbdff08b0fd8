# perfq — one front door to the CMake build.
#   make          build everything into build/ (bin/ holds the programs)
#   make test     build, then run every test: the normal build, ASan+UBSan, TSan,
#                 the Debian packages (lintian) and the QEMU scenarios (perfq.ko
#                 in a Debian guest; the packages in one with systemd as PID 1)
#   make qemu-test  build, then run only the packages and the QEMU scenarios
#   make qemu-shell boot the QEMU guest interactively (driver and tools inside)
#   make demo     build and run the demonstration
#   make device-example ARCH=riscv64|aarch64|native  the example device on the
#                 SDK (build/device-example/ARCH/perfq-device-example)
#   make bench    build and run the benchmarks (figures in build/bench/results.json)
#   make soak     build, then one daemon for an hour at 1 M records/s with
#                 applications coming and going, status polled and a new
#                 recording every 5 min: nothing unaccounted, RSS and fds flat
#                 (SOAK_ARGS="--minutes 10" to shorten; scripts/soak.py --help)
#   make fuzz     build the libFuzzer harnesses (clang, build-fuzz/) and run each
#                 for 10 M inputs (FUZZ_RUNS=N to change; make test runs each 30 s)
#   make accuracy build, then record devsim --truth 50 times (three scenarios, half
#                 of them on loaded CPUs) and check every device time against
#                 the truth and its own claim (~12 min; build/accuracy.json)
#   make deps     install the Debian packages perfq needs (only what is missing)
#   make install  install into PREFIX (default /usr/local), under DESTDIR if set
#   make uninstall  remove what make install put there
#   make install-dkms  perfq.ko through DKMS for every installed kernel
#                   (make uninstall-dkms removes it)
#   make deb      build the Debian packages (libperfq0, libperfq-dev, perfq,
#                 perfq-dkms) into build/deb/, compiled in build/deb/obj with
#                 Debian's hardening flags, and check them (lintian, symbols)
#   make format   format the C++ with .clang-format (ctest's `format` checks it)
# Every target installs missing packages first, so a fresh Debian 12 machine
# needs nothing but this Makefile.

BUILD       ?= build
BUILD_ASAN  ?= build-asan
BUILD_TSAN  ?= build-tsan
BUILD_FUZZ  ?= build-fuzz
FUZZ_RUNS   ?= 10000000
GENERATOR   ?= Ninja
CMAKE_ARGS  ?=
JOBS        ?= $(shell nproc)
PREFIX      ?= /usr/local
DESTDIR     ?=

.PHONY: all build deps device-example asan tsan fuzz soak test qemu-test qemu-shell demo bench accuracy clean help install uninstall install-dkms uninstall-dkms deb format

all: build

help:
	@sed -n '2,/^$$/p' Makefile | sed -e '/^$$/d' -e 's/^# \{0,1\}//'

deps:
	@scripts/deps.sh

# Configure (cheap when nothing changed) and build one tree.
define cmake_build
	cmake -S . -B $(1) -G $(GENERATOR) $(2) $(CMAKE_ARGS) >/dev/null
	cmake --build $(1) -j $(JOBS)
endef

build: deps
	$(call cmake_build,$(BUILD),-DCMAKE_BUILD_TYPE=RelWithDebInfo)

asan: deps
	$(call cmake_build,$(BUILD_ASAN),-DCMAKE_BUILD_TYPE=Debug -DPERFQ_SANITIZE=address -DPERFQ_BUILD_BENCH=OFF)

tsan: deps
	$(call cmake_build,$(BUILD_TSAN),-DCMAKE_BUILD_TYPE=RelWithDebInfo -DPERFQ_SANITIZE=thread -DPERFQ_BUILD_BENCH=OFF)

QEMU_RESULTS = $(BUILD)/qemu/results.txt
DEB_RESULTS  = $(BUILD)/deb/results.txt
FUZZ_RESULTS = $(BUILD_FUZZ)/results.txt
# What the systemd scenario installs: the programs, the library they link
# and the driver (libperfq-dev is checked by lintian only).
DEBS         = $(BUILD)/deb/libperfq0_$(VERSION)_amd64.deb $(BUILD)/deb/perfq_$(VERSION)_amd64.deb \
               $(BUILD)/deb/perfq-dkms_$(VERSION)_all.deb
VERSION      = $(shell sed -n 's/^PACKAGE_VERSION="\(.*\)"/\1/p' driver/dkms.conf)
# The busybox-initramfs scenarios, then `systemd`: the packages installed in
# a Debian guest with systemd as PID 1; each on the newest installed 6.1 and
# 6.12 kernels.
QEMU_SCENARIOS = load badinput e2e unplug unplug-sync systemd
# The systemd rootfs of the 6.12 guest kernel (the 6.1 one is the default).
KVERS_612    = $(shell $(MAKE) -s -C driver kver KSERIES=6.12)

# The systemd scenario's Debian rootfs (debootstrap, cached) builds in the
# background while the trees compile; the scenario waits for it.  The fuzz
# tree builds and its fuzzers run beside the sanitizer trees' tests at the
# lowest priority (run-tests.sh --beside), in the CPU those tests leave idle
# (about half of it: their end-to-end tests run alone and mostly wait).
test: deps
	@mkdir -p $(BUILD)/qemu
	@echo "perfq: building the systemd guest's Debian rootfs in the background ($(BUILD)/qemu/rootfs.log)"
	@{ qemu/build-rootfs.sh; for k in $(KVERS_612); do PERFQ_ROOTFS_KVER=$$k qemu/build-rootfs.sh; done; } \
	  >$(BUILD)/qemu/rootfs.log 2>&1 </dev/null & \
	  $(MAKE) --no-print-directory build asan tsan; rc=$$?; \
	  if [ $$rc -ne 0 ]; then echo "perfq: waiting for the rootfs build to stop"; wait; fi; exit $$rc
	@rm -f $(QEMU_RESULTS) $(DEB_RESULTS) $(FUZZ_RESULTS)
	-@scripts/make-deb.sh --results $(DEB_RESULTS) $(BUILD)
	-@qemu/run-scenarios.py --build $(BUILD) --results $(QEMU_RESULTS) $(QEMU_SCENARIOS) --debs $(DEBS)
	@scripts/run-tests.sh --results $(DEB_RESULTS) --results $(QEMU_RESULTS) --results $(FUZZ_RESULTS) \
	  $(BUILD) --beside "scripts/fuzz.sh --build $(BUILD_FUZZ) --seconds 30 --results $(FUZZ_RESULTS)" \
	  $(BUILD_ASAN) $(BUILD_TSAN)

qemu-test: build
	@rm -f $(QEMU_RESULTS) $(DEB_RESULTS)
	-@scripts/make-deb.sh --results $(DEB_RESULTS) $(BUILD)
	@qemu/run-scenarios.py --build $(BUILD) --results $(QEMU_RESULTS) $(QEMU_SCENARIOS) --debs $(DEBS)

qemu-shell: build
	@qemu/run-scenarios.py --build $(BUILD) --shell

demo: build
	@scripts/demo.sh $(BUILD)

ARCH ?= native
device-example: deps
	@case "$(ARCH)" in native|riscv64|aarch64) ;; \
	  *) echo "make device-example: ARCH=$(ARCH) is not one of native, riscv64, aarch64" >&2; exit 2 ;; esac
	cmake -S . -B $(BUILD) -G $(GENERATOR) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_ARGS) >/dev/null
	cmake --build $(BUILD) --target device-example-$(ARCH)

bench: build
	@scripts/bench.py --build $(BUILD) --out $(BUILD)/bench/results.json

soak: build
	@scripts/soak.py --build $(BUILD) $(SOAK_ARGS)

fuzz: deps
	@scripts/fuzz.sh --build $(BUILD_FUZZ) --runs $(FUZZ_RUNS)

accuracy: build
	@scripts/accuracy.py --build $(BUILD) --out $(BUILD)/accuracy.json

# The build folder's install prefix follows PREFIX (nothing recompiles); the
# list of installed files (with DESTDIR) is kept for make uninstall.
install: build
	cmake -S . -B $(BUILD) -DCMAKE_INSTALL_PREFIX=$(PREFIX) >/dev/null
	DESTDIR="$(DESTDIR)" scripts/install.sh $(BUILD)

uninstall:
	@DESTDIR="$(DESTDIR)" scripts/uninstall.sh $(BUILD)

install-dkms:
	@scripts/install-dkms.sh

uninstall-dkms:
	@scripts/install-dkms.sh --remove

# The packages compile their own tree (build/deb/obj): no `build` needed.
deb: deps
	@scripts/make-deb.sh $(BUILD)

format: deps
	@scripts/format.sh

clean:
	rm -rf $(BUILD) $(BUILD_ASAN) $(BUILD_TSAN) $(BUILD_FUZZ)
