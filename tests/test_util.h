// Helpers shared by the tests: temporary files that clean up after
// themselves, and real child processes.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

extern char** environ;

namespace perfq {

// A sanitizer build (ASan+UBSan or TSan): its programs run several times
// slower and its timings are not representative, so its tests check the
// machinery with lighter loads, longer timeouts and looser timing bounds or
// none.  Each test that runs in every tree keeps its full size and bounds in
// the plain tree.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

// A unique path under /dev/shm, unlinked when the test ends.
class TempShm {
 public:
  explicit TempShm(const std::string& tag) {
    static std::atomic<int> counter{0};
    path_ = "/dev/shm/perfq-test-" + tag + "-" + std::to_string(getpid()) + "-" +
            std::to_string(counter++);
    ::unlink(path_.c_str());
  }
  ~TempShm() { ::unlink(path_.c_str()); }
  TempShm(const TempShm&) = delete;
  TempShm& operator=(const TempShm&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

#ifdef PERFQ_BIN_DIR
// The folder of the programs the tests run (perfq-daemon, perfq-devsim, ...).
inline const std::string kBin = PERFQ_BIN_DIR;
#endif

inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

// Text as a page shows it from its HTML source (chromium's --dump-dom): the
// entities a DOM dump writes, back to their characters.
inline std::string unescape_html(std::string s) {
  static const std::pair<const char*, const char*> kEnt[] = {
      {"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""}, {"&nbsp;", " "}, {"&amp;", "&"}};
  for (const auto& [from, to] : kEnt) {
    for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + 1))
      s.replace(p, std::strlen(from), to);
  }
  return s;
}

// A unique directory (under /dev/shm when writable), removed with its content.
class TempDir {
 public:
  explicit TempDir(const std::string& tag = "test") {
    const std::filesystem::path base =
        access("/dev/shm", W_OK) == 0 ? "/dev/shm" : std::filesystem::temp_directory_path();
    std::string tmpl = (base / ("perfq-" + tag + "-XXXXXX")).string();
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Run a shell command; its exit status, or -1 if it did not exit.
inline int sh(const std::string& cmd) {
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// A child process running a program of ours, its stdout and stderr going to
// files.  Killed (SIGKILL) and reaped if the test ends while it runs.
class Child {
 public:
  explicit Child(std::vector<std::string> argv) : argv_(std::move(argv)) {
    static std::atomic<int> counter{0};
    const std::string base =
        "/tmp/perfq-test-child-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
    out_path_ = base + ".out";
    err_path_ = base + ".err";
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&fa, 2, err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    std::vector<char*> args;
    for (auto& a : argv_) args.push_back(a.data());
    args.push_back(nullptr);
    if (posix_spawn(&pid_, args[0], &fa, nullptr, args.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
  }
  ~Child() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      int st;
      waitpid(pid_, &st, 0);
    }
    ::unlink(out_path_.c_str());
    ::unlink(err_path_.c_str());
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  bool started() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  void signal(int sig) const { ::kill(pid_, sig); }

  // Wait up to timeout for the exit; true when it exited (status() tells how).
  bool wait(std::chrono::milliseconds timeout) {
    if (reaped_) return true;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      int st = 0;
      pid_t r = waitpid(pid_, &st, WNOHANG);
      if (r == pid_) {
        reaped_ = true;
        status_ = st;
        return true;
      }
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  bool running() { return !wait(std::chrono::milliseconds(0)); }
  // Exit code, or 128 + signal, or -1 while running.
  int exit_code() const {
    if (!reaped_) return -1;
    if (WIFEXITED(status_)) return WEXITSTATUS(status_);
    if (WIFSIGNALED(status_)) return 128 + WTERMSIG(status_);
    return -1;
  }
  std::string out() const { return slurp(out_path_); }
  std::string err() const { return slurp(err_path_); }

 private:
  std::vector<std::string> argv_;
  std::string out_path_, err_path_;
  pid_t pid_ = -1;
  bool reaped_ = false;
  int status_ = 0;
};

}  // namespace perfq
