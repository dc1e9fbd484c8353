// The engine's own work on a CUDA device: gradient arithmetic and the
// statistics of a step. Plain functions over plain arguments, launched on a
// stream the caller passes (a cudaStream_t as void*), so that the host code
// that calls them needs no CUDA headers. Each rounds as engine/grad/grad_math.h
// does on the CPU: fp32 arithmetic, 16-bit results rounded to nearest even
// (a NaN stays a NaN). Each returns 0, or the cudaError_t of the launch.
#pragma once

#include <cstdint>

namespace zerod::cuda_kernels {

// dst[i] = dst[i] + factor * src[i] (factor 1 exactly: dst[i] + src[i]);
// dtypes are zd_dtype values.
int accumulate(const void* src, int32_t src_dt, void* dst, int32_t dst_dt, uint64_t n, float factor, void* stream);
// p[i] = factor * p[i].
int scale(void* p, int32_t dt, uint64_t n, float factor, void* stream);
// dst[i] = srcs[0][i] + srcs[1][i] + ... in that order, in fp32 for 16-bit
// dtypes, rounded once (engine/grad/grad_math.h sum_sources); at most
// kMaxSources sources, each readable from the stream's device.
constexpr int kMaxSources = 16;
int sum_sources(const void* const* srcs, int nsrc, void* dst, int32_t dt, uint64_t n, void* stream);

// Sums of squares in double. Each span adds the partial sums of a fixed grid
// (kStatsBlocks blocks, each over a fixed strided set of elements) into
// partials[0..kStatsBlocks); finish() sums them in block order into *out (a
// device double). The order never depends on timing: the same gradients
// give the same figure on every run.
constexpr int kStatsBlocks = 1024;
int sumsq_add(const void* data, int32_t dt, uint64_t n, double* partials, void* stream);
int sumsq_finish(const double* partials, double* out, void* stream);

}  // namespace zerod::cuda_kernels
