// Sizing and refusals of a compressing optimizer: what the plan and the
// ledger count, and where it cannot run (momentum_compression.h).
#include "compression/momentum_compression_internal.h"

#include "runtime/dtype.h"
#include "error.h"

#include <algorithm>
#include <bit>
#include <string>

namespace zerod {

uint64_t compression_chunk(uint64_t count, int world) {
  const auto w = static_cast<uint64_t>(world);
  return ((count + w - 1) / w + 7) / 8 * 8;
}

namespace compression_detail {
namespace {

uint64_t packed_count(const Registry& reg, const ParamGroup& g) {
  uint64_t n = 0;
  for (zd_param_id pid : g.params) n += static_cast<uint64_t>(reg.param(pid).numel);
  return n;
}

}  // namespace

bool owns_every_element(const ModelContext& ctx) {
  return ctx.world_size == 1 || !ctx.partitioned(ZD_PARTITION_OPTIMIZER);
}

uint64_t exchange_count(const ModelContext& ctx, const ParamGroup& g) {
  return owns_every_element(ctx) ? packed_count(ctx.registry, g) : ctx.owned_count(g);
}

uint64_t server_elems(const Registry& reg, const ParamGroup& g, int world) {
  uint64_t n = 0;
  for (zd_param_id pid : g.params) n += compression_chunk(static_cast<uint64_t>(reg.param(pid).numel), world);
  return std::max(n, compression_chunk(packed_count(reg, g), world));
}

}  // namespace compression_detail

using namespace compression_detail;

CompressionBytes compression_bytes(const ModelContext& ctx, size_t group) {
  CompressionBytes b;
  if (!ctx.optimizer().compresses()) return b;
  const ParamGroup& g = ctx.registry.groups()[group];
  if (ctx.partitioned(ZD_PARTITION_GRADS)) b.grads = g.full_numel * dtype_size(ctx.grad_dtype(g));
  b.buffers = exchange_count(ctx, g) * 4;
  if (ctx.world_size > 1) {
    const uint64_t n = packed_count(ctx.registry, g);
    b.optimizer = {n * 4, server_elems(ctx.registry, g, ctx.world_size) * 4};
    // The kept average, where the momentum is partitioned (stage 0 reads the slot).
    if (ctx.partitioned(ZD_PARTITION_OPTIMIZER))
      b.optimizer.insert(b.optimizer.end(), {(n + 7) / 8, g.params.size() * static_cast<uint64_t>(ctx.world_size) * 4});
    // compression.replay: a whole copy of each slot a replayed step reads
    // (1-bit Adam: its variance; 0/1 Adam: m and v, replay_slots() says why;
    // 1-bit LAMB: m and v).
    if (ctx.config.compression_replay) {
      for (uint32_t k = std::popcount(replay_slots(ctx.optimizer())); k > 0; --k) b.optimizer.push_back(g.full_numel * 4);
      // Stage 3: and of the parameters, which forward and backward copy.
      if (ctx.params_partitioned()) b.params = g.full_numel * 4;
    }
  }
  return b;
}

uint32_t replay_slots(const OptimizerInstance& opt) {
  // What the run's compressed steps replay: those of a step long after
  // every warm-up, and those of a compressed step at the start (the first
  // step, told it is no warm-up step). They can differ: 0/1 Adam's 1-bit
  // gradient steps before its variance freezes replay m and v, its momentum
  // syncs after it only v. The replicas of both are allocated as the steps
  // come (m's given back once the syncs begin), so the plan's peak counts
  // both. A plugin that never replays answers 0 in both.
  constexpr int64_t kLateStep = int64_t{1} << 50;
  if (!opt.compresses()) return 0;
  return opt.plan(kLateStep, -1, -1).replay_slots | opt.plan(1, 0, -1).replay_slots;
}

std::string compression_replay_refusal(const OptimizerInstance& opt, uint32_t partitions, zd_dtype precision) {
  if (!opt.compresses()) return "optimizer '" + opt.plugin().name() + "' never compresses; nothing to replay";
  if (replay_slots(opt) == 0)
    return "optimizer '" + opt.plugin().name() + "' plans no compressed step that another rank can replay (its " +
           "update of an element needs more than the exchanged values, that element's state and the per-tensor "
           "scalars), so its compressed steps all-gather the working copies; leave replay out";
  if ((partitions & ZD_PARTITION_OPTIMIZER) == 0)
    return "replays what stages 1-3 all-gather after a step or in forward and backward; at stage 0 every rank "
           "updates every element already (zero.stage = 1, 2 or 3)";
  if (precision != ZD_DTYPE_F32)
    return "needs fp32 working copies (precision = \"fp32\"): a 16-bit working copy is rounded from an fp32 master "
           "that only its owner holds, so no other rank can replay it bit for bit";
  return "";
}

void check_compression_support(const ModelContext& ctx) {
  const OptimizerInstance& opt = ctx.optimizer();
  opt.check_partitions(ctx.partitions);
  if (ctx.config.compression_replay) {
    const std::string why = compression_replay_refusal(opt, ctx.partitions, ctx.config.precision);
    if (!why.empty()) fail(ZD_ERR_CONFIG, "compression.replay: " + why);
  }
  if (opt.compresses() && ctx.world_size > 1 && !ctx.comm().has_compression())
    fail(ZD_ERR_CONFIG, "optimizer '" + opt.plugin().name() +
                            "' averages what the ranks exchange with 1-bit compression, which needs a comm plugin "
                            "with compressed all-reduce (plugin ABI version 2); '" +
                            ctx.comm().plugin().name() + "' offers version 1");
}

}  // namespace zerod
