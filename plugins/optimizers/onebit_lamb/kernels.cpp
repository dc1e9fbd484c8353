#include "kernels.h"

#include <algorithm>
#include <cmath>

#include "element_io.h"

namespace zerod::optim::onebit_lamb {
namespace {

using compressing::load;
using compressing::store_work;

float update_of(const Consts& c, float m, float d, float p) {
  const float u = m / d;
  return c.has_decay ? std::fma(c.decay, p, u) : u;
}

}  // namespace

Consts make_consts(double beta1, double beta2, double eps, double weight_decay, double grad_scale) {
  Consts c{};
  c.beta1 = static_cast<float>(beta1);
  c.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  c.beta2 = static_cast<float>(beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  c.eps = static_cast<float>(eps);
  c.decay = static_cast<float>(weight_decay);
  c.has_decay = weight_decay != 0.0;
  c.grad_scale = static_cast<float>(grad_scale);
  return c;
}

// Sums of squares in double, element order.
void warmup_moments(const Consts& c, const Arrays& a, double* stats) {
  double pp = 0.0, uu = 0.0, mm = 0.0;
  for (size_t i = 0; i < a.count; ++i) {
    const float g = load(a.grad, a.grad_dtype, i) * c.grad_scale;
    const float m = std::fma(c.one_minus_beta1, g, c.beta1 * a.m[i]);
    const float v = std::fma(c.one_minus_beta2, g * g, c.beta2 * a.v[i]);
    const float p = a.master[i];
    const float upd = update_of(c, m, std::sqrt(v) + c.eps, p);
    a.m[i] = m;
    a.v[i] = v;
    a.v_fresh[i] = v;
    pp += static_cast<double>(p) * p;
    uu += static_cast<double>(upd) * upd;
    mm += static_cast<double>(m) * m;
  }
  stats[kSumA] += pp;
  stats[kSumB] += uu;
  stats[kSumM] += mm;
}

void apply(const Consts& c, const Arrays& a, float neg_lr_coeff) {
  for (size_t i = 0; i < a.count; ++i) {
    const float upd = update_of(c, a.m[i], std::sqrt(a.v[i]) + c.eps, a.master[i]);
    const float p = std::fma(neg_lr_coeff, upd, a.master[i]);
    a.master[i] = p;
    store_work(a.work, a.work_dtype, i, p);
  }
}

void prepare(const Consts& c, const Arrays& a, float scale, bool prev_scaled) {
  for (size_t i = 0; i < a.count; ++i) {
    const float prev = prev_scaled ? a.exchange[i] / scale : a.exchange[i];
    const float m = std::fma(c.one_minus_beta1, load(a.grad, a.grad_dtype, i) * c.grad_scale, c.beta1 * prev);
    a.exchange[i] = m * scale;
  }
}

void compressed_moments(const Consts& c, const Arrays& a, float scale, double* stats) {
  double uu = 0.0, pre = 0.0;
  double ratio = stats[kMaxRatio];
  for (size_t i = 0; i < a.count; ++i) {
    const float m = a.exchange[i] / scale;
    const float g = (m - a.m[i] * c.beta1) / c.one_minus_beta1;
    const float vf = std::fma(c.one_minus_beta2, g * g, c.beta2 * a.v_fresh[i]);
    const float d = std::sqrt(a.v[i]) + c.eps;
    const float u_pre = m / d;
    const float upd = c.has_decay ? std::fma(c.decay, a.master[i], u_pre) : u_pre;
    a.m[i] = m;
    a.v_fresh[i] = vf;
    uu += static_cast<double>(upd) * upd;
    pre += static_cast<double>(u_pre) * u_pre;
    ratio = std::max(ratio, static_cast<double>(d / (std::sqrt(vf) + c.eps)));
  }
  stats[kSumA] += uu;
  stats[kSumB] += pre;
  stats[kMaxRatio] = ratio;
}

}  // namespace zerod::optim::onebit_lamb
