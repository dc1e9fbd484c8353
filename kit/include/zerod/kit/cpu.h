// The one CPU-feature probe, for the engine and the plugins: which of the
// instruction sets their vector paths use this CPU runs. Header-only and
// dependency-free (kit/, ARCHITECTURE.md §13).
//
// AVX2, FMA and AVX-512 are asked of __builtin_cpu_supports, which also
// checks (XGETBV) that the OS saves the YMM/ZMM registers: a CPU that has
// the instructions under an OS that does not save their registers reports
// false. F16C and SSE4.2 come straight from CPUID leaf 1 (ECX bits 29 and
// 20): clang 14, which the fuzz build uses, does not know "f16c" in
// __builtin_cpu_supports (GCC does), and SSE registers are always saved.
//
// `static inline`, as zerod/kit/half.h explains: files built with different
// -m flags include this; each copy must be baseline code. The answers are
// computed once per translation unit (the function-local static).
#ifndef ZEROD_KIT_CPU_H
#define ZEROD_KIT_CPU_H

#if defined(__x86_64__) || defined(__i386__)
#define ZEROD_KIT_CPU_X86 1
#include <cpuid.h>
#else
#define ZEROD_KIT_CPU_X86 0
#endif

namespace zerod::cpu {

struct Features {
  bool sse42 = false;
  bool avx2 = false;  // with the OS saving YMM
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;  // with the OS saving ZMM
  bool avx512bw = false;
  bool avx512vl = false;
};

// Asks the CPU now (the probe itself; features() keeps its answer).
static inline Features probe() {
  Features f;
#if ZEROD_KIT_CPU_X86
  __builtin_cpu_init();
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(1, &a, &b, &c, &d)) {
    f.sse42 = (c & bit_SSE4_2) != 0;
    f.f16c = (c & bit_F16C) != 0;
  }
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
#endif
  return f;
}

static inline const Features& features() {
  static const Features f = probe();
  return f;
}

// The AVX2 level the project's vector kernels are built for (-mavx2 -mfma
// -mf16c).
static inline bool has_avx2_fma_f16c() {
  const Features& f = features();
  return f.avx2 && f.fma && f.f16c;
}

// The AVX-512 level (-mavx512f -mavx512bw -mavx512vl, on top of the AVX2 one).
static inline bool has_avx512_f_bw_vl() {
  const Features& f = features();
  return has_avx2_fma_f16c() && f.avx512f && f.avx512bw && f.avx512vl;
}

}  // namespace zerod::cpu

#endif  // ZEROD_KIT_CPU_H
