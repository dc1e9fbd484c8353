// CUDA updates. Built with --fmad=false and IEEE division and square root
// (nvcc's defaults), so each element rounds as the scalar reference does;
// fp16 rounding uses __float2half_rn, bf16 (working copies and Adam state
// kept in bf16) the CPU's own function; NaNs take zerod/kit/half.h's bits.
#include <zerod/kit/half.h>
#include <zerod/optim/kernels_cuda.h>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "prepared.h"

namespace zerod::optim::cuda {
namespace {

enum class Work { none, f32, bf16, f16 };
// What the Adam state arrays hold (AdamState::dtype).
enum class St { f32, bf16 };

constexpr int kThreads = 256;
constexpr size_t kMaxBlocks = 8192;

template <Dtype G>
__device__ __forceinline__ float load_grad(const void* g, size_t i) {
  if constexpr (G == Dtype::f32) {
    return static_cast<const float*>(g)[i];
  } else if constexpr (G == Dtype::bf16) {
    return __uint_as_float(uint32_t{static_cast<const uint16_t*>(g)[i]} << 16);
  } else {
    return __half2float(__ushort_as_half(static_cast<const uint16_t*>(g)[i]));
  }
}

// Numbers round in hardware (nearest even); a NaN takes the kit's bits, as
// f32_to_f16 on the CPU.
__device__ __forceinline__ uint16_t to_f16(float p) {
  const uint32_t x = __float_as_uint(p);
  return (x & 0x7FFFFFFFu) > 0x7F800000u ? zerod::f16_nan_from_f32_bits(x) : __half_as_ushort(__float2half_rn(p));
}

template <Work W>
__device__ __forceinline__ void store_work(void* w, size_t i, float p) {
  if constexpr (W == Work::f32) {
    static_cast<float*>(w)[i] = p;
  } else if constexpr (W == Work::f16) {
    static_cast<uint16_t*>(w)[i] = to_f16(p);
  } else if constexpr (W == Work::bf16) {
    static_cast<uint16_t*>(w)[i] = zerod::f32_to_bf16(p);
  }
}

template <St S>
__device__ __forceinline__ float load_state(const float* s, size_t i) {
  if constexpr (S == St::f32) {
    return s[i];
  } else {
    return __uint_as_float(uint32_t{reinterpret_cast<const uint16_t*>(s)[i]} << 16);
  }
}

template <St S>
__device__ __forceinline__ void store_state(float* s, size_t i, float x) {
  if constexpr (S == St::f32) {
    s[i] = x;
  } else {
    reinterpret_cast<uint16_t*>(s)[i] = zerod::f32_to_bf16(x);
  }
}

template <Dtype G, Work W, St S>
__global__ void adam_kernel(detail::AdamConsts c, size_t n, float* p, const void* g, float* m, float* v,
                            void* w) {
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    float pi = p[i];
    float gi = load_grad<G>(g, i) * c.grad_scale;
    if (c.l2) gi = fmaf(c.l2_decay, pi, gi);
    const float mi = fmaf(c.one_minus_beta1, gi, c.beta1 * load_state<S>(m, i));
    const float vi = fmaf(c.one_minus_beta2, gi * gi, c.beta2 * load_state<S>(v, i));
    const float denom = fmaf(sqrtf(vi), c.inv_sqrt_bc2, c.eps);
    if (c.decoupled) pi = fmaf(c.neg_lr_decay, pi, pi);
    pi = fmaf(c.neg_step, mi / denom, pi);
    p[i] = pi;
    store_state<S>(m, i, mi);
    store_state<S>(v, i, vi);
    store_work<W>(w, i, pi);
  }
}

template <Dtype G, Work W>
__global__ void sgd_kernel(detail::SgdConsts c, size_t n, float* p, const void* g, float* buf, void* w) {
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    float pi = p[i];
    float gi = load_grad<G>(g, i) * c.grad_scale;
    if (c.has_decay) gi = fmaf(c.decay, pi, gi);
    if (c.has_momentum) {
      const float b = c.first_step ? gi : fmaf(c.one_minus_dampening, gi, c.momentum * buf[i]);
      buf[i] = b;
      gi = c.nesterov ? fmaf(c.momentum, b, gi) : b;
    }
    pi = fmaf(c.neg_lr, gi, pi);
    p[i] = pi;
    store_work<W>(w, i, pi);
  }
}

