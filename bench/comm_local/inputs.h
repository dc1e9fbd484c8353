// The deterministic inputs of bench_comm_local's collectives and the values
// their outputs must hold, shared by formula with torch_gloo.py so that the
// two compared runs do the same work and are both checked.
//
// Buffers are cut in blocks of chunk = count / ranks elements (all_reduce's
// last block may be a shorter tail). Rank r's input at element j of block b
// is r + 1 + 100 b + 10000 (j % 5): the rank, the block and the place in it
// all show, so a block from the wrong rank, sent to the wrong rank or
// shifted is caught. Every value and every sum over up to 64 ranks (the
// most --ranks takes) stays below 2^24, so each is an exact f32 whatever
// order a plugin sums the ranks in.
#ifndef ZEROD_BENCH_COMM_INPUTS_H
#define ZEROD_BENCH_COMM_INPUTS_H

#include <cstddef>

namespace zerod::bench {

inline float input_value(int rank, size_t block, size_t j) {
  return static_cast<float>(static_cast<size_t>(rank) + 1 + 100 * block + 10000 * (j % 5));
}

// The sum over `ranks` ranks of input_value(r, block, j).
inline float input_sum(int ranks, size_t block, size_t j) {
  const size_t n = static_cast<size_t>(ranks);
  return static_cast<float>(n * (n + 1) / 2 + n * (100 * block + 10000 * (j % 5)));
}

}  // namespace zerod::bench

#endif  // ZEROD_BENCH_COMM_INPUTS_H
