#include "device_comm.h"

#include "runtime/dtype.h"
#include "peer_board.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace zerod {

namespace {

// Whether the comm plugin takes this rank's pool as it is: memory of a CUDA
// device, and a plugin that takes CUDA memory (nccl: comm ABI v3's
// memory()). The emulated device calls itself CUDA to its views, but its
// memory is nothing a plugin can read: it bounces.
bool plugin_takes_pool(const ModelContext& ctx, const RankResources& res) {
  const Device& d = res.device->unwrapped();
  return d.dlpack_type() == ZD_DEVICE_CUDA && std::strcmp(d.name(), "cuda") == 0 &&
         (ctx.comm().memory() & ZD_COMM_MEMORY_CUDA) != 0;
}

// A peer collective never reaches the comm plugin, which counts the rank's
// traffic: counted here as the plugin would have counted it.
void count_peer_collective(RankResources& res, const ModelContext& ctx, observe::RingCollective kind,
                           uint64_t bytes) {
  res.probe.counters().count_direct(kind, bytes, ctx.world_size);
}

// One collective between the devices of one process. Each rank posts where
// its buffers are and a mark after the work that wrote them; once everyone
// has, its stream waits for every peer's mark and reads their buffers.
// Before anyone goes on (a sender may reuse its buffer, a receiver its
// result), every rank's reads are issued and marked, and each stream waits
// for all of them: a second meeting.
class PeerCollective {
 public:
  PeerCollective(const ModelContext& ctx, RankResources& res, const zd_comm_call& c)
      : board_(*ctx.peers), res_(res), c_(c) {}

  const std::vector<PeerBoard::Post>& meet(const void* send, void* recv, uint64_t count) {
    Device& d = *res_.device;
    PeerBoard::Post mine{&d, send, recv, count, c_.tag, d.mark()};
    posts_ = board_.meet(c_.rank, mine, c_.what ? c_.what : "a collective");
    for (int q = 0; q < board_.world(); ++q)
      if (q != c_.rank) d.wait_peer_mark(*posts_[static_cast<size_t>(q)].device, posts_[static_cast<size_t>(q)].mark);
    return posts_;
  }

  // Every rank's reads of the others' buffers are done before any goes on.
  void done() {
    Device& d = *res_.device;
    PeerBoard::Post mine{&d, nullptr, nullptr, posts_[static_cast<size_t>(c_.rank)].count, c_.tag, d.mark()};
    const auto after = board_.meet(c_.rank, mine, c_.what ? c_.what : "a collective");
    for (int q = 0; q < board_.world(); ++q)
      if (q != c_.rank) d.wait_peer_mark(*after[static_cast<size_t>(q)].device, after[static_cast<size_t>(q)].mark);
  }

 private:
  PeerBoard& board_;
  RankResources& res_;
  const zd_comm_call& c_;
  std::vector<PeerBoard::Post> posts_;
};

}  // namespace

void pool_all_gather(const ModelContext& ctx, RankResources& res, const zd_comm_call& c, const Memory& from,
                     const void* send, void* recv, uint64_t count, zd_dtype dt) {
  Device& d = *res.device;
  const uint64_t bytes = count * dtype_size(dt);
  if (ctx.world_size == 1) {
    // From host memory (page-locked) this is an upload on its own queue, so
    // the gather never waits behind zerod's kernels or gradients leaving.
    from.copy_to_pool(recv, send, bytes);
    return;
  }
  if (ctx.peers && from.peer_readable()) {
    PeerCollective pc(ctx, res, c);
    const auto& posts = pc.meet(send, recv, count);
    for (int q = 0; q < ctx.world_size; ++q) {
      std::byte* dst = static_cast<std::byte*>(recv) + static_cast<uint64_t>(q) * bytes;
      const PeerBoard::Post& p = posts[static_cast<size_t>(q)];
      // In place, this rank's own chunk is there already; copying it onto
      // itself would write what the other ranks are reading (TSan saw it).
      if (q == c.rank && p.send == dst) continue;
      d.copy_peer(dst, *p.device, p.send, bytes);
    }
    pc.done();
    count_peer_collective(res, ctx, observe::RingCollective::all_gather, bytes);
    return;
  }
  if (plugin_takes_pool(ctx, res)) {
    // zerod's work that wrote the buffers (and the trainer's, which that
    // work waits for) is done before the plugin reads them on its own
    // stream; the call returns with the results in place. `send` may be
    // host memory (a shard on the host): the plugin takes that too.
    d.synchronize();
    ctx.comm().all_gather(c, send, recv, count, comm_dtype(dt));
    return;
  }
  res.transfers.bounce(from, send, bytes, recv, bytes * static_cast<uint64_t>(ctx.world_size),
                       [&](const void* mine, void* all) {
                         ctx.comm().all_gather(c, mine, all, count, comm_dtype(dt));
                       });
}

