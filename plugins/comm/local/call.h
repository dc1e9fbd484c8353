// One rank's call to a collective, as the communicator compares, checks,
// describes and executes it; and the bytes a ring algorithm would send for it.
#ifndef ZEROD_COMM_LOCAL_CALL_H
#define ZEROD_COMM_LOCAL_CALL_H

#include <zerod/zerod_plugin.h>

#include <cstdint>

#include "kernels.h"
#include "text.h"

namespace zerod::comm {

enum class Coll { all_reduce, reduce_scatter, all_gather, broadcast, barrier };

// Fields a collective does not take stay zero, so that same_collective()
// can compare every field.
struct Call {
  Coll coll = Coll::barrier;
  uint64_t tag = 0;
  uint64_t count = 0;        // all_reduce, broadcast: count; reduce_scatter: recv_count; all_gather: send_count
  zd_comm_dtype dtype = 0;   // 0 for a barrier
  zd_reduce_op op = 0;       // all_reduce, reduce_scatter only
  int32_t root = 0;          // broadcast only
  const void* send = nullptr;  // all_reduce, broadcast: buf
  void* recv = nullptr;        // all_reduce, broadcast: buf
};

// Whether two ranks are in the same collective: everything but the buffers.
bool same_collective(const Call& a, const Call& b);

// Checks one rank's call for a world of `world` ranks; false with the reason
// in `why` for a bad dtype, op or root, a NULL buffer, or a size that
// overflows.
bool check_call(const Call& c, int world, Text& why);

// Valid only for calls that passed check_call().
Dtype dtype_of(const Call& c);
Reduce reduce_of(const Call& c);

// Appends "all_reduce sum, 1024 f32" (with ", tag 0x.." when with_tag).
void describe(Text& t, const Call& c, bool with_tag);

// What this rank would send over a link running a ring algorithm:
//   all_reduce      2 (N-1)/N * count * size, rounded down
//   reduce_scatter  (N-1) * recv_count * size
//   all_gather      (N-1) * send_count * size
//   broadcast       count * size for every rank but the one before the root
//                   on the ring, (root - 1) mod N, which only receives
//   barrier         0
// A world of one sends nothing.
uint64_t ring_bytes(const Call& c, int world, int rank);

}  // namespace zerod::comm

#endif  // ZEROD_COMM_LOCAL_CALL_H
