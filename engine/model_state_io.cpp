// Model: whole values of a parameter's fp32 buffers — its master copy and
// its optimizer state slots — assembled from every rank's part (for
// zd_param_read and checkpoints), written back part by part, and the count
// of applied updates a checkpoint restores.
#include "model_state.h"

#include "dtype.h"
#include "error.h"

#include <algorithm>
#include <cstring>

namespace zerod {

TieredBuffer& Model::pick_master(GroupBuffers& b, int) { return b.master; }
TieredBuffer& Model::pick_state(GroupBuffers& b, int slot) { return b.state[static_cast<size_t>(slot)]; }

std::vector<float> Model::whole_value(RankState& rs, int rank, zd_param_id param, BufferPick pick, int slot,
                                      const std::string& call) {
  const ParamRecord& p = registry_.param(param);
  const ParamGroup& g = registry_.groups()[static_cast<size_t>(p.group)];
  TieredBuffer& buf = pick(rs.groups[static_cast<size_t>(p.group)], slot);
  const auto numel = static_cast<uint64_t>(p.numel);
  std::vector<float> full;
  if (partitioned(ZD_PARTITION_PARAMS)) {
    // Everyone's shard of this parameter.
    full.resize(p.stride * static_cast<uint64_t>(world_size_));
    std::vector<float> mine(p.stride);
    buf.read(rs.tiers(), p.flat_offset, p.stride, mine.data());
    const std::string what = call + "('" + p.name + "'): all-gather";
    wait(issue(rs, [&, rank] {
      plugins_.comm->all_gather(comm_call(rank, comm_tag(CommOp::Read, 0, static_cast<uint64_t>(param)), what),
                                mine.data(), full.data(), p.stride, ZD_COMM_F32);
    }));
    full.resize(numel);
  } else if (partitioned(ZD_PARTITION_OPTIMIZER) && world_size_ > 1) {
    // The parameter may straddle ranks: each owner broadcasts its part.
    full.resize(numel);
    for (int k = 0; k < world_size_; ++k) {
      const uint64_t lo = std::max(p.full_offset, owned_begin(g, k));
      const uint64_t hi = std::min(p.full_offset + numel, owned_begin(g, k) + g.stride);
      if (lo >= hi) continue;
      if (k == rank) buf.read(rs.tiers(), lo - owned_begin(g, k), hi - lo, full.data() + (lo - p.full_offset));
      const std::string what = call + "('" + p.name + "'): broadcast from rank " + std::to_string(k);
      wait(issue(rs, [&, rank, k, lo, hi] {
        plugins_.comm->broadcast(
            comm_call(rank, comm_tag(CommOp::Read, static_cast<uint64_t>(k), static_cast<uint64_t>(param)), what),
            full.data() + (lo - p.full_offset), hi - lo, ZD_COMM_F32, k);
      }));
    }
  } else {
    full.resize(numel);
    buf.read(rs.tiers(), p.full_offset - owned_begin(g, rank), numel, full.data());
  }
  return full;
}

void Model::set_own_part(RankState& rs, int rank, zd_param_id param, BufferPick pick, int slot,
                         const float* whole) {
  const ParamRecord& p = registry_.param(param);
  const ParamGroup& g = registry_.groups()[static_cast<size_t>(p.group)];
  TieredBuffer& buf = pick(rs.groups[static_cast<size_t>(p.group)], slot);
  const TierSet tiers = rs.tiers();
  if (partitioned(ZD_PARTITION_PARAMS)) {
    buf.write(tiers, p.flat_offset, p.shard_real(rank), whole + static_cast<uint64_t>(rank) * p.stride);
    return;
  }
  const uint64_t ob = owned_begin(g, rank);
  const uint64_t lo = std::max(p.full_offset, ob);
  const uint64_t hi = std::min(p.full_offset + static_cast<uint64_t>(p.numel), ob + owned_count(g));
  if (lo < hi) buf.write(tiers, lo - ob, hi - lo, whole + (lo - p.full_offset));
}

void Model::read_param(int rank, zd_param_id param, zd_dtype dtype, void* dst, uint64_t bytes) {
  Call call(*this, rank, "param_read");
  require_finalized("zd_param_read");
  RankState& rs = rank_state(rank);
  const ParamRecord& p = registry_.param(param);
  check_whole_param("zd_param_read", p, dtype, dst, bytes);
  const std::vector<float> full = whole_value(rs, rank, param, pick_master, 0, "param_read");
  convert(full.data(), ZD_DTYPE_F32, dst, dtype, static_cast<size_t>(p.numel));
}

namespace {

void check_slot(const char* call, const OptimizerInstance& opt, int slot) {
  const auto slots = static_cast<int>(opt.state_slots());
  if (slot < 0 || slot >= slots)
    fail(ZD_ERR_INVALID_ARGUMENT,
         std::string(call) + ": optimizer '" + opt.plugin().name() + "' has " + std::to_string(slots) +
             " state slot" + (slots == 1 ? "" : "s") + (slots ? " (0.." + std::to_string(slots - 1) + ")" : "") +
             ", not " + std::to_string(slot));
}

}  // namespace

void Model::read_state(int rank, zd_param_id param, int slot, zd_dtype dtype, void* dst, uint64_t bytes) {
  Call call(*this, rank, "optimizer_state_read");
  require_finalized("zd_optimizer_state_read");
  RankState& rs = rank_state(rank);
  const ParamRecord& p = registry_.param(param);
  check_slot("zd_optimizer_state_read", *plugins_.optimizer, slot);
  check_whole_param("zd_optimizer_state_read", p, dtype, dst, bytes);
  const std::vector<float> full = whole_value(rs, rank, param, pick_state, slot, "optimizer_state_read");
  convert(full.data(), ZD_DTYPE_F32, dst, dtype, static_cast<size_t>(p.numel));
}

void Model::write_state(int rank, zd_param_id param, int slot, zd_dtype dtype, const void* src, uint64_t bytes) {
  Call call(*this, rank, "optimizer_state_write");
  require_finalized("zd_optimizer_state_write");
  RankState& rs = rank_state(rank);
  const ParamRecord& p = registry_.param(param);
  check_slot("zd_optimizer_state_write", *plugins_.optimizer, slot);
  check_whole_param("zd_optimizer_state_write", p, dtype, src, bytes);
  if (rs.active_modules > 0)
    fail(ZD_ERR_INVALID_STATE, "zd_optimizer_state_write of '" + p.name +
                                   "' while modules are begun; write between steps");
  std::vector<float> v(static_cast<size_t>(p.numel));
  convert(src, dtype, v.data(), ZD_DTYPE_F32, v.size());
  set_own_part(rs, rank, param, pick_state, slot, v.data());
  reset_compression(rs);
}

int64_t Model::applied_steps(int rank) const { return rank_state(rank).applied; }

void Model::set_applied_steps(int rank, int64_t step) {
  Call call(*this, rank, "set_step");
  require_finalized("zd_model_set_step");
  RankState& rs = rank_state(rank);
  if (step < 0) fail(ZD_ERR_INVALID_ARGUMENT, "zd_model_set_step: the step must be >= 0, got " + std::to_string(step));
  if (rs.active_modules > 0 || rs.micro_step % config_.gradient_accumulation_steps != 0)
    fail(ZD_ERR_INVALID_STATE, "zd_model_set_step inside an accumulation window; call it between steps");
  rs.applied = step;
  reset_compression(rs);
}

}  // namespace zerod
