#include "prepared.h"

#include <cmath>

namespace zerod::optim::detail {

AdamConsts prepare_adam(const AdamParams& hp) {
  const double t = static_cast<double>(hp.step);
  const double bc1 = hp.bias_correction ? 1.0 - std::pow(hp.beta1, t) : 1.0;
  const double bc2 = hp.bias_correction ? 1.0 - std::pow(hp.beta2, t) : 1.0;
  const bool decay = hp.weight_decay > 0.0;
  AdamConsts c{};
  c.grad_scale = static_cast<float>(hp.grad_scale);
  c.beta1 = static_cast<float>(hp.beta1);
  c.one_minus_beta1 = static_cast<float>(1.0 - hp.beta1);
  c.beta2 = static_cast<float>(hp.beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - hp.beta2);
  c.eps = static_cast<float>(hp.eps);
  c.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  c.neg_step = static_cast<float>(-hp.lr / bc1);
  c.l2_decay = static_cast<float>(hp.weight_decay);
  c.neg_lr_decay = static_cast<float>(-hp.lr * hp.weight_decay);
  c.l2 = decay && !hp.decoupled;
  c.decoupled = decay && hp.decoupled;
  return c;
}

OnebitConsts prepare_onebit(const OnebitAdamParams& hp) {
  OnebitConsts c{};
  c.grad_scale = static_cast<float>(hp.grad_scale);
  c.beta1 = static_cast<float>(hp.beta1);
  c.one_minus_beta1 = static_cast<float>(1.0 - hp.beta1);
  c.beta2 = static_cast<float>(hp.beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - hp.beta2);
  c.eps = static_cast<float>(hp.eps);
  c.neg_lr = static_cast<float>(-hp.lr);
  c.decay = static_cast<float>(hp.weight_decay);
  c.has_decay = hp.weight_decay > 0.0;
  return c;
}

SgdConsts prepare_sgd(const SgdParams& hp) {
  SgdConsts c{};
  c.grad_scale = static_cast<float>(hp.grad_scale);
  c.decay = static_cast<float>(hp.weight_decay);
  c.momentum = static_cast<float>(hp.momentum);
  c.one_minus_dampening = static_cast<float>(1.0 - hp.dampening);
  c.neg_lr = static_cast<float>(-hp.lr);
  c.has_decay = hp.weight_decay > 0.0;
  c.has_momentum = hp.momentum > 0.0;
  c.first_step = hp.step <= 1;
  c.nesterov = hp.nesterov;
  return c;
}

}  // namespace zerod::optim::detail
