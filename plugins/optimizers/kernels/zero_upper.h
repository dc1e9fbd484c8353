// Clearing the upper halves of the vector registers as a vector entry point
// returns. Include only in translation units built with -mavx2 or wider.
//
// Why by hand rather than trusting the compiler's vzeroupper: GCC 12 left it
// out at the end of adam_run's AVX2 instantiations (they end in a jump to
// the scalar tail loop), and in the ASan build out of the 1-bit Adam and
// AVX-512 entry points too. A kernel that returns with the upper halves
// dirty makes every SSE instruction run next on the thread pay on Intel
// cores (the engine's code is built for baseline x86-64, so is libm): the
// scalar Adam loop ran at 2 M params/s instead of 120 M on a Xeon VM.
// kernels.*UpperState* (tests/kernels/upper_state_test.cpp) checks every
// vector entry point.
#ifndef ZEROD_OPTIM_ZERO_UPPER_H
#define ZEROD_OPTIM_ZERO_UPPER_H

#include <immintrin.h>

namespace zerod::optim {
namespace {

struct ZeroUpperOnReturn {
  ZeroUpperOnReturn() = default;
  ZeroUpperOnReturn(const ZeroUpperOnReturn&) = delete;
  ZeroUpperOnReturn& operator=(const ZeroUpperOnReturn&) = delete;
  ~ZeroUpperOnReturn() { _mm256_zeroupper(); }
};

}  // namespace
}  // namespace zerod::optim

#endif  // ZEROD_OPTIM_ZERO_UPPER_H
