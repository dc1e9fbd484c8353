#include "compression/momentum_compression.h"
// The plan of a compressed step, op by op (PREPARE, EXCHANGE, PASS), and
// the lifetime of what MomentumCompression keeps. The exchange and its
// error feedback are in momentum_compression_exchange.cpp, the replay in
// momentum_compression_replay.cpp, sizing and refusals in
// momentum_compression_sizing.cpp.
#include "compression/momentum_compression_internal.h"

#include "runtime/dtype.h"
#include "error.h"
#include "runtime/workers.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

namespace zerod {

using namespace compression_detail;

void MomentumCompression::forget_average() {
  for (Group& c : groups_) c.have_average = c.average_in_buffer = false;
  replica_valid_ = 0;
  params_valid_ = false;
}

bool MomentumCompression::keeps() const { return ctx_.world_size > 1 && !owns_all(); }

bool MomentumCompression::owns_all() const { return owns_every_element(ctx_); }

void MomentumCompression::lay_out_groups() {
  const auto& groups = ctx_.registry.groups();
  groups_.clear();
  groups_.resize(groups.size());
  packed_at_.assign(ctx_.registry.params().size(), 0);
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    Group& c = groups_[gi];
    for (zd_param_id pid : groups[gi].params) {
      c.dense.push_back(c.dense_count);
      packed_at_[static_cast<size_t>(pid)] = c.dense_count;
      c.dense_count += static_cast<uint64_t>(ctx_.registry.param(pid).numel);
    }
  }
}

void MomentumCompression::allocate() {
  lay_out_groups();
  if (!ctx_.optimizer().compresses()) return;
  const auto& groups = ctx_.registry.groups();
  const TierSet tiers = res_.tiers();
  const auto world = static_cast<uint64_t>(ctx_.world_size);
  try {
    allocate_exchange_buffers();
    if (ctx_.world_size == 1) return;  // no exchange: no error feedback, no average to keep
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      const ParamGroup& g = groups[gi];
      Group& c = groups_[gi];
      const zd_tier tier = buffers_.groups()[gi].grad_tier();
      const std::string of = " of group " + std::to_string(gi) + " of rank " + std::to_string(res_.rank);
      c.worker_error.allocate(tiers, 4, {{c.dense_count, tier}}, ZD_MEM_OPTIMIZER, "the worker error feedback" + of);
      c.server_error.allocate(tiers, 4, {{server_elems(ctx_.registry, g, ctx_.world_size), tier}}, ZD_MEM_OPTIMIZER,
                              "the server error feedback" + of);
      if (!keeps()) continue;
      c.signs.allocate(tiers, 1, {{(c.dense_count + 7) / 8, tier}}, ZD_MEM_OPTIMIZER,
                       "the kept compressed average" + of);
      c.scales.allocate(tiers, 4, {{g.params.size() * world, tier}}, ZD_MEM_OPTIMIZER,
                        "the kept compressed average's scales" + of);
    }
  } catch (...) {
    release();
    throw;
  }
}

void MomentumCompression::release() {
  const TierSet tiers = res_.tiers();
  for (Group& c : groups_) {
    for (TieredBuffer* b : {&c.worker_error, &c.server_error, &c.signs, &c.scales}) b->release(tiers);
    for (TieredBuffer& b : c.replica) b.release(tiers);
    c.params.release(tiers);
  }
  replica_valid_ = 0;
  params_valid_ = false;
  for (TieredBuffer& b : owned_) b.release(tiers);
  owned_.clear();
  for (TieredBuffer& b : scratch_) b.release(tiers);
  groups_.clear();
  packed_at_.clear();
}

void MomentumCompression::reset() {
  for (Group& c : groups_) {
    for (TieredBuffer* b : {&c.worker_error, &c.server_error}) b->zero();
    c.have_average = c.average_in_buffer = false;
  }
  errors_live_ = false;
  replica_valid_ = 0;
  params_valid_ = false;
}

