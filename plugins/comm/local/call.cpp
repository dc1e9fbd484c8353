#include "call.h"

#include <cinttypes>

namespace zerod::comm {
namespace {

const char* coll_name(Coll c) {
  switch (c) {
    case Coll::all_reduce: return "all_reduce";
    case Coll::reduce_scatter: return "reduce_scatter";
    case Coll::all_gather: return "all_gather";
    case Coll::broadcast: return "broadcast";
    case Coll::barrier: return "barrier";
    case Coll::all_to_all: return "all_to_all";
  }
  return "?";
}

const char* dtype_name(zd_comm_dtype d) {
  switch (d) {
    case ZD_COMM_F32: return "f32";
    case ZD_COMM_BF16: return "bf16";
    case ZD_COMM_F16: return "f16";
    case ZD_COMM_F64: return "f64";
    case ZD_COMM_U8: return "u8";
    default: return "?";
  }
}

bool reduces(Coll c) { return c == Coll::all_reduce || c == Coll::reduce_scatter; }

// The largest buffer of the call, in elements, is count times this.
uint64_t widest(Coll c, int world) {
  return c == Coll::reduce_scatter || c == Coll::all_gather || c == Coll::all_to_all ? static_cast<uint64_t>(world)
                                                                                      : 1u;
}

}  // namespace

uint64_t dtype_size(zd_comm_dtype d) {
  switch (d) {
    case ZD_COMM_F32: return 4;
    case ZD_COMM_BF16:
    case ZD_COMM_F16: return 2;
    case ZD_COMM_F64: return 8;
    case ZD_COMM_U8: return 1;
    default: return 0;
  }
}

bool same_collective(const Call& a, const Call& b) {
  return a.coll == b.coll && a.tag == b.tag && a.count == b.count && a.dtype == b.dtype && a.op == b.op &&
         a.root == b.root && a.compressed == b.compressed &&
         a.compressed_count == b.compressed_count;
}

bool check_call(const Call& c, int world, int rank, Text& why) {
  if (c.invalid != nullptr) {
    why.add("%s", c.invalid);
    return false;
  }
  if (c.coll == Coll::barrier) return true;
  if (dtype_size(c.dtype) == 0) {
    why.add("dtype %d is not a zd_comm_dtype", c.dtype);
    return false;
  }
  if (reduces(c.coll) && c.dtype == ZD_COMM_U8) {
    why.add("u8 is not reduced: %s takes f32, bf16, f16 or f64 (u8 is for all_gather, all_to_all and broadcast)",
            coll_name(c.coll));
    return false;
  }
  if (reduces(c.coll) && c.op != ZD_REDUCE_SUM && c.op != ZD_REDUCE_MAX) {
    why.add("op %d is not a zd_reduce_op", c.op);
    return false;
  }
  if (c.coll == Coll::broadcast && (c.root < 0 || c.root >= world)) {
    why.add("root %d is outside 0..%d", c.root, world - 1);
    return false;
  }
  const uint64_t size = element_bytes(c);
  if (c.count > UINT64_MAX / size / widest(c.coll, world)) {
    why.add("count %" PRIu64 " overflows a buffer size", c.count);
    return false;
  }
  if (c.count > 0) {
    const bool one_buffer = c.coll == Coll::all_reduce || c.coll == Coll::broadcast;
    if (one_buffer && c.recv == nullptr) {
      why.add("buf is NULL with count %" PRIu64, c.count);
      return false;
    }
    if (!one_buffer && (c.send == nullptr || c.recv == nullptr)) {
      why.add("%s is NULL with count %" PRIu64, c.send == nullptr ? "send" : "recv", c.count);
      return false;
    }
  }
  if (c.count == 0) return true;
  // Other ranks read this rank's send while it writes its recv: an overlap
  // other than the one in-place layout would give them this rank's results
  // (or half-written ones) as its inputs, with no error anywhere.
  const uint64_t chunk = c.count * size;
  const uint64_t whole = chunk * static_cast<uint64_t>(world);
  const auto s = reinterpret_cast<uintptr_t>(c.send);
  const auto r = reinterpret_cast<uintptr_t>(c.recv);
  const uint64_t at = static_cast<uint64_t>(rank) * chunk;
  switch (c.coll) {
    case Coll::all_to_all:
      if (s < r + whole && r < s + whole) {
        why.add("send and recv overlap: all_to_all does not run in place");
        return false;
      }
      break;
    // Kept under 80 characters: the nccl plugin's check across ranks carries
    // the reason in a field of that size.
    case Coll::reduce_scatter:
      if (r < s + whole && s < r + chunk && r != s + at) {
        why.add("send and recv overlap, not in place (recv = send + rank * recv_count)");
        return false;
      }
      break;
    case Coll::all_gather:
      if (s < r + whole && r < s + chunk && s != r + at) {
        why.add("send and recv overlap, not in place (send = recv + rank * send_count)");
        return false;
      }
      break;
    case Coll::all_reduce:
    case Coll::broadcast:
    case Coll::barrier: break;
  }
  return true;
}

Dtype dtype_of(const Call& c) {
  switch (c.dtype) {
    case ZD_COMM_BF16: return Dtype::bf16;
    case ZD_COMM_F16: return Dtype::f16;
    case ZD_COMM_F64: return Dtype::f64;
    default: return Dtype::f32;
  }
}

Reduce reduce_of(const Call& c) { return c.op == ZD_REDUCE_MAX ? Reduce::max : Reduce::sum; }

void describe(Text& t, const Call& c, bool with_tag) {
  if (c.compressed) {
    t.add("compressed_all_reduce of %" PRIu64 " f32", c.compressed_count);
    if (c.coll != Coll::barrier) {
      t.add(" (its %s, %" PRIu64 " u8%s)", coll_name(c.coll), c.count, c.coll == Coll::all_to_all ? " per rank" : "");
    }
    if (with_tag) t.add(", tag 0x%" PRIx64, c.tag);
    return;
  }
  t.add("%s", coll_name(c.coll));
  if (reduces(c.coll)) t.add(" %s", c.op == ZD_REDUCE_SUM ? "sum" : c.op == ZD_REDUCE_MAX ? "max" : "?");
  if (c.coll == Coll::broadcast) t.add(" from rank %d", c.root);
  if (c.coll != Coll::barrier) t.add(", %" PRIu64 " %s", c.count, dtype_name(c.dtype));
  if (c.coll == Coll::all_to_all) t.add(" per rank");
  if (with_tag) t.add("%stag 0x%" PRIx64, c.coll == Coll::barrier ? " " : ", ", c.tag);
}

uint64_t ring_bytes(const Call& c, int world, int rank) {
  if (world < 2 || c.coll == Coll::barrier) return 0;
  const uint64_t n = static_cast<uint64_t>(world);
  const uint64_t bytes = c.count * element_bytes(c);
  switch (c.coll) {
    case Coll::all_reduce: {
      // 128 bits: 2 (N-1) * bytes may pass 2^64 for a buffer that fits.
      const unsigned __int128 twice = static_cast<unsigned __int128>(2 * (n - 1)) * bytes;
      return static_cast<uint64_t>(twice / n);
    }
    case Coll::reduce_scatter:
    case Coll::all_gather:
    case Coll::all_to_all: return (n - 1) * bytes;
    case Coll::broadcast: return rank == (c.root + world - 1) % world ? 0 : bytes;
    case Coll::barrier: break;
  }
  return 0;
}

}  // namespace zerod::comm
