#include "kernels.h"

#include <cmath>

#include "element_io.h"

namespace zerod::optim::zero_one {
namespace {

using compressing::load;
using compressing::store_work;

float grad_at(const Consts& c, const Arrays& a, size_t i) { return load(a.grad, a.grad_dtype, i) * c.grad_scale; }

float denom(const Consts& c, float v) { return std::sqrt(v) + c.eps; }

float update_of(const Consts& c, float m, float d, float p) {
  const float u = m / d;
  return c.has_decay ? std::fma(c.decay, p, u) : u;
}

}  // namespace

Consts make_consts(double beta1, double beta2, double eps, double weight_decay, double lr, double grad_scale) {
  Consts c{};
  c.beta1 = static_cast<float>(beta1);
  c.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  c.beta2 = static_cast<float>(beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  c.eps = static_cast<float>(eps);
  c.decay = static_cast<float>(weight_decay);
  c.has_decay = weight_decay != 0.0;
  c.neg_lr = static_cast<float>(-lr);
  c.grad_scale = static_cast<float>(grad_scale);
  return c;
}

void variance(const Consts& c, const Arrays& a) {
  for (size_t i = 0; i < a.count; ++i) {
    const float g = grad_at(c, a, i);
    const float m = std::fma(c.one_minus_beta1, g, c.beta1 * a.m[i]);
    const float v = std::fma(c.one_minus_beta2, g * g, c.beta2 * a.v[i]);
    const float p = std::fma(c.neg_lr, update_of(c, m, denom(c, v), a.master[i]), a.master[i]);
    a.m[i] = m;
    a.v[i] = v;
    a.master[i] = p;
    store_work(a.work, a.work_dtype, i, p);
  }
}

void prepare_gradient(const Consts& c, const Arrays& a) {
  for (size_t i = 0; i < a.count; ++i) a.exchange[i] = grad_at(c, a, i);
}

void compressed_gradient(const Consts& c, const Arrays& a) {
  for (size_t i = 0; i < a.count; ++i) {
    const float m = std::fma(c.one_minus_beta1, a.exchange[i], c.beta1 * a.m[i]);
    const float p = std::fma(c.neg_lr, update_of(c, m, denom(c, a.v[i]), a.master[i]), a.master[i]);
    a.m[i] = m;
    a.master[i] = p;
    store_work(a.work, a.work_dtype, i, p);
  }
}

void local_step(const Consts& c, const Arrays& a) {
  for (size_t i = 0; i < a.count; ++i) {
    const float m = std::fma(c.one_minus_beta1, grad_at(c, a, i), c.beta1 * a.m[i]);
    const float upd = update_of(c, m, denom(c, a.v[i]), a.master[i]);
    const float p = std::fma(c.neg_lr, upd, a.master[i]);
    a.m[i] = m;
    a.u[i] = std::fma(c.neg_lr, upd, a.u[i]);
    a.master[i] = p;
    store_work(a.work, a.work_dtype, i, p);
  }
}

void sync_local(const Consts& c, const Arrays& a) {
  for (size_t i = 0; i < a.count; ++i) {
    const float m = std::fma(c.one_minus_beta1, grad_at(c, a, i), c.beta1 * a.m[i]);
    const float d = denom(c, a.v[i]);
    const float upd = update_of(c, m, d, a.master[i]);
    const float p = std::fma(c.neg_lr, upd, a.master[i]);
    const float u = std::fma(c.neg_lr, upd, a.u[i]);
    a.m[i] = m;
    a.master[i] = p - u;
    a.u[i] = u;
    a.exchange[i] = u * d;
  }
}

void sync_apply(const Consts& c, const Arrays& a, float lrs) {
  for (size_t i = 0; i < a.count; ++i) {
    const float x = a.exchange[i];
    const float p = a.master[i] + x / denom(c, a.v[i]);
    a.m[i] = -(x / lrs);
    a.u[i] = 0.0f;
    a.master[i] = p;
    store_work(a.work, a.work_dtype, i, p);
  }
}

}  // namespace zerod::optim::zero_one
