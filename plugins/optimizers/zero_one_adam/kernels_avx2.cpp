// The 0/1 Adam loops of kernels_impl.h built with -mavx2 -mfma -mf16c
// (CMakeLists.txt); kernels.cpp calls them on hosts that have AVX2.
#include <cstdint>

#include "element_io.h"
#include "kernels.h"

namespace zerod::optim::zero_one {
#define ZD_ZERO_ONE_NS avx2
#include "kernels_impl.h"
#undef ZD_ZERO_ONE_NS
}  // namespace zerod::optim::zero_one
