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

namespace {

// The record of a part of the error feedback (shard_file.h).
uint32_t error_record(ErrorPart part) {
  switch (part) {
    case ErrorPart::Worker: return ckpt::kWorkerError;
    case ErrorPart::Server: return ckpt::kServerError;
    default: return ckpt::kServerErrorFused;
  }
}

bool replicated(const ModelContext& ctx) { return ctx.registry.partitioning() == Partitioning::Replicated; }

// Whether the plan of a step exchanges (1-bit), and whether it passes over
// each rank's own local gradient (local steps).
bool plan_exchanges(const zd_optimizer_plan& p) {
  for (size_t i = 0; i < ZD_PLAN_MAX_OPS && p.ops[i] != ZD_OP_END; ++i)
    if (p.ops[i] == ZD_OP_PREPARE || p.ops[i] == ZD_OP_EXCHANGE) return true;
  return false;
}
bool plan_steps_locally(const zd_optimizer_plan& p) {
  for (size_t i = 0; i < ZD_PLAN_MAX_OPS && p.ops[i] != ZD_OP_END; ++i)
    if (p.ops[i] == ZD_OP_PASS_GRAD && p.grads == ZD_GRADS_LOCAL) return true;
  return false;
}

}  // namespace

void write_rank_shard(const ModelContext& ctx, RankResources& res, StateBuffers& buffers,
                      MomentumCompression& compression, ckpt::ShardWriter& out, bool replicated_writer) {
  const TierSet tiers = res.tiers();
  std::vector<float> chunk;
  const auto stream = [&](uint32_t param, uint32_t buffer, uint64_t first, uint64_t count, const TieredBuffer& src,
                          zd_dtype stored, uint64_t at) {
    out.begin(param, buffer, first, count);
    for (uint64_t off = 0; off < count; off += kChunk) {
      const uint64_t n = std::min(kChunk, count - off);
      chunk.resize(n);
      read_as_f32(tiers, src, stored, at + off, n, chunk.data());
      out.append(chunk.data(), n);
    }
    out.end();
  };
  // At stage 0 one rank's copy is all of it; where local steps made each
  // rank's its own, every other rank adds its own.
  const bool own = replicated(ctx) && ctx.world_size > 1 && compression.own_copies() && res.rank != 0;
  if (!replicated(ctx) || replicated_writer || own)
    for_each_owned_buffer(
        ctx, res.rank, buffers,
        [&](uint32_t param, uint32_t buffer, const OwnedRange& range, TieredBuffer& src, zd_dtype stored) {
          if (!replicated(ctx) || replicated_writer)
            stream(param, buffer, range.first, range.count, src, stored, range.at);
          if (own) stream(param, ckpt::kRankCopy + buffer, range.first, range.count, src, stored, range.at);
        });
  // The error feedback, where an exchange left it other than zero.
  if (compression.errors_live())
    for (const ErrorSpan& e : error_spans(ctx, res.rank, compression.errors_fused()))
      if (const TieredBuffer* b = compression.error_buffer(e))
        stream(static_cast<uint32_t>(e.param), error_record(e.part), e.first, e.count, *b, ZD_DTYPE_F32, e.at);
}

