// The share of a collective's memory work one rank's thread does once every
// rank has arrived. calls[j] is rank j's call; all calls are the same
// collective (same_collective) and passed check_call().
//
//   all_reduce      rank r reduces its 1/N of the elements across all N
//                   buffers and writes the result into all N
//   reduce_scatter  rank r reduces chunk r of every send into its recv
//   all_gather      rank r copies every other rank's send into its recv
//   all_to_all      rank r copies block r of every rank's send into its recv
//   broadcast       every rank but the root copies the root's buffer
//
// So a rank writes other ranks' buffers only in all_reduce, and then only
// its own 1/N; no two ranks write the same bytes.
#ifndef ZEROD_COMM_LOCAL_WORK_H
#define ZEROD_COMM_LOCAL_WORK_H

#include "call.h"

namespace zerod::comm {

// Scratch owned by one rank: `world` source and destination pointers, made
// once so the work never allocates.
struct Scratch {
  const void** srcs = nullptr;
  void** dsts = nullptr;
};

void do_share(const Call* calls, int world, int rank, const Scratch& scratch);

// Whether ranks read or write each other's buffers in this collective, so
// that none may return before all have finished their share.
bool shares_buffers(const Call& c, int world);

// [begin, end) of rank's part of count elements of `size` bytes, cut at
// 64-byte multiples so that two ranks never write the same cache line of a
// 64-byte aligned buffer.
void split(uint64_t count, uint64_t size, int world, int rank, uint64_t* begin, uint64_t* end);

}  // namespace zerod::comm

#endif  // ZEROD_COMM_LOCAL_WORK_H
