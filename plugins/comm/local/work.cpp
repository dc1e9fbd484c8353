#include "work.h"

#include <cstring>

namespace zerod::comm {
namespace {

// Outputs at least this large are written past the cache when no input
// aliases them: a reduce-scatter's recv shard of this size would be
// evicted before anyone reads it, so fetching its old contents on the way
// in is wasted traffic. (glibc's memcpy, used by all_gather and broadcast,
// makes the same choice on its own.)
constexpr uint64_t kStreamBytes = uint64_t{4} << 20;

const char* bytes_at(const void* p, uint64_t offset) { return static_cast<const char*>(p) + offset; }
char* bytes_at(void* p, uint64_t offset) { return static_cast<char*>(p) + offset; }

void all_reduce(const Call* calls, int world, int rank, const Scratch& s) {
  const Call& me = calls[rank];
  const uint64_t size = element_bytes(me);
  uint64_t begin = 0, end = 0;
  split(me.count, size, world, rank, &begin, &end);
  if (begin == end) return;
  for (int k = 0; k < world; ++k) {
    s.srcs[k] = bytes_at(calls[k].recv, begin * size);
    s.dsts[k] = bytes_at(calls[k].recv, begin * size);
  }
  ReduceJob job;
  job.srcs = s.srcs;
  job.nsrc = world;
  job.dsts = s.dsts;
  job.ndst = world;
  job.count = end - begin;
  job.dtype = dtype_of(me);
  job.op = reduce_of(me);
  reduce(job);
}

void reduce_scatter(const Call* calls, int world, int rank, const Scratch& s) {
  const Call& me = calls[rank];
  const uint64_t chunk = me.count * element_bytes(me);
  if (world == 1) {
    if (me.recv != me.send) std::memmove(me.recv, me.send, chunk);
    return;
  }
  // Written only after the tile is read from every source, so recv may be
  // send + rank * recv_count (in place).
  for (int k = 0; k < world; ++k) s.srcs[k] = bytes_at(calls[k].send, static_cast<uint64_t>(rank) * chunk);
  s.dsts[0] = me.recv;
  const auto* from = static_cast<const char*>(me.send);
  const auto* to = static_cast<const char*>(me.recv);
  const bool aliases = to + chunk > from && to < from + chunk * static_cast<uint64_t>(world);
  ReduceJob job;
  job.stream = !aliases && chunk >= kStreamBytes;
  job.srcs = s.srcs;
  job.nsrc = world;
  job.dsts = s.dsts;
  job.ndst = 1;
  job.count = me.count;
  job.dtype = dtype_of(me);
  job.op = reduce_of(me);
  reduce(job);
}

void all_gather(const Call* calls, int world, int rank) {
  const Call& me = calls[rank];
  const uint64_t chunk = me.count * element_bytes(me);
  // Pulled, so this rank writes only its own recv; chunk k of it is read by
  // nobody else, and chunk rank of rank k's recv (its send, in place) is
  // written by nobody.
  for (int k = 0; k < world; ++k) {
    char* to = bytes_at(me.recv, static_cast<uint64_t>(k) * chunk);
    if (k == rank) {
      if (to != me.send) std::memmove(to, me.send, chunk);
    } else {
      std::memcpy(to, calls[k].send, chunk);
    }
  }
}

void all_to_all(const Call* calls, int world, int rank) {
  const Call& me = calls[rank];
  const uint64_t block = me.count * element_bytes(me);
  // Pulled: block `rank` of every rank's send into this rank's recv, which
  // no other rank touches (check_call refuses a send that overlaps it).
  for (int k = 0; k < world; ++k) {
    std::memcpy(bytes_at(me.recv, static_cast<uint64_t>(k) * block),
                bytes_at(calls[k].send, static_cast<uint64_t>(rank) * block), block);
  }
}

void broadcast(const Call* calls, int rank) {
  const Call& me = calls[rank];
  if (rank == me.root) return;
  const Call& root = calls[me.root];
  if (me.recv != root.recv) std::memcpy(me.recv, root.recv, me.count * element_bytes(me));
}

}  // namespace

void split(uint64_t count, uint64_t size, int world, int rank, uint64_t* begin, uint64_t* end) {
  const uint64_t per_line = size >= 64 ? 1 : 64 / size;
  const unsigned __int128 lines = (count + per_line - 1) / per_line;
  const uint64_t b = static_cast<uint64_t>(lines * static_cast<unsigned>(rank) / static_cast<unsigned>(world)) * per_line;
  const uint64_t e =
      static_cast<uint64_t>(lines * static_cast<unsigned>(rank + 1) / static_cast<unsigned>(world)) * per_line;
  *begin = b < count ? b : count;
  *end = e < count ? e : count;
}

bool shares_buffers(const Call& c, int world) { return world > 1 && c.coll != Coll::barrier && c.count > 0; }

void do_share(const Call* calls, int world, int rank, const Scratch& scratch) {
  const Call& me = calls[rank];
  if (me.coll == Coll::barrier || me.count == 0) return;
  switch (me.coll) {
    case Coll::all_reduce:
      if (world > 1) all_reduce(calls, world, rank, scratch);
      return;
    case Coll::reduce_scatter: reduce_scatter(calls, world, rank, scratch); return;
    case Coll::all_gather: all_gather(calls, world, rank); return;
    case Coll::all_to_all: all_to_all(calls, world, rank); return;
    case Coll::broadcast: broadcast(calls, rank); return;
    case Coll::barrier: return;
  }
}

}  // namespace zerod::comm
