# perfq — one front door to the CMake build.
#   make          build everything into build/ (bin/ holds the programs)
#   make test     build, then run every test: the normal build, ASan+UBSan, TSan
#                 and the QEMU scenarios (perfq.ko in a Debian guest)
#   make qemu-test  build, then run only the QEMU scenarios
#   make qemu-shell boot the QEMU guest interactively (driver and tools inside)
#   make demo     build and run the demonstration
#   make bench    build and run the benchmarks (figures in build/bench/results.json)
#   make deps     install the Debian packages perfq needs (only what is missing)
#   make install  install into PREFIX (default /usr/local), under DESTDIR if set
#   make uninstall  remove what make install put there
#   make install-dkms  perfq.ko through DKMS for every installed kernel
#                   (make uninstall-dkms removes it)
#   make deb      build the Debian packages perfq and perfq-dkms into build/deb/
# Every target installs missing packages first, so a fresh Debian 12 machine
# needs nothing but this Makefile.

BUILD       ?= build
BUILD_ASAN  ?= build-asan
BUILD_TSAN  ?= build-tsan
GENERATOR   ?= Ninja
CMAKE_ARGS  ?=
JOBS        ?= $(shell nproc)
PREFIX      ?= /usr/local
DESTDIR     ?=

.PHONY: all build deps asan tsan test qemu-test qemu-shell demo bench clean help install uninstall install-dkms uninstall-dkms deb

all: build

help:
	@sed -n '2,17p' Makefile | sed 's/^# \{0,1\}//'

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

test: build asan tsan
	@rm -f $(QEMU_RESULTS)
	-@qemu/run-scenarios.py --build $(BUILD) --results $(QEMU_RESULTS)
	@scripts/run-tests.sh --results $(QEMU_RESULTS) $(BUILD) $(BUILD_ASAN) $(BUILD_TSAN)

qemu-test: build
	@qemu/run-scenarios.py --build $(BUILD) --results $(QEMU_RESULTS)

qemu-shell: build
	@qemu/run-scenarios.py --build $(BUILD) --shell

demo: build
	@scripts/demo.sh $(BUILD)

bench: build
	@scripts/bench.py --build $(BUILD) --out $(BUILD)/bench/results.json

# The build folder's install prefix follows PREFIX (nothing recompiles); the
# list of installed files is kept for make uninstall.
install: build
	cmake -S . -B $(BUILD) -DCMAKE_INSTALL_PREFIX=$(PREFIX) >/dev/null
	DESTDIR="$(DESTDIR)" cmake --install $(BUILD)
	@cp $(BUILD)/install_manifest.txt $(BUILD)/perfq-installed.txt

uninstall:
	@DESTDIR="$(DESTDIR)" scripts/uninstall.sh $(BUILD)

install-dkms:
	@scripts/install-dkms.sh

uninstall-dkms:
	@scripts/install-dkms.sh --remove

deb: build
	@scripts/make-deb.sh $(BUILD)

clean:
	rm -rf $(BUILD) $(BUILD_ASAN) $(BUILD_TSAN)
