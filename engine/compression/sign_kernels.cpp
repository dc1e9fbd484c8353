// Sign packing for the kept compressed average (sign_kernels.h).
#include "compression/sign_kernels.h"

#include <cmath>
#include <cstdint>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace zerod {
namespace {

bool sign_bit(const uint8_t* bits, uint64_t e) { return (bits[e >> 3] >> (e & 7)) & 1; }

// The one check of the instruction set here is at compile time: SSE2 is
// part of x86-64 itself, so every x86-64 build has it and no CPU probe is
// needed. The loops take `vector` = false for the portable byte loop alone,
// the reference the tests hold the SSE2 loop to.
#if defined(__SSE2__)
constexpr bool kSse2 = true;
#else
constexpr bool kSse2 = false;
#endif

// x[i] = +sc where bit e0 + i is set, -sc where not, for i < n: a byte of
// signs at a time between the unaligned ends. With SSE2 (every x86-64) a
// byte becomes 8 floats in two stores: a clear bit flips sc's sign bit,
// which is -sc exactly (the plain loop took 4-5x as long on 25M elements,
// twice per compressed step at stages 1-3).
void unpack(const uint8_t* bits, uint64_t e0, float sc, float* x, uint64_t n, [[maybe_unused]] bool vector) {
  uint64_t i = 0;
  for (; i < n && ((e0 + i) & 7) != 0; ++i) x[i] = sign_bit(bits, e0 + i) ? sc : -sc;
#if defined(__SSE2__)
  const __m128i lo = _mm_setr_epi32(1, 2, 4, 8), hi = _mm_setr_epi32(16, 32, 64, 128);
  const __m128i sign = _mm_set1_epi32(INT32_MIN);
  const __m128 s = _mm_set1_ps(sc);
  for (; vector && i + 8 <= n; i += 8) {
    const __m128i b = _mm_set1_epi32(bits[(e0 + i) >> 3]);
    const __m128i f0 = _mm_and_si128(_mm_cmpeq_epi32(_mm_and_si128(b, lo), _mm_setzero_si128()), sign);
    const __m128i f1 = _mm_and_si128(_mm_cmpeq_epi32(_mm_and_si128(b, hi), _mm_setzero_si128()), sign);
    _mm_storeu_ps(x + i, _mm_xor_ps(s, _mm_castsi128_ps(f0)));
    _mm_storeu_ps(x + i + 4, _mm_xor_ps(s, _mm_castsi128_ps(f1)));
  }
#endif
  for (; i + 8 <= n; i += 8) {
    const unsigned b = bits[(e0 + i) >> 3];
    for (unsigned j = 0; j < 8; ++j) x[i + j] = (b >> j) & 1u ? sc : -sc;
  }
  for (; i < n; ++i) x[i] = sign_bit(bits, e0 + i) ? sc : -sc;
}

// Bit e0 + i set where x[i] has no sign bit, cleared where it has, for
// i < n: whole bytes are written, the unaligned ends bit by bit (they may
// share a byte with the next tensor's bits).
void pack(const float* x, uint64_t n, uint8_t* bits, uint64_t e0, [[maybe_unused]] bool vector) {
  auto one = [&](uint64_t i) {
    const uint64_t e = e0 + i;
    const auto bit = static_cast<uint8_t>(1u << (e & 7));
    bits[e >> 3] = std::signbit(x[i]) ? static_cast<uint8_t>(bits[e >> 3] & ~bit)
                                      : static_cast<uint8_t>(bits[e >> 3] | bit);
  };
  uint64_t i = 0;
  for (; i < n && ((e0 + i) & 7) != 0; ++i) one(i);
#if defined(__SSE2__)
  // movmskps: the sign bits of 4 floats at once (a set bit is a clear one here).
  for (; vector && i + 8 <= n; i += 8) {
    const int neg = _mm_movemask_ps(_mm_loadu_ps(x + i)) | (_mm_movemask_ps(_mm_loadu_ps(x + i + 4)) << 4);
    bits[(e0 + i) >> 3] = static_cast<uint8_t>(~neg);
  }
#endif
  for (; i + 8 <= n; i += 8) {
    unsigned b = 0;
    for (unsigned j = 0; j < 8; ++j) b |= (std::signbit(x[i + j]) ? 0u : 1u) << j;
    bits[(e0 + i) >> 3] = static_cast<uint8_t>(b);
  }
  for (; i < n; ++i) one(i);
}

}  // namespace

void unpack_signs(const uint8_t* bits, uint64_t e0, float sc, float* x, uint64_t n) {
  unpack(bits, e0, sc, x, n, true);
}

void pack_signs(const float* x, uint64_t n, uint8_t* bits, uint64_t e0) { pack(x, n, bits, e0, true); }

const char* sign_kernels_isa() { return kSse2 ? "sse2" : "portable"; }

namespace detail {

void unpack_signs_portable(const uint8_t* bits, uint64_t e0, float sc, float* x, uint64_t n) {
  unpack(bits, e0, sc, x, n, false);
}

void pack_signs_portable(const float* x, uint64_t n, uint8_t* bits, uint64_t e0) { pack(x, n, bits, e0, false); }

}  // namespace detail
}  // namespace zerod
