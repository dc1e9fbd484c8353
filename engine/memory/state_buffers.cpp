#include "memory/state_buffers.h"

#include "runtime/dtype.h"

#include <algorithm>
#include <string>

namespace zerod {

namespace {

// How the ledger, the device and the nvme tier name a group's buffers.
// Two groups of one dtype where the ratio or placement() kept some masters
// on a device the host cannot address (state_class).
std::string group_label(const ParamGroup& g) {
  return std::string("group ") + dtype_name(g.dtype) + (g.state_class ? " (state on the device)" : "");
}

}  // namespace

void StateBuffers::allocate_values(const Placement& placement) {
  const int rank = res_.rank;
  const auto& groups = ctx_.registry.groups();
  const TierSet tiers = res_.tiers();
  try {
    tensor_scalars_.assign(ctx_.registry.params().size() * ctx_.optimizer().tensor_scalars(), 0.0f);
    tensor_scalars_set_ = false;
    groups_.resize(groups.size());
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      GroupBuffers& b = groups_[gi];
      // The ledger and the device name the buffer with its rank; the nvme
      // tier names the rank itself, so its reservations go without.
      const std::string group = group_label(groups[gi]);
      const std::string of_rank = " of rank " + std::to_string(rank);
      const std::string working = "the working copies of " + group;
      b.working.allocate(tiers, dtype_size(groups[gi].dtype), placement.tier_runs(gi, rank, Holds::Params),
                         ZD_MEM_PARAMS, working + of_rank, working);
      const std::string master = "the master copies of " + group;
      b.master.allocate(tiers, 4, placement.tier_runs(gi, rank, Holds::Master), ZD_MEM_MASTER, master + of_rank,
                        master);
    }
    // Each parameter widened to fp32 on its own: the scratch is one
    // parameter's, not the model's.
    std::vector<float> whole;
    for (const ParamRecord& p : ctx_.registry.params()) {
      if (p.staged_init.empty()) continue;
      whole.resize(static_cast<size_t>(p.numel));
      p.staged_init.read_f32(0, whole.size(), whole.data());
      write_value(p, whole.data());
    }
  } catch (...) {
    release();
    throw;
  }
}

void StateBuffers::allocate_state(const Placement& placement) {
  const int rank = res_.rank;
  const uint32_t slots = ctx_.optimizer().state_slots();
  const auto& groups = ctx_.registry.groups();
  const bool p3 = ctx_.params_partitioned();
  const TierSet tiers = res_.tiers();
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const ParamGroup& g = groups[gi];
    GroupBuffers& b = groups_[gi];
    const std::string group = group_label(g);
    const std::string of_rank = " of rank " + std::to_string(rank);
    const uint64_t grad_len = p3 ? g.flat_numel : ctx_.partitioned(ZD_PARTITION_GRADS) ? g.stride : g.full_numel;
    b.grad.allocate(tiers, dtype_size(ctx_.grad_dtype(g)), {{grad_len, placement.grad_tier(gi, rank)}},
                    ZD_MEM_GRADS, "the gradients of " + group + of_rank);
    for (uint32_t s = 0; s < slots; ++s) {
      const std::string state = "optimizer state '" + ctx_.optimizer().state_name(s) + "' of " + group;
      b.state[s].allocate(tiers, ctx_.state_size(), placement.tier_runs(gi, rank, Holds::Optimizer),
                          ZD_MEM_OPTIMIZER, state + of_rank, state);
    }
  }
}

void read_as_f32(const TierSet& tiers, const TieredBuffer& buf, zd_dtype stored, uint64_t begin, uint64_t n,
                 float* dst) {
  if (stored == ZD_DTYPE_F32) {
    buf.read(tiers, begin, n, dst);
    return;
  }
  std::vector<std::byte> raw(n * dtype_size(stored));
  buf.read(tiers, begin, n, raw.data());
  convert(raw.data(), stored, dst, ZD_DTYPE_F32, n);
}

