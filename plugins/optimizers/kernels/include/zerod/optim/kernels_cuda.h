// The optimizer updates on a CUDA device: same algorithms and fp32 operation
// order as kernels.h, one element per thread in a grid-stride loop. Declared
// only when the library was built with CUDA (ZEROD_HAVE_CUDA); this header
// needs no CUDA headers, so plain C++ callers can include it.
#ifndef ZEROD_OPTIM_KERNELS_CUDA_H
#define ZEROD_OPTIM_KERNELS_CUDA_H

#include <zerod/optim/kernels.h>

namespace zerod::optim::cuda {

// Result codes: 0 = launched, kBadDtype = a dtype is not a Dtype value, or
// an Adam state dtype other than f32 and bf16 (nothing launched), anything
// else is the cudaError_t of the launch.
constexpr int kBadDtype = -1;

// Enqueues the update on `stream` (a cudaStream_t; null is the default
// stream). Every pointer in r and s is device memory. Does not synchronise.
int adam_update(const AdamParams& hp, const Range& r, const AdamState& s, void* stream);
int sgd_update(const SgdParams& hp, const Range& r, float* momentum_buffer, void* stream);

// A readable message for a result code.
const char* error_string(int code);

}  // namespace zerod::optim::cuda

#endif  // ZEROD_OPTIM_KERNELS_CUDA_H
