#include "grad/grad_math.h"

#include "runtime/dtype.h"

#include <zerod/kit/cpu.h>

#include <cmath>

#if ZEROD_GRAD_MATH_X86
#include <immintrin.h>
#endif

namespace zerod {

namespace {

inline void store_float(void* p, zd_dtype dt, uint64_t i, float v) {
  switch (dt) {
    case ZD_DTYPE_F32: static_cast<float*>(p)[i] = v; break;
    case ZD_DTYPE_BF16: static_cast<uint16_t*>(p)[i] = f32_to_bf16(v); break;
    default: static_cast<uint16_t*>(p)[i] = f32_to_f16(v); break;
  }
}

}  // namespace

void accumulate(const void* src, zd_dtype src_dt, void* dst, zd_dtype dst_dt, uint64_t n) {
  if (src_dt == ZD_DTYPE_F32 && dst_dt == ZD_DTYPE_F32) {
    const float* s = static_cast<const float*>(src);
    float* d = static_cast<float*>(dst);
    for (uint64_t i = 0; i < n; ++i) d[i] += s[i];
    return;
  }
  if (src_dt == ZD_DTYPE_BF16 && dst_dt == ZD_DTYPE_F32) {
    // 16-bit gradients into fp32 accumulators, the usual mixed-precision
    // case (a GPU's bf16 gradients added on the host): the widening is a
    // shift, so the loop vectorises, where the generic one below switches
    // on both dtypes per element. The same sums, bit for bit.
    const uint16_t* __restrict s = static_cast<const uint16_t*>(src);
    float* __restrict d = static_cast<float*>(dst);
    for (uint64_t i = 0; i < n; ++i) d[i] += bf16_to_f32(s[i]);
    return;
  }
  if (src_dt == ZD_DTYPE_BF16 && dst_dt == ZD_DTYPE_BF16) {
    // bf16 gradients into bf16 accumulators: a GPU job's default
    // (grad_accum_dtype = "working"), every byte of its gradients added on
    // the host once a step. The generic loop below ran it at 1.8 ns an
    // element, scalar; this one widens, adds and rounds eight at a time.
    const uint16_t* s = static_cast<const uint16_t*>(src);
    uint16_t* d = static_cast<uint16_t*>(dst);
#if ZEROD_GRAD_MATH_X86
    static const bool avx2 = detail::cpu_has_avx2_fma();
    if (avx2) return detail::add_bf16_avx2(s, d, n);
#endif
    return detail::add_bf16_baseline(s, d, n);
  }
  for (uint64_t i = 0; i < n; ++i)
    store_float(dst, dst_dt, i, load_as_float(dst, dst_dt, i) + load_as_float(src, src_dt, i));
}

void assign_to_zero(const void* src, zd_dtype src_dt, void* dst, zd_dtype dst_dt, uint64_t n) {
  if (src_dt == ZD_DTYPE_F32 && dst_dt == ZD_DTYPE_F32) {
    // fp32 gradients into fp32 accumulators: vectorised, where the generic
    // loop below runs scalar, switching on both dtypes per element.
    const float* __restrict s = static_cast<const float*>(src);
    float* __restrict d = static_cast<float*>(dst);
    for (uint64_t i = 0; i < n; ++i) d[i] = 0.0f + s[i];
    return;
  }
  if (src_dt == ZD_DTYPE_BF16 && dst_dt == ZD_DTYPE_F32) {
    const uint16_t* __restrict s = static_cast<const uint16_t*>(src);
    float* __restrict d = static_cast<float*>(dst);
    for (uint64_t i = 0; i < n; ++i) d[i] = 0.0f + bf16_to_f32(s[i]);
    return;
  }
  if (src_dt == ZD_DTYPE_BF16 && dst_dt == ZD_DTYPE_BF16) {
    // 0 + x rounded back to bf16 is x itself, except that a -0 becomes +0
    // and every NaN the quiet NaN (f32_to_bf16's rule): a select on the
    // bits, which the compiler vectorises sixteen at a time.
    const uint16_t* __restrict s = static_cast<const uint16_t*>(src);
    uint16_t* __restrict d = static_cast<uint16_t*>(dst);
    for (uint64_t i = 0; i < n; ++i) {
      const uint16_t x = s[i];
      const uint16_t kept = x == 0x8000u ? uint16_t{0} : x;
      d[i] = (x & 0x7FFFu) > 0x7F80u ? kBf16QuietNan : kept;
    }
    return;
  }
  for (uint64_t i = 0; i < n; ++i) store_float(dst, dst_dt, i, 0.0f + load_as_float(src, src_dt, i));
}

void accumulate_scaled(const void* src, zd_dtype src_dt, void* dst, zd_dtype dst_dt, uint64_t n,
                       float factor) {
  if (src_dt == ZD_DTYPE_F32 && dst_dt == ZD_DTYPE_F32) {
    const float* s = static_cast<const float*>(src);
    float* d = static_cast<float*>(dst);
    for (uint64_t i = 0; i < n; ++i) d[i] += factor * s[i];
    return;
  }
  for (uint64_t i = 0; i < n; ++i)
    store_float(dst, dst_dt, i, load_as_float(dst, dst_dt, i) + factor * load_as_float(src, src_dt, i));
}

void scale_in_place(void* p, zd_dtype dt, uint64_t n, float factor) {
  if (dt == ZD_DTYPE_F32) {
    float* d = static_cast<float*>(p);
    for (uint64_t i = 0; i < n; ++i) d[i] *= factor;
    return;
  }
  for (uint64_t i = 0; i < n; ++i) store_float(p, dt, i, factor * load_as_float(p, dt, i));
}

void sum_sources(const void* const* srcs, size_t nsrc, void* dst, zd_dtype dt, uint64_t n) {
  if (nsrc == 0) return;
  if (dt == ZD_DTYPE_F32) {
    auto* d = static_cast<float*>(dst);
    for (uint64_t i = 0; i < n; ++i) {
      float acc = static_cast<const float*>(srcs[0])[i];
      for (size_t k = 1; k < nsrc; ++k) acc += static_cast<const float*>(srcs[k])[i];
      d[i] = acc;
    }
    return;
  }
  for (uint64_t i = 0; i < n; ++i) {
    float acc = load_as_float(srcs[0], dt, i);
    for (size_t k = 1; k < nsrc; ++k) acc += load_as_float(srcs[k], dt, i);
    store_float(dst, dt, i, acc);
  }
}

namespace detail {

// The fp32 sum of squares keeps kSumLanes partial sums in double, element i
// in lane i % kSumLanes, and adds them up in one fixed tree: the AVX2 loop
// holds the lanes in four registers, the baseline loop in an array, and
// both give the same bits (a float squared is exact in double, so an FMA
// and a multiply-then-add round alike). Sixteen lanes: four registers of
// four doubles keep the AVX2 loop at memory speed, where the four-lane loop
// before (four dependent double adds) ran at about half of it.
static double reduce_lanes(const double* lanes) {
  double q[4];
  for (int l = 0; l < 4; ++l) q[l] = (lanes[l] + lanes[4 + l]) + (lanes[8 + l] + lanes[12 + l]);
  return (q[0] + q[1]) + (q[2] + q[3]);
}

double sumsq_f32_baseline(const float* p, uint64_t n) {
  double lanes[kSumLanes] = {};
  uint64_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes)
    for (uint64_t l = 0; l < kSumLanes; ++l) lanes[l] += static_cast<double>(p[i + l]) * p[i + l];
  for (uint64_t l = 0; i < n; ++i, ++l) lanes[l] += static_cast<double>(p[i]) * p[i];
  return reduce_lanes(lanes);
}

void add_bf16_baseline(const uint16_t* s, uint16_t* d, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(bf16_to_f32(d[i]) + bf16_to_f32(s[i]));
}

// bf16's sum of squares is that of its fp32 widening, lanes and tree
// included (a bf16 gradient and the same values in fp32 have one norm).
// Before 2026-11-28 it kept four lanes in a generic scalar loop; the last
// bits of a bf16 job's norm moved when this replaced it.
double sumsq_bf16_baseline(const uint16_t* p, uint64_t n) {
  double lanes[kSumLanes] = {};
  uint64_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes)
    for (uint64_t l = 0; l < kSumLanes; ++l) {
      const double v = bf16_to_f32(p[i + l]);
      lanes[l] += v * v;
    }
  for (uint64_t l = 0; i < n; ++i, ++l) {
    const double v = bf16_to_f32(p[i]);
    lanes[l] += v * v;
  }
  return reduce_lanes(lanes);
}

