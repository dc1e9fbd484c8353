// Picks the kernels once: the AVX2 + F16C copy where the CPU has both, else
// the baseline. Both give the same bits (kernels.h), so the choice only
// changes speed.
#include "kernels.h"

#if ZEROD_COMM_X86
#include <cpuid.h>
#endif

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
bool kernels::avx2_supported() {
  __builtin_cpu_init();
  // F16C straight from CPUID (leaf 1, ECX bit 29): clang 14, which the fuzz
  // build uses, does not know "f16c" in __builtin_cpu_supports (GCC does).
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __builtin_cpu_supports("avx2") && __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}
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
