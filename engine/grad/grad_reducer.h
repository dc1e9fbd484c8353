// Gradients on one rank: the buffers a backward hands the trainer, how
// their contents join the rank's accumulators, and the reduction across
// ranks. Below stage 2 contributions accumulate locally and are averaged at
// the accumulation boundary (stage 0 all-reduces them, stage 1
// reduce-scatters them to their owners); from stage 2 they are reduced
// during backward, in buckets of the partitioner's reduce_bucket_size, on
// the rank's stream, into the owners' accumulators. The accumulators live
// where Placement::grad_tier says: on the device while the optimizer runs
// there, else in host memory, so that gradients leave the device at
// backward_end. What crosses from a device the host cannot address to host
// accumulators does so on a thread of its own (out_), behind the
// reduction: downloaded a chunk at a time while the host adds the chunk
// before, so neither the rank's collectives and gathers nor the trainer
// wait for the host's adds.
//
// A compressing optimizer's step may keep the gradients local instead (a
// plan with ZD_GRADS_LOCAL: each rank's whole gradient goes into the
// exchange). Below stage 2 the accumulators are whole anyway; from stage 2 a
// window with local gradients accumulates into a whole local buffer of the
// rank's own (allocated beside the accumulators when the optimizer
// compresses), and nothing is reduced during its backward.
#pragma once

#include "comm/comm_stream.h"
#include "memory/memory.h"
#include "model/model_types.h"
#include "model/model_context.h"
#include "memory/placement.h"
#include "model/rank_resources.h"
#include "memory/state_buffers.h"

#include <atomic>
#include <functional>
#include <memory>
#include <vector>

namespace zerod {

// A rank's gradient for the part of a group it updates at a step.
struct OwnedGrad {
  std::byte* data = nullptr;
  zd_tier tier = ZD_TIER_DEVICE;
  Memory* memory = nullptr;  // the memory that holds it (and works on it)
};

class GradReducer {
 public:
  GradReducer(const ModelContext& ctx, const Placement& placement, RankResources& res, StateBuffers& buffers)
      : ctx_(ctx), placement_(placement), res_(res), buffers_(buffers) {}
  ~GradReducer() { release(); }
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  void reset();    // sized for the registry (at finalize)
  void release();  // every buffer of its own goes

  // Whether the window being accumulated keeps its gradients local; set
  // before its first backward_begin (it changes nothing below stage 2).
  void set_local(bool local);
  bool local() const { return local_; }
  // The rank's whole local gradient of a group (full layout): its
  // accumulators below stage 2, the local buffer from stage 2.
  OwnedGrad local_grad(size_t group) const;

  // backward_begin: a gradient buffer for each of the module's parameters
  // (zero). Below stage 2 the first contribution of a window goes straight
  // into the (zero) accumulator when it has the parameter's dtype and is on
  // the device; everything else gets a transient buffer. All or nothing.
  void open(const ModuleRecord& mod);
  // The module's views become visible (after the rest of backward_begin).
  void activate(const ModuleRecord& mod);
  // backward_begin failed after open(): its buffers go.
  void cancel(const ModuleRecord& mod);
  // backward_end: the buffers' contents join the gradients — added to the
  // accumulators, or handed to a reduction bucket (sent when full).
  void close(const ModuleRecord& mod);
  bool view_active(zd_param_id p) const { return params_[static_cast<size_t>(p)].view_active; }
  ViewInfo view(zd_param_id p) const;

  // At an accumulation boundary, before the optimizer: the pending bucket is
  // sent (stages 2-3) or the gradients are averaged over ranks (stages 0-1;
  // not when `local`, a compressed step keeps them local).
  void flush();
  // Waits until every contribution sent so far is in the accumulators (or,
  // before a window's last micro-batch, in the window on the device).
  void drain();
  // Waits until the buckets sent so far have given their device buffers
  // back: the rank's stream (their reductions), then drain(). A device
  // allocation refused while they are out is tried again after it.
  void settle_transients();
  // At an accumulation boundary, after drain(): what only the window on the
  // device holds (parameters the last micro-batch gave nothing) goes to the
  // accumulators too.
  void settle_windows();
  // Whether the micro-batch whose backward begins now is its window's last:
  // its contributions that land in host accumulators leave each
  // parameter's squared-norm partials behind, taken as the add writes them,
  // so that the step does not read the gradients again.
  void set_final_micro_batch(bool final) { final_ = final; }
  // The sum of squares of the owned gradients of these groups (in host
  // memory): per parameter, in tiles of kTile from its first owned element,
  // summed in group, parameter and tile order, whether the partials were
  // left by the adds or are computed here. Before the optimizer reads them.
  double host_sumsq(const std::vector<size_t>& groups);
  void reduce_for_step();
  OwnedGrad owned(size_t group) const;
  // Whether a plain update zeroes group gi's owned gradients as it reads
  // them (parallel_update's zero_grad). Not where they are host memory that
  // no trainer writes into (offloaded accumulators) and the optimizer
  // compresses nothing: every contribution of the next window is written
  // over its parameter's range first (PoolAdd's `first`), so only the
  // parameters a window leaves untouched need zeros, which
  // clear_untouched() writes at the boundary. The zeroing was 2 of the 30
  // bytes a parameter that an offloaded bf16 update moves.
  bool update_zeroes(size_t gi) const;
  // At an accumulation boundary, once the window's contributions are in
  // (after settle_windows()), before any reduction or norm reads them: the
  // accumulators of parameters no contribution reached this window, which
  // still hold what the last update read, are zeroed.
  void clear_untouched();
  // After the optimizer (applied) or a skipped step: the step's buffers go
  // and the accumulators are clear for the next window (or, where the
  // update left them as read, overwritten by it: update_zeroes).
  void end_step(bool applied);
  void zero();
  // A failed step's buffers and pending buckets go, the accumulators are
  // cleared and the bucket tags restart (as on every rank).
  void restart();
  // Whether a contribution landed since the last step (a backward_end that
  // no zd_step has applied or skipped yet).
  bool pending() const;
  // The window's gradients are dropped (a checkpoint load, zd_model_set_step:
  // training starts over from the state they set): what was sent lands,
  // then views, buckets, windows and accumulators are cleared. The comm
  // goes on, so the bucket tags do too.
  void discard();

