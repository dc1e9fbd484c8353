// Run-time ISA selection. Built for the baseline ISA: it runs on every CPU
// and only calls into a vector path after checking the CPU with the kit's
// probe (zerod/kit/cpu.h, which also checks that the OS saves the wider
// registers).
#include <zerod/kit/cpu.h>
#include <zerod/optim/kernels.h>

namespace zerod::optim {

bool dtype_valid(Dtype d) { return d == Dtype::f32 || d == Dtype::bf16 || d == Dtype::f16; }

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::scalar: return true;
#if ZEROD_OPTIM_X86
    case Isa::avx2: {
      static const bool has = cpu::has_avx2_fma_f16c();
      return has;
    }
    case Isa::avx512: {
      static const bool has = cpu::has_avx512_f_bw_vl();
      return has;
    }
#else
    case Isa::avx2:
    case Isa::avx512: return false;
#endif
  }
  return false;
}

Isa best_isa() {
  if (isa_supported(Isa::avx512)) return Isa::avx512;
  if (isa_supported(Isa::avx2)) return Isa::avx2;
  return Isa::scalar;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
  }
  return "?";
}

bool adam_update(Isa isa, const AdamParams& hp, const Range& r, const AdamState& s) {
  if (!isa_supported(isa)) return false;
  switch (isa) {
    case Isa::scalar: return adam_scalar(hp, r, s);
#if ZEROD_OPTIM_X86
    case Isa::avx2: return adam_avx2(hp, r, s);
    case Isa::avx512: return adam_avx512(hp, r, s);
#else
    default: break;
#endif
  }
  return false;
}

bool sgd_update(Isa isa, const SgdParams& hp, const Range& r, float* momentum_buffer) {
  if (!isa_supported(isa)) return false;
  switch (isa) {
    case Isa::scalar: return sgd_scalar(hp, r, momentum_buffer);
#if ZEROD_OPTIM_X86
    case Isa::avx2: return sgd_avx2(hp, r, momentum_buffer);
    case Isa::avx512: return sgd_avx512(hp, r, momentum_buffer);
#else
    default: break;
#endif
  }
  return false;
}

bool onebit_adam_update(Isa isa, const OnebitAdamParams& hp, OnebitPhase phase, const Range& r, const AdamState& s) {
  if (!isa_supported(isa) || s.dtype != Dtype::f32) return false;
  switch (isa) {
    case Isa::scalar: return onebit_adam_scalar(hp, phase, r, s);
#if ZEROD_OPTIM_X86
    case Isa::avx2: return onebit_adam_avx2(hp, phase, r, s);
    case Isa::avx512: return onebit_adam_avx512(hp, phase, r, s);
#else
    default: break;
#endif
  }
  return false;
}

}  // namespace zerod::optim
