// 0/1 Adam per element (zerod's transcription of DeepSpeed's ZeroOneAdam,
// Lu et al. 2022), one loop per pass of a planned step. No bias
// correction, weight decay added to the update, as DeepSpeed's has it:
//   d   = sqrt(v) + eps
//   upd = m / d + wd p
//   p   = p - lr upd
#ifndef ZEROD_OPTIM_ZERO_ONE_KERNELS_H
#define ZEROD_OPTIM_ZERO_ONE_KERNELS_H

#include <zerod/optim/kernels.h>

#include <cstddef>

namespace zerod::optim::zero_one {

struct Consts {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, eps, decay, neg_lr, grad_scale;
  bool has_decay;
};

Consts make_consts(double beta1, double beta2, double eps, double weight_decay, double lr, double grad_scale);

// The arrays of one range; any may be unused by a pass.
struct Arrays {
  size_t count = 0;
  float* master = nullptr;
  const void* grad = nullptr;
  Dtype grad_dtype = Dtype::f32;
  void* work = nullptr;
  Dtype work_dtype = Dtype::f32;
  float* m = nullptr;
  float* v = nullptr;
  float* u = nullptr;         // the momentum accumulator (local steps)
  float* exchange = nullptr;  // the exchange buffer
};

// Each loop runs the vector path `isa` names where this build has one
// (kernels_impl.h says why the paths agree), else the baseline one.
// A variance step (full-precision averaged gradient): m and v, then p.
void variance(Isa isa, const Consts& c, const Arrays& a);
// PREPARE of a 1-bit gradient step: the exchange buffer takes g.
void prepare_gradient(Isa isa, const Consts& c, const Arrays& a);
// The pass after it: m from the compressed average of g, v frozen, then p.
void compressed_gradient(Isa isa, const Consts& c, const Arrays& a);
// PREPARE of a 1-bit momentum step (after var_freeze_step without local
// steps): the exchange buffer holds m (the last average) and takes the
// rank's local momentum, x = b1 x + (1 - b1) g.
void prepare_momentum(Isa isa, const Consts& c, const Arrays& a);
// The pass after it: m takes the compressed average, v frozen, then p.
void compressed_momentum(Isa isa, const Consts& c, const Arrays& a);
// A local step: m from the rank's own gradient, p moves, u accumulates the
// move: u = u - lr upd.
void local_step(Isa isa, const Consts& c, const Arrays& a);
// A sync step's first pass: the local step, then the local moves undone
// (p = p - u) and the exchange buffer takes u d (momentum units).
void sync_local(Isa isa, const Consts& c, const Arrays& a);
// Its last pass, with the average of u d and lrs, the sum of the learning
// rates since the last sync: m = -(avg / lrs), p = p + avg / d, u = 0.
void sync_apply(Isa isa, const Consts& c, const Arrays& a, float lrs);
// Its last pass instead when lrs = 0 (every learning rate since the last
// sync was 0, so every u was 0 and the first pass moved nothing): the
// average (only the error feedback's remainder) is not applied, p and m stay,
// u = 0 (zero_one_adam.cpp says why).
void sync_without_moves(Isa isa, const Consts& c, const Arrays& a);

}  // namespace zerod::optim::zero_one

#endif  // ZEROD_OPTIM_ZERO_ONE_KERNELS_H