#if ZEROD_GRAD_MATH_X86
// The sixteen lanes of the vector sums of squares, four a register, into
// memory for the scalar tail and the tree. Baseline code runs next on this
// thread: no upper halves are left dirty (plugins/optimizers/kernels/
// zero_upper.h says what that costs on Intel).
__attribute__((target("avx2"))) static inline void store_lanes_avx2(__m256d a0, __m256d a1, __m256d a2, __m256d a3,
                                                                     double* lanes) {
  _mm256_storeu_pd(lanes, a0);
  _mm256_storeu_pd(lanes + 4, a1);
  _mm256_storeu_pd(lanes + 8, a2);
  _mm256_storeu_pd(lanes + 12, a3);
  _mm256_zeroupper();
}

__attribute__((target("avx2,fma"))) double sumsq_f32_avx2(const float* p, uint64_t n) {
  __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
  uint64_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes) {
    const __m256d x0 = _mm256_cvtps_pd(_mm_loadu_ps(p + i)), x1 = _mm256_cvtps_pd(_mm_loadu_ps(p + i + 4));
    const __m256d x2 = _mm256_cvtps_pd(_mm_loadu_ps(p + i + 8)), x3 = _mm256_cvtps_pd(_mm_loadu_ps(p + i + 12));
    a0 = _mm256_fmadd_pd(x0, x0, a0);
    a1 = _mm256_fmadd_pd(x1, x1, a1);
    a2 = _mm256_fmadd_pd(x2, x2, a2);
    a3 = _mm256_fmadd_pd(x3, x3, a3);
  }
  double lanes[kSumLanes];
  store_lanes_avx2(a0, a1, a2, a3, lanes);
  for (uint64_t l = 0; i < n; ++i, ++l) lanes[l] += static_cast<double>(p[i]) * p[i];
  return reduce_lanes(lanes);
}

