// The fp32 kernels against double-precision transcriptions of PyTorch's
// formulas (torch 1.13 _single_tensor_adam / _single_tensor_adamw /
// _single_tensor_sgd), over 10 steps of fresh N(0,1) gradients, on every ISA
// this CPU has.
//
// Tolerance, per element, for the master and every state slot:
//   |kernel - ref| <= 1e-6 * scale,
// where scale is the largest magnitude the reference value, or any term
// summed into it (beta1*m and (1-beta1)*g for exp_avg, wd*p and g for an L2
// gradient, the step for p, ...), has had up to this step. fp32 rounding errors are relative to those
// magnitudes, not to the current value: exp_avg may cancel to near zero
// while carrying the rounding of its 0.3-sized terms, and a parameter that
// crosses zero carries the rounding of its N(0,1) start. An algorithmic slip
// (decay order, bias correction, eps placement, dampening) moves values by
// lr*scale = 1e-3 relative or more, far outside the limit. Measured worst:
// 6.3e-7 (AdamW parameters after 10 steps: two roundings per step);
// ZD_PRINT_WORST=1 prints the worst error of every check.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <random>
#include <vector>

#include "test_util.h"

namespace zerod::optim::test {
namespace {

constexpr size_t kN = 4099 + 64;  // every body and a tail on every ISA
constexpr int kSteps = 10;
constexpr double kRel = 1e-6;

// A reference quantity and, per element, its running scale (see above).
struct Tracked {
  std::vector<double> x, scale;
  explicit Tracked(std::vector<double> init) : x(std::move(init)), scale(x.size()) {
    for (size_t i = 0; i < x.size(); ++i) scale[i] = std::fabs(x[i]);
  }
  void set(size_t i, double v, std::initializer_list<double> terms) {
    x[i] = v;
    double s = std::max(scale[i], std::fabs(v));
    for (const double t : terms) s = std::max(s, std::fabs(t));
    scale[i] = s;
  }
};

Tracked zeros(size_t n) { return Tracked(std::vector<double>(n, 0.0)); }
Tracked from(const std::vector<float>& v) { return Tracked(std::vector<double>(v.begin(), v.end())); }

void expect_rel(const std::vector<float>& got, const Tracked& ref, const char* what, const char* isa, int step) {
  double worst = 0.0;
  size_t bad = 0, first_bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(double{got[i]} - ref.x[i]) / std::max(ref.scale[i], 1e-30);
    if (!(e <= kRel) && bad++ == 0) first_bad = i;
    if (e > worst || std::isnan(e)) worst = e;
  }
  if (std::getenv("ZD_PRINT_WORST") != nullptr) std::printf("%s %s step %d worst %.3g\n", isa, what, step, worst);
  EXPECT_EQ(bad, 0u) << isa << " " << what << " after step " << step << ": worst error " << worst
                     << " of scale (limit " << kRel << "), first at [" << first_bad << "]: got " << got[first_bad]
                     << ", reference " << ref.x[first_bad] << ", scale " << ref.scale[first_bad];
}

std::vector<float> normal_floats(std::mt19937_64& rng, size_t n) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(normal(rng));
  return v;
}

std::vector<Isa> available_isas() {
  std::vector<Isa> out;
  for (const Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512}) {
    if (isa_supported(isa)) out.push_back(isa);
  }
  return out;
}

// ---- Adam / AdamW ---------------------------------------------------------

struct AdamRef {
  Tracked p, m, v;
  explicit AdamRef(const std::vector<float>& p0) : p(from(p0)), m(zeros(p0.size())), v(zeros(p0.size())) {}

