// The 0/1 Adam loops, written so that the compiler can vectorise them:
// included by kernels.cpp (any x86-64) and kernels_avx2.cpp (-mavx2 -mfma),
// each inside its own namespace, and picked at run time (kernels.cpp), as
// 1-bit LAMB's are (its kernels_impl.h says more).
//
// Why this shape: the per-element form (a dtype switch per element and a
// libm fmaf call per fused multiply-add) ran as scalar code, about a fifth of
// a 0/1 Adam step at stage 0 in libm's fmaf alone. Here the gradient and
// working-copy types and the decay are template arguments, the arrays are
// declared unaliased, and each loop is an `omp simd` loop (-fopenmp-simd:
// the pragma only, no OpenMP run time). Every element's arithmetic is the
// same as before, FMA for FMA (an FMA is correctly rounded whether it is one
// instruction or a libm call), and no loop sums anything, so the results are
// the same bits.
//
// Not a standalone header: no include guard, ZD_ZERO_ONE_NS must be defined.

namespace ZD_ZERO_ONE_NS {

using compressing::fma_;
using compressing::load;
using compressing::sqrt_;
using compressing::store_work;

// The constants as plain values: loads through `c` inside a loop that
// stores could alias it, for all the compiler knows.
struct K {
  float b1, omb1, b2, omb2, eps, decay, neg_lr, gs;
  explicit K(const Consts& c)
      : b1(c.beta1), omb1(c.one_minus_beta1), b2(c.beta2), omb2(c.one_minus_beta2), eps(c.eps), decay(c.decay),
        neg_lr(c.neg_lr), gs(c.grad_scale) {}
};

template <bool kDecay>
inline float update_of(const K& k, float m, float d, float p) {
  const float u = m / d;
  if constexpr (kDecay) return fma_(k.decay, p, u);
  return u;
}

template <Dtype G>
inline float grad_at(const K& k, const void* grad, size_t i) {
  return load(grad, G, i) * k.gs;
}

// The element types and the decay of a call, chosen once: f(G, W, kWork,
// kDecay) as template arguments of `body`.
template <class Body>
void dispatch(const Consts& c, const Arrays& a, bool has_grad, Body body) {
  auto with_decay = [&]<Dtype G, Dtype W, bool kWork>() {
    if (c.has_decay)
      body.template operator()<G, W, kWork, true>();
    else
      body.template operator()<G, W, kWork, false>();
  };
  auto with_work = [&]<Dtype G>() {
    if (a.work == nullptr) return with_decay.template operator()<G, Dtype::f32, false>();
    switch (a.work_dtype) {
      case Dtype::bf16: return with_decay.template operator()<G, Dtype::bf16, true>();
      case Dtype::f16: return with_decay.template operator()<G, Dtype::f16, true>();
      case Dtype::f32: return with_decay.template operator()<G, Dtype::f32, true>();
    }
  };
  if (!has_grad) return with_work.template operator()<Dtype::f32>();
  switch (a.grad_dtype) {
    case Dtype::bf16: return with_work.template operator()<Dtype::bf16>();
    case Dtype::f16: return with_work.template operator()<Dtype::f16>();
    case Dtype::f32: return with_work.template operator()<Dtype::f32>();
  }
}

void variance(const Consts& c, const Arrays& a) {
  dispatch(c, a, true, [&]<Dtype G, Dtype W, bool kWork, bool kDecay>() {
    const K k(c);
    const void* const grad = a.grad;
    float* const __restrict m_ = a.m;
    float* const __restrict v_ = a.v;
    float* const __restrict p_ = a.master;
    void* const work = a.work;
    const size_t n = a.count;
#pragma omp simd
    for (size_t i = 0; i < n; ++i) {
      const float g = grad_at<G>(k, grad, i);
      const float m = fma_(k.omb1, g, k.b1 * m_[i]);
      const float v = fma_(k.omb2, g * g, k.b2 * v_[i]);
      const float p = fma_(k.neg_lr, update_of<kDecay>(k, m, sqrt_(v) + k.eps, p_[i]), p_[i]);
      m_[i] = m;
      v_[i] = v;
      p_[i] = p;
      if constexpr (kWork) store_work<W>(work, i, p);
    }
  });
}

// PREPARE: the exchange buffer takes the rank's gradient, or (a momentum
// sync) the rank's momentum from the last average it holds.
template <bool kMomentum>
void prepare(const Consts& c, const Arrays& a) {
  dispatch(c, a, true, [&]<Dtype G, Dtype, bool, bool>() {
    const K k(c);
    const void* const grad = a.grad;
    float* const __restrict x = a.exchange;
    const size_t n = a.count;
#pragma omp simd
    for (size_t i = 0; i < n; ++i)
      x[i] = kMomentum ? fma_(k.omb1, grad_at<G>(k, grad, i), k.b1 * x[i]) : grad_at<G>(k, grad, i);
  });
}

void prepare_gradient(const Consts& c, const Arrays& a) { prepare<false>(c, a); }

// A step with v frozen from the exchanged average x: m moves by x (a 1-bit
// gradient step) or takes it (a momentum sync), then p.
template <bool kTakeAverage>
void frozen_step(const Consts& c, const Arrays& a) {
  dispatch(c, a, false, [&]<Dtype, Dtype W, bool kWork, bool kDecay>() {
    const K k(c);
    const float* const __restrict x = a.exchange;
    float* const __restrict m_ = a.m;
    const float* const __restrict v_ = a.v;
    float* const __restrict p_ = a.master;
    void* const work = a.work;
    const size_t n = a.count;
#pragma omp simd
    for (size_t i = 0; i < n; ++i) {
      const float m = kTakeAverage ? x[i] : fma_(k.omb1, x[i], k.b1 * m_[i]);
      const float p = fma_(k.neg_lr, update_of<kDecay>(k, m, sqrt_(v_[i]) + k.eps, p_[i]), p_[i]);
      m_[i] = m;
      p_[i] = p;
      if constexpr (kWork) store_work<W>(work, i, p);
    }
  });
}

void compressed_gradient(const Consts& c, const Arrays& a) { frozen_step<false>(c, a); }

void prepare_momentum(const Consts& c, const Arrays& a) { prepare<true>(c, a); }

void compressed_momentum(const Consts& c, const Arrays& a) { frozen_step<true>(c, a); }

void local_step(const Consts& c, const Arrays& a) {
  dispatch(c, a, true, [&]<Dtype G, Dtype W, bool kWork, bool kDecay>() {
    const K k(c);
    const void* const grad = a.grad;
    float* const __restrict m_ = a.m;
    const float* const __restrict v_ = a.v;
    float* const __restrict u_ = a.u;
    float* const __restrict p_ = a.master;
    void* const work = a.work;
    const size_t n = a.count;
#pragma omp simd
    for (size_t i = 0; i < n; ++i) {
      const float m = fma_(k.omb1, grad_at<G>(k, grad, i), k.b1 * m_[i]);
      const float upd = update_of<kDecay>(k, m, sqrt_(v_[i]) + k.eps, p_[i]);
      const float p = fma_(k.neg_lr, upd, p_[i]);
      m_[i] = m;
      u_[i] = fma_(k.neg_lr, upd, u_[i]);
      p_[i] = p;
      if constexpr (kWork) store_work<W>(work, i, p);
    }
  });
}

void sync_local(const Consts& c, const Arrays& a) {
  dispatch(c, a, true, [&]<Dtype G, Dtype, bool, bool kDecay>() {
    const K k(c);
    const void* const grad = a.grad;
    float* const __restrict m_ = a.m;
    const float* const __restrict v_ = a.v;
    float* const __restrict u_ = a.u;
    float* const __restrict p_ = a.master;
    float* const __restrict x = a.exchange;
    const size_t n = a.count;
#pragma omp simd
    for (size_t i = 0; i < n; ++i) {
      const float m = fma_(k.omb1, grad_at<G>(k, grad, i), k.b1 * m_[i]);
      const float d = sqrt_(v_[i]) + k.eps;
      const float upd = update_of<kDecay>(k, m, d, p_[i]);
      const float p = fma_(k.neg_lr, upd, p_[i]);
      const float u = fma_(k.neg_lr, upd, u_[i]);
      m_[i] = m;
      p_[i] = p - u;
      u_[i] = u;
      x[i] = u * d;
    }
  });
}

void sync_apply(const Consts& c, const Arrays& a, float lrs) {
  dispatch(c, a, false, [&]<Dtype, Dtype W, bool kWork, bool>() {
    const K k(c);
    const float* const __restrict x_ = a.exchange;
    float* const __restrict m_ = a.m;
    const float* const __restrict v_ = a.v;
    float* const __restrict u_ = a.u;
    float* const __restrict p_ = a.master;
    void* const work = a.work;
    const size_t n = a.count;
#pragma omp simd
    for (size_t i = 0; i < n; ++i) {
      const float x = x_[i];
      const float p = p_[i] + x / (sqrt_(v_[i]) + k.eps);
      m_[i] = -(x / lrs);
      u_[i] = 0.0f;
      p_[i] = p;
      if constexpr (kWork) store_work<W>(work, i, p);
    }
  });
}

// A sync step's last pass when no learning rate was summed since the last
// sync (lrs = 0): there were no moves, so the average is not read, p and m
// stay as the first pass left them, u = 0, and the working copy takes p
// (the first pass wrote the master alone).
void sync_without_moves(const Consts& c, const Arrays& a) {
  dispatch(c, a, false, [&]<Dtype, Dtype W, bool kWork, bool>() {
    float* const __restrict u_ = a.u;
    const float* const __restrict p_ = a.master;
    void* const work = a.work;
    const size_t n = a.count;
#pragma omp simd
    for (size_t i = 0; i < n; ++i) {
      u_[i] = 0.0f;
      if constexpr (kWork) store_work<W>(work, i, p_[i]);
    }
  });
}

}  // namespace ZD_ZERO_ONE_NS
