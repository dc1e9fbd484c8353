// The tile loops behind kernels.h. Included once per ISA level by a file
// that defines ZEROD_COMM_ISA (base, avx2) and is built with that level's -m
// flags; everything but reduce() has internal linkage, so the copies never
// meet at link time (the ODR trap zerod/kit/half.h describes).
//
// A tile of elements is reduced across all sources into an accumulator that
// stays in L1, then written to every destination: each source is read once
// and each destination written once, which is what the memory bound allows.
#ifndef ZEROD_COMM_ISA
#error "define ZEROD_COMM_ISA before including kernels_impl.h"
#endif

#include <zerod/kit/half.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "kernels.h"

namespace zerod::comm::kernels::ZEROD_COMM_ISA {
namespace {

// Elements per tile: an fp32 accumulator of 8 KiB (16 KiB for fp64) plus a
// widened source and the rounded result fit in L1 with room to spare.
constexpr size_t kTile = 2048;

template <Reduce O, typename A>
inline A combine(A acc, A x) {
  if constexpr (O == Reduce::sum) {
    return acc + x;
  } else {
    // Bitwise | rather than ||: no branch, so the loop vectorises.
    const bool take = (x > acc) | __builtin_isnan(x);
    return take ? x : acc;
  }
}

template <Reduce O, typename A>
void combine_tile(A* __restrict acc, const A* __restrict x, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] = combine<O>(acc[i], x[i]);
}

template <Dtype D>
void widen(const uint16_t* __restrict s, float* __restrict d, size_t n) {
  size_t i = 0;
  if constexpr (D == Dtype::f16) {
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      _mm256_storeu_ps(d + i, _mm256_cvtph_ps(h));
    }
#endif
    for (; i < n; ++i) d[i] = f16_to_f32(s[i]);
  } else {
    for (; i < n; ++i) d[i] = bf16_to_f32(s[i]);
  }
}

template <Dtype D>
void narrow(const float* __restrict s, uint16_t* __restrict d, size_t n) {
  size_t i = 0;
  if constexpr (D == Dtype::f16) {
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), h);
    }
#endif
    for (; i < n; ++i) d[i] = f32_to_f16(s[i]);
  } else {
    for (; i < n; ++i) d[i] = f32_to_bf16(s[i]);
  }
}

// Copies a tile out; with `stream`, bypassing the cache (SSE2 is baseline
// x86-64, so both ISA levels have it). The caller fences at the end.
inline void write_out(void* dst, const void* src, size_t bytes, bool stream) {
#if defined(__SSE2__)
  if (stream) {
    auto* d = static_cast<char*>(dst);
    const auto* s = static_cast<const char*>(src);
    const size_t head = std::min(bytes, (16 - (reinterpret_cast<uintptr_t>(d) & 15u)) & 15u);
    std::memcpy(d, s, head);
    size_t i = head;
    for (; i + 16 <= bytes; i += 16) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
    }
    std::memcpy(d + i, s + i, bytes - i);
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

template <typename T>
const T* src_at(const ReduceJob& j, int k, size_t off) {
  return static_cast<const T*>(j.srcs[k]) + off;
}

template <typename T>
T* dst_at(const ReduceJob& j, int k, size_t off) {
  return static_cast<T*>(j.dsts[k]) + off;
}

// fp32 and fp64: the accumulator has the element type.
template <typename T, Reduce O>
void reduce_wide(const ReduceJob& j) {
  alignas(64) T acc[kTile];
  for (size_t off = 0; off < j.count; off += kTile) {
    const size_t n = std::min(kTile, j.count - off);
    std::memcpy(acc, src_at<T>(j, 0, off), n * sizeof(T));
    for (int k = 1; k < j.nsrc; ++k) combine_tile<O>(acc, src_at<T>(j, k, off), n);
    for (int k = 0; k < j.ndst; ++k) write_out(dst_at<T>(j, k, off), acc, n * sizeof(T), j.stream);
  }
}

// bf16 and fp16: combined in fp32, rounded once per element.
template <Dtype D, Reduce O>
void reduce_half(const ReduceJob& j) {
  alignas(64) float acc[kTile];
  alignas(64) float wide[kTile];
  alignas(64) uint16_t out[kTile];
  for (size_t off = 0; off < j.count; off += kTile) {
    const size_t n = std::min(kTile, j.count - off);
    widen<D>(src_at<uint16_t>(j, 0, off), acc, n);
    for (int k = 1; k < j.nsrc; ++k) {
      widen<D>(src_at<uint16_t>(j, k, off), wide, n);
      combine_tile<O>(acc, wide, n);
    }
    narrow<D>(acc, out, n);
    for (int k = 0; k < j.ndst; ++k) write_out(dst_at<uint16_t>(j, k, off), out, n * sizeof(uint16_t), j.stream);
  }
}

template <Reduce O>
void reduce_as(const ReduceJob& j) {
  switch (j.dtype) {
    case Dtype::f32: reduce_wide<float, O>(j); return;
    case Dtype::f64: reduce_wide<double, O>(j); return;
    case Dtype::bf16: reduce_half<Dtype::bf16, O>(j); return;
    case Dtype::f16: reduce_half<Dtype::f16, O>(j); return;
  }
}

}  // namespace

void reduce(const ReduceJob& job) {
  if (job.count == 0 || job.nsrc < 1) return;
  if (job.op == Reduce::sum) reduce_as<Reduce::sum>(job);
  else reduce_as<Reduce::max>(job);
#if defined(__SSE2__)
  // Non-temporal stores are weakly ordered: drain them before the caller
  // tells other threads the output is ready.
  if (job.stream) _mm_sfence();
#endif
}

}  // namespace zerod::comm::kernels::ZEROD_COMM_ISA