  void step(const AdamParams& hp, const std::vector<float>& grad) {
    const double bc1 = hp.bias_correction ? 1.0 - std::pow(hp.beta1, double(hp.step)) : 1.0;
    const double bc2 = hp.bias_correction ? 1.0 - std::pow(hp.beta2, double(hp.step)) : 1.0;
    const double step_size = hp.lr / bc1;
    for (size_t i = 0; i < p.x.size(); ++i) {
      double g = double{grad[i]} * hp.grad_scale;
      double g_mag = std::fabs(g);  // the terms g is summed from
      double pi = p.x[i];
      if (hp.decoupled) {
        pi *= 1.0 - hp.lr * hp.weight_decay;  // torch: param.mul_(1 - lr * weight_decay)
      } else if (hp.weight_decay != 0.0) {
        g += hp.weight_decay * pi;  // torch: grad = grad.add(param, alpha=weight_decay)
        g_mag += std::fabs(hp.weight_decay * pi);
      }
      const double mt = m.x[i] * hp.beta1, gt = (1.0 - hp.beta1) * g;
      m.set(i, mt + gt, {mt, gt, (1.0 - hp.beta1) * g_mag});
      const double vt = v.x[i] * hp.beta2, g2t = (1.0 - hp.beta2) * g * g;
      v.set(i, vt + g2t, {vt, g2t, (1.0 - hp.beta2) * g_mag * g_mag});
      const double denom = std::sqrt(v.x[i]) / std::sqrt(bc2) + hp.eps;
      const double delta = step_size * m.x[i] / denom;
      // The step inherits exp_avg's absolute error: include its scale too.
      p.set(i, pi - delta, {pi, delta, step_size * m.scale[i] / denom});
    }
  }
};

void run_adam(AdamParams hp) {
  for (const Isa isa : available_isas()) {
    std::mt19937_64 rng(7);
    std::vector<float> p = normal_floats(rng, kN), m(kN, 0.0f), v(kN, 0.0f);
    AdamRef ref(p);
    for (int t = 1; t <= kSteps; ++t) {
      const std::vector<float> g = normal_floats(rng, kN);
      hp.step = t;
      Range r;
      r.count = kN;
      r.master = p.data();
      r.grad = g.data();
      ASSERT_TRUE(adam_update(isa, hp, r, AdamState{m.data(), v.data()}));
      ref.step(hp, g);
      expect_rel(p, ref.p, "param", isa_name(isa), t);
      expect_rel(m, ref.m, "exp_avg", isa_name(isa), t);
      expect_rel(v, ref.v, "exp_avg_sq", isa_name(isa), t);
      if (::testing::Test::HasFailure()) return;
    }
  }
}

// Adam with its state kept in bf16 is, on every ISA, the fp32 update of the
// widened state, rounded back to nearest even: the master bit for bit what
// the fp32 kernel makes of the same widened state, m and v its m and v
// through f32_to_bf16. Over 3 steps, so the later steps start from rounded
// state (and from both ways of rounding: values near ties occur at this n).
TEST(Reference, AdamBf16StateIsTheFp32UpdateRounded) {
  AdamParams hp;
  hp.weight_decay = 0.01;
  hp.decoupled = true;
  for (const Isa isa : available_isas()) {
    std::mt19937_64 rng(11);
    std::vector<float> p = normal_floats(rng, kN);
    std::vector<uint16_t> m(kN, 0), v(kN, 0);
    for (int t = 1; t <= 3; ++t) {
      const std::vector<float> g = normal_floats(rng, kN);
      hp.step = t;
      // The fp32 scalar reference from the same (widened) state.
      std::vector<float> p32 = p, m32(kN), v32(kN);
      for (size_t i = 0; i < kN; ++i) {
        m32[i] = bf16_to_f32(m[i]);
        v32[i] = bf16_to_f32(v[i]);
      }
      Range r;
      r.count = kN;
      r.grad = g.data();
      r.master = p32.data();
      ASSERT_TRUE(adam_update(Isa::scalar, hp, r, AdamState{m32.data(), v32.data()}));
      r.master = p.data();
      ASSERT_TRUE(adam_update(isa, hp, r,
                              AdamState{reinterpret_cast<float*>(m.data()), reinterpret_cast<float*>(v.data()),
                                        Dtype::bf16}));
      size_t bad = 0;
      for (size_t i = 0; i < kN; ++i) {
        if (f32_bits(p[i]) == f32_bits(p32[i]) && m[i] == f32_to_bf16(m32[i]) && v[i] == f32_to_bf16(v32[i]))
          continue;
        if (bad++ < 3)
          ADD_FAILURE() << isa_name(isa) << " step " << t << " [" << i << "]: p " << p[i] << " vs " << p32[i]
                        << ", m 0x" << std::hex << m[i] << " vs 0x" << f32_to_bf16(m32[i]) << ", v 0x" << v[i]
                        << " vs 0x" << f32_to_bf16(v32[i]) << std::dec;
      }
      ASSERT_EQ(bad, 0u) << isa_name(isa) << " step " << t;
      // The state really is kept in bf16: m is not the fp32 value it rounds.
      size_t rounded = 0;
      for (size_t i = 0; i < kN; ++i) rounded += bf16_to_f32(m[i]) != m32[i];
      EXPECT_GT(rounded, kN / 2) << "most m values lose bits in bf16";
    }
  }
}

