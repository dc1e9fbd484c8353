#include "crc32c.h"

#include <array>
#include <cstring>

#include <zerod/kit/cpu.h>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace zerod::ckpt {

namespace {

constexpr uint32_t kPoly = 0x82f63b78u;  // reflected Castagnoli

std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[i] = c;
  }
  return t;
}

uint32_t by_table(uint32_t crc, const unsigned char* p, size_t n) {
  static const std::array<uint32_t, 256> table = make_table();
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t by_instruction(uint32_t crc, const unsigned char* p, size_t n) {
  uint64_t c = crc;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  for (; n; --n, ++p) c32 = _mm_crc32_u8(c32, *p);
  return c32;
}
#endif

}  // namespace

uint32_t crc32c(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
#if defined(__x86_64__)
  static const bool hw = cpu::features().sse42;
  crc = hw ? by_instruction(crc, p, n) : by_table(crc, p, n);
#else
  crc = by_table(crc, p, n);
#endif
  return ~crc;
}

}  // namespace zerod::ckpt
