// The 1-bit LAMB loops of kernels_impl.h built with -mavx2 -mfma -mf16c
// (CMakeLists.txt); kernels.cpp calls them on hosts that have AVX2.
#include <cmath>

#include "element_io.h"
#include "kernels.h"

namespace zerod::optim::onebit_lamb {
#define ZD_LAMB_NS avx2
#include "kernels_impl.h"
#undef ZD_LAMB_NS
}  // namespace zerod::optim::onebit_lamb
