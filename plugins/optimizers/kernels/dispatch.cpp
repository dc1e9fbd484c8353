// Run-time ISA selection. Built for the baseline ISA: it runs on every CPU
// and only calls into a vector path after checking the CPU (and, through
// __builtin_cpu_supports, that the OS saves the wider registers).
#include <zerod/optim/kernels.h>

#if ZEROD_OPTIM_X86
#include <cpuid.h>
#endif

namespace zerod::optim {
namespace {

#if ZEROD_OPTIM_X86
// F16C straight from CPUID (leaf 1, ECX bit 29): clang 14, which the fuzz
// build uses, does not know "f16c" in __builtin_cpu_supports (GCC does).
bool cpu_has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}

bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
}

bool cpu_has_avx512() {
  __builtin_cpu_init();
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
}
#endif

}  // namespace

bool dtype_valid(Dtype d) { return d == Dtype::f32 || d == Dtype::bf16 || d == Dtype::f16; }

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::scalar: return true;
#if ZEROD_OPTIM_X86
    case Isa::avx2: {
      static const bool has = cpu_has_avx2();
      return has;
    }
    case Isa::avx512: {
      static const bool has = cpu_has_avx512();
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
