// 1-bit Adam per element in fp32 and the scalar loops of its three phases
// (kernels.h, OnebitPhase). The scalar reference is these loops; the AVX2
// path reuses them for its tail. Same rules as element.h: internal linkage,
// fused multiply-adds spelled out where the vector code has one.
#ifndef ZEROD_OPTIM_ONEBIT_ADAM_ELEMENT_H
#define ZEROD_OPTIM_ONEBIT_ADAM_ELEMENT_H

#include "element.h"

namespace zerod::optim::detail {
namespace {

// m = beta1 m + (1 - beta1) g, for a gradient already multiplied by grad_scale.
inline float onebit_m(const OnebitConsts& c, float m, float g) {
  return __builtin_fmaf(c.one_minus_beta1, g, c.beta1 * m);
}

inline float onebit_v(const OnebitConsts& c, float v, float g) {
  return __builtin_fmaf(c.one_minus_beta2, g * g, c.beta2 * v);
}

// p - lr * (m / (sqrt(v) + eps) + wd * p): no bias correction, the decay
// taken from the old p, as DeepSpeed's OnebitAdam does.
inline float onebit_step(const OnebitConsts& c, float p, float m, float v) {
  float u = m / (__builtin_sqrtf(v) + c.eps);
  if (c.has_decay) u = __builtin_fmaf(c.decay, p, u);
  return __builtin_fmaf(c.neg_lr, u, p);
}

template <Dtype G, Work W>
void onebit_warmup_loop(const OnebitConsts& c, const Range& r, const AdamState& s, size_t begin) {
  for (size_t i = begin; i < r.count; ++i) {
    const float g = load_grad<G>(r.grad, i) * c.grad_scale;
    const float m = onebit_m(c, s.exp_avg[i], g);
    const float v = onebit_v(c, s.exp_avg_sq[i], g);
    const float p = onebit_step(c, r.master[i], m, v);
    s.exp_avg[i] = m;
    s.exp_avg_sq[i] = v;
    r.master[i] = p;
    store_work<W>(r.work, i, p);
  }
}

template <Dtype G>
void onebit_momentum_loop(const OnebitConsts& c, const Range& r, const AdamState& s, size_t begin) {
  for (size_t i = begin; i < r.count; ++i)
    s.exp_avg[i] = onebit_m(c, s.exp_avg[i], load_grad<G>(r.grad, i) * c.grad_scale);
}

template <Work W>
void onebit_frozen_loop(const OnebitConsts& c, const Range& r, const AdamState& s, size_t begin) {
  for (size_t i = begin; i < r.count; ++i) {
    const float p = onebit_step(c, r.master[i], s.exp_avg[i], s.exp_avg_sq[i]);
    r.master[i] = p;
    store_work<W>(r.work, i, p);
  }
}

// Calls warmup.template operator()<G, W>(), momentum.template operator()<G>()
// or frozen.template operator()<W>() for the phase and the dtypes it reads;
// false for a phase or dtype that is not one of their values.
template <typename Warmup, typename Momentum, typename Frozen>
bool with_phase(OnebitPhase phase, const Range& r, Warmup&& warmup, Momentum&& momentum, Frozen&& frozen) {
  switch (phase) {
    case OnebitPhase::warmup: return with_types(r, warmup);
    case OnebitPhase::momentum:
      switch (r.grad_dtype) {
        case Dtype::f32: momentum.template operator()<Dtype::f32>(); return true;
        case Dtype::bf16: momentum.template operator()<Dtype::bf16>(); return true;
        case Dtype::f16: momentum.template operator()<Dtype::f16>(); return true;
      }
      return false;
    case OnebitPhase::frozen:
      return with_work<Dtype::f32>(r, [&]<Dtype, Work W>() { frozen.template operator()<W>(); });
  }
  return false;
}

}  // namespace
}  // namespace zerod::optim::detail

#endif  // ZEROD_OPTIM_ONEBIT_ADAM_ELEMENT_H
