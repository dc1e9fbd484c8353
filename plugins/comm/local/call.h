// One rank's call to a collective, as the rendezvous compares, checks,
// describes and executes it; and the bytes a ring algorithm would send for it.
// Shared by the local and mpi plugins.
#ifndef ZEROD_COMM_LOCAL_CALL_H
#define ZEROD_COMM_LOCAL_CALL_H

#include <zerod/zerod_plugin.h>

#include <cstdint>

#include "kernels.h"
#include "text.h"

namespace zerod::comm {

enum class Coll { all_reduce, reduce_scatter, all_gather, broadcast, barrier, all_to_all };

// Fields a collective does not take stay zero, so that same_collective()
// can compare every field.
struct Call {
  Coll coll = Coll::barrier;
  uint64_t tag = 0;
  uint64_t count = 0;        // all_reduce, broadcast: count; reduce_scatter: recv_count;
                             // all_gather: send_count; all_to_all: elements per block
  zd_comm_dtype dtype = 0;   // 0 for a barrier
  zd_reduce_op op = 0;       // all_reduce, reduce_scatter only
  int32_t root = 0;          // broadcast only
  // A step of compressed_all_reduce (its byte all_to_all or all_gather, or
  // a barrier for count 0), with that call's fp32 count: so that a rank in
  // a compressed all-reduce and one in a plain byte collective disagree, and
  // the step is not counted as a collective of its own.
  bool compressed = false;
  uint64_t compressed_count = 0;
  const void* send = nullptr;  // all_reduce, broadcast: buf
  void* recv = nullptr;        // all_reduce, broadcast: buf
  // Set by the plugin glue for an argument the Call does not carry (a NULL
  // error-feedback buffer): the reason the call is invalid. Not compared.
  const char* invalid = nullptr;
};

// Whether two ranks are in the same collective: everything but the buffers.
bool same_collective(const Call& a, const Call& b);

// Checks rank `rank`'s call for a job of `world` ranks; false with the
// reason in `why` for a bad dtype (u8 in a reduction), op or root, a NULL
// buffer, a size that overflows, or send and recv that overlap other than
// in place: all_to_all never; reduce_scatter only at recv = send + rank *
// recv_count, all_gather only at send = recv + rank * send_count (other
// ranks read this rank's send while it writes its recv, so any other overlap
// hands them this rank's results as its inputs).
bool check_call(const Call& c, int world, int rank, Text& why);

// Bytes per element of a zd_comm_dtype (0 for an unknown one).
uint64_t dtype_size(zd_comm_dtype dtype);
// The element size of a call that passed check_call().
inline uint64_t element_bytes(const Call& c) { return dtype_size(c.dtype); }

// Valid only for reductions that passed check_call().
Dtype dtype_of(const Call& c);
Reduce reduce_of(const Call& c);

// Appends "all_reduce sum, 1024 f32" (with ", tag 0x.." when with_tag);
// "all_to_all, 64 u8 per rank"; a step of a compressed all-reduce reads
// "compressed_all_reduce of 1000 f32 (its all_gather, 132 u8)".
void describe(Text& t, const Call& c, bool with_tag);

// What this rank would send over a link running a ring algorithm:
//   all_reduce      2 (N-1)/N * count * size, rounded down
//   reduce_scatter  (N-1) * recv_count * size
//   all_gather      (N-1) * send_count * size
//   all_to_all      (N-1) * count * size (every block but its own)
//   broadcast       count * size for every rank but the one before the root
//                   on the ring, (root - 1) mod N, which only receives
//   barrier         0
// A world of one sends nothing.
uint64_t ring_bytes(const Call& c, int world, int rank);

}  // namespace zerod::comm

#endif  // ZEROD_COMM_LOCAL_CALL_H
