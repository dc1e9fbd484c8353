// Run-time ISA selection for the 1-bit kernels. Built for the baseline ISA:
// it calls into the AVX2 table only after asking the kit's probe
// (zerod/kit/cpu.h, which also checks that the OS saves the YMM registers).
#include <zerod/kit/cpu.h>

#include "onebit_kernels.h"

namespace zerod::comm::onebit::detail {

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::scalar: return true;
    case Isa::avx2: {
#if ZEROD_ONEBIT_X86
      static const bool has = cpu::features().avx2 && cpu::features().fma;
      return has;
#else
      return false;
#endif
    }
  }
  return false;
}

Isa best_isa() { return isa_supported(Isa::avx2) ? Isa::avx2 : Isa::scalar; }

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
  }
  return "?";
}

const Kernels& kernels(Isa isa) {
#if ZEROD_ONEBIT_X86
  if (isa == Isa::avx2 && isa_supported(Isa::avx2)) return avx2::kTable;
#else
  (void)isa;
#endif
  return scalar::kTable;
}

}  // namespace zerod::comm::onebit::detail
