// Model::step: at an accumulation boundary, reduce the gradients to their
// owners, check for overflow, take the global norm, clip, and run the
// optimizer on the owned range, writing the working copies in the same
// pass; then hand the new working copies to every rank that needs them.
// And the restart of a job whose ranks died (never of one whose update
// stopped part-way).
#include "model/model_rank.h"

#include "memory/memory.h"
#include "runtime/dtype.h"
#include "error.h"
#include "log.h"

#include <charconv>
#include <cmath>
#include <exception>
#include <optional>

namespace zerod {

namespace {

// Overflows of a dynamic scale are logged: the first kOverflowsLogged, then
// every kOverflowLogInterval-th. A run's first steps halve a high initial
// scale a few times, which is normal; a run that keeps overflowing says so
// now and then without flooding the log.
constexpr int64_t kOverflowsLogged = 5;
constexpr int64_t kOverflowLogInterval = 100;

// A loss scale as written in a job script (65536, 0.25), whatever the
// process's locale.
std::string scale_text(double scale) {
  char b[64];
  const auto r = std::to_chars(b, b + sizeof b, scale);
  return std::string(b, r.ptr);
}

bool overflow_logged(int64_t overflow) {
  return overflow <= kOverflowsLogged || overflow % kOverflowLogInterval == 0;
}

// What the dynamic scaler did about the `overflow`-th overflow (1-based),
// at the update that would have been `step`.
std::string overflow_message(int64_t step, int64_t overflow, OverflowOutcome outcome, double before, double after) {
  std::string m = "step " + std::to_string(step) + " skipped (overflow " + std::to_string(overflow) +
                  "): the gradients hold inf or NaN; loss scale ";
  switch (outcome) {
    case OverflowOutcome::kTolerated:
      m += scale_text(before) + " kept (fp16.hysteresis: a later overflow halves it)";
      break;
    case OverflowOutcome::kAtMinimum:
      m += scale_text(before) + " is fp16.min_loss_scale already and cannot go lower";
      break;
    default:
      m += scale_text(before) + " -> " + scale_text(after);
  }
  if (overflow == kOverflowsLogged)
    m += "; further overflows are logged every " + std::to_string(kOverflowLogInterval) + "th";
  return m;
}

// Why zd_step fails where a dynamic scale overflows at its minimum.
std::string at_minimum_message(const JobConfig& config, int64_t step) {
  return config.source + ": step " + std::to_string(step) +
         ": the gradients hold inf or NaN with the loss scale already at fp16.min_loss_scale (" +
         scale_text(config.loss_scale.min_scale) +
         ") and no hysteresis left: no lower scale can make them finite, so every further step would be "
         "skipped. This window was skipped; nothing was updated. Look for the inf or NaN in the loss, the data "
         "or the model, or lower the learning rate; where the gradients really exceed fp16's range at this "
         "scale, lower fp16.min_loss_scale or train in bf16. fp16.raise_error_at_min_scale = false skips such "
         "steps instead of failing";
}

}  // namespace

double Model::learning_rate(int64_t step) {
  if (!policy_) return base_lr_;
  // Every rank asks for the same steps; the script runs once per step.
  std::lock_guard<std::mutex> lock(schedule_mu_);
  for (const auto& [s, lr] : lr_cache_)
    if (s == step) return lr;
  double lr = base_lr_;
  if (auto v = policy_->lr(step)) {
    if (!std::isfinite(*v) || *v < 0)
      fail(ZD_ERR_CONFIG, config_.source + ": lr(" + std::to_string(step) + ") returned " +
                              std::to_string(*v) + "; a learning rate must be finite and >= 0");
    lr = *v;
  }
  lr_cache_.emplace_back(step, lr);
  if (lr_cache_.size() > 8) lr_cache_.erase(lr_cache_.begin());
  return lr;
}

zd_optimizer_plan Model::plan_for(int64_t step) {
  const OptimizerInstance& opt = *plugins_.optimizer;
  if (!opt.compresses() && opt.tensor_scalars() == 0 && opt.tensor_stats() == 0 && !opt.takes_schedules())
    return OptimizerInstance::plain_plan();
  // Every rank asks for the same steps; the script runs once per step.
  std::lock_guard<std::mutex> lock(schedule_mu_);
  for (const auto& [s, p] : plan_cache_)
    if (s == step) return p;
  int warmup = -1, sync = -1;
  if (policy_) {
    if (auto w = policy_->warmup(step - 1)) warmup = *w ? 1 : 0;
    if (auto y = policy_->sync(step - 1)) sync = *y ? 1 : 0;
  }
  const zd_optimizer_plan p = opt.plan(step, warmup, sync);
  plan_cache_.emplace_back(step, p);
  if (plan_cache_.size() > 8) plan_cache_.erase(plan_cache_.begin());
  return p;
}

const zd_optimizer_plan& Model::next_plan(RankState& rs) {
  if (rs.plan_step != rs.applied + 1) {
    rs.plan = plan_for(rs.applied + 1);
    rs.plan_step = rs.applied + 1;
  }
  return rs.plan;
}

void Model::gather_working_copies(RankState& rs) {
  if (registry_.partitioning() != Partitioning::Group || world_size_ == 1) return;
  const std::string what = "step: all-gather of the updated working copies";
  const auto& groups = registry_.groups();
  const int rank = rs.res.rank;
  observe::Span span(rs.res.probe, "residency", "gather working copies");
  ctx_.run(*rs.res.stream, [&] {
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      const ParamGroup& g = groups[gi];
      std::byte* w = rs.buffers.groups()[gi].working.addr(0);  // stages 1-2: one device segment
      rs.res.pool_memory.all_gather(ctx_, ctx_.comm_call(rank, comm_tag(CommOp::GatherWorking, gi, 0), what),
                                    rs.res.pool_memory, w + ctx_.owned_begin(g, rank) * dtype_size(g.dtype), w,
                                    g.stride, g.dtype);
    }
  });
}

