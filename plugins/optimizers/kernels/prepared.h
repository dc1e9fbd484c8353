// Per-call fp32 constants, computed once in double by a baseline-compiled
// translation unit, so that every ISA path rounds from identical values.
#ifndef ZEROD_OPTIM_PREPARED_H
#define ZEROD_OPTIM_PREPARED_H

#include <zerod/optim/kernels.h>

namespace zerod::optim::detail {

struct AdamConsts {
  float grad_scale;
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float eps;
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^t), or 1
  float neg_step;      // -lr / (1 - beta1^t)
  float l2_decay;      // wd, added to the gradient (Adam)
  float neg_lr_decay;  // -lr * wd, applied to the old p (AdamW)
  bool l2;
  bool decoupled;
};

struct SgdConsts {
  float grad_scale;
  float decay;
  float momentum;
  float one_minus_dampening;
  float neg_lr;
  bool has_decay;
  bool has_momentum;
  bool first_step;
  bool nesterov;
};

struct OnebitConsts {
  float grad_scale;
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float eps;
  float neg_lr;  // -lr
  float decay;   // wd, added to the update
  bool has_decay;
};

AdamConsts prepare_adam(const AdamParams& hp);
OnebitConsts prepare_onebit(const OnebitAdamParams& hp);
SgdConsts prepare_sgd(const SgdParams& hp);

}  // namespace zerod::optim::detail

#endif  // ZEROD_OPTIM_PREPARED_H
