// compression.replay: a compressed step replayed over the elements other
// ranks own, on whole copies of the replayed state slots (and at stage 3 of
// the parameters), so that no all-gather of the working copies follows it
// (momentum_compression.h).
#include "compression/momentum_compression_internal.h"

#include "log.h"
#include "observe/probe.h"
#include "checkpoint/state_io.h"
#include "runtime/workers.h"

#include <bit>
#include <cstring>
#include <string>
#include <utility>

namespace zerod {

bool MomentumCompression::replays(const zd_optimizer_plan& plan) const {
  const OptimizerInstance& opt = ctx_.optimizer();
  // plan() checked the shape (PREPARE, EXCHANGE, then passes only).
  // Statistics over whole tensors are the owners': a replayed pass adds to
  // none, and reads the scalars every rank's tensor_step made of them.
  if (plan.replay_slots == 0 || !keeps()) return false;
  for (const ParamGroup& g : ctx_.registry.groups())
    if (g.dtype != ZD_DTYPE_F32) return false;
  if (!ctx_.config.compression_replay) {
    if (!replay_hinted_ && res_.rank == 0) {
      const bool p3 = ctx_.params_partitioned();
      log_info("optimizer '" + opt.plugin().name() + "': " +
               (p3 ? "forward and backward all-gather the fp32 parameters after each compressed step"
                   : "each compressed step all-gathers the fp32 working copies afterwards") +
               " (4 bytes per parameter, against 1 bit per parameter exchanged); compression.replay = true "
               "replays the step on every rank instead, for whole copies of " +
               std::to_string(std::popcount(plan.replay_slots)) + " state slot(s)" +
               (p3 ? " and the parameters" : "") + " in memory (4 bytes per parameter each)");
    }
    replay_hinted_ = true;
    return false;
  }
  // The replay's loops reach the whole copies, (stages 1-2) the working
  // copy and (stage 3) the whole copy of the parameters through host
  // windows, on any device.
  return true;
}

// Every rank copies the owners' values of the replayed slots, whole: a
// collective (each owner broadcasts its part), once after the slots last
// changed. Only the slots whose copies are not valid are copied; the copy
// of a slot this plan does not replay is given back (0/1 Adam's m once its
// variance froze: its momentum syncs replay v alone). Every rank calls this
// with the same plan and the same replica_valid_, so the broadcasts match.
void MomentumCompression::fill_replica(uint32_t slots) {
  const auto& groups = ctx_.registry.groups();
  const TierSet tiers = res_.tiers();
  const OptimizerInstance& opt = ctx_.optimizer();
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    Group& c = groups_[gi];
    for (uint32_t k = 0; k < ZD_OPTIMIZER_MAX_STATE; ++k) {
      TieredBuffer& r = c.replica[k];
      if ((slots >> k & 1u) == 0) {
        r.release(tiers);
        continue;
      }
      if ((replica_valid_ >> k & 1u) != 0) continue;
      if (r.empty())
        r.allocate(tiers, 4, {{groups[gi].full_numel, buffers_.groups()[gi].grad_tier()}}, ZD_MEM_OPTIMIZER,
                   "the whole copy of state slot '" + opt.state_name(k) + "' of group " + std::to_string(gi) +
                       " (compression.replay)");
      for (zd_param_id pid : groups[gi].params) {
        const ParamRecord& p = ctx_.registry.param(pid);
        HostWindow w(r, p.full_offset, static_cast<uint64_t>(p.numel), 4, HostWindow::kWrite,
                     "a replayed slot's whole copy");
        read_whole_into(ctx_, res_, buffers_, pid, static_cast<int>(k), "step: compression.replay", w.f32());
        w.done();
      }
    }
  }
}

// Stage 3: every rank copies every owner's parameters, whole, before the
// first replayed step after one that was not (an all-gather per tensor, as
// forward would have made; every rank decides alike, so the collectives
// match).
void MomentumCompression::fill_params() {
  const auto& groups = ctx_.registry.groups();
  const TierSet tiers = res_.tiers();
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    TieredBuffer& b = groups_[gi].params;
    if (b.empty())
      b.allocate(tiers, 4, {{groups[gi].full_numel, buffers_.groups()[gi].grad_tier()}}, ZD_MEM_PARAMS,
                 "the whole copy of the parameters of group " + std::to_string(gi) + " (compression.replay)");
    for (zd_param_id pid : groups[gi].params) {
      const ParamRecord& p = ctx_.registry.param(pid);
      HostWindow w(b, p.full_offset, static_cast<uint64_t>(p.numel), 4, HostWindow::kWrite,
                   "the whole copy of the parameters");
      read_whole_into(ctx_, res_, buffers_, pid, kMasterSlot, "step: compression.replay", w.f32());
      w.done();
    }
  }
}

