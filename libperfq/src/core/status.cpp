#include "perfq/status.h"

#include <fmt/format.h>

#include <cstring>

#include "core/ring.h"

namespace perfq {

Status Status::from_errno(const std::string& what, int err) {
  Errc code = Errc::kIo;
  if (err == ENOENT) code = Errc::kNotFound;
  if (err == EEXIST) code = Errc::kExists;
  return Status(code, what + ": " + std::strerror(err));
}

std::string RingFault::describe() const {
  switch (kind) {
    case Kind::kNone:
      return "no fault";
    case Kind::kTailBehindHead:
      return fmt::format("tail {} is behind head {} (previous tail {}, capacity {})", seen, own,
                         previous, capacity);
    case Kind::kTailTooFarAhead:
      return fmt::format("tail {} is more than capacity {} ahead of head {} (previous tail {})",
                         seen, capacity, own, previous);
    case Kind::kTailMovedBackwards:
      return fmt::format("tail moved backwards from {} to {} (head {}, capacity {})", previous,
                         seen, own, capacity);
    case Kind::kHeadAheadOfTail:
      return fmt::format("head {} is ahead of tail {} (previous head {}, capacity {})", seen, own,
                         previous, capacity);
    case Kind::kHeadTooFarBehind:
      return fmt::format("head {} is more than capacity {} behind tail {} (previous head {})", seen,
                         capacity, own, previous);
    case Kind::kHeadMovedBackwards:
      return fmt::format("head moved backwards from {} to {} (tail {}, capacity {})", previous,
                         seen, own, capacity);
  }
  return "unknown fault";
}

}  // namespace perfq