std::vector<ErrorSpan> error_spans(const ModelContext& ctx, int rank, const std::vector<char>& fused) {
  std::vector<ErrorSpan> out;
  const auto& groups = ctx.registry.groups();
  const auto r = static_cast<uint64_t>(rank);
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const ParamGroup& g = groups[gi];
    // The packed order (registration order, no gaps): the worker error's,
    // and a fused exchange's.
    std::vector<uint64_t> packed;
    uint64_t total = 0;
    for (zd_param_id pid : g.params) {
      packed.push_back(total);
      total += static_cast<uint64_t>(ctx.registry.param(pid).numel);
    }
    for (size_t j = 0; j < g.params.size(); ++j) {
      const auto n = static_cast<uint64_t>(ctx.registry.param(g.params[j]).numel);
      if (n > 0) out.push_back({ErrorPart::Worker, gi, g.params[j], 0, n, packed[j]});
    }
    if (gi < fused.size() && fused[gi] != 0) {
      // Chunk `rank` of the packed group, [lo, hi), at the buffer's start.
      const uint64_t chunk = compression_chunk(total, ctx.world_size);
      const uint64_t lo = std::min(total, r * chunk), hi = std::min(total, lo + chunk);
      for (size_t j = 0; j < g.params.size(); ++j) {
        const uint64_t p0 = packed[j], p1 = p0 + static_cast<uint64_t>(ctx.registry.param(g.params[j]).numel);
        const uint64_t a = std::max(lo, p0), b = std::min(hi, p1);
        if (a < b) out.push_back({ErrorPart::ServerFused, gi, g.params[j], a - p0, b - a, a - lo});
      }
      continue;
    }
    // Chunk `rank` of each tensor, one tensor's chunk after another's.
    uint64_t server_at = 0;
    for (zd_param_id pid : g.params) {
      const auto n = static_cast<uint64_t>(ctx.registry.param(pid).numel);
      const uint64_t chunk = compression_chunk(n, ctx.world_size);
      const uint64_t lo = std::min(n, r * chunk), hi = std::min(n, lo + chunk);
      if (lo < hi) out.push_back({ErrorPart::Server, gi, pid, lo, hi - lo, server_at});
      server_at += chunk;
    }
  }
  return out;
}

std::vector<char> MomentumCompression::errors_fused() const {
  std::vector<char> fused;
  for (const Group& c : groups_) fused.push_back(c.errors_fused ? 1 : 0);
  return fused;
}

TieredBuffer* MomentumCompression::error_buffer(const ErrorSpan& span) {
  if (span.group >= groups_.size()) return nullptr;
  Group& c = groups_[span.group];
  TieredBuffer& b = span.part == ErrorPart::Worker ? c.worker_error : c.server_error;
  return b.empty() ? nullptr : &b;
}

void MomentumCompression::errors_restored(const std::vector<char>& fused) {
  for (size_t gi = 0; gi < groups_.size() && gi < fused.size(); ++gi) groups_[gi].errors_fused = fused[gi] != 0;
  errors_live_ = true;
}

// What every update call of this step says of tensor pid: the types, the
// step's scale, lr and number, the plan's kind, the pass, and the tensor's
// scalars.
zd_optimizer_update MomentumCompression::step_update(const StepState& st, const ParamGroup& g, zd_param_id pid,
                                                     uint32_t pass) {
  const uint32_t k = ctx_.optimizer().tensor_scalars();
  zd_optimizer_update u{};
  u.struct_size = sizeof u;
  u.grad_dtype = ctx_.grad_dtype(g);
  u.work_dtype = g.dtype;
  u.grad_scale = st.grad_scale;
  u.lr = st.lr;
  u.step = st.t;
  u.kind = st.plan.kind;
  u.pass = pass;
  u.tensor = k ? buffers_.tensor_scalars().data() + static_cast<uint64_t>(pid) * k : nullptr;
  return u;
}

