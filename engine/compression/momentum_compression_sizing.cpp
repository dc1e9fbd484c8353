// Sizing and refusals of a compressing optimizer: what the plan and the
// ledger count, and where it cannot run (momentum_compression.h).
#include "compression/momentum_compression_internal.h"

#include "runtime/dtype.h"
#include "error.h"
#include "memory/align.h"
#include "memory/host_scratch.h"

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

namespace {

// The host windows of one group's compressed steps on one rank, window by
// window as the code opens them (compression_window_bytes).
struct WindowSizer {
  const ModelContext& ctx;
  const ParamGroup& g;
  int rank;
  const PoolResident& pool;
  uint64_t replayed;  // the slots a replay keeps whole copies of; 0 where no step replays

  uint64_t win(bool in_pool, uint64_t bytes) const {
    return in_pool && bytes != 0 ? align_up(bytes, HostScratch::kAlign) : 0;
  }
  bool keeps() const { return ctx.world_size > 1 && !owns_every_element(ctx); }
  // The whole copy a replay updates: stages 1-2 the working copy, stage 3
  // the kept parameters (in the gradients' tier).
  bool whole_in_pool() const { return ctx.params_partitioned() ? pool.buffers : pool.working; }
  uint64_t numel(size_t k) const { return static_cast<uint64_t>(ctx.registry.param(g.params[k]).numel); }
  uint64_t owned(size_t k) const { return ctx.owned_span(ctx.registry.param(g.params[k]), rank).count; }

  // A replay over a tensor's elements others own, or one tensor's whole
  // copy filled or read (fill_replica, fill_params, the kept parameters).
  uint64_t replay(size_t k) const {
    if (replayed == 0) return 0;
    return win(whole_in_pool(), 4 * numel(k)) + replayed * win(pool.buffers, 4 * numel(k));
  }
  // One piece of a planned pass: the rank's part of a tensor, each operand.
  uint64_t piece(size_t k) const {
    const uint64_t n = owned(k);
    const OptimizerInstance& opt = ctx.optimizer();
    return win(pool.master, 4 * n) + opt.state_slots() * win(pool.state, ctx.state_size() * n) +
           win(pool.working, dtype_size(g.dtype) * n) + win(pool.buffers, dtype_size(ctx.grad_dtype(g)) * n) +
           win(pool.buffers, 4 * n);  // the last two: the gradient and the exchange buffer
  }
  // The kept average's bits of `count` elements (whole bytes from any bit)
  // and its scales.
  uint64_t kept_average(uint64_t count) const {
    return win(pool.buffers, count / 8 + 2) + win(pool.buffers, 4 * static_cast<uint64_t>(ctx.world_size));
  }
  // What one segment's prepare and exchange hold at once (prepare(),
  // exchange(), replay(), scatter_owned()): its exchange buffer's window the
  // whole time, beside the largest of what comes and goes while it is open.
  // `ks`: the segment's tensors (indices into the group's params).
  uint64_t segment(const std::vector<size_t>& ks) const {
    uint64_t count = 0, lo = UINT64_MAX, hi = 0, slot = 0, scatter = 0, replays = 0;
    for (size_t k : ks) {
      const ParamRecord& p = ctx.registry.param(g.params[k]);
      count += numel(k);
      lo = std::min(lo, p.full_offset);
      hi = std::max(hi, p.full_offset + numel(k));
      slot += win(pool.state, 4 * numel(k));    // read_slot, where the rank owns every element
      scatter += win(pool.buffers, 4 * owned(k));  // scatter_owned, where it does not
      replays = std::max(replays, replay(k));
    }
    if (count == 0) return 0;
    const bool several = ctx.world_size > 1;
    uint64_t during = std::max<uint64_t>(keeps() ? kept_average(count) : 0, owns_every_element(ctx) ? slot : 0);
    during = std::max(during, win(pool.buffers, dtype_size(ctx.grad_dtype(g)) * (hi - lo)));
    if (several)
      during = std::max(during, win(pool.buffers, 4 * count) +
                                    win(pool.buffers, 4 * compression_chunk(count, ctx.world_size)) +
                                    (keeps() ? kept_average(count) : 0));
    during = std::max(during, replays);
    if (!owns_every_element(ctx)) during = std::max(during, scatter);
    return win(pool.buffers, 4 * count) + during;
  }
};

}  // namespace

uint64_t compression_window_bytes(const ModelContext& ctx, size_t group, int rank, const PoolResident& pool) {
  const OptimizerInstance& opt = ctx.optimizer();
  if (!opt.compresses()) return 0;
  const ParamGroup& g = ctx.registry.groups()[group];
  const bool replays = ctx.config.compression_replay && ctx.world_size > 1 && !owns_every_element(ctx);
  const WindowSizer z{ctx, g, rank, pool, replays ? static_cast<uint64_t>(std::popcount(replay_slots(opt))) : 0};
  const unsigned layouts = exchange_layouts(opt);
  uint64_t most = 0;
  std::vector<size_t> all;
  for (size_t k = 0; k < g.params.size(); ++k) {
    all.push_back(k);
    most = std::max({most, z.piece(k), z.replay(k)});
    if ((layouts & kTensorAtATime) != 0) most = std::max(most, z.segment({k}));
  }
  if ((layouts & kFused) != 0) most = std::max(most, z.segment(all));
  return most;
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