unsigned blocks_for(size_t n) {
  const size_t want = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(want < kMaxBlocks ? want : kMaxBlocks);
}

template <Dtype G, Work W>
struct AdamLaunch {
  static void run(const detail::AdamConsts& c, const Range& r, const AdamState& s, cudaStream_t st) {
    adam_kernel<G, W, St::f32><<<blocks_for(r.count), kThreads, 0, st>>>(c, r.count, r.master, r.grad,
                                                                           s.exp_avg, s.exp_avg_sq, r.work);
  }
};

// The same with the state kept in bf16.
template <Dtype G, Work W>
struct AdamBf16StateLaunch {
  static void run(const detail::AdamConsts& c, const Range& r, const AdamState& s, cudaStream_t st) {
    adam_kernel<G, W, St::bf16><<<blocks_for(r.count), kThreads, 0, st>>>(c, r.count, r.master, r.grad,
                                                                            s.exp_avg, s.exp_avg_sq, r.work);
  }
};

template <Dtype G, Work W>
struct SgdLaunch {
  static void run(const detail::SgdConsts& c, const Range& r, float* buf, cudaStream_t st) {
    sgd_kernel<G, W><<<blocks_for(r.count), kThreads, 0, st>>>(c, r.count, r.master, r.grad, buf, r.work);
  }
};

// Runs Launch<G, W>::run(args...) for the range's dtypes (C++17: this file is
// built as CUDA 17, which CMake 3.25 knows for nvcc; it knows no CUDA 20).
template <template <Dtype, Work> class Launch, Dtype G, typename... A>
bool with_work(const Range& r, A&&... args) {
  if (r.work == nullptr) return Launch<G, Work::none>::run(args...), true;
  switch (r.work_dtype) {
    case Dtype::f32: return Launch<G, Work::f32>::run(args...), true;
    case Dtype::bf16: return Launch<G, Work::bf16>::run(args...), true;
    case Dtype::f16: return Launch<G, Work::f16>::run(args...), true;
  }
  return false;
}

template <template <Dtype, Work> class Launch, typename... A>
bool with_types(const Range& r, A&&... args) {
  switch (r.grad_dtype) {
    case Dtype::f32: return with_work<Launch, Dtype::f32>(r, args...);
    case Dtype::bf16: return with_work<Launch, Dtype::bf16>(r, args...);
    case Dtype::f16: return with_work<Launch, Dtype::f16>(r, args...);
  }
  return false;
}

}  // namespace

int adam_update(const AdamParams& hp, const Range& r, const AdamState& s, void* stream) {
  if (!dtype_valid(r.grad_dtype) || (r.work != nullptr && !dtype_valid(r.work_dtype))) return kBadDtype;
  if (s.dtype != Dtype::f32 && s.dtype != Dtype::bf16) return kBadDtype;
  if (r.count == 0) return 0;
  const detail::AdamConsts c = detail::prepare_adam(hp);
  if (s.dtype == Dtype::bf16)
    with_types<AdamBf16StateLaunch>(r, c, r, s, static_cast<cudaStream_t>(stream));
  else
    with_types<AdamLaunch>(r, c, r, s, static_cast<cudaStream_t>(stream));
  return static_cast<int>(cudaGetLastError());
}

int sgd_update(const SgdParams& hp, const Range& r, float* momentum_buffer, void* stream) {
  if (!dtype_valid(r.grad_dtype) || (r.work != nullptr && !dtype_valid(r.work_dtype))) return kBadDtype;
  if (r.count == 0) return 0;
  const detail::SgdConsts c = detail::prepare_sgd(hp);
  with_types<SgdLaunch>(r, c, r, momentum_buffer, static_cast<cudaStream_t>(stream));
  return static_cast<int>(cudaGetLastError());
}

const char* error_string(int code) {
  if (code == kBadDtype) return "unsupported dtype";
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

}  // namespace zerod::optim::cuda