// PREPARE (and the EXCHANGE after it), segment by segment: only one
// segment's whole values are held at a time.
void MomentumCompression::prepare(StepState& st, bool then_exchange) {
  const auto& groups = ctx_.registry.groups();
  const zd_optimizer_plan& plan = st.plan;
  const bool several = ctx_.world_size > 1;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const ParamGroup& g = groups[gi];
    Group& c = groups_[gi];
    const OwnedGrad local = grads_.local_grad(gi);
    const size_t gsz = dtype_size(ctx_.grad_dtype(g));
    const bool held = plan.keep_average && c.average_in_buffer;
    const int32_t in = !plan.keep_average                    ? ZD_EXCHANGE_IN_ZERO
                       : (keeps() && c.have_average) || held ? ZD_EXCHANGE_IN_AVERAGE
                                                             : ZD_EXCHANGE_IN_SLOT;
    c.average_in_buffer = false;
    // A replayed step of a model exchanged as one segment (one group,
    // fused: 1-bit LAMB's) leaves the whole average in the scratch buffer,
    // which nothing else uses before the next step: it stays there, as
    // stage 0's stays in its exchange buffer, instead of being packed to
    // bits and rebuilt from them (the same values: the exchange's average
    // is a scale per chunk times the signs). Anything that moves the state
    // on clears average_in_buffer (run, forget_average, reset).
    const bool one_segment = st.replay && then_exchange && plan.keep_average && plan.fused != 0 && groups.size() == 1;
    bool in_scratch = false;
    for (const Segment& s : segments(gi, plan.fused != 0)) {
      // Every element is written below (zeros where the plan starts from
      // zero): only an average held in the buffer is read from it.
      bool direct = false;
      HostWindow xw = segment_window(st, gi, s, held ? HostWindow::kReadWrite : HostWindow::kWrite, &direct);
      float* const xs = xw.f32();
      in_scratch = one_segment && !direct;
      if (in == ZD_EXCHANGE_IN_ZERO) {
        std::memset(xs, 0, s.count * 4);
      } else if (held) {
        // In the buffer already (owns_all: every segment is in place).
      } else if (in == ZD_EXCHANGE_IN_AVERAGE) {
        fill_from_average(gi, s, xs);
      } else if (in == ZD_EXCHANGE_IN_SLOT) {
        read_slot(gi, s, static_cast<int>(ctx_.optimizer().average_slot()), xs);
      }
      // The segment's local gradients (the full layout: its tensors and
      // any padding between them), read and zeroed by prepare().
      uint64_t lo = UINT64_MAX, hi = 0;
      for (zd_param_id pid : s.params) {
        const ParamRecord& p = ctx_.registry.param(pid);
        lo = std::min(lo, p.full_offset);
        hi = std::max(hi, p.full_offset + static_cast<uint64_t>(p.numel));
      }
      if (lo > hi) lo = hi;
      {
        // Gone before the exchange's windows open: the host scratch holds
        // the segment's window beside one of them at a time
        // (compression_window_bytes).
        HostWindow grad(*local.memory, local.data + lo * gsz, (hi - lo) * gsz, HostWindow::kReadWrite,
                        "the host copy of a segment's local gradients");
        for (zd_param_id pid : s.params) {
          const ParamRecord& p = ctx_.registry.param(pid);
          zd_optimizer_update u = step_update(st, g, pid, 0);
          u.count = static_cast<uint64_t>(p.numel);
          u.grad = grad.data() + (p.full_offset - lo) * gsz;
          u.exchange = xs + (packed_at_[static_cast<size_t>(pid)] - s.dense);
          u.exchange_in = in;
          parallel_prepare(res_.workers, ctx_.optimizer(), u);
        }
        grad.done();
      }
      if (then_exchange && several) exchange(gi, s, xs, plan.keep_average != 0 && keeps() && !in_scratch);
      if (then_exchange && st.replay) replay(st, gi, s, xs, 1);
      if (!direct) scatter_owned(st, gi, s, xs);
      xw.done();
    }
    // The kept bits are current unless the average stayed in the scratch.
    if (then_exchange && plan.keep_average && keeps()) c.have_average = !in_scratch;
    c.average_in_buffer = then_exchange && plan.keep_average && (owns_all() || in_scratch);
  }
  st.consumed = true;
}

