// Elementwise gradient arithmetic the engine does itself (the optimizer
// plugin does the update): adding a contribution into an accumulator, and
// the sum of squares that gives the global norm and the overflow check.
#pragma once

#include <zerod/zerod.h>

#include <cstdint>

namespace zerod {

// dst[i] += src[i] for n elements; any pair of dtypes. 16-bit results are
// rounded to nearest even.
void accumulate(const void* src, zd_dtype src_dt, void* dst, zd_dtype dst_dt, uint64_t n);
// dst[i] = 0 + src[i]: what accumulate() leaves in a zero accumulator, bit
// for bit (a -0 becomes +0), without reading it.
void assign_to_zero(const void* src, zd_dtype src_dt, void* dst, zd_dtype dst_dt, uint64_t n);
// dst[i] += factor * src[i].
void accumulate_scaled(const void* src, zd_dtype src_dt, void* dst, zd_dtype dst_dt, uint64_t n,
                       float factor);
// p[i] *= factor.
void scale_in_place(void* p, zd_dtype dt, uint64_t n, float factor);
// dst[i] = srcs[0][i] + srcs[1][i] + ..., in that order, in fp32 for 16-bit
// types (rounded to nearest even once): the local comm plugin's sum.
void sum_sources(const void* const* srcs, size_t nsrc, void* dst, zd_dtype dt, uint64_t n);

struct GradStats {
  double sumsq = 0.0;
  bool finite = true;  // no inf or NaN among the values
};

// Squares are summed in double: an fp32 value squared cannot overflow it, so
// any inf or NaN shows up as a non-finite sum.
GradStats grad_stats(const void* data, zd_dtype dt, uint64_t n);

// The vector and baseline paths of grad_stats and accumulate, for the test
// that holds them to the same bits; each picks one once per process.
#if defined(__x86_64__) || defined(__i386__)
#define ZEROD_GRAD_MATH_X86 1
#else
#define ZEROD_GRAD_MATH_X86 0
#endif
namespace detail {
constexpr uint64_t kSumLanes = 16;
double sumsq_f32_baseline(const float* p, uint64_t n);
// The bf16 paths of accumulate (bf16 into bf16) and grad_stats, likewise.
void add_bf16_baseline(const uint16_t* s, uint16_t* d, uint64_t n);
double sumsq_bf16_baseline(const uint16_t* p, uint64_t n);
#if ZEROD_GRAD_MATH_X86
double sumsq_f32_avx2(const float* p, uint64_t n);
void add_bf16_avx2(const uint16_t* s, uint16_t* d, uint64_t n);
double sumsq_bf16_avx2(const uint16_t* p, uint64_t n);
bool cpu_has_avx2_fma();
#endif
}  // namespace detail

// A run of gradient elements, for the statistics of a step.
struct GradSpan {
  const void* data;
  zd_dtype dtype;
  uint64_t count;
};

}  // namespace zerod
