// AVX-512 F/BW/VL paths. Built with -mavx512f -mavx512bw -mavx512vl (and the
// AVX2 set); called only after isa_supported(Isa::avx512). Bodies of 4 and 1
// vectors (32 ZMM registers leave room; 8 in Adam's walk of large ranges),
// then one masked vector for the tail, so no element takes the scalar loop.
// bf16 is rounded with integer ops, which needs no AVX512-BF16.

#include "avx512_vec.h"
#include "zero_upper.h"

namespace zerod::optim {
namespace {

struct AdamVec {
  explicit AdamVec(const detail::AdamConsts& c)
      : grad_scale(_mm512_set1_ps(c.grad_scale)),
        beta1(_mm512_set1_ps(c.beta1)),
        one_minus_beta1(_mm512_set1_ps(c.one_minus_beta1)),
        beta2(_mm512_set1_ps(c.beta2)),
        one_minus_beta2(_mm512_set1_ps(c.one_minus_beta2)),
        eps(_mm512_set1_ps(c.eps)),
        inv_sqrt_bc2(_mm512_set1_ps(c.inv_sqrt_bc2)),
        neg_step(_mm512_set1_ps(c.neg_step)),
        l2_decay(_mm512_set1_ps(c.l2_decay)),
        neg_lr_decay(_mm512_set1_ps(c.neg_lr_decay)),
        l2(c.l2),
        decoupled(c.decoupled) {}
  __m512 grad_scale, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, inv_sqrt_bc2, neg_step,
      l2_decay, neg_lr_decay;
  bool l2, decoupled;
};

// SD: what the state arrays hold. Nt: the working copy through stream_work
// (adam_run_large; never Masked).
template <int S, bool Masked, Dtype G, Work W, St SD, bool Nt = false>
inline void adam_block(const AdamVec& c, const Range& r, const AdamState& s, size_t i, __mmask16 k) {
  static_assert(!(Nt && Masked), "streaming stores have no masked form");
#pragma GCC unroll 8
  for (int j = 0; j < S; ++j) {
    const size_t o = i + j * kLanes;
    __m512 p = load_f32<Masked>(r.master + o, k);
    __m512 g = _mm512_mul_ps(load_grad<G, Masked>(r.grad, o, k), c.grad_scale);
    __m512 m = load_state<SD, Masked>(s.exp_avg, o, k);
    __m512 v = load_state<SD, Masked>(s.exp_avg_sq, o, k);
    if (c.l2) g = _mm512_fmadd_ps(c.l2_decay, p, g);
    m = _mm512_fmadd_ps(c.one_minus_beta1, g, _mm512_mul_ps(c.beta1, m));
    v = _mm512_fmadd_ps(c.one_minus_beta2, _mm512_mul_ps(g, g), _mm512_mul_ps(c.beta2, v));
    const __m512 denom = _mm512_fmadd_ps(_mm512_sqrt_ps(v), c.inv_sqrt_bc2, c.eps);
    if (c.decoupled) p = _mm512_fmadd_ps(c.neg_lr_decay, p, p);
    p = _mm512_fmadd_ps(c.neg_step, _mm512_div_ps(m, denom), p);
    store_f32<Masked>(r.master + o, k, p);
    store_state<SD, Masked>(s.exp_avg, o, k, m);
    store_state<SD, Masked>(s.exp_avg_sq, o, k, v);
    if constexpr (Nt) {
      stream_work<W>(r.work, o, p);
    } else {
      store_work<W, Masked>(r.work, o, k, p);
    }
  }
}

// Ranges from this many elements with a working copy take adam_run_large
// (kStreamWork, kernels.h, says why this size).
constexpr size_t kLargeRange = kStreamWork;

// A range with a working copy, from kLargeRange elements (a range far larger
// than the caches, or an engine tile of one): one walk from the start in
// bodies of 8 vectors, the working copy by streaming stores from its
// first vector boundary (no read-for-ownership of lines that are only
// written: 30 bytes a parameter instead of 32 with a bf16 copy).
// Why not the AVX2 path's walk of the two halves at once, which this path
// also took until 2026-11-26: on the 2-core Intel Xeon VM (AVX-512 and AMX,
// where issue 33 was measured) it was the slower walk. Timed there by a
// harness calling the kernels as bench_cpu_adam's (c) rows do (100M
// parameters, fp32 gradients, 2 MiB pages, kernels interleaved step by
// step, 6 quiet runs, 2026-11-26 21:42-21:47 UTC), against the two halves:
// one walk from the start +4-5% in fp32 at 1 thread and +2-6% at 2, +0-4%
// with a bf16 working copy; bodies of 8 vectors instead of 4 a further
// +1.5% (0-3%) with the bf16 copy (our guess at why: its streaming stores
// then fill four whole lines in a row). Against the AVX2 path (two halves; auto picks this
// one wherever AVX-512 runs): +7-9% at 1 thread, +5-10% at 2 (fp32
// 0.96-1.01 G params/s at 1 thread, 1.75-1.91 G at 2). The halves were
// measured on an AMD EPYC (Zen 3) VM, where they gained 4% at 1 thread; no
// AVX-512 AMD CPU was at hand. Without a working copy the plain loop of
// adam_run, which those ranges take, is as fast as this walk in fp32
// (within 1-2%, either way).
// Each element gets the same operations as in adam_run: results identical.
template <Dtype G, Work W, St SD>
void adam_run_large(const AdamVec& c, const Range& r, const AdamState& s, size_t head) {
  if (head > 0) adam_block<1, true, G, W, SD>(c, r, s, 0, tail_mask(head));  // up to the working copy's boundary
  size_t i = head;
  for (; i + 8 * kLanes <= r.count; i += 8 * kLanes) adam_block<8, false, G, W, SD, true>(c, r, s, i, kAll);
  for (; i + kLanes <= r.count; i += kLanes) adam_block<1, false, G, W, SD, true>(c, r, s, i, kAll);
  if (i < r.count) adam_block<1, true, G, W, SD>(c, r, s, i, tail_mask(r.count - i));
  _mm_sfence();
}

template <Dtype G, Work W, St SD>
void adam_run(const detail::AdamConsts& consts, const Range& r, const AdamState& s) {
  const AdamVec c(consts);
  if constexpr (W != Work::none) {
    if (r.count >= kLargeRange) {
      const size_t head = work_head<W>(r.work);
      if (head != SIZE_MAX) return adam_run_large<G, W, SD>(c, r, s, head);
    }
  }
  size_t i = 0;
  for (; i + 4 * kLanes <= r.count; i += 4 * kLanes) adam_block<4, false, G, W, SD>(c, r, s, i, kAll);
  for (; i + kLanes <= r.count; i += kLanes) adam_block<1, false, G, W, SD>(c, r, s, i, kAll);
  if (i < r.count) adam_block<1, true, G, W, SD>(c, r, s, i, tail_mask(r.count - i));
}

struct SgdVec {
  explicit SgdVec(const detail::SgdConsts& c)
      : grad_scale(_mm512_set1_ps(c.grad_scale)),
        decay(_mm512_set1_ps(c.decay)),
        momentum(_mm512_set1_ps(c.momentum)),
        one_minus_dampening(_mm512_set1_ps(c.one_minus_dampening)),
        neg_lr(_mm512_set1_ps(c.neg_lr)),
        has_decay(c.has_decay),
        has_momentum(c.has_momentum),
        first_step(c.first_step),
        nesterov(c.nesterov) {}
  __m512 grad_scale, decay, momentum, one_minus_dampening, neg_lr;
  bool has_decay, has_momentum, first_step, nesterov;
};

template <int S, bool Masked, Dtype G, Work W>
inline void sgd_block(const SgdVec& c, const Range& r, float* buf, size_t i, __mmask16 k) {
#pragma GCC unroll 4
  for (int j = 0; j < S; ++j) {
    const size_t o = i + j * kLanes;
    __m512 p = load_f32<Masked>(r.master + o, k);
    __m512 g = _mm512_mul_ps(load_grad<G, Masked>(r.grad, o, k), c.grad_scale);
    if (c.has_decay) g = _mm512_fmadd_ps(c.decay, p, g);
    if (c.has_momentum) {
      const __m512 b = c.first_step ? g
                                    : _mm512_fmadd_ps(c.one_minus_dampening, g,
                                                      _mm512_mul_ps(c.momentum, load_f32<Masked>(buf + o, k)));
      store_f32<Masked>(buf + o, k, b);
      g = c.nesterov ? _mm512_fmadd_ps(c.momentum, b, g) : b;
    }
    p = _mm512_fmadd_ps(c.neg_lr, g, p);
    store_f32<Masked>(r.master + o, k, p);
    store_work<W, Masked>(r.work, o, k, p);
  }
}

template <Dtype G, Work W>
void sgd_run(const detail::SgdConsts& consts, const Range& r, float* buf) {
  const SgdVec c(consts);
  size_t i = 0;
  for (; i + 4 * kLanes <= r.count; i += 4 * kLanes) sgd_block<4, false, G, W>(c, r, buf, i, kAll);
  for (; i + kLanes <= r.count; i += kLanes) sgd_block<1, false, G, W>(c, r, buf, i, kAll);
  if (i < r.count) sgd_block<1, true, G, W>(c, r, buf, i, tail_mask(r.count - i));
}

}  // namespace

bool adam_avx512(const AdamParams& hp, const Range& r, const AdamState& s) {
  const ZeroUpperOnReturn clean;
  const detail::AdamConsts c = detail::prepare_adam(hp);
  return detail::with_state(s, [&]<St SD>() {
    return detail::with_types(r, [&]<Dtype G, Work W>() { adam_run<G, W, SD>(c, r, s); });
  });
}

bool sgd_avx512(const SgdParams& hp, const Range& r, float* momentum_buffer) {
  const ZeroUpperOnReturn clean;
  const detail::SgdConsts c = detail::prepare_sgd(hp);
  return detail::with_types(r, [&]<Dtype G, Work W>() { sgd_run<G, W>(c, r, momentum_buffer); });
}

}  // namespace zerod::optim