StepFigures Model::step(int rank) {
  Call call(*this, rank, "step", -1, true);
  require_finalized("zd_step");
  RankState& rs = rank_state(rank);
  if (rs.active_modules > 0) {
    for (size_t m = 0; m < rs.modules.size(); ++m) {
      const RankState::ModuleCalls& a = rs.modules[m];
      if (a.forward || a.backward)
        fail(ZD_ERR_INVALID_STATE,
             "zd_step while " + ctx_.module_label(static_cast<zd_module_id>(m)) + " is still in " +
                 (a.forward ? "forward: call zd_forward_end" : "backward: call zd_backward_end") +
                 " first");
    }
  }
  // The recorded module order is complete after the first micro-batch;
  // every micro-batch starts from its beginning.
  rs.residency.start_micro_batch();

  StepFigures f;
  f.micro_step = rs.micro_step + 1;
  f.step = rs.applied;
  f.loss_scale = rs.scaler.scale();
  const int64_t gas = config_.gradient_accumulation_steps;
  if (f.micro_step % gas != 0) {
    rs.micro_step = f.micro_step;
    rs.last = f;
    return f;
  }
  observe::RankProbe& probe = rs.res.probe;

  // An accumulation boundary. The learning rate and the plan are resolved
  // first so a failing lr() leaves the gradients and counters untouched.
  // The trainer's lr (zd_model_set_lr) stands in for the schedule's; every
  // optimizer, plain or compressing, takes f.lr alike.
  f.boundary = true;
  f.lr = rs.trainer_lr ? *rs.trainer_lr : learning_rate(rs.applied);
  const zd_optimizer_plan plan = next_plan(rs);
  // Gradients the trainer wrote straight into the accumulators are read now.
  rs.res.device->wait_for_trainer();
  {
    // The gradient buckets and gathers still in flight.
    observe::Span span(probe, "grads", "wait for collectives", {}, &probe.counters().reduce_wait_ns);
    if (ctx_.partitioned(ZD_PARTITION_GRADS)) rs.grads.flush();
    ctx_.drain(*rs.res.stream);
    rs.grads.drain();
    rs.grads.settle_windows();
    rs.grads.clear_untouched();
  }
  if (ctx_.params_partitioned()) rs.residency.release_all();
  // A compressing optimizer's step may keep the gradients local (it
  // exchanges them, or what it made of them, compressed).
  const bool local = plan.grads == ZD_GRADS_LOCAL;
  if (!local) rs.grads.reduce_for_step();

  observe::Span norm_span(probe, "optimizer", "gradient norm");
  const GradStats stats = rs.optimizer.gradient_stats(local);
  norm_span.end();
  // Local gradients: the mean over ranks of their squared norms.
  const double sumsq = local ? stats.sumsq / static_cast<double>(world_size_) : stats.sumsq;
  const double scale = rs.scaler.scale();
  // Gradients were averaged over ranks (or are local) and summed over gas
  // micro-batches at the loss scale.
  const double denom = scale * static_cast<double>(gas);
  rs.micro_step = f.micro_step;
  // An overflow at the minimum scale skips its window whole, as any other,
  // and then fails the call: the model stays consistent for a trainer that
  // catches it (and loads a checkpoint, say).
  bool stuck_at_minimum = false;
  if (!stats.finite) {
    const OverflowOutcome outcome = skip_step(rs, f);
    stuck_at_minimum = outcome == OverflowOutcome::kAtMinimum && config_.loss_scale.raise_error_at_min_scale;
  } else {
    const double norm = std::sqrt(sumsq) / denom;
    double clip = 1.0;
    if (config_.gradient_clipping > 0.0 && norm > config_.gradient_clipping)
      clip = config_.gradient_clipping / (norm + 1e-6);
    // A snapshot still reading the masters and state: they change now.
    snapshots_->fence(rank);
    // The update writes the working shards that one-sided gathers read
    // (every rank passed the collectives above, so no wait here).
    bool replayed = false;  // compression.replay: every working copy is current already
    {
      const ShardWrite phase(ctx_, *rs.res.stream, rank, "zd_step's update");
      try {
        observe::Span span(probe, "optimizer", OptimizerInstance::is_plain(plan) ? "optimizer" : "compressed step");
        if (OptimizerInstance::is_plain(plan)) {
          rs.compression.forget_average();
          const auto args = OptimizerRunner::plain_args(clip / denom, f.lr, rs.applied + 1, /*with_grad=*/true);
          if (can_overlap(rs, plan)) {
            // The device's and the disk's pieces now; the host's behind
            // this call, module by module (stage 3's persistent parameters
            // first: they are gathered below).
            rs.optimizer.pass_off_host(args);
            std::vector<zd_param_id> persistent;
            if (ctx_.params_partitioned())
              for (size_t i = 0; i < registry_.params().size(); ++i)
                if (registry_.params()[i].persistent) persistent.push_back(static_cast<zd_param_id>(i));
            rs.update.start(args, std::move(persistent));
          } else {
            rs.optimizer.pass(args);
          }
        } else {
          replayed = rs.compression.run(plan, clip / denom, f.lr, rs.applied + 1);
        }
      } catch (const Error& e) {
        // A tier failed part-way (a disk error): the tiles before it were
        // updated, the rest not. Nothing wrong was written, but this step is
        // half applied, so no further call may pretend otherwise, nor may a
        // restart resume it.
        stopped_part_way(rank, rs.applied + 1, e);
      }
    }
    // The masters have moved: the counters move with them, before any
    // collective below can fail (a restart then resumes from here).
    rs.scaler.update(false);
    ++rs.applied;
    rs.grads.end_step(/*applied=*/true);
    snapshots_->after_step(rank, rs.applied, rs.res, rs.buffers, rs.compression, rs.scaler, rs.trainer_lr);
    rs.grads.set_local(false);  // the next window's plan decides, at its first backward
    if (!replayed) gather_working_copies(rs);
    // Persistent parameters are refreshed from the new shards.
    if (ctx_.params_partitioned()) {
      observe::Span span(probe, "residency", "refresh persistent");
      wait_update(rs, kPersistentFirst);
      rs.residency.refresh_persistent();
    }
    f.applied = true;
    f.grad_norm = norm;
    f.loss_scale = rs.scaler.scale();
  }
  f.step = rs.applied;
  rs.last = f;
  rs.res.device->step_ended();
  rs.boundary_reached = true;  // the step's timeline closes as this call returns
  activity_.record_step(rank, f.lr, f.loss_scale, f.grad_norm, f.skipped);
  if (stuck_at_minimum) fail(ZD_ERR_CONFIG, at_minimum_message(config_, rs.applied + 1));
  return f;
}

