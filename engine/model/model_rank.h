// One rank of a Model: its resources, its parts, and the call-order state
// the Model keeps for it. Private to engine/model/model*.cpp.
#pragma once

#include "grad/grad_reducer.h"
#include "optimizer/loss_scaler.h"
#include "model/model.h"
#include "compression/momentum_compression.h"
#include "optimizer/optimizer_runner.h"
#include "optimizer/overlapped_update.h"
#include "model/rank_resources.h"
#include "memory/residency.h"
#include "memory/state_buffers.h"

#include <atomic>
#include <optional>
#include <vector>

namespace zerod {

struct Model::RankState {
  RankState(const ModelContext& ctx, const Placement& placement, int rank, ThreadPool& shared, std::mutex& shared_mu)
      : res(rank, shared, shared_mu),
        buffers(ctx, res),
        residency(ctx, res, buffers),
        grads(ctx, placement, res, buffers),
        optimizer(ctx, placement, res, buffers, grads),
        compression(ctx, res, buffers, optimizer, grads),
        update(ctx, res, optimizer) {
    residency.copy_from([this](const ParamRecord& p) { return compression.whole_param(p); });
    residency.prefetch_when({[this](zd_module_id m) { return update.module_ready(m); },
                             [this](zd_module_id m) { update.await_module(m); }});
    // A gather that does not fit while gradient buckets are still out
    // waits for them first: the reductions queued on the stream, then
    // their way to the accumulators.
    residency.settle_transients_with([this] { grads.settle_transients(); });
  }

  // Declared in the order they are built; destroyed in reverse, so every
  // part gives its buffers back before the tiers and the device go.
  RankResources res;
  StateBuffers buffers;
  Residency residency;
  GradReducer grads;
  OptimizerRunner optimizer;
  MomentumCompression compression;
  OverlappedUpdate update;

  struct ModuleCalls {
    bool forward = false;
    bool backward = false;
    int64_t since_ns = 0;  // when the begin call of the forward or backward in progress was entered
  };
  std::vector<ModuleCalls> modules;
  int active_modules = 0;
  int registered = 0;  // parameters this rank registered
  bool finalized = false;
  // zd_param_write and zd_optimizer_state_write calls the rank completed.
  // Every rank makes the same ones, and at stages 1-2 none waits for the
  // others: counts that differ say a rank was lost between the ranks'
  // writes of one value (Model::writes_apart). Read from other threads.
  std::atomic<int64_t> whole_writes{0};

  LossScaler scaler{LossScaleConfig{}};
  int64_t overflows = 0;  // windows the dynamic scaler skipped, for the log's rate (not checkpointed)
  int64_t micro_step = 0;
  int64_t applied = 0;
  // zd_model_set_lr's lr, applied at every boundary in place of the job's
  // schedule; none until the trainer sets one (or a load or resume
  // restores one). The same on every rank (set_lr agrees on it).
  std::optional<double> trainer_lr;
  StepFigures last;
  bool boundary_reached = false;  // set by step(), consumed by its Call's end (the step's timeline closes there)
  // The optimizer's plan for update applied + 1 (plan_step), asked for once.
  zd_optimizer_plan plan{};
  int64_t plan_step = 0;
};

// A write phase of a rank's working shards (shard_board.h) while gathers
// are one-sided, from its begin to the end of the scope. The rank's own
// gathers in flight, which read the shards, are done first wherever
// parameters are gathered (stage 3: a gather ahead still running between
// two modules' calls); the rest needs a board. A wait that fails (a rank
// lost, the comm timeout) breaks the job, as a collective's would. The
// phase ends with its scope, failed or not, and the other ranks then copy
// the shards as complete: a write that fails inside it breaks the job
// before the scope ends (a catch inside it), which fails their gathers.
class ShardWrite {
 public:
  ShardWrite(const ModelContext& ctx, CommStream& stream, int rank, const char* what)
      : board_(ctx.shards), rank_(rank) {
    if (board_ || ctx.params_partitioned()) ctx.drain(stream);
    if (!board_) return;
    try {
      board_->begin_write(rank_, what);
    } catch (const Error& e) {
      ctx.broken_by(e);
    }
  }
  ~ShardWrite() {
    if (board_) board_->end_write(rank_);
  }
  ShardWrite(const ShardWrite&) = delete;
  ShardWrite& operator=(const ShardWrite&) = delete;

 private:
  ShardBoard* board_;
  int rank_;
};

class Model::Call {
 public:
  // What the call does to what the overlapped update (OverlappedUpdate)
  // writes: Touches waits for the whole update first; Untouched (the
  // trainer's lr, which the update took at its boundary) goes on beside it.
  enum class Update { Touches, Untouched };
  // of_step: a call of a training step (forward/backward begin and end,
  // step), whose first after a boundary opens the step.
  Call(Model& m, int rank, const char* name, zd_module_id module = -1, bool of_step = false,
       Update update = Update::Touches);
  ~Call();
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;
  // When the call was entered, while tracing (else 0).
  int64_t entered_ns() const { return t0_; }

 private:
  Model& m_;
  int rank_;
  const char* name_;
  zd_module_id module_;
  int64_t t0_;
};

}  // namespace zerod
