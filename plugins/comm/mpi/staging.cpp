#include "staging.h"

#include <cstring>

#include "kernels.h"

namespace zerod::comm::mpi {
namespace {

const uint8_t* at(const void* p, uint64_t offset) { return static_cast<const uint8_t*>(p) + offset; }
uint8_t* at(void* p, uint64_t offset) { return static_cast<uint8_t*>(p) + offset; }

// Rank `index`'s 1/L of `count` elements: the reduction over the L ranks'
// `bufs` (rank order) into dst. One rank copies: its values stay bit for
// bit (a reduction of one source would round 16-bit NaNs).
void reduce_share(const Call* calls, int local, int index, bool use_send, uint64_t count, uint8_t* dst,
                  const Scratch& s) {
  const Call& me = calls[index];
  const uint64_t size = element_bytes(me);
  uint64_t b, e;
  split(count, size, local, index, &b, &e);
  if (b == e) return;
  auto src = [&](int j) { return at(use_send ? calls[j].send : calls[j].recv, b * size); };
  if (local == 1) {
    std::memcpy(dst + b * size, src(0), (e - b) * size);
    return;
  }
  for (int j = 0; j < local; ++j) s.srcs[j] = src(j);
  s.dsts[0] = dst + b * size;
  ReduceJob job;
  job.srcs = s.srcs;
  job.nsrc = local;
  job.dsts = s.dsts;
  job.ndst = 1;
  job.count = e - b;
  job.dtype = dtype_of(me);
  job.op = reduce_of(me);
  reduce(job);
}

}  // namespace

void stage_in(const Call* calls, const Topology& t, int index, uint8_t* staging, const Layout& l,
              const Scratch& scratch) {
  const Call& me = calls[index];
  const uint64_t size = element_bytes(me);
  const uint64_t rank = static_cast<uint64_t>(t.first_rank(t.node) + index);
  uint8_t* node = staging + l.node;
  switch (me.coll) {
    case Coll::all_reduce: reduce_share(calls, t.local, index, false, me.count, node, scratch); return;
    case Coll::reduce_scatter:
      reduce_share(calls, t.local, index, true, me.count * static_cast<uint64_t>(t.world), node, scratch);
      return;
    case Coll::all_gather:
      if (me.count > 0) std::memcpy(node + rank * me.count * size, me.send, me.count * size);
      return;
    case Coll::broadcast:
      if (static_cast<uint64_t>(me.root) == rank && me.count > 0) std::memcpy(node, me.recv, me.count * size);
      return;
    case Coll::all_to_all: {
      const uint64_t block = me.count * size;
      const uint64_t local = static_cast<uint64_t>(t.local);
      if (block == 0) return;
      for (int m = 0; m < t.nodes; ++m) {
        for (uint64_t j = 0; j < local; ++j) {
          const uint64_t to = rank_block(m, static_cast<uint64_t>(index), j, t, block);
          std::memcpy(node + to, at(me.send, (static_cast<uint64_t>(m) * local + j) * block), block);
        }
      }
      return;
    }
    case Coll::barrier: return;
  }
}

void stage_out(const Call& me, const Topology& t, int index, const uint8_t* staging, const Layout& l) {
  const uint64_t size = element_bytes(me);
  const uint64_t rank = static_cast<uint64_t>(t.first_rank(t.node) + index);
  const uint8_t* node = staging + l.node;
  switch (me.coll) {
    case Coll::all_reduce:
      if (me.count > 0) std::memcpy(me.recv, node, me.count * size);
      return;
    case Coll::reduce_scatter:
      if (me.count > 0) std::memcpy(me.recv, node + rank * me.count * size, me.count * size);
      return;
    case Coll::all_gather:
      if (me.count > 0) std::memcpy(me.recv, node, static_cast<uint64_t>(t.world) * me.count * size);
      return;
    case Coll::broadcast:
      if (static_cast<uint64_t>(me.root) != rank && me.count > 0) std::memcpy(me.recv, node, me.count * size);
      return;
    case Coll::all_to_all: {
      const uint64_t block = me.count * size;
      const uint64_t local = static_cast<uint64_t>(t.local);
      if (block == 0) return;
      for (int m = 0; m < t.nodes; ++m) {
        // Blocks from this node's ranks are in node's group for this node;
        // node m's arrived in the in-area's group m, laid out alike.
        const uint8_t* from = m == t.node ? node : staging + l.in;
        for (uint64_t i = 0; i < local; ++i) {
          const uint64_t src = rank_block(m, i, static_cast<uint64_t>(index), t, block);
          std::memcpy(at(me.recv, (static_cast<uint64_t>(m) * local + i) * block), from + src, block);
        }
      }
      return;
    }
    case Coll::barrier: return;
  }
}

}  // namespace zerod::comm::mpi
