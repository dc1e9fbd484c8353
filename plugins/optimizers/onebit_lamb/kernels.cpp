#include "kernels.h"

#include <cmath>

#include "element_io.h"

// The baseline path (any x86-64, or any other CPU).
namespace zerod::optim::onebit_lamb {
#define ZD_LAMB_NS baseline
#include "kernels_impl.h"
#undef ZD_LAMB_NS

#if ZEROD_LAMB_AVX2
// kernels_avx2.cpp: the same loops built with -mavx2 -mfma.
namespace avx2 {
void warmup_moments(const Consts& c, const Arrays& a, double* stats);
void apply(const Consts& c, const Arrays& a, float neg_lr_coeff);
void prepare(const Consts& c, const Arrays& a, float scale, bool prev_scaled);
void compressed_moments(const Consts& c, const Arrays& a, float scale, double* stats);
}  // namespace avx2
#endif

namespace {

// AVX-512 hosts take the AVX2 path: these loops are bound by memory and by
// sqrt/divide throughput, not by vector width.
bool vector(Isa isa) {
#if ZEROD_LAMB_AVX2
  return isa == Isa::avx2 || isa == Isa::avx512;
#else
  (void)isa;
  return false;
#endif
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

#if ZEROD_LAMB_AVX2
#define ZD_LAMB_PICK(isa, call) (vector(isa) ? avx2::call : baseline::call)
#else
#define ZD_LAMB_PICK(isa, call) baseline::call
#endif

void warmup_moments(Isa isa, const Consts& c, const Arrays& a, double* stats) {
  ZD_LAMB_PICK(isa, warmup_moments(c, a, stats));
}

void apply(Isa isa, const Consts& c, const Arrays& a, float neg_lr_coeff) {
  ZD_LAMB_PICK(isa, apply(c, a, neg_lr_coeff));
}

void prepare(Isa isa, const Consts& c, const Arrays& a, float scale, bool prev_scaled) {
  ZD_LAMB_PICK(isa, prepare(c, a, scale, prev_scaled));
}

void compressed_moments(Isa isa, const Consts& c, const Arrays& a, float scale, double* stats) {
  ZD_LAMB_PICK(isa, compressed_moments(c, a, scale, stats));
}

#undef ZD_LAMB_PICK

}  // namespace zerod::optim::onebit_lamb
