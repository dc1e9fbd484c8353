// A collective between daemons, once every daemon's ranks have arrived and
// have staged their inputs in their daemon's staging buffer: each daemon
// exchanges its staging with the others directly (no ring: a daemon sends
// each other daemon what that daemon needs, so each byte crosses the
// network once per daemon, never once per rank) and reduces what it
// receives in node order.
//
//   all_reduce      the node partial (count elements) is cut in N chunks;
//                   node n gets chunk n of every node's partial, sums them
//                   in node order (fp32 for 16-bit types, rounded once),
//                   then sends the result to every node (2(N-1)/N of the
//                   buffer each way, as a ring)
//   reduce_scatter  node n gets, from every node, its partial of the chunks
//                   of node n's ranks, and sums them in node order
//   all_gather      node n sends its ranks' chunks to every node
//   broadcast       the root's node sends the buffer to every node
//   all_to_all      node n sends node m the blocks its ranks have for m's
//   barrier         nothing: the arrival across nodes is the barrier
//
// So an all_reduce sums ranks node by node (local ranks in order, the
// partial rounded to the dtype), then the nodes' partials in node order:
// the same order every time, and one result copied to every rank, so every
// rank gets the same bits.
#ifndef ZEROD_COMM_MPI_EXCHANGE_H
#define ZEROD_COMM_MPI_EXCHANGE_H

#include <cstdint>

#include "call.h"
#include "topology.h"

namespace zerod::comm::mpi {

// Where a collective's data lives in the staging buffer (byte offsets,
// 64-byte aligned).
struct Layout {
  uint64_t node = 0;  // this daemon's data: the partial, the gathered ranks,
  uint64_t node_bytes = 0;  // the broadcast payload, all_to_all's outgoing blocks
  uint64_t in = 0;          // what comes from other daemons before it is reduced
  uint64_t in_bytes = 0;    // (reductions), or all_to_all's incoming blocks
  uint64_t total = 0;
};

Layout layout(const Call& c, const Topology& t);

// all_to_all: where block [i][j] of group m is, in the node area or the
// in-area (each holds `nodes` groups of local x local blocks): the block
// local rank i of the sending node has for rank j of the receiving node.
inline uint64_t rank_block(int m, uint64_t i, uint64_t j, const Topology& t, uint64_t block) {
  const uint64_t local = static_cast<uint64_t>(t.local);
  return ((static_cast<uint64_t>(m) * local + i) * local + j) * block;
}

// all_reduce: [begin, end) of node m's chunk of count elements of size
// bytes; the same cut on every daemon.
void node_chunk(uint64_t count, uint64_t size, int nodes, int m, uint64_t* begin, uint64_t* end);

// What exchange() needs from the network side.
class Wire {
 public:
  virtual void send(int node, const void* data, uint64_t bytes) = 0;
  virtual void recv(int node, void* data, uint64_t bytes) = 0;
  // The number the next transfer will get (transfers are numbered in the
  // order they are posted).
  virtual uint64_t mark() const = 0;
  // Waits for every transfer posted before `until` (a mark(); by default
  // all); false when the collective failed (the failure is reported by the
  // Wire).
  virtual bool flush(uint64_t until = UINT64_MAX) = 0;

 protected:
  ~Wire() = default;
};

// The daemon's side of collective c (valid, agreed by every daemon) on
// staging laid out by layout(c, t). Throws std::bad_alloc.
bool exchange(const Call& c, const Topology& t, uint8_t* staging, Wire& wire);

}  // namespace zerod::comm::mpi

#endif  // ZEROD_COMM_MPI_EXCHANGE_H
