// Picks the kernels once: the AVX2 + F16C copy where the CPU has both, else
// the baseline. Both give the same bits (kernels.h), so the choice only
// changes speed.
#include <zerod/kit/cpu.h>

#include "kernels.h"

namespace zerod::comm {
namespace {

using ReduceFn = void (*)(const ReduceJob&);

ReduceFn pick() {
#if ZEROD_COMM_X86
  if (kernels::avx2_supported()) return kernels::avx2::reduce;
#endif
  return kernels::base::reduce;
}

ReduceFn chosen() {
  static const ReduceFn fn = pick();
  return fn;
}

}  // namespace

#if ZEROD_COMM_X86
// The kit's probe (zerod/kit/cpu.h). These kernels are built with -mavx2
// -mf16c, no FMA.
bool kernels::avx2_supported() { return cpu::features().avx2 && cpu::features().f16c; }
#endif

size_t element_size(Dtype dtype) {
  switch (dtype) {
    case Dtype::f32: return 4;
    case Dtype::bf16:
    case Dtype::f16: return 2;
    case Dtype::f64: return 8;
  }
  return 0;
}

void reduce(const ReduceJob& job) { chosen()(job); }

const char* kernel_isa() {
#if ZEROD_COMM_X86
  return chosen() == kernels::avx2::reduce ? "avx2" : "baseline";
#else
  return "baseline";
#endif
}

}  // namespace zerod::comm