OverflowOutcome Model::skip_step(RankState& rs, StepFigures& f) {
  const double before = rs.scaler.scale();
  const OverflowOutcome outcome = rs.scaler.update(true);
  rs.grads.end_step(/*applied=*/false);
  f.skipped = true;
  f.grad_norm = std::nan("");
  f.loss_scale = rs.scaler.scale();
  const int rank = rs.res.rank;
  if (!rs.scaler.dynamic()) {
    if (rank == 0) log_warn("step " + std::to_string(rs.applied + 1) + " skipped: the gradients hold inf or NaN");
    return outcome;
  }
  ++rs.overflows;
  if (rank == first_local_ && overflow_logged(rs.overflows))
    log_warn(overflow_message(rs.applied + 1, rs.overflows, outcome, before, f.loss_scale));
  return outcome;
}

void Model::wait_update(RankState& rs, zd_module_id m) {
  try {
    if (m == kPersistentFirst)
      rs.update.wait_first();
    else if (m < 0)
      rs.update.wait_all();
    else
      rs.update.wait_module(m);
  } catch (const Error& e) {
    // As when the synchronous update fails part-way: modules before the
    // failure were updated, the rest not.
    stopped_part_way(rs.res.rank, rs.applied, e);
  }
}

Error Model::part_way_error(int rank, int64_t step, const Error& e) {
  return Error(e.code(), std::string(e.what()) + "\nrank " + std::to_string(rank) + ": the optimizer step " +
                             std::to_string(step) +
                             " stopped part-way; what is on disk is intact, but the step is half applied: "
                             "restart from a checkpoint");
}

