// Sizing and refusals of a compressing optimizer: what the plan and the
// ledger count, and where it cannot run (momentum_compression.h).
#include "compression/momentum_compression_internal.h"

#include "runtime/dtype.h"
#include "error.h"

#include <algorithm>
#include <bit>
#include <string>
#include <vector>

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

// The steps whose plans stand for the run's (replay_slots, exchange_layouts):
// one long after every warm-up, and a compressed step at the start (the
// first step, told it is no warm-up step).
constexpr int64_t kLateStep = int64_t{1} << 50;

// The layouts the optimizer's plans exchange in, as bits.
constexpr unsigned kTensorAtATime = 1, kFused = 2;
unsigned exchange_layouts(const OptimizerInstance& opt) {
  unsigned layouts = 0;
  for (const zd_optimizer_plan& plan : {opt.plan(kLateStep, -1, -1), opt.plan(1, 0, -1)}) {
    bool exchanges = false;
    for (zd_plan_op op : plan.ops) exchanges = exchanges || op == ZD_OP_PREPARE || op == ZD_OP_EXCHANGE;
    if (exchanges) layouts |= plan.fused ? kFused : kTensorAtATime;
  }
  // Neither plan exchanges: the smaller layout; a step that exchanges
  // fused all the same grows the scratch buffer then (MomentumCompression::scratch).
  return layouts ? layouts : kTensorAtATime;
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

int64_t owned_piece(const ModelContext& ctx, int rank, const ParamGroup& g, const std::vector<zd_param_id>& params,
                    const std::vector<uint64_t>& in_segment, uint64_t count) {
  if (count == 0 || params.empty()) return -1;
  uint64_t base = 0;
  bool found = false;
  for (size_t j = 0; j < params.size(); ++j) {
    const ParamRecord& p = ctx.registry.param(params[j]);
    if (p.numel == 0) continue;  // nowhere in either layout
    // The rank owns the tensor whole, at the same distance from the
    // segment's start as the tensors before it.
    const ModelContext::OwnedSpan sp = ctx.owned_span(p, rank);
    if (sp.from != 0 || sp.count != static_cast<uint64_t>(p.numel)) return -1;
    const uint64_t off = in_segment[j];
    if (sp.at < off) return -1;
    if (!found) {
      base = sp.at - off;
      found = true;
    } else if (sp.at - off != base) {
      return -1;
    }
  }
  return base + count <= exchange_count(ctx, g) ? static_cast<int64_t>(base) : -1;
}

uint64_t scratch_count(const ModelContext& ctx, size_t group, int rank) {
  if (owns_every_element(ctx)) return 0;
  const ParamGroup& g = ctx.registry.groups()[group];
  const unsigned layouts = exchange_layouts(ctx.optimizer());
  uint64_t need = 0, total = 0;
  std::vector<uint64_t> packed;  // each tensor's first element in the fused segment
  for (zd_param_id pid : g.params) {
    const auto n = static_cast<uint64_t>(ctx.registry.param(pid).numel);
    if ((layouts & kTensorAtATime) != 0 && owned_piece(ctx, rank, g, {pid}, {0}, n) < 0) need = std::max(need, n);
    packed.push_back(total);
    total += n;
  }
  if ((layouts & kFused) != 0 && owned_piece(ctx, rank, g, g.params, packed, total) < 0) need = std::max(need, total);
  return need;
}

}  // namespace compression_detail

using namespace compression_detail;

namespace {

// "'w0'" or "'w0' and 3 more": the tensors of a group, for a message.
std::string tensors_of(const ModelContext& ctx, const ParamGroup& g) {
  std::string s = "'" + ctx.registry.param(g.params.front()).name + "'";
  if (g.params.size() > 1) s += " and " + std::to_string(g.params.size() - 1) + " more";
  return s;
}

}  // namespace

std::string split_fused_exchange_warning(const ModelContext& ctx) {
  const OptimizerInstance& opt = ctx.optimizer();
  if (!opt.compresses() || ctx.world_size == 1 || (exchange_layouts(opt) & kFused) == 0) return "";
  const auto& groups = ctx.registry.groups();
  for (size_t a = 0; a < groups.size(); ++a)
    for (size_t b = a + 1; b < groups.size(); ++b) {
      if (groups[a].dtype != groups[b].dtype || groups[a].params.empty() || groups[b].params.empty()) continue;
      const ParamGroup& on = groups[a].state_class != 0 ? groups[a] : groups[b];
      const ParamGroup& off = groups[a].state_class != 0 ? groups[b] : groups[a];
      const std::string dt = dtype_name(on.dtype);
      return "optimizer '" + opt.plugin().name() + "' compresses each parameter group as one buffer, with a scale "
             "per chunk of it, and offload.ratio or placement() keeps the optimizer state of some " + dt +
             " tensors on the device (" + tensors_of(ctx, on) + ") and of the others off it (" +
             tensors_of(ctx, off) + "), which on a device the host cannot address makes them two groups, "
             "compressed apart (" + ctx.config.source + "): from the first compressed step every parameter "
             "differs from the same job's with that state in one place (or on the cpu device). For those "
             "results, keep the optimizer state of every " + dt + " tensor on the device, or of every one off it "
             "(offload.ratio = 1, or a placement() that places them alike)";
    }
  return "";
}

CompressionBytes compression_bytes(const ModelContext& ctx, size_t group, int rank) {
  CompressionBytes b;
  if (!ctx.optimizer().compresses()) return b;
  const ParamGroup& g = ctx.registry.groups()[group];
  if (ctx.partitioned(ZD_PARTITION_GRADS)) b.grads = g.full_numel * dtype_size(ctx.grad_dtype(g));
  b.buffers = exchange_count(ctx, g) * 4;
  b.scratch = scratch_count(ctx, group, rank) * 4;
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
