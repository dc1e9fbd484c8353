// Memory-traffic yardsticks for the Adam benchmark: a STREAM-style triad and
// a pure-traffic Adam proxy (the loads and stores of an Adam step, FMAs only).
#ifndef ZEROD_BENCH_TRAFFIC_H
#define ZEROD_BENCH_TRAFFIC_H

#include <cstddef>

namespace zerod::bench {

// a[i] = b[i] + s * c[i]. STREAM counts 24 bytes per element.
void triad(double* a, const double* b, const double* c, double s, size_t n);

// Reads p, g, m, v and writes p, m, v in place: 28 bytes per parameter,
// the traffic of an fp32 Adam step, with none of its arithmetic cost.
void adam_proxy(float* p, const float* g, float* m, float* v, float k, size_t n);

// The same traffic, four ways: 0 the loop above as the compiler vectorises
// it, 1 AVX2 intrinsics shaped like the kernel (two vectors per iteration),
// 2 that with software prefetch 1 KiB ahead on every stream, 3 that walking
// the two halves of the range at once, as the AVX2 kernel walks a large
// range. False when the CPU lacks what the variant needs.
inline constexpr int kProxyVariants = 4;
bool adam_proxy_variant(int variant, float* p, const float* g, float* m, float* v, float k, size_t n);

}  // namespace zerod::bench

#endif  // ZEROD_BENCH_TRAFFIC_H