void write_from_f32(const TierSet& tiers, TieredBuffer& buf, zd_dtype stored, uint64_t begin, uint64_t n,
                    const float* src) {
  if (stored == ZD_DTYPE_F32) {
    buf.write(tiers, begin, n, src);
    return;
  }
  std::vector<std::byte> raw(n * dtype_size(stored));
  convert(src, ZD_DTYPE_F32, raw.data(), stored, n);
  buf.write(tiers, begin, n, raw.data());
}

void StateBuffers::release() {
  const TierSet tiers = res_.tiers();
  for (GroupBuffers& b : groups_) {
    b.working.release(tiers);
    b.grad.release(tiers);
    b.master.release(tiers);
    for (TieredBuffer& s : b.state) s.release(tiers);
  }
  groups_.clear();
  tensor_scalars_.clear();
}

void StateBuffers::write_value(const ParamRecord& p, const float* whole) {
  const int rank = res_.rank;
  GroupBuffers& b = of(p);
  const TierSet tiers = res_.tiers();
  const size_t esz = dtype_size(p.dtype);
  if (ctx_.params_partitioned()) {
    const uint64_t real = p.shard_real(rank);
    if (real == 0) return;  // a small parameter's last ranks hold only padding
    const float* mine = whole + static_cast<uint64_t>(rank) * p.stride;
    b.master.write(tiers, p.flat_offset, real, mine);
    std::vector<std::byte> w(real * esz);
    convert(mine, ZD_DTYPE_F32, w.data(), p.dtype, real);
    b.working.write(tiers, p.flat_offset, real, w.data());
    return;
  }
  // Stages 0-2: the whole working copy, and the owned part of the master.
  const auto numel = static_cast<uint64_t>(p.numel);
  std::vector<std::byte> w(numel * esz);
  convert(whole, ZD_DTYPE_F32, w.data(), p.dtype, numel);
  b.working.write(tiers, p.full_offset, numel, w.data());
  uint64_t lo, hi;
  ctx_.owned_part(p, rank, &lo, &hi);
  const uint64_t ob = ctx_.owned_begin(ctx_.registry.groups()[static_cast<size_t>(p.group)], rank);
  if (lo < hi) b.master.write(tiers, lo - ob, hi - lo, whole + (lo - p.full_offset));
}

void StateBuffers::read_value(const ParamRecord& p, float* whole) const {
  const int rank = res_.rank;
  const GroupBuffers& b = groups_[static_cast<size_t>(p.group)];
  const TierSet tiers = res_.tiers();
  if (ctx_.params_partitioned()) {
    const uint64_t real = p.shard_real(rank);
    if (real != 0) b.master.read(tiers, p.flat_offset, real, whole + static_cast<uint64_t>(rank) * p.stride);
    return;
  }
  uint64_t lo, hi;
  ctx_.owned_part(p, rank, &lo, &hi);
  const uint64_t ob = ctx_.owned_begin(ctx_.registry.groups()[static_cast<size_t>(p.group)], rank);
  if (lo < hi) b.master.read(tiers, lo - ob, hi - lo, whole + (lo - p.full_offset));
}

void StateBuffers::working_from_master() {
  const int rank = res_.rank;
  const bool p3 = ctx_.params_partitioned();
  const auto& groups = ctx_.registry.groups();
  const TierSet tiers = res_.tiers();
  constexpr uint64_t kChunk = uint64_t{1} << 20;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const ParamGroup& g = groups[gi];
    GroupBuffers& b = groups_[gi];
    const size_t esz = dtype_size(g.dtype);
    const uint64_t at = p3 ? 0 : ctx_.owned_begin(g, rank);
    const uint64_t n_owned = ctx_.owned_count(g);
    std::vector<float> m;
    std::vector<std::byte> w;
    for (uint64_t e = 0; e < n_owned; e += kChunk) {
      const uint64_t n = std::min(kChunk, n_owned - e);
      m.resize(n);
      w.resize(n * esz);
      b.master.read(tiers, e, n, m.data());
      convert(m.data(), ZD_DTYPE_F32, w.data(), g.dtype, n);
      b.working.write(tiers, at + e, n, w.data());
    }
  }
}

}  // namespace zerod
