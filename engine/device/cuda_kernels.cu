// Built with --fmad=false: an add after a multiply rounds twice, as the CPU
// loops in engine/grad/grad_math.cpp do.
#include "cuda_kernels.h"

#include <zerod/kit/half.h>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace zerod::cuda_kernels {
namespace {

constexpr int kThreads = 256;
constexpr uint64_t kMaxBlocks = 8192;
constexpr int32_t kF32 = 1, kBF16 = 2;  // zd_dtype values (F16 = 3)

__device__ __forceinline__ float load(const void* p, int32_t dt, uint64_t i) {
  if (dt == kF32) return static_cast<const float*>(p)[i];
  const uint16_t h = static_cast<const uint16_t*>(p)[i];
  if (dt == kBF16) return __uint_as_float(uint32_t{h} << 16);
  return __half2float(__ushort_as_half(h));
}

// The host's rounding (zerod/kit/half.h): nearest even, PyTorch's NaN rule.
// fp16 numbers round in hardware (__float2half_rn is nearest even too); a NaN
// takes the kit's bits rather than whichever NaN the intrinsic makes.
__device__ __forceinline__ void store(void* p, int32_t dt, uint64_t i, float v) {
  if (dt == kF32) {
    static_cast<float*>(p)[i] = v;
    return;
  }
  uint16_t out;
  if (dt == kBF16) {
    out = zerod::f32_to_bf16(v);
  } else {
    const uint32_t x = __float_as_uint(v);
    out = (x & 0x7fffffffu) > 0x7f800000u ? zerod::f16_nan_from_f32_bits(x) : __half_as_ushort(__float2half_rn(v));
  }
  static_cast<uint16_t*>(p)[i] = out;
}

__global__ void accumulate_kernel(const void* src, int32_t sdt, void* dst, int32_t ddt, uint64_t n, float factor,
                                  bool scaled) {
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float s = load(src, sdt, i);
    store(dst, ddt, i, __fadd_rn(load(dst, ddt, i), scaled ? __fmul_rn(factor, s) : s));
  }
}

struct Sources {
  const void* p[kMaxSources];
};

__global__ void sum_sources_kernel(Sources s, int nsrc, void* dst, int32_t dt, uint64_t n) {
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    float acc = load(s.p[0], dt, i);
    for (int k = 1; k < nsrc; ++k) acc = __fadd_rn(acc, load(s.p[k], dt, i));
    store(dst, dt, i, acc);
  }
}

__global__ void scale_kernel(void* p, int32_t dt, uint64_t n, float factor) {
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride)
    store(p, dt, i, __fmul_rn(factor, load(p, dt, i)));
}

// Block b sums the squares of elements b*T + t + k*(kStatsBlocks*T) over k,
// per thread, then the block's threads in a fixed tree.
__global__ void sumsq_kernel(const void* data, int32_t dt, uint64_t n, double* partials) {
  __shared__ double acc[kThreads];
  double s = 0.0;
  const uint64_t stride = uint64_t{kStatsBlocks} * kThreads;
  for (uint64_t i = uint64_t{blockIdx.x} * kThreads + threadIdx.x; i < n; i += stride) {
    const double v = load(data, dt, i);
    s += v * v;
  }
  acc[threadIdx.x] = s;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) acc[threadIdx.x] += acc[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] += acc[0];
}

__global__ void sumsq_finish_kernel(const double* partials, double* out) {
  double s = 0.0;
  for (int b = 0; b < kStatsBlocks; ++b) s += partials[b];
  *out = s;
}

unsigned blocks_for(uint64_t n) {
  const uint64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > kMaxBlocks ? kMaxBlocks : b));
}

}  // namespace

int accumulate(const void* src, int32_t src_dt, void* dst, int32_t dst_dt, uint64_t n, float factor, void* stream) {
  if (n == 0) return 0;
  accumulate_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(src, src_dt, dst, dst_dt, n,
                                                                                      factor, factor != 1.0f);
  return static_cast<int>(cudaGetLastError());
}

int sum_sources(const void* const* srcs, int nsrc, void* dst, int32_t dt, uint64_t n, void* stream) {
  if (n == 0 || nsrc < 1) return 0;
  if (nsrc > kMaxSources) return static_cast<int>(cudaErrorInvalidValue);
  Sources s{};
  for (int k = 0; k < nsrc; ++k) s.p[k] = srcs[k];
  sum_sources_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(s, nsrc, dst, dt, n);
  return static_cast<int>(cudaGetLastError());
}

int scale(void* p, int32_t dt, uint64_t n, float factor, void* stream) {
  if (n == 0) return 0;
  scale_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(p, dt, n, factor);
  return static_cast<int>(cudaGetLastError());
}

int sumsq_add(const void* data, int32_t dt, uint64_t n, double* partials, void* stream) {
  if (n == 0) return 0;
  sumsq_kernel<<<kStatsBlocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(data, dt, n, partials);
  return static_cast<int>(cudaGetLastError());
}

int sumsq_finish(const double* partials, double* out, void* stream) {
  sumsq_finish_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(partials, out);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace zerod::cuda_kernels