RankCarry rank_carry(const ModelContext& ctx, const ckpt::Manifest& m, const std::string& dir) {
  using Held = ckpt::Manifest::Held;
  RankCarry c;
  const auto& params = ctx.registry.params();
  const int world = ctx.world_size;
  // The same groups (by working dtype) of the same tensors: each tensor's
  // chunk, and a fused group's, is where the checkpoint's ranks had it.
  bool same_groups = m.params.size() == params.size() && m.error_fused.size() == ctx.registry.groups().size();
  for (size_t i = 0; same_groups && i < params.size(); ++i)
    same_groups = m.params[i].dtype == dtype_name(params[i].dtype);
  // On a device the host cannot address, offload.ratio or placement() may
  // split a dtype's tensors into two groups (Placement::state_class), and
  // the manifest does not say which tensors each of the writer's groups
  // held: the same count and dtypes may still be other groups, whose fused
  // chunks lie elsewhere. So the error feedback is not carried into a split
  // layout (a run at another ratio read it in the wrong chunks and failed).
  bool split = false;  // a dtype in two groups
  const auto& groups = ctx.registry.groups();
  for (size_t a = 0; a < groups.size(); ++a)
    for (size_t b = a + 1; b < groups.size(); ++b) split = split || groups[a].dtype == groups[b].dtype;
  same_groups = same_groups && !split;
  const bool compresses = ctx.optimizer().compresses();
  c.errors = m.error_feedback == Held::Yes && m.world_size == world && world > 1 && compresses && same_groups;
  c.copies = m.rank_copies == Held::Yes && m.world_size == world && world > 1 && replicated(ctx);
  const bool lose_errors = m.error_feedback == Held::Yes && !c.errors;
  const bool lose_copies = m.rank_copies == Held::Yes && !c.copies;
  const std::string copies =
      "each rank's own parameters and optimizer state (0/1 Adam's local steps at ZeRO stage 0 made them differ)";
  // What a load leaves, and what it does instead.
  const auto instead = [](bool errors, bool own) {
    return std::string(errors ? "the error feedback restarts at zero" : "") + (errors && own ? ", and " : "") +
           (own ? "every rank takes rank 0's copy" : "") +
           ", so the run goes on near, not bit for bit as, the one that wrote it";
  };
  const auto what = [&copies](bool errors, bool own) {
    return std::string(errors ? "the error feedback of each rank's 1-bit exchanges" : "") +
           (errors && own ? " and " : "") + (own ? copies : "");
  };
  if (lose_errors || lose_copies) {
    std::string here = "ZeRO stage " + std::to_string(ctx.config.zero_stage);
    if (m.world_size != world)
      here = std::to_string(world) + (world == 1 ? " rank" : " ranks");
    else if (lose_errors && split && world > 1)
      here = "exchange groups split by offload.ratio or placement() (part of the optimizer on the device), which the "
             "checkpoint does not record";
    else if (lose_errors && !same_groups && world > 1)
      here = "other exchange groups (other working dtypes, or offload.ratio or placement() keeping part of the "
             "optimizer on a device the host cannot address)";
    c.warning = "the checkpoint " + dir + " holds " + what(lose_errors, lose_copies) + ", which only a job of " +
                std::to_string(m.world_size) + " ranks" + (lose_copies ? " at ZeRO stage 0" : "") +
                " takes up; this one runs " + here + ": " + instead(lose_errors, lose_copies);
  } else if (m.error_feedback == Held::Dropped || m.rank_copies == Held::Dropped) {
    const bool errors = m.error_feedback == Held::Dropped, own = m.rank_copies == Held::Dropped;
    c.warning = "the checkpoint " + dir + " was resharded (zerod ckpt reshard) from another world size, which left "
                "out " + what(errors, own) + ": " + instead(errors, own);
  } else if (m.error_feedback == Held::Unknown && m.world_size > 1 && compresses && m.step > 0 &&
             m.params.size() == params.size()) {
    // A checkpoint of a zerod before format 5 held neither: it loads as it
    // did then (as DeepSpeed's do: error feedback at zero, one copy), said
    // where the optimizer had used them by its step (its own schedule).
    const OptimizerInstance& opt = ctx.optimizer();
    bool errors = false, local = false, reset = false;
    for (int64_t s = m.step; s >= 1 && !((errors || reset) && (local || m.zero_stage != 0)); --s) {
      const zd_optimizer_plan p = opt.plan(s, -1, -1);
      if (!reset && plan_exchanges(p)) errors = true;
      if (p.reset_errors) reset = true;  // zero from step s on, but for what s itself exchanged
      if (m.zero_stage == 0 && plan_steps_locally(p)) local = true;
    }
    if (errors || local)
      c.warning = "the checkpoint " + dir + " was written before checkpoints held " + what(errors, local) +
                  " (format " + std::to_string(m.version) + "): " + instead(errors, local);
  }
  return c;
}

void verify_rank_state(const ModelContext& ctx, RankResources& res, StateBuffers& buffers, const ckpt::Source& src) {
  const RankCarry carry = rank_carry(ctx, src.manifest(), src.dir());
  const bool own = carry.copies && res.rank != 0;
  for_each_owned_buffer(ctx, res.rank, buffers,
                        [&](uint32_t param, uint32_t buffer, const OwnedRange& range, TieredBuffer&, zd_dtype) {
                          if (own)
                            src.read_rank(res.rank, param, ckpt::kRankCopy + buffer, range.first, range.count,
                                          nullptr);
                          else
                            src.verify(param, buffer, range.first, range.count);
                        });
  if (carry.errors)
    for (const ErrorSpan& e : error_spans(ctx, res.rank, src.manifest().error_fused))
      src.read_rank(res.rank, static_cast<uint32_t>(e.param), error_record(e.part), e.first, e.count, nullptr);
}

