// The device pool's collectives where the comm plugins cannot read and
// write it (a GPU, the emulated device); PoolMemory (memory.h) calls them,
// and engine parts call the memories. One rank needs no exchange at all: a
// gather or reduce-scatter is a copy on the device. Several ranks in one
// process (a daemon's GPUs) read each other's pools with the devices' own
// peer copies and sum kernels, meeting on the PeerBoard (ctx.peers): no
// byte crosses the host, and the sums are the local comm plugin's to the
// bit. Ranks in several processes go through host memory (the rank's
// Transfers bounce: a copy out, the collective, a copy in) until the comm
// plugins take device buffers (NCCL; DESIGN.md §9).
#pragma once

#include "memory/memory.h"
#include "model/model_context.h"
#include "model/rank_resources.h"

namespace zerod {

// send: count elements in `from`; recv: count * world elements in the pool.
void pool_all_gather(const ModelContext& ctx, RankResources& res, const zd_comm_call& c, const Memory& from,
                     const void* send, void* recv, uint64_t count, zd_dtype dt);
// send: recv_count * world elements, recv: recv_count elements, both in the pool.
void pool_reduce_scatter(const ModelContext& ctx, RankResources& res, const zd_comm_call& c, const void* send,
                         void* recv, uint64_t recv_count, zd_dtype dt);
// buf: count elements in the pool, summed over ranks in place.
void pool_all_reduce(const ModelContext& ctx, RankResources& res, const zd_comm_call& c, void* buf, uint64_t count,
                     zd_dtype dt);

}  // namespace zerod
