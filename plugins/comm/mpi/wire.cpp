#include "wire.h"

namespace zerod::comm::mpi {

Header header_of(uint64_t seq, int node, const Call& c, const char* what) {
  Header h;
  h.seq = seq;
  h.node = node;
  h.coll = static_cast<int32_t>(c.coll);
  h.tag = c.tag;
  h.count = c.count;
  h.dtype = c.dtype;
  h.op = c.op;
  h.root = c.root;
  h.compressed = c.compressed ? 1 : 0;
  h.compressed_count = c.compressed_count;
  copy_text(h.what, sizeof h.what, what);
  return h;
}

bool eager(const Call& c, int nodes) {
  return nodes > 1 && c.coll == Coll::all_reduce && c.count > 0 && c.count * element_bytes(c) <= kEagerBytes;
}

Call call_of(const Header& h) {
  Call c;
  c.coll = static_cast<Coll>(h.coll);
  c.tag = h.tag;
  c.count = h.count;
  c.dtype = h.dtype;
  c.op = h.op;
  c.root = h.root;
  c.compressed = h.compressed != 0;
  c.compressed_count = h.compressed_count;
  return c;
}

}  // namespace zerod::comm::mpi