// f32_to_bf16 of eight fp32 sums, in vector form: round to nearest even,
// every NaN to the quiet NaN.
__attribute__((target("avx2"))) static inline __m128i round_to_bf16_avx2(__m256 f) {
  const __m256i x = _mm256_castps_si256(f);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7FFFFFFF)), _mm256_set1_epi32(0x7F800000));
  const __m256i r = _mm256_blendv_epi8(rounded, _mm256_set1_epi32(kBf16QuietNan), nan);
  // Each lane holds a value below 2^16: the unsigned pack keeps it as is.
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

__attribute__((target("avx2"))) static inline __m256 widen_bf16_avx2(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

__attribute__((target("avx2,fma"))) void add_bf16_avx2(const uint16_t* s, uint16_t* d, uint64_t n) {
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(d + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m256 sum = _mm256_add_ps(widen_bf16_avx2(a), widen_bf16_avx2(b));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), round_to_bf16_avx2(sum));
  }
  _mm256_zeroupper();
  for (; i < n; ++i) d[i] = f32_to_bf16(bf16_to_f32(d[i]) + bf16_to_f32(s[i]));
}

__attribute__((target("avx2,fma"))) double sumsq_bf16_avx2(const uint16_t* p, uint64_t n) {
  __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
  uint64_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes) {
    const __m256 lo = widen_bf16_avx2(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i)));
    const __m256 hi = widen_bf16_avx2(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i + 8)));
    const __m256d x0 = _mm256_cvtps_pd(_mm256_castps256_ps128(lo)), x1 = _mm256_cvtps_pd(_mm256_extractf128_ps(lo, 1));
    const __m256d x2 = _mm256_cvtps_pd(_mm256_castps256_ps128(hi)), x3 = _mm256_cvtps_pd(_mm256_extractf128_ps(hi, 1));
    a0 = _mm256_fmadd_pd(x0, x0, a0);
    a1 = _mm256_fmadd_pd(x1, x1, a1);
    a2 = _mm256_fmadd_pd(x2, x2, a2);
    a3 = _mm256_fmadd_pd(x3, x3, a3);
  }
  double lanes[kSumLanes];
  store_lanes_avx2(a0, a1, a2, a3, lanes);
  for (uint64_t l = 0; i < n; ++i, ++l) {
    const double v = bf16_to_f32(p[i]);
    lanes[l] += v * v;
  }
  return reduce_lanes(lanes);
}

bool cpu_has_avx2_fma() {
  const cpu::Features& f = cpu::features();
  return f.avx2 && f.fma;
}
#endif

}  // namespace detail

GradStats grad_stats(const void* data, zd_dtype dt, uint64_t n) {
  GradStats s;
  if (dt == ZD_DTYPE_F32) {
    const float* p = static_cast<const float*>(data);
#if ZEROD_GRAD_MATH_X86
    static const bool avx2 = detail::cpu_has_avx2_fma();
    s.sumsq = avx2 ? detail::sumsq_f32_avx2(p, n) : detail::sumsq_f32_baseline(p, n);
#else
    s.sumsq = detail::sumsq_f32_baseline(p, n);
#endif
  } else if (dt == ZD_DTYPE_BF16) {
    const uint16_t* p = static_cast<const uint16_t*>(data);
#if ZEROD_GRAD_MATH_X86
    static const bool avx2 = detail::cpu_has_avx2_fma();
    s.sumsq = avx2 ? detail::sumsq_bf16_avx2(p, n) : detail::sumsq_bf16_baseline(p, n);
#else
    s.sumsq = detail::sumsq_bf16_baseline(p, n);
#endif
  } else {
    // Four partial sums let the loop pipeline; their order is fixed, so the
    // result is the same on every run.
    double acc[4] = {0, 0, 0, 0};
    for (uint64_t i = 0; i < n; ++i) {
      const double v = load_as_float(data, dt, i);
      acc[i & 3] += v * v;
    }
    s.sumsq = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  }
  s.finite = std::isfinite(s.sumsq);
  return s;
}

}  // namespace zerod
