#include "kernels.h"

#include <cstdint>

#include "element_io.h"

// The baseline path (any x86-64, or any other CPU).
namespace zerod::optim::zero_one {
#define ZD_ZERO_ONE_NS baseline
#include "kernels_impl.h"
#undef ZD_ZERO_ONE_NS

#if ZEROD_ZERO_ONE_AVX2
// kernels_avx2.cpp: the same loops built with -mavx2 -mfma.
namespace avx2 {
void variance(const Consts& c, const Arrays& a);
void prepare_gradient(const Consts& c, const Arrays& a);
void compressed_gradient(const Consts& c, const Arrays& a);
void prepare_momentum(const Consts& c, const Arrays& a);
void compressed_momentum(const Consts& c, const Arrays& a);
void local_step(const Consts& c, const Arrays& a);
void sync_local(const Consts& c, const Arrays& a);
void sync_apply(const Consts& c, const Arrays& a, float lrs);
void sync_without_moves(const Consts& c, const Arrays& a);
}  // namespace avx2
#endif

namespace {

// AVX-512 hosts take the AVX2 path: these loops are bound by memory and by
// sqrt/divide throughput, not by vector width.
bool vector(Isa isa) {
#if ZEROD_ZERO_ONE_AVX2
  return isa == Isa::avx2 || isa == Isa::avx512;
#else
  (void)isa;
  return false;
#endif
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

#if ZEROD_ZERO_ONE_AVX2
#define ZD_ZERO_ONE_PICK(isa, call) (vector(isa) ? avx2::call : baseline::call)
#else
#define ZD_ZERO_ONE_PICK(isa, call) baseline::call
#endif

void variance(Isa isa, const Consts& c, const Arrays& a) { ZD_ZERO_ONE_PICK(isa, variance(c, a)); }
void prepare_gradient(Isa isa, const Consts& c, const Arrays& a) { ZD_ZERO_ONE_PICK(isa, prepare_gradient(c, a)); }
void compressed_gradient(Isa isa, const Consts& c, const Arrays& a) {
  ZD_ZERO_ONE_PICK(isa, compressed_gradient(c, a));
}
void prepare_momentum(Isa isa, const Consts& c, const Arrays& a) { ZD_ZERO_ONE_PICK(isa, prepare_momentum(c, a)); }
void compressed_momentum(Isa isa, const Consts& c, const Arrays& a) {
  ZD_ZERO_ONE_PICK(isa, compressed_momentum(c, a));
}
void local_step(Isa isa, const Consts& c, const Arrays& a) { ZD_ZERO_ONE_PICK(isa, local_step(c, a)); }
void sync_local(Isa isa, const Consts& c, const Arrays& a) { ZD_ZERO_ONE_PICK(isa, sync_local(c, a)); }
void sync_apply(Isa isa, const Consts& c, const Arrays& a, float lrs) { ZD_ZERO_ONE_PICK(isa, sync_apply(c, a, lrs)); }
void sync_without_moves(Isa isa, const Consts& c, const Arrays& a) {
  ZD_ZERO_ONE_PICK(isa, sync_without_moves(c, a));
}

#undef ZD_ZERO_ONE_PICK

}  // namespace zerod::optim::zero_one
