// CRC32C (Castagnoli, polynomial 0x1EDC6F41, reflected 0x82F63B78), the
// checksum of every trace chunk.  Portable slice-by-8 tables; no CPU
// feature detection.  crc32c("123456789") == 0xE3069283.
#pragma once

#include <cstddef>
#include <cstdint>

namespace perfq {

// Extends `crc` (0 for a fresh checksum) over `len` bytes.  Thread-safe.
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t len) noexcept;

inline uint32_t crc32c(const void* data, size_t len) noexcept {
  return crc32c_extend(0, data, len);
}

}  // namespace perfq