 private:
  struct ParamEntry {
    Block view;                // a transient gradient buffer, or empty (the view is the accumulator)
    bool view_active = false;  // between backward_begin and backward_end
    bool touched = false;      // a contribution landed in this accumulation window
  };
  // A contribution waiting in a reduction bucket (stages 2-3).
  struct Pending {
    zd_param_id param;
    Block view;
    bool first;  // the window's first contribution to the parameter's accumulators
  };

  std::byte* accumulator(const ParamRecord& p) const;
  // Whether contributions go to reduction buckets (stages 2-3, averaged
  // gradients) rather than into whole accumulators.
  bool reducing() const { return ctx_.partitioned(ZD_PARTITION_GRADS) && !local_; }
  // Whether a contribution sent now leaves its norm partials (see
  // set_final_micro_batch): at stages 2-3, and below on one rank, where the
  // accumulators hold what the optimizer reads.
  // `final`: final_ as of when the contribution was sent (work deferred to
  // another thread must not read final_, which the next backward_begin sets).
  // `mem`: the accumulators' memory (only the host's adds leave partials).
  bool fuse_norm(const Memory& mem, bool final) const {
    return final && !local_ && mem.leaves_norms() && (reducing() || ctx_.world_size == 1);
  }
  NormTiles norm_of(zd_param_id p) {
    return {norm_sums_.data() + norm_at_[static_cast<size_t>(p)], ctx_.owned_span(ctx_.registry.param(p), res_.rank).count};
  }
  void forget_norms() { std::fill(norm_valid_.begin(), norm_valid_.end(), 0); }
  void send_bucket(size_t group);
  // Runs fn where contributions join the accumulators: in order on out_'s
  // thread where leaving the pool is a transfer (Transfers::leaving_stream),
  // else at once.
  void to_accumulators(std::function<void()> fn);
  // A gradient buffer in the device tier (a view, a bucket): when the
  // budget refuses it while buckets sent before still hold theirs, it waits
  // for them to give theirs back and tries again.
  Block allocate_transient(uint64_t bytes, const std::string& what);
  void release_transient();  // views and buckets; not the whole local buffers nor the reduced ranges
  void release_reduced();
  // Stage 1 on several ranks: the step reduce-scatters the whole gradients
  // into reduced_ (stage 0 all-reduces them in place; from stage 2 the
  // buckets reduce them during backward).
  bool stage1_reduces() const {
    return ctx_.world_size > 1 && ctx_.partitioned(ZD_PARTITION_OPTIMIZER) && !ctx_.partitioned(ZD_PARTITION_GRADS);
  }

  // Stages 2-3, offload.accumulate on the device: a group's micro-batches
  // before the window's last add into window_[group] (its owned range, in
  // the device tier), the last one's sum leaves for the accumulators.
  bool windowed(size_t group) const { return !window_.empty() && !window_[group].empty(); }
  std::byte* window_at(size_t group, uint64_t at) const;
  // The parameters' owned ranges in group gi's window go to the
  // accumulators (on the calling thread, in one add_from_pool) and the
  // window ranges are cleared; each parameter once; `ready` as above,
  // `final` as in fuse_norm.
  void settle_window(size_t gi, const std::vector<zd_param_id>& pids, uint64_t ready, bool final);

  const ModelContext& ctx_;
  const Placement& placement_;
  RankResources& res_;
  StateBuffers& buffers_;
  std::vector<TieredBuffer> window_;  // per group; empty where not windowed
  std::vector<char> in_window_;       // per parameter: the window holds contributions not yet sent on
  std::vector<char> settled_;         // per parameter: its accumulators took a window's sum this window
  std::vector<char> handed_;          // per parameter: a settle of it was queued this window (res_.stream's thread)
  bool left_as_read_ = false;         // an update was applied since the accumulators were last cleared:
                                      // groups it did not zero (update_zeroes) hold what it read
  std::vector<ParamEntry> params_;
  std::vector<std::vector<Pending>> buckets_;  // per group
  std::vector<uint64_t> bucket_elems_;         // per group
  uint64_t bucket_seq_ = 0;                    // tags the bucket collectives
  std::vector<TieredBuffer> reduced_;          // stage 1, several ranks: the owned range of each group's averaged
                                               // gradients (allocated at reset(), counted in the plan)
  // reduce_for_step filled reduced_ for this step: owned() is there. Atomic:
  // the overlapped update's thread calls owned() while end_step() clears
  // it (it is false then: stage 1 on several ranks never overlaps).
  std::atomic<bool> reduced_ready_{false};
  std::vector<TieredBuffer> whole_;            // stages 2-3, compressing optimizer: the local whole gradients
  bool local_ = false;
  bool final_ = true;
  // Per parameter: where its tiles' squared-norm partials begin in
  // norm_sums_, and whether the window's last contribution left them.
  std::vector<uint64_t> norm_at_;
  std::vector<double> norm_sums_;
  std::vector<char> norm_valid_;
  std::unique_ptr<CommStream> out_;  // made at reset(), when the device is known
};

}  // namespace zerod
