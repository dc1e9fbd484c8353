// The project's one fp32 <-> bf16 / fp16 conversion, for the engine, the
// plugins and the CUDA kernels of both. Round to nearest even, subnormals
// kept, overflow to infinity. The NaN rule is PyTorch's (c10):
//   - fp32 -> bf16: every NaN becomes the quiet NaN 0x7FC0, whatever its sign
//     and payload (c10::detail::round_to_nearest_even).
//   - fp32 -> fp16: a NaN stays a NaN, made quiet, keeping its sign and the top
//     bits of its payload (c10's F16C path, _cvtss_sh, which is what every
//     x86 vcvtps2ph in the tree does too).
//   - bf16 -> fp32 is exact (payload kept); fp16 -> fp32 is exact and returns
//     a NaN quiet with its payload, as vcvtph2ps does.
// tests/kernels/half_rule_test.cpp holds the engine, the optimizer kernels of
// every ISA and the comm kernels to these bits.
//
// Dependency-free (kit/ may be included by the engine and by plugins; see
// ARCHITECTURE.md §13). The functions are `static inline` on purpose: this
// header is included by translation units compiled with different -m flags,
// and an out-of-line copy with external linkage compiled for AVX-512 could be
// the one the linker keeps for the baseline code (an ODR trap that shows up as
// SIGILL at -O0). The same goes for __builtin_bit_cast instead of std::bit_cast.
#ifndef ZEROD_KIT_HALF_H
#define ZEROD_KIT_HALF_H

#include <cstdint>

#if defined(__CUDACC__)
#define ZD_KIT_HD __host__ __device__
#else
#define ZD_KIT_HD
#endif

namespace zerod {

// The bf16 every NaN rounds to (c10's), for the vector paths' blends.
inline constexpr uint16_t kBf16QuietNan = 0x7FC0u;

// Device code has CUDA's own bit casts.
#if defined(__CUDA_ARCH__)
ZD_KIT_HD static inline uint32_t f32_bits(float f) { return __float_as_uint(f); }
ZD_KIT_HD static inline float f32_from_bits(uint32_t u) { return __uint_as_float(u); }
#else
static inline uint32_t f32_bits(float f) { return __builtin_bit_cast(uint32_t, f); }
static inline float f32_from_bits(uint32_t u) { return __builtin_bit_cast(float, u); }
#endif

// bf16 is the top half of an fp32, so widening is exact and keeps NaN payloads.
ZD_KIT_HD static inline float bf16_to_f32(uint16_t h) { return f32_from_bits(uint32_t{h} << 16); }

// Round to nearest even; a NaN becomes kBf16QuietNan, so it can never round
// into an infinity.
ZD_KIT_HD static inline uint16_t f32_to_bf16(float f) {
  uint32_t x = f32_bits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return kBf16QuietNan;
  x += 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

// The fp16 of an fp32 NaN (bits x): quiet, with its sign and the top 9 bits of
// its payload.
ZD_KIT_HD static inline uint16_t f16_nan_from_f32_bits(uint32_t x) {
  return static_cast<uint16_t>(((x >> 16) & 0x8000u) | 0x7E00u | ((x >> 13) & 0x3FFu));
}

// Exact. A NaN is returned quiet with its payload's top bits, as vcvtph2ps does.
ZD_KIT_HD static inline float f16_to_f32(uint16_t h) {
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

// Round to nearest even with subnormals and overflow to infinity; a NaN as
// f16_nan_from_f32_bits says.
ZD_KIT_HD static inline uint16_t f32_to_f16(float f) {
  const uint32_t x = f32_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return f16_nan_from_f32_bits(x);
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

}  // namespace zerod

#endif  // ZEROD_KIT_HALF_H
