// 1-bit Adam, AVX-512 F/BW/VL. Called only after isa_supported(Isa::avx512).
// Bodies of 4 and 1 vectors, then one masked vector for the tail, as
// avx512.cpp does for Adam.
#include "avx512_vec.h"
#include "onebit_adam_element.h"
#include "zero_upper.h"

namespace zerod::optim {
namespace {

struct OnebitVec {
  explicit OnebitVec(const detail::OnebitConsts& c)
      : grad_scale(_mm512_set1_ps(c.grad_scale)),
        beta1(_mm512_set1_ps(c.beta1)),
        one_minus_beta1(_mm512_set1_ps(c.one_minus_beta1)),
        beta2(_mm512_set1_ps(c.beta2)),
        one_minus_beta2(_mm512_set1_ps(c.one_minus_beta2)),
        eps(_mm512_set1_ps(c.eps)),
        neg_lr(_mm512_set1_ps(c.neg_lr)),
        decay(_mm512_set1_ps(c.decay)),
        has_decay(c.has_decay) {}
  __m512 grad_scale, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, neg_lr, decay;
  bool has_decay;

  __m512 m(__m512 m0, __m512 g) const { return _mm512_fmadd_ps(one_minus_beta1, g, _mm512_mul_ps(beta1, m0)); }
  __m512 v(__m512 v0, __m512 g) const {
    return _mm512_fmadd_ps(one_minus_beta2, _mm512_mul_ps(g, g), _mm512_mul_ps(beta2, v0));
  }
  __m512 step(__m512 p, __m512 m0, __m512 v0) const {
    __m512 u = _mm512_div_ps(m0, _mm512_add_ps(_mm512_sqrt_ps(v0), eps));
    if (has_decay) u = _mm512_fmadd_ps(decay, p, u);
    return _mm512_fmadd_ps(neg_lr, u, p);
  }
};

template <int S, bool Masked, Dtype G, Work W>
inline void warmup_block(const OnebitVec& c, const Range& r, const AdamState& s, size_t i, __mmask16 k) {
#pragma GCC unroll 4
  for (int j = 0; j < S; ++j) {
    const size_t o = i + j * kLanes;
    const __m512 g = _mm512_mul_ps(load_grad<G, Masked>(r.grad, o, k), c.grad_scale);
    const __m512 m = c.m(load_f32<Masked>(s.exp_avg + o, k), g);
    const __m512 v = c.v(load_f32<Masked>(s.exp_avg_sq + o, k), g);
    const __m512 p = c.step(load_f32<Masked>(r.master + o, k), m, v);
    store_f32<Masked>(s.exp_avg + o, k, m);
    store_f32<Masked>(s.exp_avg_sq + o, k, v);
    store_f32<Masked>(r.master + o, k, p);
    store_work<W, Masked>(r.work, o, k, p);
  }
}

template <int S, bool Masked, Dtype G>
inline void momentum_block(const OnebitVec& c, const Range& r, const AdamState& s, size_t i, __mmask16 k) {
#pragma GCC unroll 4
  for (int j = 0; j < S; ++j) {
    const size_t o = i + j * kLanes;
    const __m512 g = _mm512_mul_ps(load_grad<G, Masked>(r.grad, o, k), c.grad_scale);
    store_f32<Masked>(s.exp_avg + o, k, c.m(load_f32<Masked>(s.exp_avg + o, k), g));
  }
}

template <int S, bool Masked, Work W>
inline void frozen_block(const OnebitVec& c, const Range& r, const AdamState& s, size_t i, __mmask16 k) {
#pragma GCC unroll 4
  for (int j = 0; j < S; ++j) {
    const size_t o = i + j * kLanes;
    const __m512 p = c.step(load_f32<Masked>(r.master + o, k), load_f32<Masked>(s.exp_avg + o, k),
                            load_f32<Masked>(s.exp_avg_sq + o, k));
    store_f32<Masked>(r.master + o, k, p);
    store_work<W, Masked>(r.work, o, k, p);
  }
}

// Runs Block<4>, Block<1> and a masked Block<1> over the range: the three
// phases share the walk.
template <typename Block4, typename Block1, typename Tail>
inline void walk(size_t count, Block4&& b4, Block1&& b1, Tail&& tail) {
  size_t i = 0;
  for (; i + 4 * kLanes <= count; i += 4 * kLanes) b4(i);
  for (; i + kLanes <= count; i += kLanes) b1(i);
  if (i < count) tail(i, tail_mask(count - i));
}

}  // namespace

bool onebit_adam_avx512(const OnebitAdamParams& hp, OnebitPhase phase, const Range& r, const AdamState& s) {
  const ZeroUpperOnReturn clean;
  const OnebitVec c(detail::prepare_onebit(hp));
  return detail::with_phase(
      phase, r,
      [&]<Dtype G, Work W>() {
        walk(
            r.count, [&](size_t i) { warmup_block<4, false, G, W>(c, r, s, i, kAll); },
            [&](size_t i) { warmup_block<1, false, G, W>(c, r, s, i, kAll); },
            [&](size_t i, __mmask16 k) { warmup_block<1, true, G, W>(c, r, s, i, k); });
      },
      [&]<Dtype G>() {
        walk(
            r.count, [&](size_t i) { momentum_block<4, false, G>(c, r, s, i, kAll); },
            [&](size_t i) { momentum_block<1, false, G>(c, r, s, i, kAll); },
            [&](size_t i, __mmask16 k) { momentum_block<1, true, G>(c, r, s, i, k); });
      },
      [&]<Work W>() {
        walk(
            r.count, [&](size_t i) { frozen_block<4, false, W>(c, r, s, i, kAll); },
            [&](size_t i) { frozen_block<1, false, W>(c, r, s, i, kAll); },
            [&](size_t i, __mmask16 k) { frozen_block<1, true, W>(c, r, s, i, k); });
      });
}

}  // namespace zerod::optim
