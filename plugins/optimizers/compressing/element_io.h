// What the compressing optimizers' scalar kernels (0/1 Adam, 1-bit LAMB)
// share: reading a gradient element of any dtype as fp32 and writing the
// working copy. Their loops are plain per-element C++ with every fused
// multiply-add spelled out (std::fma, built with -ffp-contract=off), which
// is what their reference implementations in the tests transcribe.
// `static inline`, as convert.h's: 1-bit LAMB includes this header in a
// translation unit built with -mavx2 as well as in its baseline one, and one
// shared (COMDAT) copy could hand the baseline AVX2 code.
#ifndef ZEROD_OPTIM_COMPRESSING_ELEMENT_IO_H
#define ZEROD_OPTIM_COMPRESSING_ELEMENT_IO_H

#include <zerod/optim/convert.h>
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

// The working copy of element i from its new fp32 master (none when work is NULL).
static inline void store_work(void* work, Dtype dt, size_t i, float x) {
  if (work == nullptr) return;
  switch (dt) {
    case Dtype::bf16: static_cast<uint16_t*>(work)[i] = f32_to_bf16(x); return;
    case Dtype::f16: static_cast<uint16_t*>(work)[i] = f32_to_f16(x); return;
    case Dtype::f32: static_cast<float*>(work)[i] = x; return;
  }
}

}  // namespace zerod::optim::compressing

#endif  // ZEROD_OPTIM_COMPRESSING_ELEMENT_IO_H
