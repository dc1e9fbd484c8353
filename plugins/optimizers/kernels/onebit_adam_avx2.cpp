// 1-bit Adam, AVX2 + FMA + F16C. Built with -mavx2 -mfma -mf16c; called only
// after isa_supported(Isa::avx2). Bodies of 2 and 1 vectors, then the scalar
// loop, as avx2.cpp does for Adam.
#include "avx2_vec.h"
#include "onebit_adam_element.h"
#include "zero_upper.h"

namespace zerod::optim {
namespace {

struct OnebitVec {
  explicit OnebitVec(const detail::OnebitConsts& c)
      : grad_scale(_mm256_set1_ps(c.grad_scale)),
        beta1(_mm256_set1_ps(c.beta1)),
        one_minus_beta1(_mm256_set1_ps(c.one_minus_beta1)),
        beta2(_mm256_set1_ps(c.beta2)),
        one_minus_beta2(_mm256_set1_ps(c.one_minus_beta2)),
        eps(_mm256_set1_ps(c.eps)),
        neg_lr(_mm256_set1_ps(c.neg_lr)),
        decay(_mm256_set1_ps(c.decay)),
        has_decay(c.has_decay) {}
  __m256 grad_scale, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, neg_lr, decay;
  bool has_decay;

  __m256 m(__m256 m0, __m256 g) const { return _mm256_fmadd_ps(one_minus_beta1, g, _mm256_mul_ps(beta1, m0)); }
  __m256 v(__m256 v0, __m256 g) const {
    return _mm256_fmadd_ps(one_minus_beta2, _mm256_mul_ps(g, g), _mm256_mul_ps(beta2, v0));
  }
  __m256 step(__m256 p, __m256 m0, __m256 v0) const {
    __m256 u = _mm256_div_ps(m0, _mm256_add_ps(_mm256_sqrt_ps(v0), eps));
    if (has_decay) u = _mm256_fmadd_ps(decay, p, u);
    return _mm256_fmadd_ps(neg_lr, u, p);
  }
};

template <int S, Dtype G, Work W>
inline void warmup_block(const OnebitVec& k, const Range& r, const AdamState& s, size_t i) {
#pragma GCC unroll 2
  for (int j = 0; j < S; ++j) {
    const size_t o = i + j * kLanes;
    const __m256 g = _mm256_mul_ps(load_grad<G>(r.grad, o), k.grad_scale);
    const __m256 m = k.m(_mm256_loadu_ps(s.exp_avg + o), g);
    const __m256 v = k.v(_mm256_loadu_ps(s.exp_avg_sq + o), g);
    const __m256 p = k.step(_mm256_loadu_ps(r.master + o), m, v);
    _mm256_storeu_ps(s.exp_avg + o, m);
    _mm256_storeu_ps(s.exp_avg_sq + o, v);
    _mm256_storeu_ps(r.master + o, p);
    store_work<W>(r.work, o, p);
  }
}

template <int S, Dtype G>
inline void momentum_block(const OnebitVec& k, const Range& r, const AdamState& s, size_t i) {
#pragma GCC unroll 2
  for (int j = 0; j < S; ++j) {
    const size_t o = i + j * kLanes;
    const __m256 g = _mm256_mul_ps(load_grad<G>(r.grad, o), k.grad_scale);
    _mm256_storeu_ps(s.exp_avg + o, k.m(_mm256_loadu_ps(s.exp_avg + o), g));
  }
}

template <int S, Work W>
inline void frozen_block(const OnebitVec& k, const Range& r, const AdamState& s, size_t i) {
#pragma GCC unroll 2
  for (int j = 0; j < S; ++j) {
    const size_t o = i + j * kLanes;
    const __m256 p =
        k.step(_mm256_loadu_ps(r.master + o), _mm256_loadu_ps(s.exp_avg + o), _mm256_loadu_ps(s.exp_avg_sq + o));
    _mm256_storeu_ps(r.master + o, p);
    store_work<W>(r.work, o, p);
  }
}

}  // namespace

bool onebit_adam_avx2(const OnebitAdamParams& hp, OnebitPhase phase, const Range& r, const AdamState& s) {
  const ZeroUpperOnReturn clean;
  const detail::OnebitConsts c = detail::prepare_onebit(hp);
  const OnebitVec k(c);
  return detail::with_phase(
      phase, r,
      [&]<Dtype G, Work W>() {
        size_t i = 0;
        for (; i + 2 * kLanes <= r.count; i += 2 * kLanes) warmup_block<2, G, W>(k, r, s, i);
        for (; i + kLanes <= r.count; i += kLanes) warmup_block<1, G, W>(k, r, s, i);
        detail::onebit_warmup_loop<G, W>(c, r, s, i);
      },
      [&]<Dtype G>() {
        size_t i = 0;
        for (; i + 2 * kLanes <= r.count; i += 2 * kLanes) momentum_block<2, G>(k, r, s, i);
        for (; i + kLanes <= r.count; i += kLanes) momentum_block<1, G>(k, r, s, i);
        detail::onebit_momentum_loop<G>(c, r, s, i);
      },
      [&]<Work W>() {
        size_t i = 0;
        for (; i + 2 * kLanes <= r.count; i += 2 * kLanes) frozen_block<2, W>(k, r, s, i);
        for (; i + kLanes <= r.count; i += kLanes) frozen_block<1, W>(k, r, s, i);
        detail::onebit_frozen_loop<W>(c, r, s, i);
      });
}

}  // namespace zerod::optim