// Stage 3, after a replayed step: the rank's own new parameters (its
// working shard, what an all-gather would send) into its whole copy, where
// the replay wrote everyone else's.
void MomentumCompression::copy_owned_params() {
  const TierSet tiers = res_.tiers();
  for (const ParamRecord& p : ctx_.registry.params()) {
    const ModelContext::OwnedSpan own = ctx_.owned_span(p, res_.rank);
    if (own.count == 0) continue;
    HostWindow w(groups_[static_cast<size_t>(p.group)].params, p.full_offset + own.from, own.count, 4,
                 HostWindow::kWrite, "the whole copy of the parameters");
    buffers_.of(p).working.read(tiers, own.at, own.count, w.f32());
    w.done();
  }
}

float* MomentumCompression::params_of(const ParamRecord& p) const {
  return reinterpret_cast<float*>(groups_[static_cast<size_t>(p.group)].params.addr(0)) + p.full_offset;
}

Residency::WholeValue MomentumCompression::whole_param(const ParamRecord& p) const {
  if (!params_valid_) return {};
  const TieredBuffer& b = groups_[static_cast<size_t>(p.group)].params;
  return {params_of(p), b.segments().front().memory};  // one segment: allocated as one run
}

void MomentumCompression::write_whole_param(const ParamRecord& p, const float* whole) {
  if (!params_valid_ || p.numel == 0) return;
  HostWindow w(groups_[static_cast<size_t>(p.group)].params, p.full_offset, static_cast<uint64_t>(p.numel), 4,
               HostWindow::kWrite, "the whole copy of the parameters");
  std::memcpy(w.data(), whole, static_cast<size_t>(p.numel) * 4);
  w.done();
}

// Pass `pass` of the step over the segment's elements that other ranks own,
// on this rank's fp32 working copy, from the exchanged average x (the first
// pass; NULL for a later one, which reads no exchange): what each owner's
// pass computes for its master, element for element. Statistics a replayed
// pass gathers are thrown away: the owners' are the ones combined.
void MomentumCompression::replay(StepState& st, size_t gi, const Segment& s, const float* x, uint32_t pass) {
  const OptimizerInstance& opt = ctx_.optimizer();
  const ParamGroup& g = ctx_.registry.groups()[gi];
  const Group& c = groups_[gi];
  const uint32_t slots = opt.state_slots(), mask = st.plan.replay_slots, nstats = opt.tensor_stats();
  // Stages 1-2: the rank's whole working copy; stage 3: its whole copy of
  // the parameters (both fp32, in the full layout).
  const TieredBuffer& whole = ctx_.params_partitioned() ? c.params : buffers_.groups()[gi].working;
  observe::Span span(res_.probe, "optimizer", "replay");
  for (zd_param_id pid : s.params) {
    const ParamRecord& p = ctx_.registry.param(pid);
    const uint64_t begin = p.full_offset, end = begin + static_cast<uint64_t>(p.numel);
    const ModelContext::OwnedSpan own = ctx_.owned_span(p, res_.rank);
    uint64_t lo = begin + own.from, hi = lo + own.count;
    if (lo >= hi) lo = hi = end;  // none of it is this rank's: all of it is replayed
    const float* px = x != nullptr ? x + (packed_at_[static_cast<size_t>(pid)] - s.dense) : nullptr;
    for (const auto& [a, b] : {std::pair{begin, lo}, std::pair{hi, end}}) {
      if (a >= b) continue;
      // The working copy (as the master) and the replayed slots' copies
      // over [a, b), through host windows: read, updated, written back.
      HostWindow master(whole, a, b - a, 4, HostWindow::kReadWrite, "the replayed working copy");
      HostWindow replica[ZD_OPTIMIZER_MAX_STATE];
      for (uint32_t k = 0; k < slots; ++k)
        if (mask >> k & 1u)
          replica[k] = HostWindow(c.replica[k], a, b - a, 4, HostWindow::kReadWrite, "a replayed slot's whole copy");
      zd_optimizer_update u = step_update(st, g, pid, pass);
      u.count = b - a;
      u.master = master.f32();
      u.exchange = px != nullptr ? const_cast<float*>(px + (a - begin)) : nullptr;
      for (uint32_t k = 0; k < slots; ++k)
        if (mask >> k & 1u) u.state[k] = replica[k].f32();
      const uint64_t tiles = (u.count + kTile - 1) / kTile;
      res_.workers.run(tiles, [&](size_t i) {
        const uint64_t off = i * kTile, n = std::min(kTile, u.count - off);
        zd_optimizer_update tile = update_slice(u, slots, off, n);
        // The slots the pass writes or does not read: scratch, per thread.
        thread_local std::vector<float> scratch;
        thread_local std::vector<double> discarded;
        scratch.resize(kTile);
        for (uint32_t k = 0; k < slots; ++k)
          if ((mask >> k & 1u) == 0) tile.state[k] = scratch.data();
        if (nstats > 0) {
          discarded.assign(nstats, 0.0);
          tile.stats = discarded.data();
        }
        opt.update(ZD_ISA_AUTO, tile);
      });
      master.done();
      for (HostWindow& w : replica) w.done();
    }
  }
}

}  // namespace zerod
