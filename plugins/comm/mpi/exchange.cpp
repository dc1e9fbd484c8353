#include "exchange.h"

#include <algorithm>
#include <vector>

#include "kernels.h"
#include "work.h"

namespace zerod::comm::mpi {
namespace {

uint64_t align64(uint64_t n) { return (n + 63) / 64 * 64; }

// The receive slot of node m in the in-area, which has one slot per other
// node.
uint64_t slot(int m, int me) { return static_cast<uint64_t>(m < me ? m : m - 1); }

uint64_t largest_chunk(uint64_t count, uint64_t size, int nodes) {
  uint64_t most = 0;
  for (int m = 0; m < nodes; ++m) {
    uint64_t b, e;
    node_chunk(count, size, nodes, m, &b, &e);
    if (e - b > most) most = e - b;
  }
  return most * size;
}

// dst = the node-order reduction of `count` elements: srcs[m] is node m's.
void reduce_nodes(const Call& c, const std::vector<const void*>& srcs, void* dst, uint64_t count) {
  void* dsts[1] = {dst};
  ReduceJob job;
  job.srcs = srcs.data();
  job.nsrc = static_cast<int>(srcs.size());
  job.dsts = dsts;
  job.ndst = 1;
  job.count = count;
  job.dtype = dtype_of(c);
  job.op = reduce_of(c);
  reduce(job);
}

// all_reduce runs in rounds of about `segment` bytes per node chunk, two
// deep: the reduce-scatter of round s+1 is on the wire while round s is
// reduced and its all-gather sent, so the link is not idle while this
// daemon adds. Receives alternate between two slots of the in-area.
uint64_t round_elems(uint64_t size, const Topology& t) {
  const uint64_t per_node = t.segment / size > 0 ? t.segment / size : 1;
  return per_node * static_cast<uint64_t>(t.nodes);
}

bool all_reduce(const Call& c, const Topology& t, uint8_t* base, const Layout& l, Wire& w) {
  const uint64_t size = element_bytes(c);
  const uint64_t per_round = round_elems(size, t);
  const uint64_t rounds = (c.count + per_round - 1) / per_round;
  const uint64_t slot_bytes = largest_chunk(per_round, size, t.nodes);
  const uint64_t others = static_cast<uint64_t>(t.nodes - 1);
  uint8_t* node = base + l.node;
  uint8_t* in = base + l.in;
  // Round s: elements [first(s), first(s) + len(s)); node m's chunk of it.
  auto first = [&](uint64_t s) { return s * per_round; };
  auto len = [&](uint64_t s) { return std::min(per_round, c.count - first(s)); };
  auto chunk = [&](uint64_t s, int m, uint64_t* b, uint64_t* e) {
    node_chunk(len(s), size, t.nodes, m, b, e);
    *b += first(s);
    *e += first(s);
  };
  auto slot_of = [&](uint64_t s, int m) { return in + ((s % 2) * others + slot(m, t.node)) * slot_bytes; };
  // Reduce-scatter of round s: chunk m of this partial to node m; chunk n
  // of theirs into this round's slots.
  auto scatter = [&](uint64_t s) {
    uint64_t mb, me;
    chunk(s, t.node, &mb, &me);
    for (int m = 0; m < t.nodes; ++m) {
      if (m == t.node) continue;
      uint64_t b, e;
      chunk(s, m, &b, &e);
      w.send(m, node + b * size, (e - b) * size);
      w.recv(m, slot_of(s, m), (me - mb) * size);
    }
    return w.mark();
  };
  std::vector<const void*> srcs(static_cast<size_t>(t.nodes));
  uint64_t scattered = rounds > 0 ? scatter(0) : w.mark();
  for (uint64_t s = 0; s < rounds; ++s) {
    // The next round's slots were freed by round s-1's reduction.
    const uint64_t next = s + 1 < rounds ? scatter(s + 1) : scattered;
    if (!w.flush(scattered)) return false;
    scattered = next;
    uint64_t mb, me;
    chunk(s, t.node, &mb, &me);
    for (int m = 0; m < t.nodes; ++m) srcs[m] = m == t.node ? node + mb * size : slot_of(s, m);
    reduce_nodes(c, srcs, node + mb * size, me - mb);
    // All-gather of round s: the reduced chunk n to every node; theirs into
    // place (their sends from this round already went: they were flushed).
    for (int m = 0; m < t.nodes; ++m) {
      if (m == t.node) continue;
      uint64_t b, e;
      chunk(s, m, &b, &e);
      w.send(m, node + mb * size, (me - mb) * size);
      w.recv(m, node + b * size, (e - b) * size);
    }
  }
  return w.flush();
}

bool reduce_scatter(const Call& c, const Topology& t, uint8_t* base, const Layout& l, Wire& w) {
  const uint64_t block = static_cast<uint64_t>(t.local) * c.count * element_bytes(c);  // one node's ranks' chunks
  uint8_t* node = base + l.node;
  uint8_t* in = base + l.in;
  for (int m = 0; m < t.nodes; ++m) {
    if (m == t.node) continue;
    w.send(m, node + static_cast<uint64_t>(m) * block, block);
    w.recv(m, in + slot(m, t.node) * block, block);
  }
  if (!w.flush()) return false;
  uint8_t* mine = node + static_cast<uint64_t>(t.node) * block;
  std::vector<const void*> srcs(static_cast<size_t>(t.nodes));
  for (int m = 0; m < t.nodes; ++m) srcs[m] = m == t.node ? mine : in + slot(m, t.node) * block;
  reduce_nodes(c, srcs, mine, static_cast<uint64_t>(t.local) * c.count);
  return true;
}

bool all_gather(const Call& c, const Topology& t, uint8_t* base, const Layout& l, Wire& w) {
  const uint64_t block = static_cast<uint64_t>(t.local) * c.count * element_bytes(c);
  uint8_t* node = base + l.node;
  for (int m = 0; m < t.nodes; ++m) {
    if (m == t.node) continue;
    w.send(m, node + static_cast<uint64_t>(t.node) * block, block);
    w.recv(m, node + static_cast<uint64_t>(m) * block, block);
  }
  return w.flush();
}

bool broadcast(const Call& c, const Topology& t, uint8_t* base, const Layout& l, Wire& w) {
  const uint64_t bytes = c.count * element_bytes(c);
  const int root = t.node_of(c.root);
  if (t.node == root) {
    for (int m = 0; m < t.nodes; ++m) {
      if (m != t.node) w.send(m, base + l.node, bytes);
    }
  } else {
    w.recv(root, base + l.node, bytes);
  }
  return w.flush();
}

bool all_to_all(const Call& c, const Topology& t, uint8_t* base, const Layout& l, Wire& w) {
  const uint64_t group = static_cast<uint64_t>(t.local) * static_cast<uint64_t>(t.local) * c.count * element_bytes(c);
  for (int m = 0; m < t.nodes; ++m) {
    if (m == t.node) continue;
    w.send(m, base + l.node + static_cast<uint64_t>(m) * group, group);
    w.recv(m, base + l.in + static_cast<uint64_t>(m) * group, group);
  }
  return w.flush();
}

}  // namespace

void node_chunk(uint64_t count, uint64_t size, int nodes, int m, uint64_t* begin, uint64_t* end) {
  split(count, size, nodes, m, begin, end);
}

Layout layout(const Call& c, const Topology& t) {
  Layout l;
  const uint64_t size = element_bytes(c);
  const uint64_t n = static_cast<uint64_t>(t.nodes);
  const uint64_t world = static_cast<uint64_t>(t.world);
  const uint64_t local = static_cast<uint64_t>(t.local);
  switch (c.coll) {
    case Coll::all_reduce:
      l.node_bytes = c.count * size;
      // Two rounds' receive slots (all_reduce above).
      l.in_bytes = c.count == 0 ? 0 : 2 * (n - 1) * largest_chunk(round_elems(size, t), size, t.nodes);
      break;
    case Coll::reduce_scatter:
      l.node_bytes = world * c.count * size;
      l.in_bytes = (n - 1) * local * c.count * size;
      break;
    case Coll::all_gather: l.node_bytes = world * c.count * size; break;
    case Coll::broadcast: l.node_bytes = c.count * size; break;
    case Coll::all_to_all:
      // Group m of node: this node's ranks' blocks for node m's ranks, [i][j]
      // for local rank i and node m's rank j; group m of in: node m's ranks'
      // blocks for this node's ranks (group n unused: local blocks are read
      // from node's group n).
      l.node_bytes = n * local * local * c.count * size;
      l.in_bytes = l.node_bytes;
      break;
    case Coll::barrier: break;
  }
  l.node = 0;
  l.in = align64(l.node_bytes);
  l.total = l.in + align64(l.in_bytes);
  return l;
}

bool exchange(const Call& c, const Topology& t, uint8_t* staging, Wire& wire) {
  if (t.nodes < 2 || c.coll == Coll::barrier) return true;
  const Layout l = layout(c, t);
  switch (c.coll) {
    case Coll::all_reduce: return all_reduce(c, t, staging, l, wire);
    case Coll::reduce_scatter: return reduce_scatter(c, t, staging, l, wire);
    case Coll::all_gather: return all_gather(c, t, staging, l, wire);
    case Coll::broadcast: return broadcast(c, t, staging, l, wire);
    case Coll::all_to_all: return all_to_all(c, t, staging, l, wire);
    case Coll::barrier: break;
  }
  return true;
}

}  // namespace zerod::comm::mpi
