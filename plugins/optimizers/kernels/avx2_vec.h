// Loads and stores of the AVX2 kernels: gradients widened from f32/bf16/f16,
// working copies rounded to nearest even. Include only in translation units
// built with -mavx2 -mfma -mf16c (everything here has internal linkage, so no
// AVX2 copy can be picked by the linker for baseline code).
#ifndef ZEROD_OPTIM_AVX2_VEC_H
#define ZEROD_OPTIM_AVX2_VEC_H

#include <immintrin.h>

#include <cstdint>

#include "element.h"

namespace zerod::optim {
namespace {

using detail::St;
using detail::Work;
constexpr size_t kLanes = 8;

template <Dtype G>
inline __m256 load_grad(const void* g, size_t i) {
  if constexpr (G == Dtype::f32) {
    return _mm256_loadu_ps(static_cast<const float*>(g) + i);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(g) + i));
    if constexpr (G == Dtype::f16) {
      return _mm256_cvtph_ps(h);
    } else {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
  }
}

// Round to nearest even into the low 16 bits of each lane; NaN ->
// kBf16QuietNan (zerod/kit/half.h's rule, as f32_to_bf16).
inline __m256i bf16_round(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i bias = _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF));
  const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
  const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  return _mm256_blendv_epi8(r, _mm256_set1_epi32(kBf16QuietNan), _mm256_castps_si256(nan));
}

// Eight floats as eight 16-bit values of the working copy's type.
template <Work W>
inline __m128i pack16(__m256 p) {
  if constexpr (W == Work::f16) {
    return _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  } else {
    // packus works within 128-bit lanes; the permute gathers both halves low.
    const __m256i r = bf16_round(p);
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08));
  }
}

template <Work W>
inline void store_work(void* w, size_t i, __m256 p) {
  if constexpr (W == Work::f32) {
    _mm256_storeu_ps(static_cast<float*>(w) + i, p);
  } else if constexpr (W == Work::f16 || W == Work::bf16) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(w) + i), pack16<W>(p));
  }
}

// Eight elements of an Adam state array, widened from bf16 where it is kept
// so (the same bits as detail::load_state), and stored back rounded to
// nearest even (detail::store_state).
template <St S>
inline __m256 load_state(const float* s, size_t i) {
  if constexpr (S == St::f32) {
    return _mm256_loadu_ps(s + i);
  } else {
    return load_grad<Dtype::bf16>(s, i);
  }
}

template <St S>
inline void store_state(float* s, size_t i, __m256 x) {
  if constexpr (S == St::f32) {
    _mm256_storeu_ps(s + i, x);
  } else {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(reinterpret_cast<uint16_t*>(s) + i), pack16<Work::bf16>(x));
  }
}

// store_work with streaming (non-temporal) stores, for a working copy that is
// written and not read back soon: i must put w + i on a vector boundary
// (32 bytes for f32, 16 for the 16-bit types), and the caller ends its loop
// with _mm_sfence(), as streaming stores are weakly ordered.
template <Work W>
inline void stream_work(void* w, size_t i, __m256 p) {
  if constexpr (W == Work::f32) {
    _mm256_stream_ps(static_cast<float*>(w) + i, p);
  } else if constexpr (W == Work::f16 || W == Work::bf16) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(w) + i), pack16<W>(p));
  }
}

// Elements from w to the first vector boundary stream_work can store at, or
// SIZE_MAX where there is none (an address not a multiple of the element).
template <Work W>
inline size_t work_head(const void* w) {
  if constexpr (W == Work::none) {
    return 0;
  } else {
    constexpr size_t size = W == Work::f32 ? 4 : 2;
    constexpr size_t vec = kLanes * size;
    const uintptr_t a = reinterpret_cast<uintptr_t>(w);
    if (a % size != 0) return SIZE_MAX;
    return (vec - a % vec) % vec / size;
  }
}

}  // namespace
}  // namespace zerod::optim

#endif  // ZEROD_OPTIM_AVX2_VEC_H
