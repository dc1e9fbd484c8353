// Scalar fp32 <-> fp16/bf16 conversions, round-to-nearest-even, bit-exact
// with the vector paths (F16C vcvtps2ph/vcvtph2ps for fp16, integer rounding
// for bf16).
//
// The functions are `static inline` on purpose: this header is included by
// translation units compiled with different -m flags, and an out-of-line copy
// with external linkage compiled for AVX-512 could be the one the linker keeps
// for the baseline code (an ODR trap that shows up as SIGILL at -O0). The same
// goes for __builtin_bit_cast instead of std::bit_cast.
#ifndef ZEROD_OPTIM_CONVERT_H
#define ZEROD_OPTIM_CONVERT_H

#include <cstdint>

namespace zerod::optim {

static inline uint32_t f32_bits(float f) { return __builtin_bit_cast(uint32_t, f); }
static inline float f32_from_bits(uint32_t u) { return __builtin_bit_cast(float, u); }

// bf16 is the top half of an fp32, so widening is exact and keeps NaN payloads.
static inline float bf16_to_f32(uint16_t h) { return f32_from_bits(uint32_t{h} << 16); }

// Round to nearest even; every NaN becomes the quiet NaN 0x7FC0 (as PyTorch
// does), so a NaN can never round into an infinity.
static inline uint16_t f32_to_bf16(float f) {
  uint32_t x = f32_bits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0u;
  x += 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

// Exact. A NaN is returned quiet with its payload's top bits, as vcvtph2ps does.
static inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t e = (h >> 10) & 0x1Fu;
  const uint32_t m = h & 0x3FFu;
  if (e == 0x1F) return f32_from_bits(sign | 0x7F800000u | (m ? 0x400000u : 0u) | (m << 13));
  if (e == 0) {
    // Subnormal: m * 2^-24 is exact in fp32.
    const float mag = static_cast<float>(m) * 0x1p-24f;
    return f32_from_bits(sign | f32_bits(mag));
  }
  return f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
}

// Round to nearest even with subnormals and overflow to infinity; a NaN is
// made quiet keeping its payload's top bits, as vcvtps2ph does.
static inline uint16_t f32_to_f16(float f) {
  const uint32_t x = f32_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((ax >> 13) & 0x3FFu));
  if (ax >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520 rounds to inf
  if (ax >= 0x38800000u) {                                              // fp16 normal range
    // Rounding before rebiasing lets a mantissa carry step the exponent.
    const uint32_t r = ax + 0xFFFu + ((ax >> 13) & 1u) - 0x38000000u;
    return static_cast<uint16_t>(sign | (r >> 13));
  }
  if (ax <= 0x33000000u) return sign;  // <= 2^-25: ties to the even 0
  // fp16 subnormal: k units of 2^-24.
  const uint32_t e = ax >> 23;
  const uint32_t mant = (ax & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126u - e;  // 14..24
  uint32_t k = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (k & 1u))) ++k;
  return static_cast<uint16_t>(sign | k);
}

}  // namespace zerod::optim

#endif  // ZEROD_OPTIM_CONVERT_H
