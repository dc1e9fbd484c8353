// The reduction kernels for x86-64 with AVX2 and F16C (built with -mavx2
// -mf16c; kernels_dispatch.cpp checks the CPU before calling them).
#define ZEROD_COMM_ISA avx2
#include "kernels_impl.h"
