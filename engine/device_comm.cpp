#include "device_comm.h"

#include "dtype.h"

#include <vector>

namespace zerod {

void device_all_gather(const ModelContext& ctx, RankResources& res, const zd_comm_call& c, const void* send,
                       bool send_on_device, void* recv, uint64_t count, zd_dtype dt) {
  Device& d = *res.device;
  if (d.host_addressable()) {
    ctx.comm().all_gather(c, send, recv, count, comm_dtype(dt));
    return;
  }
  const uint64_t bytes = count * dtype_size(dt);
  if (ctx.world_size == 1) {
    if (send_on_device) {
      d.copy_within(recv, send, bytes);
      return;
    }
    // From the host tier (page-locked) on the upload queue, so the gather
    // never waits behind zerod's kernels or gradients leaving; recv may be
    // a block the stream's earlier work used, hence the order after it.
    d.upload_after_stream();
    const uint64_t t = d.upload(recv, send, bytes);
    d.stream_waits(t);
    res.note_shard_upload(t);
    return;
  }
  std::vector<std::byte> mine(bytes), all(bytes * static_cast<uint64_t>(ctx.world_size));
  if (send_on_device)
    d.copy_to_host(mine.data(), send, bytes);
  else
    std::copy_n(static_cast<const std::byte*>(send), bytes, mine.data());
  ctx.comm().all_gather(c, mine.data(), all.data(), count, comm_dtype(dt));
  d.copy_to_device(recv, all.data(), all.size());
}

void device_reduce_scatter(const ModelContext& ctx, RankResources& res, const zd_comm_call& c, const void* send,
                           void* recv, uint64_t recv_count, zd_dtype dt) {
  Device& d = *res.device;
  if (d.host_addressable()) {
    ctx.comm().reduce_scatter(c, send, recv, recv_count, comm_dtype(dt), ZD_REDUCE_SUM);
    return;
  }
  const uint64_t bytes = recv_count * dtype_size(dt);
  if (ctx.world_size == 1) {
    d.copy_within(recv, send, bytes);
    return;
  }
  std::vector<std::byte> all(bytes * static_cast<uint64_t>(ctx.world_size)), mine(bytes);
  d.copy_to_host(all.data(), send, all.size());
  ctx.comm().reduce_scatter(c, all.data(), mine.data(), recv_count, comm_dtype(dt), ZD_REDUCE_SUM);
  d.copy_to_device(recv, mine.data(), bytes);
}

void device_all_reduce(const ModelContext& ctx, RankResources& res, const zd_comm_call& c, void* buf, uint64_t count,
                       zd_dtype dt) {
  Device& d = *res.device;
  if (d.host_addressable()) {
    ctx.comm().all_reduce(c, buf, count, comm_dtype(dt), ZD_REDUCE_SUM);
    return;
  }
  if (ctx.world_size == 1) return;
  std::vector<std::byte> host(count * dtype_size(dt));
  d.copy_to_host(host.data(), buf, host.size());
  ctx.comm().all_reduce(c, host.data(), count, comm_dtype(dt), ZD_REDUCE_SUM);
  d.copy_to_device(buf, host.data(), host.size());
}

}  // namespace zerod
