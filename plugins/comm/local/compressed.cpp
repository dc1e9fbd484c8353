#include "compressed.h"

#include <onebit.h>

#include <cinttypes>
#include <cstring>

namespace zerod::comm {
namespace {

bool served(const Rendezvous& rv, const zd_comm_call* call) {
  return call != nullptr && call->struct_size >= sizeof(zd_comm_call) && call->rank >= rv.first() &&
         call->rank < rv.first() + rv.ranks();
}

// A driver failure that is not an exchange's (its scratch could not be had):
// the other ranks are waiting, or will wait, in an exchange this rank will
// never join, so the rendezvous fails with this rank named.
zd_status failed_alone(Rendezvous& rv, const zd_comm_call* call, uint64_t count, zd_status st) {
  if (!rv.failed()) {
    char msg[kMessageMax];
    Text t(msg, sizeof msg);
    t.add("rank %d's compressed_all_reduce ", call->rank);
    t.quoted(call->what, kWhatMax);
    t.add(" of %" PRIu64 " f32 failed on that rank: %s", count,
          st == ZD_ERR_OUT_OF_MEMORY ? "out of memory for its scratch" : "internal error in the 1-bit driver");
    rv.fail(st, msg);
  }
  return rv.take_failure(call->rank - rv.first());
}

}  // namespace

zd_status compressed_all_reduce(Runner& runner, Rendezvous& rv, const zd_comm_call* call, float* buf, uint64_t count,
                                float* worker_error, float* server_error) noexcept {
  Call step;
  step.coll = Coll::barrier;
  step.compressed = true;
  step.compressed_count = count;
  if (!served(rv, call)) return runner.run(call, step);
  const int index = call->rank - rv.first();
  if (count == 0) {
    // Nothing to exchange, but still a collective every rank meets, so that
    // the ranks' sequences stay aligned and a mismatch is named here.
    const zd_status st = runner.run(call, step);
    if (st == ZD_OK) rv.count(index, 0, 1);
    return st;
  }
  if (buf == nullptr || worker_error == nullptr || server_error == nullptr) {
    step.invalid = buf == nullptr            ? "buf is NULL"
                   : worker_error == nullptr ? "worker_error is NULL"
                                             : "server_error is NULL";
    return runner.run(call, step);
  }
  zd_status st;
  bool exchange_failed = false;
  try {
    onebit::Exchange ex;
    ex.all_to_all = [&](const void* send, void* recv, uint64_t bytes) {
      Call c = step;
      c.coll = Coll::all_to_all;
      c.dtype = ZD_COMM_U8;
      c.count = bytes;
      c.send = send;
      c.recv = recv;
      const zd_status s = runner.run(call, c);
      exchange_failed = s != ZD_OK;
      return s;
    };
    ex.all_gather = [&](const void* send, void* recv, uint64_t bytes) {
      Call c = step;
      c.coll = Coll::all_gather;
      c.dtype = ZD_COMM_U8;
      c.count = bytes;
      c.send = send;
      c.recv = recv;
      const zd_status s = runner.run(call, c);
      exchange_failed = s != ZD_OK;
      return s;
    };
    st = onebit::compressed_all_reduce(call->rank, rv.world(), buf, count, worker_error, server_error, ex);
  } catch (...) {
    st = ZD_ERR_OUT_OF_MEMORY;  // std::function's allocation
  }
  if (st == ZD_OK) {
    rv.count(index, 0, 1);
    return ZD_OK;
  }
  // An exchange that failed has set this rank's message and failed the
  // rendezvous.
  return exchange_failed ? st : failed_alone(rv, call, count, st);
}

}  // namespace zerod::comm
