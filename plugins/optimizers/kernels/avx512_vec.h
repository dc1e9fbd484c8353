// Loads and stores of the AVX-512 kernels: plain or masked (for the tail),
// gradients widened from f32/bf16/f16, working copies rounded to nearest
// even. Include only in translation units built with the AVX-512 F/BW/VL
// flags (internal linkage throughout, as in avx2_vec.h).
#ifndef ZEROD_OPTIM_AVX512_VEC_H
#define ZEROD_OPTIM_AVX512_VEC_H

// GCC 12.2's AVX-512 headers build their "undefined" vectors as `__m512 __Y =
// __Y;`, which -Wmaybe-uninitialized reports at every inlined intrinsic (GCC
// PR 105593, fixed in 12.3), and -Wuninitialized too once a translation unit
// inlines enough of them (it did with the bf16 state's instantiations). The
// state must be set before the header.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <cstdint>

#include "element.h"

namespace zerod::optim {
namespace {

using detail::St;
using detail::Work;
constexpr size_t kLanes = 16;
constexpr __mmask16 kAll = 0xFFFF;

// With a partial mask, masked-off lanes read as zero and are never written.
template <bool Masked>
inline __m512 load_f32(const float* p, __mmask16 k) {
  if constexpr (Masked) return _mm512_maskz_loadu_ps(k, p);
  else return _mm512_loadu_ps(p);
}

template <bool Masked>
inline void store_f32(float* p, __mmask16 k, __m512 x) {
  if constexpr (Masked) _mm512_mask_storeu_ps(p, k, x);
  else _mm512_storeu_ps(p, x);
}

template <bool Masked>
inline __m256i load_u16(const uint16_t* p, __mmask16 k) {
  if constexpr (Masked) return _mm256_maskz_loadu_epi16(k, p);
  else return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

template <Dtype G, bool Masked>
inline __m512 load_grad(const void* g, size_t i, __mmask16 k) {
  if constexpr (G == Dtype::f32) {
    return load_f32<Masked>(static_cast<const float*>(g) + i, k);
  } else {
    const __m256i h = load_u16<Masked>(static_cast<const uint16_t*>(g) + i, k);
    if constexpr (G == Dtype::f16) {
      return _mm512_cvtph_ps(h);
    } else {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
  }
}

// Round to nearest even into the low 16 bits of each lane; NaN ->
// kBf16QuietNan (zerod/kit/half.h's rule, as f32_to_bf16).
inline __m512i bf16_round(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i bias = _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF));
  const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  return _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(kBf16QuietNan));
}

template <Work W, bool Masked>
inline void store_work(void* w, size_t i, __mmask16 k, __m512 p) {
  if constexpr (W == Work::f32) {
    store_f32<Masked>(static_cast<float*>(w) + i, k, p);
  } else if constexpr (W == Work::f16) {
    const __m256i h = _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    uint16_t* dst = static_cast<uint16_t*>(w) + i;
    if constexpr (Masked) _mm256_mask_storeu_epi16(dst, k, h);
    else _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), h);
  } else if constexpr (W == Work::bf16) {
    const __m512i r = bf16_round(p);
    uint16_t* dst = static_cast<uint16_t*>(w) + i;
    if constexpr (Masked) _mm512_mask_cvtepi32_storeu_epi16(dst, k, r);
    else _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm512_cvtepi32_epi16(r));
  }
}

// Sixteen elements of an Adam state array (plain or masked), widened from
// bf16 where it is kept so (the bits of detail::load_state), and stored back
// rounded to nearest even (detail::store_state).
template <St S, bool Masked>
inline __m512 load_state(const float* s, size_t i, __mmask16 k) {
  if constexpr (S == St::f32) {
    return load_f32<Masked>(s + i, k);
  } else {
    return load_grad<Dtype::bf16, Masked>(s, i, k);
  }
}

template <St S, bool Masked>
inline void store_state(float* s, size_t i, __mmask16 k, __m512 x) {
  if constexpr (S == St::f32) {
    store_f32<Masked>(s + i, k, x);
  } else {
    store_work<Work::bf16, Masked>(s, i, k, x);
  }
}

// store_work with streaming (non-temporal) stores, for a working copy that is
// written and not read back soon: i must put w + i on a vector boundary
// (64 bytes for f32, 32 for the 16-bit types), and the caller ends its loop
// with _mm_sfence(), as streaming stores are weakly ordered.
template <Work W>
inline void stream_work(void* w, size_t i, __m512 p) {
  if constexpr (W == Work::f32) {
    _mm512_stream_ps(static_cast<float*>(w) + i, p);
  } else if constexpr (W == Work::f16) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(w) + i),
                        _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  } else if constexpr (W == Work::bf16) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(w) + i),
                        _mm512_cvtepi32_epi16(bf16_round(p)));
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

inline __mmask16 tail_mask(size_t n) { return static_cast<__mmask16>((1u << n) - 1u); }

}  // namespace
}  // namespace zerod::optim

#endif  // ZEROD_OPTIM_AVX512_VEC_H