void pool_reduce_scatter(const ModelContext& ctx, RankResources& res, const zd_comm_call& c, const void* send,
                         void* recv, uint64_t recv_count, zd_dtype dt) {
  Device& d = *res.device;
  const uint64_t bytes = recv_count * dtype_size(dt);
  if (ctx.world_size == 1) {
    d.copy_within(recv, send, bytes);
    return;
  }
  if (ctx.peers) {
    // This rank's range of every rank's send, summed in rank order.
    PeerCollective pc(ctx, res, c);
    const auto& posts = pc.meet(send, recv, recv_count);
    std::vector<Device::PeerSpan> srcs;
    for (const PeerBoard::Post& p : posts)
      srcs.push_back({p.device, static_cast<const std::byte*>(p.send) + static_cast<uint64_t>(c.rank) * bytes});
    d.sum_peers(recv, dt, recv_count, srcs);
    pc.done();
    count_peer_collective(res, ctx, observe::RingCollective::reduce_scatter, bytes);
    return;
  }
  if (plugin_takes_pool(ctx, res)) {
    d.synchronize();  // as in pool_all_gather
    ctx.comm().reduce_scatter(c, send, recv, recv_count, comm_dtype(dt), ZD_REDUCE_SUM);
    return;
  }
  res.transfers.bounce(res.pool_memory, send, bytes * static_cast<uint64_t>(ctx.world_size), recv, bytes,
                       [&](const void* all, void* mine) {
                         ctx.comm().reduce_scatter(c, all, mine, recv_count, comm_dtype(dt), ZD_REDUCE_SUM);
                       });
}

void pool_all_reduce(const ModelContext& ctx, RankResources& res, const zd_comm_call& c, void* buf, uint64_t count,
                     zd_dtype dt) {
  Device& d = *res.device;
  if (ctx.world_size == 1) return;
  if (ctx.peers) {
    // Rank r sums slice r of everyone's buffer into scratch of its own;
    // once every rank has read every buffer, each gathers every slice from
    // its owner's scratch into its buffer (in place, so the reads come first).
    const size_t esz = dtype_size(dt);
    const auto world = static_cast<uint64_t>(ctx.world_size);
    const uint64_t per = (count + world - 1) / world;
    auto slice = [&](uint64_t r) {
      const uint64_t lo = std::min(count, r * per);
      return std::make_pair(lo, std::min(count, lo + per) - lo);
    };
    const auto [lo, n] = slice(static_cast<uint64_t>(c.rank));
    Block scratch = d.allocate_for_overwrite(std::max<uint64_t>(n, 1) * esz, ZD_MEM_BUFFERS, "an all-reduce's slice");
    try {
      PeerCollective sum(ctx, res, c);
      const auto& posts = sum.meet(buf, scratch.ptr, count);
      std::vector<Device::PeerSpan> srcs;
      for (const PeerBoard::Post& p : posts) srcs.push_back({p.device, static_cast<const std::byte*>(p.send) + lo * esz});
      if (n) d.sum_peers(scratch.ptr, dt, n, srcs);
      sum.done();
      PeerCollective gather(ctx, res, c);
      const auto& sums = gather.meet(scratch.ptr, buf, count);
      for (uint64_t q = 0; q < world; ++q) {
        const auto [qlo, qn] = slice(q);
        if (qn)
          d.copy_peer(static_cast<std::byte*>(buf) + qlo * esz, *sums[q].device, sums[q].send, qn * esz);
      }
      gather.done();
    } catch (...) {
      d.release(scratch, ZD_MEM_BUFFERS);
      throw;
    }
    d.release(scratch, ZD_MEM_BUFFERS);
    count_peer_collective(res, ctx, observe::RingCollective::all_reduce, count * esz);
    return;
  }
  if (plugin_takes_pool(ctx, res)) {
    d.synchronize();  // as in pool_all_gather
    ctx.comm().all_reduce(c, buf, count, comm_dtype(dt), ZD_REDUCE_SUM);
    return;
  }
  const uint64_t bytes = count * dtype_size(dt);
  res.transfers.bounce(res.pool_memory, buf, bytes, buf, bytes, [&](const void*, void* host) {
    ctx.comm().all_reduce(c, host, count, comm_dtype(dt), ZD_REDUCE_SUM);
  });
}

}  // namespace zerod
