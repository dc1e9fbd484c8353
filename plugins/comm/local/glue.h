// The C entry points of a comm plugin's descriptors, written once for the
// local and mpi plugins: each turns its arguments into a Call for the
// instance. An instance type I offers
//   zd_status run(const zd_comm_call*, Call) noexcept;
//   zd_status compressed_all_reduce(const zd_comm_call*, float* buf, uint64_t count,
//                                   float* worker_error, float* server_error) noexcept;
//   void abort(zd_status, const char*) noexcept;
//   const char* last_error(int rank) const noexcept;
//   zd_comm_figures figures(int rank) const noexcept;
// Every entry point is noexcept and refuses a NULL instance.
#ifndef ZEROD_COMM_LOCAL_GLUE_H
#define ZEROD_COMM_LOCAL_GLUE_H

#include <zerod/zerod_plugin.h>

#include <cstring>

#include "call.h"

namespace zerod::comm {

// Copies f into out, no further than out->struct_size (a caller built
// against an older header knows fewer fields); out->struct_size is kept.
inline void put_figures(zd_comm_figures* out, zd_comm_figures f) noexcept {
  if (out == nullptr || out->struct_size < sizeof(uint32_t)) return;
  const uint32_t size = out->struct_size;
  std::memcpy(out, &f, size < sizeof f ? size : sizeof f);
  out->struct_size = size;
}

template <typename I>
struct Glue {
  static zd_status all_reduce(void* inst, const zd_comm_call* call, void* buf, uint64_t count, zd_comm_dtype dtype,
                              zd_reduce_op op) noexcept {
    Call c;
    c.coll = Coll::all_reduce;
    c.count = count;
    c.dtype = dtype;
    c.op = op;
    c.send = buf;
    c.recv = buf;
    return run(inst, call, c);
  }

  static zd_status reduce_scatter(void* inst, const zd_comm_call* call, const void* send, void* recv,
                                  uint64_t recv_count, zd_comm_dtype dtype, zd_reduce_op op) noexcept {
    Call c;
    c.coll = Coll::reduce_scatter;
    c.count = recv_count;
    c.dtype = dtype;
    c.op = op;
    c.send = send;
    c.recv = recv;
    return run(inst, call, c);
  }

  static zd_status all_gather(void* inst, const zd_comm_call* call, const void* send, void* recv,
                              uint64_t send_count, zd_comm_dtype dtype) noexcept {
    Call c;
    c.coll = Coll::all_gather;
    c.count = send_count;
    c.dtype = dtype;
    c.send = send;
    c.recv = recv;
    return run(inst, call, c);
  }

  static zd_status broadcast(void* inst, const zd_comm_call* call, void* buf, uint64_t count, zd_comm_dtype dtype,
                             int32_t root) noexcept {
    Call c;
    c.coll = Coll::broadcast;
    c.count = count;
    c.dtype = dtype;
    c.root = root;
    c.send = buf;
    c.recv = buf;
    return run(inst, call, c);
  }

  static zd_status barrier(void* inst, const zd_comm_call* call) noexcept {
    Call c;
    c.coll = Coll::barrier;
    return run(inst, call, c);
  }

  static zd_status all_to_all(void* inst, const zd_comm_call* call, const void* send, void* recv, uint64_t count,
                              zd_comm_dtype dtype) noexcept {
    Call c;
    c.coll = Coll::all_to_all;
    c.count = count;
    c.dtype = dtype;
    c.send = send;
    c.recv = recv;
    return run(inst, call, c);
  }

  static zd_status compressed_all_reduce(void* inst, const zd_comm_call* call, float* buf, uint64_t count,
                                         float* worker_error, float* server_error) noexcept {
    if (inst == nullptr) return ZD_ERR_INVALID_ARGUMENT;
    return static_cast<I*>(inst)->compressed_all_reduce(call, buf, count, worker_error, server_error);
  }

  static void abort(void* inst, zd_status status, const char* reason) noexcept {
    if (inst != nullptr) static_cast<I*>(inst)->abort(status, reason);
  }

  static const char* last_error(const void* inst, int32_t rank) noexcept {
    return inst != nullptr ? static_cast<const I*>(inst)->last_error(rank) : "";
  }

  static void figures(const void* inst, int32_t rank, zd_comm_figures* out) noexcept {
    zd_comm_figures f{};
    f.struct_size = sizeof f;
    if (inst != nullptr) f = static_cast<const I*>(inst)->figures(rank);
    put_figures(out, f);
  }

  static uint64_t bytes_sent(const void* inst, int32_t rank) noexcept {
    return inst != nullptr ? static_cast<const I*>(inst)->figures(rank).bytes_sent : 0;
  }

  static void destroy(void* inst) noexcept { delete static_cast<I*>(inst); }

 private:
  static zd_status run(void* inst, const zd_comm_call* call, const Call& c) noexcept {
    if (inst == nullptr) return ZD_ERR_INVALID_ARGUMENT;
    return static_cast<I*>(inst)->run(call, c);
  }
};

}  // namespace zerod::comm

// The entries of a zd_comm_v2 table after create(), each the Glue's (a v3
// table lists memory() after them): what the local, mpi and nccl plugins'
// descriptors of version 2 or later share.
#define ZD_COMM_GLUE_V2_FUNCTIONS(G)                                                                       \
  .destroy = G::destroy, .all_reduce = G::all_reduce, .reduce_scatter = G::reduce_scatter,                 \
  .all_gather = G::all_gather, .broadcast = G::broadcast, .barrier = G::barrier, .abort = G::abort,         \
  .last_error = G::last_error, .all_to_all = G::all_to_all, .compressed_all_reduce = G::compressed_all_reduce, \
  .figures = G::figures

#endif  // ZEROD_COMM_LOCAL_GLUE_H