TEST(Reference, AdamWMatchesTorchFormula) {
  AdamParams hp;
  hp.weight_decay = 0.01;
  hp.decoupled = true;
  run_adam(hp);
}

TEST(Reference, AdamL2MatchesTorchFormula) {
  AdamParams hp;
  hp.weight_decay = 0.01;
  hp.decoupled = false;
  run_adam(hp);
}

TEST(Reference, AdamWithoutBiasCorrectionWithGradScale) {
  AdamParams hp;
  hp.lr = 3e-4;
  hp.beta1 = 0.8;
  hp.beta2 = 0.99;
  hp.eps = 1e-6;
  hp.weight_decay = 0.05;
  hp.decoupled = true;
  hp.bias_correction = false;
  hp.grad_scale = 1.0 / 1024.0;
  run_adam(hp);
}

// ---- SGD -------------------------------------------------------------------

struct SgdRef {
  Tracked p, buf;
  explicit SgdRef(const std::vector<float>& p0) : p(from(p0)), buf(zeros(p0.size())) {}

  void step(const SgdParams& hp, const std::vector<float>& grad) {
    for (size_t i = 0; i < p.x.size(); ++i) {
      double d = double{grad[i]} * hp.grad_scale;
      double d_mag = std::fabs(d);  // the terms d is summed from
      if (hp.weight_decay != 0.0) {
        d += hp.weight_decay * p.x[i];
        d_mag += std::fabs(hp.weight_decay * p.x[i]);
      }
      if (hp.momentum != 0.0) {
        // torch: the buffer starts as a clone of d_p, later mul_(momentum).add_(d_p, alpha=1-dampening)
        const double bt = buf.x[i] * hp.momentum, dt = (1.0 - hp.dampening) * d;
        buf.set(i, hp.step == 1 ? d : bt + dt, {bt, dt, d_mag});
        d_mag = hp.nesterov ? d_mag + hp.momentum * buf.scale[i] : buf.scale[i];
        d = hp.nesterov ? d + hp.momentum * buf.x[i] : buf.x[i];
      }
      const double delta = hp.lr * d;
      p.set(i, p.x[i] - delta, {delta, hp.lr * d_mag});
    }
  }
};

void run_sgd(SgdParams hp) {
  for (const Isa isa : available_isas()) {
    std::mt19937_64 rng(11);
    std::vector<float> p = normal_floats(rng, kN), buf(kN, 0.0f);
    SgdRef ref(p);
    for (int t = 1; t <= kSteps; ++t) {
      const std::vector<float> g = normal_floats(rng, kN);
      hp.step = t;
      Range r;
      r.count = kN;
      r.master = p.data();
      r.grad = g.data();
      ASSERT_TRUE(sgd_update(isa, hp, r, buf.data()));
      ref.step(hp, g);
      expect_rel(p, ref.p, "param", isa_name(isa), t);
      if (hp.momentum > 0.0) expect_rel(buf, ref.buf, "momentum_buffer", isa_name(isa), t);
      if (::testing::Test::HasFailure()) return;
    }
  }
}

TEST(Reference, SgdPlain) {
  SgdParams hp;
  hp.lr = 1e-2;
  run_sgd(hp);
}

TEST(Reference, SgdMomentumDampeningWeightDecay) {
  SgdParams hp;
  hp.lr = 1e-2;
  hp.momentum = 0.9;
  hp.dampening = 0.1;
  hp.weight_decay = 1e-4;
  hp.grad_scale = 0.5;
  run_sgd(hp);
}

TEST(Reference, SgdNesterovWeightDecay) {
  SgdParams hp;
  hp.lr = 1e-2;
  hp.momentum = 0.9;
  hp.nesterov = true;
  hp.weight_decay = 1e-2;
  run_sgd(hp);
}

}  // namespace
}  // namespace zerod::optim::test
