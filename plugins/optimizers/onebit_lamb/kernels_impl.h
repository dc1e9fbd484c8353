// The 1-bit LAMB loops, written so that the compiler can vectorise them:
// included by kernels.cpp (any x86-64) and kernels_avx2.cpp (-mavx2 -mfma),
// each inside its own namespace, and picked at run time (kernels.cpp).
//
// Why this shape: the per-element form (a dtype switch and a std::fma per
// element, one double sum in element order) runs as scalar code calling
// libm's fma, several times slower than Adam's step over the same bytes.
// Here the gradient and working-copy types are template arguments (the
// switch leaves the loop), the arrays are declared unaliased, and each loop
// is an `omp simd` loop (-fopenmp-simd: the pragma only, no OpenMP run-time)
// whose double sums are reductions kept in the vector's lanes and added up
// at the end. Every element's arithmetic is the same as before, FMA for FMA
// (an FMA is correctly rounded whether it is one instruction or a libm
// call); only the order in which the double sums add their terms changes,
// which moves a tensor norm in its last bits (the tests hold 1-bit LAMB to
// its reference within 1e-5 and the stages to each other within 1e-6).
//
// Not a standalone header: no include guard, ZD_LAMB_NS must be defined.

namespace ZD_LAMB_NS {

using compressing::fma_;
using compressing::load;
using compressing::sqrt_;
using compressing::store_work;

template <Dtype G>
inline float grad_at(const void* grad, size_t i) {
  return load(grad, G, i);
}

// The constants as plain values: loads through `c` inside a loop that
// stores could alias it, for all the compiler knows.
struct K {
  float b1, omb1, b2, omb2, eps, decay, gs;
  explicit K(const Consts& c)
      : b1(c.beta1), omb1(c.one_minus_beta1), b2(c.beta2), omb2(c.one_minus_beta2), eps(c.eps), decay(c.decay),
        gs(c.grad_scale) {}
};

template <bool kDecay>
inline float update_of(const K& k, float m, float d, float p) {
  const float u = m / d;
  if constexpr (kDecay) return fma_(k.decay, p, u);
  return u;
}

template <Dtype G, bool kDecay>
void warmup_moments_t(const Consts& c, const Arrays& a, double* stats) {
  const K k(c);
  double pp = 0.0, uu = 0.0, mm = 0.0;
  const void* const grad = a.grad;
  float* const __restrict m_ = a.m;
  float* const __restrict v_ = a.v;
  float* const __restrict vf_ = a.v_fresh;
  const float* const __restrict p_ = a.master;
  const size_t n = a.count;
#pragma omp simd reduction(+ : pp, uu, mm)
  for (size_t i = 0; i < n; ++i) {
    const float g = grad_at<G>(grad, i) * k.gs;
    const float m = fma_(k.omb1, g, k.b1 * m_[i]);
    const float v = fma_(k.omb2, g * g, k.b2 * v_[i]);
    const float p = p_[i];
    const float upd = update_of<kDecay>(k, m, sqrt_(v) + k.eps, p);
    m_[i] = m;
    v_[i] = v;
    vf_[i] = v;
    pp += static_cast<double>(p) * p;
    uu += static_cast<double>(upd) * upd;
    mm += static_cast<double>(m) * m;
  }
  stats[kSumA] += pp;
  stats[kSumB] += uu;
  stats[kSumM] += mm;
}

template <Dtype W, bool kWork, bool kDecay>
void apply_t(const Consts& c, const Arrays& a, float neg_lr_coeff) {
  const K k(c);
  float* const __restrict p_ = a.master;
  const float* const __restrict m_ = a.m;
  const float* const __restrict v_ = a.v;
  void* const work = a.work;
  const size_t n = a.count;
#pragma omp simd
  for (size_t i = 0; i < n; ++i) {
    const float upd = update_of<kDecay>(k, m_[i], sqrt_(v_[i]) + k.eps, p_[i]);
    const float p = fma_(neg_lr_coeff, upd, p_[i]);
    p_[i] = p;
    if constexpr (kWork) store_work<W>(work, i, p);
  }
}

template <Dtype G, bool kScaled>
void prepare_t(const Consts& c, const Arrays& a, float scale) {
  const K k(c);
  const void* const grad = a.grad;
  float* const __restrict x = a.exchange;
  const size_t n = a.count;
#pragma omp simd
  for (size_t i = 0; i < n; ++i) {
    const float prev = kScaled ? x[i] / scale : x[i];
    const float m = fma_(k.omb1, grad_at<G>(grad, i) * k.gs, k.b1 * prev);
    x[i] = m * scale;
  }
}

template <bool kDecay>
void compressed_moments_t(const Consts& c, const Arrays& a, float scale, double* stats) {
  const K k(c);
  double uu = 0.0, pre = 0.0, ratio = stats[kMaxRatio];
  const float* const __restrict x = a.exchange;
  float* const __restrict m_ = a.m;
  float* const __restrict vf_ = a.v_fresh;
  const float* const __restrict v_ = a.v;
  const float* const __restrict p_ = a.master;
  const size_t n = a.count;
#pragma omp simd reduction(+ : uu, pre) reduction(max : ratio)
  for (size_t i = 0; i < n; ++i) {
    const float m = x[i] / scale;
    const float g = (m - m_[i] * k.b1) / k.omb1;
    const float vf = fma_(k.omb2, g * g, k.b2 * vf_[i]);
    const float d = sqrt_(v_[i]) + k.eps;
    const float u_pre = m / d;
    const float upd = kDecay ? fma_(k.decay, p_[i], u_pre) : u_pre;
    m_[i] = m;
    vf_[i] = vf;
    uu += static_cast<double>(upd) * upd;
    pre += static_cast<double>(u_pre) * u_pre;
    const auto q = static_cast<double>(d / (sqrt_(vf) + k.eps));
    ratio = q > ratio ? q : ratio;
  }
  stats[kSumA] += uu;
  stats[kSumB] += pre;
  stats[kMaxRatio] = ratio;
}

// The entry points: the element types and the decay chosen once per call.

void warmup_moments(const Consts& c, const Arrays& a, double* stats) {
  auto with = [&]<bool kDecay>() {
    switch (a.grad_dtype) {
      case Dtype::bf16: return warmup_moments_t<Dtype::bf16, kDecay>(c, a, stats);
      case Dtype::f16: return warmup_moments_t<Dtype::f16, kDecay>(c, a, stats);
      case Dtype::f32: return warmup_moments_t<Dtype::f32, kDecay>(c, a, stats);
    }
  };
  c.has_decay ? with.template operator()<true>() : with.template operator()<false>();
}

void apply(const Consts& c, const Arrays& a, float neg_lr_coeff) {
  auto with = [&]<bool kDecay>() {
    if (a.work == nullptr) return apply_t<Dtype::f32, false, kDecay>(c, a, neg_lr_coeff);
    switch (a.work_dtype) {
      case Dtype::bf16: return apply_t<Dtype::bf16, true, kDecay>(c, a, neg_lr_coeff);
      case Dtype::f16: return apply_t<Dtype::f16, true, kDecay>(c, a, neg_lr_coeff);
      case Dtype::f32: return apply_t<Dtype::f32, true, kDecay>(c, a, neg_lr_coeff);
    }
  };
  c.has_decay ? with.template operator()<true>() : with.template operator()<false>();
}

void prepare(const Consts& c, const Arrays& a, float scale, bool prev_scaled) {
  auto with = [&]<bool kScaled>() {
    switch (a.grad_dtype) {
      case Dtype::bf16: return prepare_t<Dtype::bf16, kScaled>(c, a, scale);
      case Dtype::f16: return prepare_t<Dtype::f16, kScaled>(c, a, scale);
      case Dtype::f32: return prepare_t<Dtype::f32, kScaled>(c, a, scale);
    }
  };
  prev_scaled ? with.template operator()<true>() : with.template operator()<false>();
}

void compressed_moments(const Consts& c, const Arrays& a, float scale, double* stats) {
  c.has_decay ? compressed_moments_t<true>(c, a, scale, stats) : compressed_moments_t<false>(c, a, scale, stats);
}

}  // namespace ZD_LAMB_NS