void Model::stopped_part_way(int rank, int64_t step, const Error& e) {
  break_job(part_way_error(rank, step, e), /*part_way=*/true);
}

bool Model::can_overlap(const RankState& rs, const zd_optimizer_plan& plan) const {
  const OptimizerInstance& opt = *plugins_.optimizer;
  // Stages 1-2 on several ranks all-gather the new working copies right
  // after the update; one-sided gathers read every rank's shards at a
  // version the whole update moves; a snapshot due now reads the masters.
  return config_.offload.overlap && OptimizerInstance::is_plain(plan) && !opt.compresses() &&
         opt.tensor_scalars() == 0 && opt.tensor_stats() == 0 &&
         (registry_.partitioning() != Partitioning::Group || world_size_ == 1) && !shard_board_ &&
         !snapshots_->due(rs.applied + 1);
}

void Model::recover(std::unique_ptr<CommInstance> comm) {
  // An overlapped update still to be waited for: one whose failure a call
  // reported has been waited for already (its step is half_applied_), so a
  // failure here went unseen (its rank's trainer died before its next
  // call), and its step is half applied as well.
  for (auto& rs : ranks_) {
    std::optional<Error> failed;
    try {
      rs->update.finish();
    } catch (const Error& e) {
      failed.emplace(e);
    } catch (const std::exception& e) {
      failed.emplace(ZD_ERR_INTERNAL, e.what());
    } catch (...) {
      failed.emplace(ZD_ERR_INTERNAL, "the overlapped update failed with an unknown exception");
    }
    if (failed) {
      const Error part_way = part_way_error(rs->res.rank, rs->applied, *failed);
      std::lock_guard<std::mutex> lock(reg_mu_);
      if (!half_applied_) half_applied_.emplace(part_way);
      mark_broken_locked(part_way.code(), part_way.what());
    }
  }
  // Resuming a half-applied step would apply some of it twice (the tiles it
  // reached get the retried update again) or leave the ranks a step apart.
  if (const std::optional<Error> half = half_applied_step())
    fail(half->code(),
         std::string("this model cannot be resumed: a write of its state (an optimizer step, a checkpoint load or "
                     "snapshot resume, a zd_param_write or zd_optimizer_state_write) stopped part-way and left it "
                     "half applied (resume from a checkpoint or a snapshot instead):\n") +
             half->what());
  // The old streams' tasks have all ended (their collectives failed); a new
  // stream per rank, then the new comm they will call.
  for (auto& rs : ranks_)
    rs->res.stream = std::make_unique<CommStream>(world_size_ > 1 || rs->res.transfers.bytes_travel());
  {
    // Status, metrics and rank_lost read the comm from other threads.
    std::lock_guard<std::mutex> lock(comm_mu_);
    plugins_.comm.swap(comm);
  }
  comm.reset();  // the old one, outside the lock: its teardown may take a while
  board_->reset();  // the new comm numbers its collectives from the start
  if (shard_board_) shard_board_->reset();
  if (peer_board_) peer_board_->reset();
  plugins_.comm->observe_with(board_.get());
  const int64_t gas = config_.gradient_accumulation_steps;
  for (auto& rsp : ranks_) {
    RankState& rs = *rsp;
    rs.grads.restart();
    rs.residency.restart();
    // The next compressed step starts from the optimizer's slot, not from an
    // average kept before the failure. (One that failed between its exchange
    // and its pass stopped part-way: such a model never gets here.)
    rs.compression.forget_average();
    for (RankState::ModuleCalls& m : rs.modules) m = RankState::ModuleCalls{};
    rs.active_modules = 0;
    rs.micro_step = rs.applied * gas;  // the interrupted window's gradients are gone
    rs.boundary_reached = false;
    rs.res.probe.restart(rs.applied);
    rs.res.probe.counters().forget_direct();  // as the new comm's figures start from zero
  }
  activity_.clear_lost();
  {
    std::lock_guard<std::mutex> lock(reg_mu_);
    broken_.clear();
    broken_code_ = ZD_OK;
    is_broken_.store(false);
  }
  std::lock_guard<std::mutex> lock(schedule_mu_);
  lr_cache_.clear();
  plan_cache_.clear();
}

void Model::rebuild_working_copies(int rank) {
  Call call(*this, rank, "rebuild");
  RankState& rs = rank_state(rank);
  // A rank whose rebuild failed cannot finish it (its finalize is not
  // retried), and the others would wait for it in the gathers after it, or
  // copy its shards half rebuilt: any failure breaks the job, a write's
  // before its phase ends.
  try {
    if (ctx_.params_partitioned()) rs.residency.forget_gathered();
    {
      const ShardWrite phase(ctx_, *rs.res.stream, rank, "the rebuild of the working copies");
      try {
        rs.buffers.working_from_master();
      } catch (...) {
        rebuild_failed(rank);
      }
    }
    gather_working_copies(rs);
    if (ctx_.params_partitioned()) rs.residency.refresh_persistent();
  } catch (...) {
    rebuild_failed(rank);
  }
}

}  // namespace zerod