void MomentumCompression::tensor_step(StepState& st, zd_plan_op op) {
  const OptimizerInstance& opt = ctx_.optimizer();
  if (opt.tensor_scalars() == 0 && opt.tensor_stats() == 0) return;
  const auto& params = ctx_.registry.params();
  std::vector<uint64_t> numel;
  numel.reserve(params.size());
  for (const ParamRecord& p : params) numel.push_back(static_cast<uint64_t>(p.numel));
  zd_tensor_step s{};
  s.struct_size = sizeof s;
  s.kind = st.plan.kind;
  s.op = op;
  s.pass = op == ZD_OP_PASS || op == ZD_OP_PASS_GRAD ? st.pass : 0;
  s.step = st.t;
  s.lr = st.lr;
  s.tensors = params.size();
  s.numel = numel.data();
  s.stats = st.have_stats ? st.stats.data() : nullptr;
  std::vector<float>& scalars = buffers_.tensor_scalars();
  s.scalars = scalars.empty() ? nullptr : scalars.data();
  opt.tensor_step(s);
  buffers_.note_tensor_scalars_set();
}

void MomentumCompression::pass(StepState& st, bool with_grad) {
  const OptimizerInstance& opt = ctx_.optimizer();
  const uint32_t nstats = opt.tensor_stats();
  st.stats.assign(ctx_.registry.params().size() * nstats, 0.0);
  OptimizerRunner::PassArgs a;
  a.grad_scale = st.grad_scale;
  a.lr = st.lr;
  a.t = st.t;
  a.with_grad = with_grad;
  a.planned = true;
  a.kind = st.plan.kind;
  a.pass = st.pass;
  if (st.owned != nullptr)
    a.exchange = [this, &st](size_t gi, zd_param_id pid, uint64_t at) { return exchange_of(st, gi, pid, at); };
  const std::vector<float>& scalars = buffers_.tensor_scalars();
  a.scalars = scalars.empty() ? nullptr : scalars.data();
  a.stats = nstats ? &st.stats : nullptr;
  runner_.pass(a);
  if (with_grad) st.consumed = true;
  st.have_stats = nstats > 0;
  combine_stats(st);
  // The first pass was replayed with the exchange (prepare); a later one
  // (1-bit LAMB's, which applies the trust ratio the owners' statistics
  // gave) is replayed here, after the owners' pass and the tensor_step that
  // set the scalars it reads, the same on every rank.
  if (st.replay && st.pass > 1)
    for (size_t gi = 0; gi < ctx_.registry.groups().size(); ++gi)
      for (const Segment& s : segments(gi, st.plan.fused != 0)) replay(st, gi, s, nullptr, st.pass);
}

// Each owner summed (or maxed) its part of every tensor: combine them, so
// that every rank's tensor_step sees the same figures.
void MomentumCompression::combine_stats(StepState& st) {
  const OptimizerInstance& opt = ctx_.optimizer();
  const uint32_t nstats = opt.tensor_stats();
  if (nstats == 0 || owns_all()) return;
  for (zd_stat_op op : {ZD_STAT_SUM, ZD_STAT_MAX}) {
    std::vector<double> v;
    std::vector<size_t> at;
    for (size_t i = 0; i < st.stats.size(); ++i)
      if (opt.stat_op(static_cast<uint32_t>(i % nstats)) == op) {
        v.push_back(st.stats[i]);
        at.push_back(i);
      }
    if (v.empty()) continue;
    const std::string what = "step: all-reduce of the optimizer's per-tensor statistics";
    ctx_.run(*res_.stream, [&] {
      ctx_.comm().all_reduce(ctx_.comm_call(res_.rank, comm_tag(CommOp::Stats, op == ZD_STAT_SUM ? 1 : 2, st.pass), what),
                             v.data(), v.size(), ZD_COMM_F64, op == ZD_STAT_SUM ? ZD_REDUCE_SUM : ZD_REDUCE_MAX);
    });
    for (size_t j = 0; j < at.size(); ++j) st.stats[at[j]] = v[j];
  }
}

