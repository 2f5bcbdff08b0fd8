// Helpers shared by the tests: temporary files that clean up after themselves.
#pragma once

#include <unistd.h>

#include <atomic>
#include <string>

namespace perfq {

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

}  // namespace perfq
