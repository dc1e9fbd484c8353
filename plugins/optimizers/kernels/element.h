// The per-element algorithms in fp32 and the scalar loops built on them. The
// scalar reference is these loops; the AVX2 path reuses them for its tail.
//
// Everything here has internal linkage (anonymous namespace): the header is
// compiled into translation units with different -m flags, and a shared
// out-of-line copy could be an AVX-512 one running on a baseline CPU.
// Fused multiply-adds are spelled out (__builtin_fmaf) where the vector code
// uses one, and the library is built with -ffp-contract=off, so the scalar and
// vector paths round identically.
#ifndef ZEROD_OPTIM_ELEMENT_H
#define ZEROD_OPTIM_ELEMENT_H

#include <zerod/kit/half.h>
#include <zerod/optim/kernels.h>

#include <cstddef>
#include <cstdint>

#include "prepared.h"

namespace zerod::optim::detail {
namespace {

// What the working copy is written as; `none` when Range::work is null.
enum class Work { none, f32, bf16, f16 };

// Calls f.template operator()<G, W>() for the range's dtypes; false for a
// dtype that is not a Dtype value.
template <Dtype G, typename F>
bool with_work(const Range& r, F&& f) {
  if (r.work == nullptr) {
    f.template operator()<G, Work::none>();
    return true;
  }
  switch (r.work_dtype) {
    case Dtype::f32: f.template operator()<G, Work::f32>(); return true;
    case Dtype::bf16: f.template operator()<G, Work::bf16>(); return true;
    case Dtype::f16: f.template operator()<G, Work::f16>(); return true;
  }
  return false;
}

// What the Adam state arrays hold (AdamState::dtype, f32 or bf16).
enum class St { f32, bf16 };

// Calls f.template operator()<S>() for the state's dtype and returns what
// it returns; false for a dtype the state cannot be kept in.
template <typename F>
bool with_state(const AdamState& s, F&& f) {
  switch (s.dtype) {
    case Dtype::f32: return f.template operator()<St::f32>();
    case Dtype::bf16: return f.template operator()<St::bf16>();
    default: return false;
  }
}

template <typename F>
bool with_types(const Range& r, F&& f) {
  switch (r.grad_dtype) {
    case Dtype::f32: return with_work<Dtype::f32>(r, f);
    case Dtype::bf16: return with_work<Dtype::bf16>(r, f);
    case Dtype::f16: return with_work<Dtype::f16>(r, f);
  }
  return false;
}

template <Dtype G>
inline float load_grad(const void* g, size_t i) {
  if constexpr (G == Dtype::f32) {
    return static_cast<const float*>(g)[i];
  } else if constexpr (G == Dtype::bf16) {
    return bf16_to_f32(static_cast<const uint16_t*>(g)[i]);
  } else {
    return f16_to_f32(static_cast<const uint16_t*>(g)[i]);
  }
}

template <Work W>
inline void store_work(void* w, size_t i, float p) {
  if constexpr (W == Work::f32) {
    static_cast<float*>(w)[i] = p;
  } else if constexpr (W == Work::bf16) {
    static_cast<uint16_t*>(w)[i] = f32_to_bf16(p);
  } else if constexpr (W == Work::f16) {
    static_cast<uint16_t*>(w)[i] = f32_to_f16(p);
  }
}

// A state element widened to fp32 (exact), and stored back: bf16 rounded to
// nearest even, as the working copy is.
template <St S>
inline float load_state(const float* s, size_t i) {
  if constexpr (S == St::f32) {
    return s[i];
  } else {
    return bf16_to_f32(reinterpret_cast<const uint16_t*>(s)[i]);
  }
}

template <St S>
inline void store_state(float* s, size_t i, float x) {
  if constexpr (S == St::f32) {
    s[i] = x;
  } else {
    reinterpret_cast<uint16_t*>(s)[i] = f32_to_bf16(x);
  }
}

inline void adam_element(const AdamConsts& c, float& p, float g, float& m, float& v) {
  g = g * c.grad_scale;
  if (c.l2) g = __builtin_fmaf(c.l2_decay, p, g);
  m = __builtin_fmaf(c.one_minus_beta1, g, c.beta1 * m);
  v = __builtin_fmaf(c.one_minus_beta2, g * g, c.beta2 * v);
  const float denom = __builtin_fmaf(__builtin_sqrtf(v), c.inv_sqrt_bc2, c.eps);
  if (c.decoupled) p = __builtin_fmaf(c.neg_lr_decay, p, p);
  p = __builtin_fmaf(c.neg_step, m / denom, p);
}

// buf is null when there is no momentum.
inline void sgd_element(const SgdConsts& c, float& p, float g, float* buf) {
  g = g * c.grad_scale;
  if (c.has_decay) g = __builtin_fmaf(c.decay, p, g);
  if (buf != nullptr) {
    const float b = c.first_step ? g : __builtin_fmaf(c.one_minus_dampening, g, c.momentum * *buf);
    *buf = b;
    g = c.nesterov ? __builtin_fmaf(c.momentum, b, g) : b;
  }
  p = __builtin_fmaf(c.neg_lr, g, p);
}

// S: what the state arrays hold; the update is the same fp32 arithmetic
// either way, only the loads widen and the stores round.
template <Dtype G, Work W, St S = St::f32>
void adam_loop(const AdamConsts& c, const Range& r, const AdamState& s, size_t begin) {
  for (size_t i = begin; i < r.count; ++i) {
    float p = r.master[i];
    float m = load_state<S>(s.exp_avg, i);
    float v = load_state<S>(s.exp_avg_sq, i);
    adam_element(c, p, load_grad<G>(r.grad, i), m, v);
    r.master[i] = p;
    store_state<S>(s.exp_avg, i, m);
    store_state<S>(s.exp_avg_sq, i, v);
    store_work<W>(r.work, i, p);
  }
}

template <Dtype G, Work W>
void sgd_loop(const SgdConsts& c, const Range& r, float* buf, size_t begin) {
  for (size_t i = begin; i < r.count; ++i) {
    float p = r.master[i];
    sgd_element(c, p, load_grad<G>(r.grad, i), c.has_momentum ? buf + i : nullptr);
    r.master[i] = p;
    store_work<W>(r.work, i, p);
  }
}

}  // namespace
}  // namespace zerod::optim::detail

#endif  // ZEROD_OPTIM_ELEMENT_H
