// What the compressing optimizers' loops (0/1 Adam, 1-bit LAMB) share:
// reading a gradient element of any dtype as fp32, writing the working copy
// in a type fixed at compile time, and FMA and square root as builtins.
// Every fused multiply-add is spelled out (built with -ffp-contract=off),
// as their reference implementations in the tests transcribe them; each
// plugin's kernels_impl.h says how its loops vectorise.
// `static`, as zerod/kit/half.h's functions: each plugin includes this header in a
// translation unit built with -mavx2 as well as in its baseline one, and one
// shared (COMDAT) copy could hand the baseline AVX2 code. Builtins rather
// than std::fma/std::sqrt for the same reason: an out-of-line copy of those
// (at -O0) is one shared symbol.
#ifndef ZEROD_OPTIM_COMPRESSING_ELEMENT_IO_H
#define ZEROD_OPTIM_COMPRESSING_ELEMENT_IO_H

#include <zerod/kit/half.h>
#include <zerod/optim/kernels.h>

#include <cstddef>
#include <cstdint>

namespace zerod::optim::compressing {

static inline float load(const void* p, Dtype dt, size_t i) {
  switch (dt) {
    case Dtype::bf16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case Dtype::f16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case Dtype::f32: break;
  }
  return static_cast<const float*>(p)[i];
}

static inline float fma_(float x, float y, float z) { return __builtin_fmaf(x, y, z); }
static inline float sqrt_(float x) { return __builtin_sqrtf(x); }

// The working copy of element i from its new fp32 master (W fixed: no
// branch in the loop).
template <Dtype W>
static inline void store_work(void* work, size_t i, float p) {
  if constexpr (W == Dtype::f32)
    static_cast<float*>(work)[i] = p;
  else if constexpr (W == Dtype::bf16)
    static_cast<uint16_t*>(work)[i] = f32_to_bf16(p);
  else
    static_cast<uint16_t*>(work)[i] = f32_to_f16(p);
}

}  // namespace zerod::optim::compressing

#endif  // ZEROD_OPTIM_COMPRESSING_ELEMENT_IO_H
