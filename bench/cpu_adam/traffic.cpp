// Built with -O3 (the loops must vectorise), once per ISA level and picked at
// run time, so the yardsticks use the same vector width as the kernel they
// are compared with. The levels are the optimizer kernels' own (-mavx2 -mfma
// -mf16c, and -mavx512f -mavx512bw -mavx512vl on top), and the CPU is asked
// through the project's one probe (zerod/kit/cpu.h), so the bench runs a
// level exactly where the kernels do. Plain functions rather than
// target_clones: an ifunc resolver runs before the sanitizer runtimes start
// and crashes instrumented builds.
#include "traffic.h"

#include "zerod/kit/cpu.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace zerod::bench {
namespace {

using TriadFn = void (*)(double*, const double*, const double*, double, size_t);
using ProxyFn = void (*)(float*, const float*, float*, float*, float, size_t);

#define ZEROD_TRAFFIC_LOOPS(suffix, attr)                                                                   \
  attr void triad_##suffix(double* __restrict a, const double* __restrict b, const double* __restrict c,    \
                           double s, size_t n) {                                                            \
    for (size_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];                                                  \
  }                                                                                                          \
  attr void proxy_##suffix(float* __restrict p, const float* __restrict g, float* __restrict m,             \
                           float* __restrict v, float k, size_t n) {                                        \
    for (size_t i = 0; i < n; ++i) {                                                                         \
      const float gi = g[i];                                                                                 \
      const float mi = m[i] * k + gi;                                                                        \
      const float vi = v[i] * k + gi;                                                                        \
      m[i] = mi;                                                                                             \
      v[i] = vi;                                                                                             \
      p[i] = p[i] + k * (mi + vi);                                                                           \
    }                                                                                                        \
  }

ZEROD_TRAFFIC_LOOPS(base, )
#if defined(__x86_64__)
// The same traffic in the kernel's shape: AVX2 intrinsics, two vectors per
// iteration, unaligned loads, in-place stores.
__attribute__((target("avx2,fma"))) inline void proxy_two_vectors(float* p, const float* g, float* m, float* v,
                                                                  __m256 kk, size_t i) {
  for (size_t j = 0; j < 16; j += 8) {
    const __m256 gi = _mm256_loadu_ps(g + i + j);
    const __m256 mi = _mm256_fmadd_ps(_mm256_loadu_ps(m + i + j), kk, gi);
    const __m256 vi = _mm256_fmadd_ps(_mm256_loadu_ps(v + i + j), kk, gi);
    _mm256_storeu_ps(m + i + j, mi);
    _mm256_storeu_ps(v + i + j, vi);
    _mm256_storeu_ps(p + i + j, _mm256_fmadd_ps(kk, _mm256_add_ps(mi, vi), _mm256_loadu_ps(p + i + j)));
  }
}

// Optionally with software prefetch a fixed distance ahead on all four streams.
template <bool Prefetch>
__attribute__((target("avx2,fma"))) void proxy_kernel_like(float* p, const float* g, float* m, float* v, float k,
                                                           size_t n) {
  const __m256 kk = _mm256_set1_ps(k);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    if constexpr (Prefetch) {
      constexpr size_t ahead = 256;  // elements: 1 KiB per stream
      _mm_prefetch(reinterpret_cast<const char*>(p + i + ahead), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(g + i + ahead), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(m + i + ahead), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(v + i + ahead), _MM_HINT_T0);
    }
    proxy_two_vectors(p, g, m, v, kk, i);
  }
  proxy_base(p + i, g + i, m + i, v + i, k, n - i);
}

// The order in which the AVX2 kernel walks a range of 2^20 elements or more
// (adam_run_large in plugins/optimizers/kernels/avx2.cpp): its two halves at
// once, 64 elements of each in turn, the halves 2 KiB apart modulo a page.
__attribute__((target("avx2,fma"))) void proxy_two_halves(float* p, const float* g, float* m, float* v, float k,
                                                          size_t n) {
  if (n < (size_t{1} << 20)) {  // the kernel's kLargeRange
    proxy_kernel_like<false>(p, g, m, v, k, n);
    return;
  }
  const __m256 kk = _mm256_set1_ps(k);
  const size_t part = (n / 2 / 1024 - 1) * 1024 + 512;
  for (size_t i = 0; i < part; i += 64) {
    for (size_t j = 0; j < 64; j += 16) proxy_two_vectors(p, g, m, v, kk, i + j);
    for (size_t j = 0; j < 64; j += 16) proxy_two_vectors(p, g, m, v, kk, part + i + j);
  }
  const size_t done = 2 * part;
  proxy_kernel_like<false>(p + done, g + done, m + done, v + done, k, n - done);
}

ZEROD_TRAFFIC_LOOPS(v3, __attribute__((target("avx2,fma,f16c"))))
ZEROD_TRAFFIC_LOOPS(v4, __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl"))))

// 4: the AVX-512 kernel's level, 3: the AVX2 kernel's, 0: neither.
int level() {
  if (cpu::has_avx512_f_bw_vl()) return 4;
  if (cpu::has_avx2_fma_f16c()) return 3;
  return 0;
}
#else
int level() { return 0; }
#endif

}  // namespace

void triad(double* a, const double* b, const double* c, double s, size_t n) {
#if defined(__x86_64__)
  static const TriadFn fn = level() == 4 ? triad_v4 : level() == 3 ? triad_v3 : triad_base;
#else
  static const TriadFn fn = triad_base;
#endif
  fn(a, b, c, s, n);
}

void adam_proxy(float* p, const float* g, float* m, float* v, float k, size_t n) {
#if defined(__x86_64__)
  static const ProxyFn fn = level() == 4 ? proxy_v4 : level() == 3 ? proxy_v3 : proxy_base;
#else
  static const ProxyFn fn = proxy_base;
#endif
  fn(p, g, m, v, k, n);
}

}  // namespace zerod::bench

namespace zerod::bench {

bool adam_proxy_variant(int variant, float* p, const float* g, float* m, float* v, float k, size_t n) {
  if (variant == 0) {
    adam_proxy(p, g, m, v, k, n);
    return true;
  }
#if defined(__x86_64__)
  if (level() >= 3) {
    if (variant == 1) proxy_kernel_like<false>(p, g, m, v, k, n);
    else if (variant == 2) proxy_kernel_like<true>(p, g, m, v, k, n);
    else proxy_two_halves(p, g, m, v, k, n);
    return true;
  }
#endif
  return false;
}

}  // namespace zerod::bench