bool MomentumCompression::run(const zd_optimizer_plan& plan, double grad_scale, double lr, int64_t t) {
  if (groups_.empty()) lay_out_groups();
  StepState st{plan, grad_scale, lr, t, nullptr, {}, false, 0, false, replays(plan)};
  // A plan without a prepare that starts from the average moves the slot on
  // some other way: the buffer no longer holds what it was made from.
  bool prepares = false;
  for (zd_plan_op op : plan.ops) prepares = prepares || op == ZD_OP_PREPARE;
  if (!plan.keep_average || !prepares)
    for (Group& c : groups_) c.average_in_buffer = false;
  // A plan that keeps no average moves the average slot on; the replicas
  // stay valid if this step replays them (0/1 Adam's m), as below.
  if (!plan.keep_average)
    for (Group& c : groups_) c.have_average = false;
  if (!st.replay) {
    // A step that is not replayed may change what the replicas copied.
    replica_valid_ = 0;
  } else if (replica_valid_ != plan.replay_slots) {
    fill_replica(plan.replay_slots);
    replica_valid_ = plan.replay_slots;
  }
  // Stage 3: the replay moves the whole copy of the parameters on from the
  // owners' values before the step; it is current again once the owners'
  // parts are copied in at the end (a step that fails part-way leaves it
  // invalid).
  const bool whole_params = st.replay && ctx_.params_partitioned();
  if (whole_params && !params_valid_) fill_params();
  params_valid_ = false;
  if (plan.reset_errors) {
    for (Group& c : groups_)
      for (TieredBuffer* b : {&c.worker_error, &c.server_error}) b->zero();
    errors_live_ = false;
  }
  bool exchanges = false;
  for (zd_plan_op op : plan.ops) exchanges = exchanges || op == ZD_OP_PREPARE || op == ZD_OP_EXCHANGE;
  if (exchanges) {
    if (owned_.size() != ctx_.registry.groups().size())
      fail(ZD_ERR_INTERNAL, "a compressed step ran before finalize allocated its exchange buffers");
    st.owned = &owned_;
  }
  for (size_t i = 0; i < ZD_PLAN_MAX_OPS && plan.ops[i] != ZD_OP_END; ++i) {
    const zd_plan_op op = plan.ops[i];
    switch (op) {
      case ZD_OP_PREPARE: {
        tensor_step(st, op);
        const bool then = i + 1 < ZD_PLAN_MAX_OPS && plan.ops[i + 1] == ZD_OP_EXCHANGE;
        prepare(st, then);
        if (then) ++i;
        break;
      }
      case ZD_OP_EXCHANGE:
        if (!owns_all())
          fail(ZD_ERR_CONFIG, "optimizer '" + ctx_.optimizer().plugin().name() + "' planned update " +
                                  std::to_string(t) + " to exchange what a pass wrote over the rank's own part only; "
                                  "that needs every rank to own every element (ZeRO stage 0)");
        exchange_in_place(st);
        break;
      case ZD_OP_PASS:
      case ZD_OP_PASS_GRAD:
        if (op == ZD_OP_PASS_GRAD && plan.grads == ZD_GRADS_LOCAL && !owns_all())
          fail(ZD_ERR_CONFIG, "optimizer '" + ctx_.optimizer().plugin().name() + "' planned update " +
                                  std::to_string(t) + " as a pass over each rank's own local gradient, which needs "
                                  "every rank to own every element (ZeRO stage 0)");
        // A pass over each rank's own local gradient (stage 0, checked
        // above): each rank's parameters and state are its own from now on.
        if (op == ZD_OP_PASS_GRAD && plan.grads == ZD_GRADS_LOCAL && ctx_.world_size > 1) own_copies_ = true;
        ++st.pass;
        tensor_step(st, op);
        pass(st, op == ZD_OP_PASS_GRAD);
        break;
      default: fail(ZD_ERR_INTERNAL, "an unknown op in a checked plan");
    }
  }
  tensor_step(st, ZD_OP_END);
  if (plan.grads == ZD_GRADS_LOCAL && !st.consumed) grads_.zero();
  if (whole_params) {
    copy_owned_params();
    params_valid_ = true;
  }
  return st.replay;
}

}  // namespace zerod