void read_rank_state(const ModelContext& ctx, RankResources& res, StateBuffers& buffers, const ckpt::Source& src,
                     bool verified) {
  // Everything this rank will read is there and whole before anything of
  // its state changes: a damaged checkpoint loses nothing.
  if (!verified) verify_rank_state(ctx, res, buffers, src);
  const TierSet tiers = res.tiers();
  // At stage 0 after local steps: the rank's own copy (rank 0's is the plain records).
  const bool own = rank_carry(ctx, src.manifest(), src.dir()).copies && res.rank != 0;
  std::vector<float> chunk;
  for_each_owned_buffer(ctx, res.rank, buffers,
                        [&](uint32_t param, uint32_t buffer, const OwnedRange& range, TieredBuffer& dst,
                            zd_dtype stored) {
                          for (uint64_t off = 0; off < range.count; off += kChunk) {
                            const uint64_t n = std::min(kChunk, range.count - off);
                            chunk.resize(n);
                            if (own)
                              src.read_rank(res.rank, param, ckpt::kRankCopy + buffer, range.first + off, n,
                                            chunk.data());
                            else
                              src.read(param, buffer, range.first + off, n, chunk.data());
                            write_from_f32(tiers, dst, stored, range.at + off, n, chunk.data());
                          }
                        });
  // The optimizer's per-tensor scalars: the checkpoint's (of the count the
  // optimizer keeps: check_checkpoint_fits), or zero from one that holds
  // none, which it lets through only where the next update reads none.
  std::vector<float>& scalars = buffers.tensor_scalars();
  const ckpt::Manifest& m = src.manifest();
  if (m.tensor_scalars != 0 && m.scalars.size() == scalars.size()) {
    scalars = m.scalars;
    buffers.note_tensor_scalars_set();
  } else {
    std::fill(scalars.begin(), scalars.end(), 0.0f);
    buffers.note_tensor_scalars_cleared();
  }
  buffers.working_from_master();
}

void read_rank_errors(const ModelContext& ctx, RankResources& res, MomentumCompression& compression,
                      const ckpt::Source& src) {
  const ckpt::Manifest& m = src.manifest();
  const RankCarry carry = rank_carry(ctx, m, src.dir());
  compression.set_own_copies(carry.copies);
  if (!carry.errors) return;
  const TierSet tiers = res.tiers();
  std::vector<float> chunk;
  for (const ErrorSpan& e : error_spans(ctx, res.rank, m.error_fused)) {
    TieredBuffer* b = compression.error_buffer(e);
    if (b == nullptr) continue;
    for (uint64_t off = 0; off < e.count; off += kChunk) {
      const uint64_t n = std::min(kChunk, e.count - off);
      chunk.resize(n);
      src.read_rank(res.rank, static_cast<uint32_t>(e.param), error_record(e.part), e.first + off, n, chunk.data());
      write_from_f32(tiers, *b, ZD_DTYPE_F32, e.at + off, n, chunk.data());
    }
  }
  compression.errors_restored(m.error_fused);
}

ckpt::Manifest describe_model(const ModelContext& ctx, int64_t step, const LossScaler& scaler,
                              std::optional<double> trainer_lr, const StateBuffers& buffers,
                              const MomentumCompression& compression) {
  ckpt::Manifest m;
  m.step = step;
  m.lr = trainer_lr;
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
  // What each rank holds alone (every rank's compression says the same).
  using Held = ckpt::Manifest::Held;
  if (ctx.optimizer().compresses()) {
    const bool live = ctx.world_size > 1 && compression.errors_live();
    m.error_feedback = live ? Held::Yes : Held::No;
    if (live) m.error_fused = compression.errors_fused();
  }
  m.rank_copies = ctx.world_size > 1 && replicated(ctx) && compression.own_copies() ? Held::Yes : Held::No;
  return m;
}

namespace {

std::string slot_list(const std::vector<std::string>& slots) {
  std::string out;
  for (const std::string& s : slots) out += (out.empty() ? "" : ", ") + s;
  return "(" + out + ")";
}

// The setting that changes an optimizer's slots, where one of ours does:
// the same plugin with other slots is otherwise a mystery to its user.
std::string settings_behind_slots(const std::string& optimizer) {
  if (optimizer == "zero_one_adam")
    return " in optimizer.local_steps (true, the default, keeps the momentum_accumulator of the local steps at ZeRO "
           "stage 0; false, which stages 1-3 need, does not)";
  return "";
}

}  // namespace

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
  if (m.optimizer != opt.plugin().name())
    fail(ZD_ERR_CONFIG, "the checkpoint " + dir + " was written by optimizer '" + m.optimizer + "', this job runs '" +
                            opt.plugin().name() + "' (" + ctx.config.source + "): their states do not carry over");
  if (m.slots != slots)
    fail(ZD_ERR_CONFIG, "the checkpoint " + dir + " holds the state slots " + slot_list(m.slots) + " of optimizer '" +
                            m.optimizer + "', and this job's (" + ctx.config.source + ") keeps " + slot_list(slots) +
                            ": its settings differ" + settings_behind_slots(m.optimizer) +
                            ", and the states do not carry over; load it with the settings that wrote it");
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
