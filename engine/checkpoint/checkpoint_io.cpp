#include "checkpoint_io.h"

#include "runtime/dtype.h"
#include "error.h"

#include <algorithm>
#include <vector>

namespace zerod {

namespace {
constexpr uint64_t kChunk = uint64_t{1} << 20;  // elements streamed at a time

// Calls fn(param index, buffer number, what the rank holds, that buffer,
// what it keeps its values as) for every buffer of fp32 values (the master,
// then each state slot) of every parameter the rank holds a part of, in
// registration order. Checkpoints hold fp32 whatever the job's state dtype,
// so a checkpoint of a bf16-state job loads into an fp32 one and back.
template <typename Fn>
void for_each_owned_buffer(const ModelContext& ctx, int rank, StateBuffers& buffers, Fn fn) {
  const uint32_t slots = ctx.optimizer().state_slots();
  const auto& params = ctx.registry.params();
  for (size_t i = 0; i < params.size(); ++i) {
    const auto own = owned_range(ctx, params[i], rank);
    if (!own) continue;
    GroupBuffers& b = buffers.of(params[i]);
    for (uint32_t buffer = 0; buffer <= slots; ++buffer) {
      const bool master = buffer == ckpt::kMasterBuffer;
      fn(static_cast<uint32_t>(i), buffer, *own, master ? b.master : b.state[buffer - 1],
         master ? ZD_DTYPE_F32 : ctx.state_dtype());
    }
  }
}
}  // namespace

std::optional<OwnedRange> owned_range(const ModelContext& ctx, const ParamRecord& p, int rank) {
  const auto numel = static_cast<uint64_t>(p.numel);
  switch (ctx.registry.partitioning()) {
    case Partitioning::Replicated:
      return OwnedRange{0, numel, p.full_offset};
    case Partitioning::Group: {
      uint64_t lo, hi;
      ctx.owned_part(p, rank, &lo, &hi);
      if (lo >= hi) return std::nullopt;
      const ParamGroup& g = ctx.registry.groups()[static_cast<size_t>(p.group)];
      return OwnedRange{lo - p.full_offset, hi - lo, lo - ctx.owned_begin(g, rank)};
    }
    default: {
      const uint64_t real = p.shard_real(rank);
      if (real == 0) return std::nullopt;
      return OwnedRange{static_cast<uint64_t>(rank) * p.stride, real, p.flat_offset};
    }
  }
}

void write_rank_shard(const ModelContext& ctx, RankResources& res, StateBuffers& buffers, ckpt::ShardWriter& out,
                      bool replicated_writer) {
  // At stage 0 one rank's copy is all of it.
  if (ctx.registry.partitioning() == Partitioning::Replicated && !replicated_writer) return;
  const TierSet tiers = res.tiers();
  std::vector<float> chunk;
  for_each_owned_buffer(ctx, res.rank, buffers,
                        [&](uint32_t param, uint32_t buffer, const OwnedRange& own, TieredBuffer& src,
                            zd_dtype stored) {
                          out.begin(param, buffer, own.first, own.count);
                          for (uint64_t off = 0; off < own.count; off += kChunk) {
                            const uint64_t n = std::min(kChunk, own.count - off);
                            chunk.resize(n);
                            read_as_f32(tiers, src, stored, own.at + off, n, chunk.data());
                            out.append(chunk.data(), n);
                          }
                          out.end();
                        });
}

void verify_rank_state(const ModelContext& ctx, RankResources& res, StateBuffers& buffers, const ckpt::Source& src) {
  for_each_owned_buffer(ctx, res.rank, buffers,
                        [&](uint32_t param, uint32_t buffer, const OwnedRange& own, TieredBuffer&, zd_dtype) {
                          src.verify(param, buffer, own.first, own.count);
                        });
}

void read_rank_state(const ModelContext& ctx, RankResources& res, StateBuffers& buffers, const ckpt::Source& src,
                     bool verified) {
  // Everything this rank will read is there and whole before anything of
  // its state changes: a damaged checkpoint loses nothing.
  if (!verified) verify_rank_state(ctx, res, buffers, src);
  const TierSet tiers = res.tiers();
  std::vector<float> chunk;
  for_each_owned_buffer(ctx, res.rank, buffers,
                        [&](uint32_t param, uint32_t buffer, const OwnedRange& own, TieredBuffer& dst,
                            zd_dtype stored) {
                          for (uint64_t off = 0; off < own.count; off += kChunk) {
                            const uint64_t n = std::min(kChunk, own.count - off);
                            chunk.resize(n);
                            src.read(param, buffer, own.first + off, n, chunk.data());
                            write_from_f32(tiers, dst, stored, own.at + off, n, chunk.data());
                          }
                        });
  // The optimizer's per-tensor scalars: the checkpoint's (of the count the
  // optimizer keeps: check_checkpoint_fits), or zero from one that holds
  // none, which it lets through only where the next update reads none.
  std::vector<float>& scalars = buffers.tensor_scalars();
  const ckpt::Manifest& m = src.manifest();
  if (m.tensor_scalars != 0 && m.scalars.size() == scalars.size())
    scalars = m.scalars;
  else
    std::fill(scalars.begin(), scalars.end(), 0.0f);
  buffers.working_from_master();
}

ckpt::Manifest describe_model(const ModelContext& ctx, int64_t step, const LossScaler& scaler,
                              const StateBuffers& buffers) {
  ckpt::Manifest m;
  m.step = step;
  m.world_size = ctx.world_size;
  m.zero_stage = ctx.config.zero_stage;
  m.precision = precision_name(ctx.config.precision);
  m.optimizer = ctx.optimizer().plugin().name();
  for (uint32_t s = 0; s < ctx.optimizer().state_slots(); ++s) m.slots.push_back(ctx.optimizer().state_name(s));
  m.loss_scale = scaler.scale();
  m.scaler_iteration = scaler.iteration();
  m.scaler_last_overflow = scaler.last_overflow_iteration();
  m.scaler_hysteresis_left = scaler.hysteresis_left();
  for (const ParamRecord& p : ctx.registry.params())
    m.params.push_back({p.name, ctx.registry.module(p.module).name, dtype_name(p.dtype), p.shape,
                        static_cast<uint64_t>(p.numel)});
  m.tensor_scalars = ctx.optimizer().tensor_scalars();
  m.scalars = buffers.tensor_scalars();
  if (m.scalars.size() != m.params.size() * m.tensor_scalars)
    fail(ZD_ERR_INTERNAL, "describe_model: " + std::to_string(m.scalars.size()) + " per-tensor scalars for " +
                              std::to_string(m.params.size()) + " parameters of " +
                              std::to_string(m.tensor_scalars) + " each");
  return m;
}

void check_checkpoint_fits(const ModelContext& ctx, const ckpt::Manifest& m, const std::string& dir) {
  const auto& params = ctx.registry.params();
  if (m.params.size() != params.size())
    fail(ZD_ERR_SHAPE_MISMATCH, "the checkpoint " + dir + " holds " + std::to_string(m.params.size()) +
                                    " parameters, this model has " + std::to_string(params.size()));
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamRecord& p = params[i];
    const ckpt::ParamEntry& e = m.params[i];
    if (e.name != p.name)
      fail(ZD_ERR_SHAPE_MISMATCH, "the checkpoint " + dir + " holds '" + e.name + "' as parameter #" + std::to_string(i) +
                                      " where this model has '" + p.name + "'");
    if (e.shape != p.shape)
      fail(ZD_ERR_SHAPE_MISMATCH, "parameter '" + p.name + "' has another shape in the checkpoint " + dir);
  }
  const OptimizerInstance& opt = ctx.optimizer();
  std::vector<std::string> slots;
  for (uint32_t s = 0; s < opt.state_slots(); ++s) slots.push_back(opt.state_name(s));
  if (m.optimizer != opt.plugin().name() || m.slots != slots)
    fail(ZD_ERR_CONFIG, "the checkpoint " + dir + " was written by optimizer '" + m.optimizer + "', this job runs '" +
                            opt.plugin().name() + "' (" + ctx.config.source + "): their states do not carry over");
  const uint32_t k = opt.tensor_scalars();
  if (m.tensor_scalars != 0 && m.tensor_scalars != k)
    fail(ZD_ERR_CONFIG, "the checkpoint " + dir + " holds " + std::to_string(m.tensor_scalars) +
                            " per-tensor scalars of optimizer '" + m.optimizer + "' per parameter, and this job's '" +
                            opt.plugin().name() + "' keeps " + std::to_string(k) + " (another version of the "
                            "plugin?): its state does not carry over");
  // A checkpoint written before checkpoints held the scalars: they were
  // zero when it was taken only if nothing had used them yet. The plugin
  // says whether the next update reads what earlier ones left there.
  if (m.tensor_scalars == 0 && k > 0 && m.step > 0 && opt.plan(m.step + 1, -1, -1).kept_scalars != 0)
    fail(ZD_ERR_CONFIG, "the checkpoint " + dir + " holds no per-tensor scalars of optimizer '" + m.optimizer +
                            "' (it was written before checkpoints held them, in format " + std::to_string(m.version) +
                            "), and its update " + std::to_string(m.step + 1) + " reads what the updates before it "
                            "left in them (" + std::to_string(k) + " per parameter, such as 1-bit LAMB's frozen trust "
                            "ratios or 0/1 Adam's sum of learning rates since its last sync). Resumed from it, the run "
                            "would not go on as the one that wrote it did (1-bit LAMB would not move at all); load "
                            "a checkpoint this zerod wrote, or one of a step where the optimizer did not use them "
                            "yet (step 0, or 0/1 Adam's before its var_freeze_step)");
}

double all_reduce_max(const ModelContext& ctx, RankResources& res, int rank, uint64_t group, uint64_t id,
                      const std::string& what, double value) {
  if (ctx.world_size == 1) return value;
  ctx.run(*res.stream, [&] {
    ctx.comm().all_reduce(ctx.comm_call(rank, comm_tag(CommOp::Read, group, id), what), &value, 1, ZD_COMM_F64,
                          ZD_REDUCE_MAX);
  });
  return value;
}

}  // namespace zerod
