// CRC-32C (Castagnoli), the checksum of every record of a checkpoint: the
// SSE4.2 instruction where the CPU has it, else a table.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zerod::ckpt {

// Extends crc (0 for a fresh sum) over n bytes.
uint32_t crc32c(uint32_t crc, const void* data, size_t n);

}  // namespace zerod::ckpt
