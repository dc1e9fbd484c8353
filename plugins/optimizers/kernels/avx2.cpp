// AVX2 + FMA + F16C paths. Built with -mavx2 -mfma -mf16c; called only after
// isa_supported(Isa::avx2). Bodies of 2 and 1 vectors, then the scalar loop:
// wider unrolling spills the 16 YMM registers (deepspeed-internals.md §1.3).
#include "avx2_vec.h"
#include "zero_upper.h"

namespace zerod::optim {
namespace {

struct AdamVec {
  explicit AdamVec(const detail::AdamConsts& c)
      : grad_scale(_mm256_set1_ps(c.grad_scale)),
        beta1(_mm256_set1_ps(c.beta1)),
        one_minus_beta1(_mm256_set1_ps(c.one_minus_beta1)),
        beta2(_mm256_set1_ps(c.beta2)),
        one_minus_beta2(_mm256_set1_ps(c.one_minus_beta2)),
        eps(_mm256_set1_ps(c.eps)),
        inv_sqrt_bc2(_mm256_set1_ps(c.inv_sqrt_bc2)),
        neg_step(_mm256_set1_ps(c.neg_step)),
        l2_decay(_mm256_set1_ps(c.l2_decay)),
        neg_lr_decay(_mm256_set1_ps(c.neg_lr_decay)),
        l2(c.l2),
        decoupled(c.decoupled) {}
  __m256 grad_scale, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, inv_sqrt_bc2, neg_step,
      l2_decay, neg_lr_decay;
  bool l2, decoupled;
};

// SD: what the state arrays hold. Nt: the working copy through stream_work
// (adam_run_large).
template <int S, Dtype G, Work W, St SD, bool Nt = false>
inline void adam_block(const AdamVec& k, const Range& r, const AdamState& s, size_t i) {
#pragma GCC unroll 4
  for (int j = 0; j < S; ++j) {
    const size_t o = i + j * kLanes;
    __m256 p = _mm256_loadu_ps(r.master + o);
    __m256 g = _mm256_mul_ps(load_grad<G>(r.grad, o), k.grad_scale);
    __m256 m = load_state<SD>(s.exp_avg, o);
    __m256 v = load_state<SD>(s.exp_avg_sq, o);
    if (k.l2) g = _mm256_fmadd_ps(k.l2_decay, p, g);
    m = _mm256_fmadd_ps(k.one_minus_beta1, g, _mm256_mul_ps(k.beta1, m));
    v = _mm256_fmadd_ps(k.one_minus_beta2, _mm256_mul_ps(g, g), _mm256_mul_ps(k.beta2, v));
    const __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(v), k.inv_sqrt_bc2, k.eps);
    if (k.decoupled) p = _mm256_fmadd_ps(k.neg_lr_decay, p, p);
    p = _mm256_fmadd_ps(k.neg_step, _mm256_div_ps(m, denom), p);
    _mm256_storeu_ps(r.master + o, p);
    store_state<SD>(s.exp_avg, o, m);
    store_state<SD>(s.exp_avg_sq, o, v);
    if constexpr (Nt) {
      stream_work<W>(r.work, o, p);
    } else {
      store_work<W>(r.work, o, p);
    }
  }
}

// Ranges from this many elements (4 MiB of each fp32 array) take
// adam_run_large. Why a threshold: the two halves pay only where the arrays
// stream from DRAM. Ranges from kStreamWork elements (kernels.h) with a
// working copy stream it below this size too (adam_run_streaming).
constexpr size_t kLargeRange = size_t{1} << 20;
// Elements of one half taken before turning to the other: 4 lines a stream.
constexpr size_t kTurn = 64;

// A range far larger than the caches: the step is bound by memory traffic,
// 28 bytes a parameter (read p, g, m, v; write p, m, v), and at one thread by
// how many lines one core keeps in flight rather than by the DRAM. The core's
// hardware prefetchers follow each stream only so far ahead, and start over
// at every 4 KiB page; so this walks the two halves of the range at once,
// kTurn elements of each in turn, giving them eight streams instead of four.
// The halves start 2 KiB apart modulo a page, so that their lines fall in
// different L1 sets. The working copy is written and never read here:
// streaming stores spare reading each of its lines before overwriting it
// (read-for-ownership), 30 bytes a parameter instead of 32 with a bf16 copy.
// p, m and v keep plain stores: their lines were just read and are in the
// cache, and streaming stores on them measured 35% slower.
// Measured on a 2-core AMD EPYC (Zen 3, AVX2) VM at 100M parameters against
// the plain loop, medians of 9-15 interleaved rounds: the two halves +4% at
// 1 thread and even (+0%) at 2; the streaming working copy +7-10% at both.
// Four, six or eight parts, and software prefetch (of every line or of each
// page's first lines, 0.5-4 KiB ahead), were no faster or much slower.
// Each element gets the same operations as in adam_run, so the results are
// identical; only the order in which elements are visited changes.
template <Dtype G, Work W, St SD, bool Nt>
void adam_run_large(const AdamVec& k, const detail::AdamConsts& c, const Range& r, const AdamState& s,
                    size_t head) {
  Range first = r;
  first.count = head;  // up to the working copy's first vector boundary
  detail::adam_loop<G, W, SD>(c, first, s, 0);
  const size_t n = r.count - head;
  const size_t part = (n / 2 / 1024 - 1) * 1024 + 512;  // a multiple of kTurn, (n/2 - 512, n/2]
  for (size_t i = head; i < head + part; i += kTurn) {
    for (size_t j = 0; j < kTurn; j += 2 * kLanes) adam_block<2, G, W, SD, Nt>(k, r, s, i + j);
    for (size_t j = 0; j < kTurn; j += 2 * kLanes) adam_block<2, G, W, SD, Nt>(k, r, s, part + i + j);
  }
  size_t i = head + 2 * part;
  for (; i + 2 * kLanes <= r.count; i += 2 * kLanes) adam_block<2, G, W, SD, Nt>(k, r, s, i);
  for (; i + kLanes <= r.count; i += kLanes) adam_block<1, G, W, SD, Nt>(k, r, s, i);
  detail::adam_loop<G, W, SD>(c, r, s, i);
  if constexpr (Nt) _mm_sfence();
}

// A range of kStreamWork to kLargeRange elements with a working copy: the
// plain loop, the working copy by streaming stores from its first vector
// boundary (an engine tile of a large update; kernels.h). The same
// operations on each element as adam_run's plain loop: results identical.
template <Dtype G, Work W, St SD>
void adam_run_streaming(const AdamVec& k, const detail::AdamConsts& c, const Range& r, const AdamState& s,
                        size_t head) {
  Range first = r;
  first.count = head;
  detail::adam_loop<G, W, SD>(c, first, s, 0);
  size_t i = head;
  for (; i + 2 * kLanes <= r.count; i += 2 * kLanes) adam_block<2, G, W, SD, true>(k, r, s, i);
  for (; i + kLanes <= r.count; i += kLanes) adam_block<1, G, W, SD, true>(k, r, s, i);
  detail::adam_loop<G, W, SD>(c, r, s, i);
  _mm_sfence();
}

template <Dtype G, Work W, St SD>
void adam_run(const detail::AdamConsts& c, const Range& r, const AdamState& s) {
  const AdamVec k(c);
  if (r.count >= kLargeRange) {
    if constexpr (W != Work::none) {
      const size_t head = work_head<W>(r.work);
      if (head != SIZE_MAX) return adam_run_large<G, W, SD, true>(k, c, r, s, head);
    }
    return adam_run_large<G, W, SD, false>(k, c, r, s, 0);
  }
  if constexpr (W != Work::none) {
    if (r.count >= kStreamWork) {
      const size_t head = work_head<W>(r.work);
      if (head != SIZE_MAX) return adam_run_streaming<G, W, SD>(k, c, r, s, head);
    }
  }
  size_t i = 0;
  for (; i + 2 * kLanes <= r.count; i += 2 * kLanes) adam_block<2, G, W, SD>(k, r, s, i);
  for (; i + kLanes <= r.count; i += kLanes) adam_block<1, G, W, SD>(k, r, s, i);
  detail::adam_loop<G, W, SD>(c, r, s, i);
}

struct SgdVec {
  explicit SgdVec(const detail::SgdConsts& c)
      : grad_scale(_mm256_set1_ps(c.grad_scale)),
        decay(_mm256_set1_ps(c.decay)),
        momentum(_mm256_set1_ps(c.momentum)),
        one_minus_dampening(_mm256_set1_ps(c.one_minus_dampening)),
        neg_lr(_mm256_set1_ps(c.neg_lr)),
        has_decay(c.has_decay),
        has_momentum(c.has_momentum),
        first_step(c.first_step),
        nesterov(c.nesterov) {}
  __m256 grad_scale, decay, momentum, one_minus_dampening, neg_lr;
  bool has_decay, has_momentum, first_step, nesterov;
};

template <int S, Dtype G, Work W>
inline void sgd_block(const SgdVec& k, const Range& r, float* buf, size_t i) {
#pragma GCC unroll 4
  for (int j = 0; j < S; ++j) {
    const size_t o = i + j * kLanes;
    __m256 p = _mm256_loadu_ps(r.master + o);
    __m256 g = _mm256_mul_ps(load_grad<G>(r.grad, o), k.grad_scale);
    if (k.has_decay) g = _mm256_fmadd_ps(k.decay, p, g);
    if (k.has_momentum) {
      const __m256 b = k.first_step ? g
                                    : _mm256_fmadd_ps(k.one_minus_dampening, g,
                                                      _mm256_mul_ps(k.momentum, _mm256_loadu_ps(buf + o)));
      _mm256_storeu_ps(buf + o, b);
      g = k.nesterov ? _mm256_fmadd_ps(k.momentum, b, g) : b;
    }
    p = _mm256_fmadd_ps(k.neg_lr, g, p);
    _mm256_storeu_ps(r.master + o, p);
    store_work<W>(r.work, o, p);
  }
}

template <Dtype G, Work W>
void sgd_run(const detail::SgdConsts& c, const Range& r, float* buf) {
  const SgdVec k(c);
  size_t i = 0;
  for (; i + 2 * kLanes <= r.count; i += 2 * kLanes) sgd_block<2, G, W>(k, r, buf, i);
  for (; i + kLanes <= r.count; i += kLanes) sgd_block<1, G, W>(k, r, buf, i);
  detail::sgd_loop<G, W>(c, r, buf, i);
}

}  // namespace

bool adam_avx2(const AdamParams& hp, const Range& r, const AdamState& s) {
  const ZeroUpperOnReturn clean;
  const detail::AdamConsts c = detail::prepare_adam(hp);
  return detail::with_state(s, [&]<St SD>() {
    return detail::with_types(r, [&]<Dtype G, Work W>() { adam_run<G, W, SD>(c, r, s); });
  });
}

bool sgd_avx2(const SgdParams& hp, const Range& r, float* momentum_buffer) {
  const ZeroUpperOnReturn clean;
  const detail::SgdConsts c = detail::prepare_sgd(hp);
  return detail::with_types(r, [&]<Dtype G, Work W>() { sgd_run<G, W>(c, r, momentum_buffer); });
}

}  // namespace zerod::optim
