#include "core/mapping.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

namespace perfq {

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

Result<Mapping> Mapping::map_shared(int fd, size_t len, const std::string& what) {
  void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return Status::from_errno("mmap " + what);
  return Mapping(p, len);
}

void Mapping::reset() {
  if (addr_) ::munmap(addr_, len_);
  addr_ = nullptr;
  len_ = 0;
}

}  // namespace perfq
