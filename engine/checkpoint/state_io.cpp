#include "checkpoint/state_io.h"

#include <algorithm>

namespace zerod {

namespace {

TieredBuffer& pick(GroupBuffers& b, int slot) { return slot == kMasterSlot ? b.master : b.state[static_cast<size_t>(slot)]; }
// What the buffer keeps its fp32 values as: the master fp32, the state the
// job's state dtype.
zd_dtype stored(const ModelContext& ctx, int slot) { return slot == kMasterSlot ? ZD_DTYPE_F32 : ctx.state_dtype(); }

}  // namespace

void read_whole_into(const ModelContext& ctx, RankResources& res, StateBuffers& buffers, zd_param_id param, int slot,
                     const std::string& call, float* whole) {
  const ParamRecord& p = ctx.registry.param(param);
  const ParamGroup& g = ctx.registry.groups()[static_cast<size_t>(p.group)];
  TieredBuffer& buf = pick(buffers.of(p), slot);
  const zd_dtype dt = stored(ctx, slot);
  const auto numel = static_cast<uint64_t>(p.numel);
  const int rank = res.rank;
  if (ctx.params_partitioned()) {
    // Everyone's shard of this parameter.
    std::vector<float> full(p.stride * static_cast<uint64_t>(ctx.world_size));
    std::vector<float> mine(p.stride);
    read_as_f32(res.tiers(), buf, dt, p.flat_offset, p.stride, mine.data());
    const std::string what = call + "('" + p.name + "'): all-gather";
    ctx.run(*res.stream, [&] {
      ctx.comm().all_gather(ctx.comm_call(rank, comm_tag(CommOp::Read, 0, static_cast<uint64_t>(param)), what),
                            mine.data(), full.data(), p.stride, ZD_COMM_F32);
    });
    std::copy(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(numel), whole);
  } else if (ctx.partitioned(ZD_PARTITION_OPTIMIZER) && ctx.world_size > 1) {
    // The parameter may straddle ranks: each owner broadcasts its part.
    for (int k = 0; k < ctx.world_size; ++k) {
      uint64_t lo, hi;
      ctx.owned_part(p, k, &lo, &hi);
      if (lo >= hi) continue;
      if (k == rank) read_as_f32(res.tiers(), buf, dt, lo - ctx.owned_begin(g, k), hi - lo, whole + (lo - p.full_offset));
      const std::string what = call + "('" + p.name + "'): broadcast from rank " + std::to_string(k);
      ctx.run(*res.stream, [&, k, lo, hi] {
        ctx.comm().broadcast(
            ctx.comm_call(rank, comm_tag(CommOp::Read, static_cast<uint64_t>(k), static_cast<uint64_t>(param)), what),
            whole + (lo - p.full_offset), hi - lo, ZD_COMM_F32, k);
      });
    }
  } else {
    read_as_f32(res.tiers(), buf, dt, p.full_offset - ctx.owned_begin(g, rank), numel, whole);
  }
}

std::vector<float> read_whole(const ModelContext& ctx, RankResources& res, StateBuffers& buffers, zd_param_id param,
                              int slot, const std::string& call) {
  std::vector<float> full(static_cast<size_t>(ctx.registry.param(param).numel));
  read_whole_into(ctx, res, buffers, param, slot, call, full.data());
  return full;
}

void write_own_part(const ModelContext& ctx, RankResources& res, StateBuffers& buffers, zd_param_id param, int slot,
                    const float* whole) {
  const ParamRecord& p = ctx.registry.param(param);
  const ParamGroup& g = ctx.registry.groups()[static_cast<size_t>(p.group)];
  TieredBuffer& buf = pick(buffers.of(p), slot);
  const zd_dtype dt = stored(ctx, slot);
  const TierSet tiers = res.tiers();
  const int rank = res.rank;
  if (ctx.params_partitioned()) {
    write_from_f32(tiers, buf, dt, p.flat_offset, p.shard_real(rank), whole + static_cast<uint64_t>(rank) * p.stride);
    return;
  }
  uint64_t lo, hi;
  ctx.owned_part(p, rank, &lo, &hi);
  if (lo < hi) write_from_f32(tiers, buf, dt, lo - ctx.owned_begin(g, rank), hi - lo, whole + (lo - p.full_offset));
}

}  // namespace zerod
