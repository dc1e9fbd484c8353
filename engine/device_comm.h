// Collectives over buffers in the device tier. The comm plugins read and
// write memory the host can address: on the cpu device that is the pool
// itself. On a device the host cannot address (a GPU), one rank needs no
// exchange at all — a gather or reduce-scatter is a copy on the device.
// Several ranks in one process (a daemon's GPUs) read each other's pools
// with the devices' own peer copies and sum kernels, meeting on the
// PeerBoard (ctx.peers): no byte crosses the host, and the sums are the
// local comm plugin's to the bit. Ranks in several processes go through
// host memory (a copy out, the collective, a copy in) until the comm
// plugins take device buffers (NCCL; DESIGN.md §9).
#pragma once

#include "model_context.h"
#include "rank_resources.h"

namespace zerod {

// send: count elements (on the device when send_on_device, else host
// memory); recv: count * world elements on the device.
void device_all_gather(const ModelContext& ctx, RankResources& res, const zd_comm_call& c, const void* send,
                       bool send_on_device, void* recv, uint64_t count, zd_dtype dt);
// send: recv_count * world elements, recv: recv_count elements, both on the device.
void device_reduce_scatter(const ModelContext& ctx, RankResources& res, const zd_comm_call& c, const void* send,
                           void* recv, uint64_t recv_count, zd_dtype dt);
// buf: count elements on the device, summed over ranks in place.
void device_all_reduce(const ModelContext& ctx, RankResources& res, const zd_comm_call& c, void* buf, uint64_t count,
                       zd_dtype dt);

}  // namespace zerod
