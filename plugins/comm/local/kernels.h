// The memory work of a reduction: N source arrays reduced element by element
// in source order, the result written to every destination. Each ISA level
// has its own copy (kernels_base.cpp, kernels_avx2.cpp); reduce() picks the
// best one this CPU runs, once.
//
// Results are bit-identical on every path: sums are plain IEEE adds in
// source order (no FMA, no reassociation), 16-bit values are widened exactly,
// combined in fp32 and rounded once, round-to-nearest-even (zerod/kit/half.h, which
// F16C matches bit for bit).
#ifndef ZEROD_COMM_LOCAL_KERNELS_H
#define ZEROD_COMM_LOCAL_KERNELS_H

#include <cstddef>

namespace zerod::comm {

enum class Dtype { f32, bf16, f16, f64 };
enum class Reduce { sum, max };

// MAX keeps the later value when it is greater or NaN, so a NaN anywhere
// gives NaN (as torch.maximum does) and ties keep the earlier rank's value.
struct ReduceJob {
  const void* const* srcs = nullptr;  // nsrc >= 1 arrays of count elements
  int nsrc = 0;
  void* const* dsts = nullptr;        // ndst arrays of count elements; a dst may be a src
  int ndst = 0;
  size_t count = 0;
  Dtype dtype = Dtype::f32;
  Reduce op = Reduce::sum;
  // Write the destinations with non-temporal stores: for large outputs no
  // source aliases, which would otherwise be read into the cache only to be
  // overwritten (a third more traffic for a reduce-scatter of two ranks).
  bool stream = false;
};

size_t element_size(Dtype dtype);

// Runs the job with the best kernels this CPU supports.
void reduce(const ReduceJob& job);
// "avx2" or "baseline": what reduce() uses, for logs and the benchmark.
const char* kernel_isa();

namespace kernels {
namespace base {
void reduce(const ReduceJob& job);
}
#if ZEROD_COMM_X86
namespace avx2 {
void reduce(const ReduceJob& job);
}
// Whether this CPU runs the avx2 path (AVX2 and F16C).
bool avx2_supported();
#endif
}  // namespace kernels

}  // namespace zerod::comm

#endif  // ZEROD_COMM_LOCAL_KERNELS_H
