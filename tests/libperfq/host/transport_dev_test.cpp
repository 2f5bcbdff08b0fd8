// The /dev/perfqN transport's host-side pieces that run without the driver:
// the fault guard (a real SIGBUS from a truncated file mapping) and the
// errors of opening a device node that is not there.  The driver itself is
// exercised in a real kernel by the QEMU scenarios (qemu/).
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/mapping.h"
#include "core/region.h"
#include "core/ring.h"
#include "host/fault_guard.h"
#include "host/transport.h"

namespace perfq {
namespace {

// A two-page file, mapped shared, that the test can pull away by truncating.
struct ShrinkingFile {
  std::string path;
  UniqueFd fd;
  void* addr = nullptr;
  size_t len = 2 * 4096;

  ShrinkingFile() {
    char tmpl[] = "/tmp/perfq-fault-guard-XXXXXX";
    fd = UniqueFd(::mkstemp(tmpl));
    path = tmpl;
    REQUIRE(fd.valid());
    REQUIRE(::ftruncate(fd.get(), static_cast<off_t>(len)) == 0);
    addr = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    REQUIRE(addr != MAP_FAILED);
    static_cast<volatile uint64_t*>(addr)[0] = 0x1234;
  }
  ~ShrinkingFile() {
    ::munmap(addr, len);
    ::unlink(path.c_str());
  }
  void pull_away() { REQUIRE(::ftruncate(fd.get(), 0) == 0); }
  volatile uint64_t* words() const { return static_cast<volatile uint64_t*>(addr); }
};

TEST_CASE("fault guard turns a SIGBUS in a registered mapping into a flag", "[fault_guard]") {
  ShrinkingFile f;
  std::atomic<bool> gone{false};
  FaultGuardRange guard(f.addr, f.len, &gone);
  REQUIRE(guard.valid());
  CHECK(f.words()[0] == 0x1234);
  CHECK_FALSE(gone.load());

  const uint64_t hits = fault_guard_hits();
  f.pull_away();  // the next access raises a real SIGBUS
  SECTION("a read retries and sees zeros") {
    CHECK(f.words()[0] == 0);
    CHECK(gone.load());
    CHECK(fault_guard_hits() == hits + 1);
  }
  SECTION("a write retries into the zero memory, and the whole range is covered") {
    f.words()[600] = 7;  // second page
    CHECK(gone.load());
    CHECK(f.words()[600] == 7);
    CHECK(f.words()[0] == 0);
    CHECK(fault_guard_hits() == hits + 1);
  }
}

TEST_CASE("fault guard lets any other SIGBUS kill the process", "[fault_guard]") {
  install_fault_guard();
  ShrinkingFile f;
  std::atomic<bool> gone{false};
  const bool registered = GENERATE(false, true);
  FaultGuardRange guard;
  if (registered) {
    guard = FaultGuardRange(f.addr, f.len, &gone);
    guard.reset();  // unregistered again: no longer guarded
  }
  f.pull_away();
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // Quiet: a sanitizer's report of the expected crash is noise here.
    const int null_fd = ::open("/dev/null", O_WRONLY);
    if (null_fd >= 0) ::dup2(null_fd, 2);
    (void)f.words()[0];
    ::_exit(0);  // survived: wrong
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  // Killed by SIGBUS, or (under a sanitizer, whose handler we chain to) a
  // nonzero exit after its report: never a clean exit.
  CHECK_FALSE((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  if (WIFSIGNALED(status)) CHECK(WTERMSIG(status) == SIGBUS);
  CHECK_FALSE(gone.load());
}

// The drain publishes its head into the region with a release store, and
// the sync thread and status read it with acquire loads: the first access
// after a device goes can be either, and under a sanitizer it faults inside
// the sanitizer's runtime.  It returns, the flag set.  In a child, so that
// a hang fails the test instead of hanging it.
TEST_CASE("fault guard: an atomic store or load into a pulled-away mapping returns",
          "[fault_guard]") {
  ShrinkingFile f;
  const bool store = GENERATE(true, false);
  // Atomics on the words first (TSan then keeps state for them).
  store_release(const_cast<uint64_t*>(f.words()) + 1, 1);
  CHECK(load_acquire(const_cast<const uint64_t*>(f.words()) + 1) == 1);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    std::atomic<bool> gone{false};
    FaultGuardRange guard(f.addr, f.len, &gone);
    f.pull_away();
    uint64_t* word = const_cast<uint64_t*>(f.words()) + 1;
    if (store) {
      store_release(word, 2);
      ::_exit(gone.load() && load_acquire(word) == 2 ? 0 : 3);
    }
    const uint64_t v = load_acquire(word);  // zeros, once the guard mapped them
    ::_exit(gone.load() && v == 0 ? 0 : 4);
  }
  int status = 0;
  pid_t got = 0;
  for (int i = 0; i < 300 && got == 0; ++i) {  // 30 s
    got = ::waitpid(pid, &status, WNOHANG);
    if (got == 0) ::usleep(100'000);
  }
  if (got == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    FAIL("the access into the pulled-away mapping did not return in 30 s");
  }
  REQUIRE(got == pid);
  INFO("store: " << store << ", status " << status);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("fault guard keeps separate ranges apart", "[fault_guard]") {
  ShrinkingFile a, b;
  std::atomic<bool> gone_a{false}, gone_b{false};
  FaultGuardRange ga(a.addr, a.len, &gone_a), gb(b.addr, b.len, &gone_b);
  b.pull_away();
  CHECK(b.words()[1] == 0);
  CHECK(gone_b.load());
  CHECK_FALSE(gone_a.load());
  CHECK(a.words()[0] == 0x1234);
}

TEST_CASE("opening /dev/perfqN without the driver says so", "[transport]") {
  auto t = open_transport("/dev/perfq-test-does-not-exist");
  REQUIRE_FALSE(t.is_ok());
  CHECK(t.status().code() == Errc::kNotFound);
  CHECK(t.status().message().find("perfq.ko") != std::string::npos);
}

TEST_CASE("an shm transport is never gone", "[transport]") {
  const std::string path = "/dev/shm/perfq-transport-dev-test-" + std::to_string(::getpid());
  RegionGeometry g;
  g.ring_capacity = 64;
  auto r = Region::create(path, g);
  REQUIRE(r.is_ok());
  auto t = open_transport("shm:" + path);
  REQUIRE(t.is_ok());
  CHECK_FALSE(t.value()->gone());
  ::unlink(path.c_str());
}

}  // namespace
}  // namespace perfq
