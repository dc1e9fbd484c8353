// 1-bit LAMB per element (zerod's transcription of DeepSpeed's OnebitLamb,
// Li et al. 2021), one loop per pass of a planned step. No bias
// correction; weight decay added to the update. The per-tensor figures
// (norms, the frozen trust ratio, its factor) are the plugin's tensor
// scalars and statistics: these loops read a tensor's coefficient and add
// up its statistics.
#ifndef ZEROD_OPTIM_ONEBIT_LAMB_KERNELS_H
#define ZEROD_OPTIM_ONEBIT_LAMB_KERNELS_H

#include <zerod/optim/kernels.h>

#include <cstddef>

namespace zerod::optim::onebit_lamb {

// Per-tensor statistics (zd_optimizer_v3 tensor_stats), by index. A
// warm-up pass fills the first three, a compressed pass 0, 1 and 3.
enum Stat : unsigned {
  kSumA = 0,       // warm-up: sum p^2 (the old p);           compressed: sum upd^2
  kSumB = 1,       // warm-up: sum upd^2;                     compressed: sum (m/d)^2
  kSumM = 2,       // warm-up: sum m^2 (the new m)
  kMaxRatio = 3,   // compressed: max over the tensor of d / d_fresh
  kStats = 4
};

struct Consts {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, eps, decay, grad_scale;
  bool has_decay;
};
Consts make_consts(double beta1, double beta2, double eps, double weight_decay, double grad_scale);

struct Arrays {
  size_t count = 0;
  float* master = nullptr;
  const void* grad = nullptr;
  Dtype grad_dtype = Dtype::f32;
  void* work = nullptr;
  Dtype work_dtype = Dtype::f32;
  float* m = nullptr;
  float* v = nullptr;
  float* v_fresh = nullptr;
  float* exchange = nullptr;
};

// Each loop runs the vector path `isa` names where this build has one
// (kernels_impl.h says why the paths agree), else the baseline one.
// Warm-up, pass 1 (averaged gradient): m, v, v_fresh = v, and the sums.
void warmup_moments(Isa isa, const Consts& c, const Arrays& a, double* stats);
// Any pass that applies: p -= (lr coeff) (m/d + wd p), d from v.
void apply(Isa isa, const Consts& c, const Arrays& a, float neg_lr_coeff);
// PREPARE: the local momentum from the previous one, scaled for the fused
// exchange. prev_scaled: the exchange buffer holds the last average (still
// scaled by `scale`) rather than the momentum itself.
void prepare(Isa isa, const Consts& c, const Arrays& a, float scale, bool prev_scaled);
// Compressed, pass 1: m = avg / scale; the gradient it implies updates
// v_fresh; the sums and the largest d / d_fresh.
void compressed_moments(Isa isa, const Consts& c, const Arrays& a, float scale, double* stats);

}  // namespace zerod::optim::onebit_lamb

#endif  // ZEROD_OPTIM_ONEBIT_LAMB_KERNELS_H
