// The engine's model: a job's parameters, their state on every rank, the
// call-order rules of a training step, and the step itself.
//
// Every call names the rank it comes from; one Model serves all the ranks a
// daemon hosts (each rank's calls arrive on a thread of its own), and
// embedded mode is a job of one rank. The Model keeps the call order and
// runs the sequence of a step; the parts do the work, each owning its state:
//   Placement           where each piece of state lives, what each tier needs
//   StateBuffers        a rank's working copies, gradients, masters, state
//   Residency           stage-3 gather / release / prefetch
//   GradReducer         gradient buffers, accumulation, reduction across ranks
//   OptimizerRunner     the update where the state lives (device, host, NVMe)
//   MomentumCompression 1-bit compressed momentum averaging
//   state_io            whole values of masters and optimizer state
// and each rank computes on a Device (cpu or cuda) through RankResources.
// Collectives go through the comm plugin; what is split across ranks comes
// from the partitioner plugin (the ZeRO stage).
//
// A call either completes or throws zerod::Error. A call made out of order
// changes nothing and the model stays usable. A failed collective (a rank
// timed out, ranks disagree, a rank was lost) or a step that stops part-way
// (a tier failed in the update) breaks the job: the collectives the other
// ranks wait in fail at once, and every later call on every rank fails with
// the same message, which says which rank was where.
#pragma once

#include "runtime/activity.h"
#include "checkpoint/snapshots.h"
#include "checkpoint/source.h"
#include "comm/peer_board.h"
#include "comm/shard_board.h"
#include "device/device.h"
#include "device/select.h"
#include "error.h"
#include "model/job_config.h"
#include "memory/ledger.h"
#include "memory/memory_admission.h"
#include "model/model_context.h"
#include "model/model_types.h"
#include "observe/collective_board.h"
#include "observe/rank_counters.h"
#include "observe/tracer.h"
#include "memory/placement.h"
#include "runtime/plugin_host.h"
#include "model/registry.h"
#include "runtime/thread_pool.h"

#include <zerod/zerod.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace zerod {

// Checks a whole-parameter buffer: a valid dtype, exactly numel elements of
// it, not NULL. `call` names the C function in the message.
void check_whole_param(const char* call, const ParamRecord& p, zd_dtype dtype, const void* ptr,
                       uint64_t bytes);

// What a test may look at inside a rank's shard (padding included).
enum class ShardBuffer { Master, Gradient, WorkingShard };

class Model final : private FailureSink {
 public:
  // policy may be null (constant lr); it is not owned and must outlive the
  // model. Its lr() is called under a lock, once per step.
  // This process (daemon) serves ranks [first_local_rank, first_local_rank
  // + local_ranks) of world_size (-1: all of them); with several nodes each
  // daemon holds its own ranks' state and the comm plugin joins them.
  // config.device ("cpu", "cuda", "auto") picks each rank's device.
  // open_device opens each rank's device (null: the device the job names).
  Model(JobConfig config, ModelPlugins plugins, JobPolicy* policy, int world_size, int first_local_rank = 0,
        int local_ranks = -1, DeviceFactory open_device = nullptr);
  ~Model() override;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // --- registration: every rank registers the same parameters in order ----
  // Rank 0's initial values are used (as data-parallel training broadcasts
  // rank 0's weights); the other ranks' must have the same names, modules,
  // dtypes and shapes.
  zd_param_id register_param(int rank, const std::string& name, const std::string& module,
                             zd_dtype dtype, std::vector<int64_t> shape, const void* init,
                             zd_dtype init_dtype);
  // A collective: returns on every rank once all ranks have finalized.
  void finalize(int rank);
  bool finalized() const { return finalized_.load(); }
  // The registry grows while ranks register, on their threads: read it
  // from those threads, or after finalize. Other threads (status, metrics)
  // take registry_summary(), read under the registration lock.
  const Registry& registry() const { return registry_; }
  struct RegistrySummary {
    size_t params = 0;
    size_t modules = 0;
    uint64_t numel = 0;  // elements of every parameter
  };
  RegistrySummary registry_summary() const;

  // --- one step, per rank ---------------------------------------------------
  void forward_begin(int rank, zd_module_id module);
  void forward_end(int rank, zd_module_id module);
  void backward_begin(int rank, zd_module_id module);
  void backward_end(int rank, zd_module_id module);
  ViewInfo param_view(int rank, zd_param_id param);
  ViewInfo grad_view(int rank, zd_param_id param);
  StepFigures step(int rank);
  double loss_scale(int rank) const;
  // The trainer's stream for the rank's device (a cudaStream_t; nullptr =
  // the default stream). Between steps.
  void set_stream(int rank, void* stream);
  // Before any rank finalizes: what the model's planned state is charged
  // against beyond the job's own budgets (a daemon serving several jobs),
  // every local rank's at once.
  void set_memory_admission(std::shared_ptr<MemoryAdmission> admission) { admission_ = std::move(admission); }

  // --- whole parameters -----------------------------------------------------
  // With the optimizer state partitioned (stage >= 1) on several ranks,
  // read_param is a collective: every rank reads the same parameter.
  void read_param(int rank, zd_param_id param, zd_dtype dtype, void* dst, uint64_t bytes);
  // Every rank writes the same value; each updates its own copies.
  void write_param(int rank, zd_param_id param, zd_dtype dtype, const void* src, uint64_t bytes);

  // --- optimizer state, for checkpoints ---------------------------------------
  // One state slot of a parameter, whole, like read_param (a collective with
  // the state partitioned on several ranks) and write_param.
  void read_state(int rank, zd_param_id param, int slot, zd_dtype dtype, void* dst, uint64_t bytes);
  void write_state(int rank, zd_param_id param, int slot, zd_dtype dtype, const void* src, uint64_t bytes);
  // Optimizer updates applied so far on the rank.
  int64_t applied_steps(int rank) const;
  // Restores the count of applied updates (a checkpoint's); every rank the
  // same value, between steps. Error feedback of a compressing optimizer
  // restarts at zero; gradients of a backward no step applied are dropped,
  // as a load drops them (a warning says so).
  void set_applied_steps(int rank, int64_t step);
  // The lr of every update from the next boundary on, in place of the
  // job's schedule, until set again (zd_model_set_lr): finite and >= 0,
  // between modules. With several ranks a collective that refuses, on
  // every rank, values that differ between them.
  void set_lr(int rank, double lr);

  // --- checkpoints (docs/checkpoints.md) ---------------------------------------
  // A collective, between steps: every rank writes its shard of the masters
  // and optimizer state into dir (created if need be), streaming; rank 0
  // then writes the manifest. Returns on every rank once the checkpoint is
  // whole.
  void save_checkpoint(int rank, const std::string& dir);
  // A collective, between steps: every rank reads what it holds now from a
  // checkpoint written at any world size and stage, the working copies
  // follow the masters, and the step and loss scale are restored.
  // Gradients of a backward no step applied are dropped: the next update is
  // the checkpoint's next one.
  void load_checkpoint(int rank, const std::string& dir);
  // At a clean end of the job (no rank inside the model): the last snapshot,
  // when the job takes snapshots and steps were applied since the newest.
  // Returns "" unless the end's snapshot failed (or its last update did, so
  // none was taken): then what the error in the log said, that the run's
  // final state was NOT saved (Snapshots::lose_end), for the daemon to turn
  // into an exit status; across nodes, what final_snapshot(rank) found.
  std::string final_snapshot();
  // Across nodes, as a rank leaves cleanly (zd_model_destroy, before its
  // comm goes): the same, agreed by every rank of the job (a collective).
  std::string final_snapshot(int rank);
  // --- observing (docs/observability.md) -------------------------------------
  // The trainer's report: tokens and samples it processed since its last
  // report (0 = not counted) and, with has_loss, its loss. From the rank's
  // own thread; recorded against the steps applied so far.
  void report(int rank, uint64_t tokens, uint64_t samples, bool has_loss, double loss);
  // The rank's live counters (metrics, `zerod top`); read from any thread.
  const observe::RankCounters& counters(int rank) const;
  // The job's timeline recorder, or null when the job records none.
  const observe::Tracer* tracer() const { return tracer_.get(); }

  // --- failures ---------------------------------------------------------------
  // The rank's trainer went away: its collectives fail everywhere, and every
  // later call on every rank gets ZD_ERR_PEER_LOST. Thread-safe.
  void rank_lost(int rank, const std::string& reason);
  // The rank left the job cleanly (destroyed its model): calls that need no
  // other rank go on; collectives fail with ZD_ERR_PEER_LOST naming it.
  void rank_left(int rank, const std::string& reason);
  // The host stops (the daemon's SIGTERM): the job fails on every rank
  // with `reason` (ZD_ERR_PEER_LOST), blaming no rank, as rank_lost would
  // one. Logged as info: a stop is asked for, not a failure. Thread-safe.
  void stop_job(const std::string& reason);
  // The rank's trainer created the model or attached to it: the job's
  // "where each rank was" tells a rank that never did as one that has not
  // created this model.
  void rank_joined(int rank);
  // "" while the job is healthy.
  std::string broken_reason() const;
  // The first failure's code; ZD_OK while the job is healthy.
  zd_status broken_code() const;
  // The first update that stopped part-way on a rank (a tier, or a
  // compressed update's own exchange, failed inside it: some of the rank's
  // state was updated, the rest not), as that rank's error said it; none
  // when no update did. Likewise any other write of the state that stopped
  // part-way: a checkpoint load, a resume from a snapshot at finalize,
  // zd_param_write, zd_optimizer_state_write; and ranks lost between the
  // ranks' writes of one value (writes_apart). A lost rank or a collective
  // failed outside an update leaves every rank's state whole (an update
  // applies on a rank or not at all); this does not, and no restart may
  // resume it (recover refuses). Thread-safe.
  std::optional<Error> half_applied_step() const;

  // --- restart (a job that keeps its state when ranks die) ------------------
  // Clears everything a failed step left (modules begun, gradients not yet
  // applied, gathers, the failure itself) and takes a fresh comm instance;
  // the masters, optimizer state and step counters stay. Only while no rank
  // is inside the model. Then every rank calls rebuild_working_copies.
  // Refused, changing nothing, when an update stopped part-way
  // (half_applied_step(), which an overlapped update that failed unseen
  // also sets here): that state is half applied, and the job resumes from
  // a checkpoint or a snapshot instead.
  void recover(std::unique_ptr<CommInstance> comm);
  // A collective: rebuilds the rank's working copies from its masters (the
  // source of truth) and hands them to the ranks that need them.
  void rebuild_working_copies(int rank);

  // --- planning -----------------------------------------------------------
  // What finalize would place on each tier, per rank and kind, without
  // allocating anything: the same placement code, so the plan is the real
  // figure. Registration must be complete; the model is laid out by it.
  // Against the rank's own budgets; a placement the rank's device cannot
  // run is refused (ZD_ERR_CONFIG) as finalize refuses it. Every rank's
  // table, not one: ranks differ (worst_cells, memory/placement.h).
  TierPlan plan(int rank);
  // The budget table text (as finalize refuses with), and whether it fits.
  std::string plan_table(const TierPlan& p, bool* fits) const { return placement_.table(p, fits); }

  // --- introspection ------------------------------------------------------
  int world_size() const { return world_size_; }
  int first_local_rank() const { return first_local_; }
  int local_ranks() const { return static_cast<int>(ranks_.size()); }
  bool is_local(int rank) const { return rank >= first_local_ && rank < first_local_ + local_ranks(); }
  const JobConfig& config() const { return config_; }
  const OptimizerInstance& optimizer() const { return *plugins_.optimizer; }
  const PartitionerInstance& partitioner() const { return *plugins_.partitioner; }
  // The comm plugin's instance, for the ranks' own threads: recover()
  // replaces it while no rank is inside the model. Other threads read
  // through comm_figures(), which holds comm_mu_ against the replacement.
  const CommInstance& comm() const { return *plugins_.comm; }
  // The rank's traffic (zd_model_comm_figures, the metrics): the comm
  // plugin's figures and the collectives the engine ran without it (stage
  // 3's one-sided gathers, the peer collectives between a daemon's GPUs),
  // counted alike. comm().figures() alone misses the latter.
  zd_comm_figures comm_figures(int rank) const;
  uint32_t partitions() const { return ctx_.partitions; }
  const MemoryLedger& ledger(int rank) const;
  const Device& device(int rank) const;
  const ActivityTable& activity() const { return activity_; }
  StepFigures last_step(int rank) const;
  unsigned threads() const { return pool_.size(); }
  // The CPUs the rank's optimizer threads were placed on (empty: the shared
  // pool, unpinned), and a tier's own description ("" when not in use).
  std::vector<int> optimizer_cpus(int rank) const;
  std::string tier_description(int rank, zd_tier tier) const;
  // For tests: a rank's shard of a parameter as fp32, padding included, and
  // whether its working copy is gathered now (always true below stage 3).
  // The Gradient shard after a step is what the update read, where it left
  // host accumulators as read (GradReducer::update_zeroes), not zeros.
  std::vector<float> shard_values(int rank, zd_param_id param, ShardBuffer which) const;
  bool resident(int rank, zd_param_id param) const;
  // Stage 3: elements gathered on the rank now, persistent ones excluded.
  uint64_t live_elements(int rank) const;
  // Waits until the rank's work in flight (prefetches, gradient buckets, its
  // shard of a snapshot) is done; from the rank's own thread.
  void sync(int rank);

 private:
  // Ranks of this process on one GPU share its default device budget.
  void share_gpus();
  struct RankState;
  // Enters a call on a rank: records it in the activity table, refuses it if
  // the job is broken, and records its return.
  class Call;

  RankState& rank_state(int rank);
  const RankState& rank_state(int rank) const;
  void require_finalized(const char* call) const;
  void require_healthy() const;

  // finalize (model.cpp)
  void check_registrations();
  void check_registrations_across_nodes(RankState& rs);
  void share_initial_values(RankState& rs);
  void lay_out_once();
  void set_up_observing(int local_ranks);
  void set_up_tiers(RankState& rs);
  // What each of this process's ranks plans to hold per tier, by rank.
  std::map<int, TierBytes> local_needs() const;
  void check_device_support(const RankState& rs) const;
  // finalize's steps: the rank's state checked, admitted and allocated;
  // its shards published and the barrier every rank passes once placed
  // (at stage 3, the persistent parameters gathered); the resume from the
  // newest snapshot, *resuming set once it overwrites the state.
  void place_rank(RankState& rs);
  void share_placement(RankState& rs);
  void resume_from_snapshot(RankState& rs, bool* resuming);
  // A finalize that failed gives back all it took (its state, NVMe
  // extents, the node's memory) and the initial values it dropped; one
  // whose resume failed in a job of several breaks the job first, and keeps
  // its state where the shard board points the other ranks at it. Called
  // inside the catch block.
  void undo_finalize(RankState& rs, bool resuming);
  // Breaks the job with the failure being handled, naming the rank's
  // finalize; the first failure aborts the collectives and the boards.
  void break_for_failed_resume(int rank);
  void allocate_rank(RankState& rs);
  void release_rank(RankState& rs);
  // The registered initial values, once every local rank has written them
  // into its masters and working copies: dropped before any rank allocates
  // its gradients and optimizer state (StateBuffers::allocate_values).
  void drop_initial_values(RankState& rs);
  // A finalize that fails after the rank took them: a job of one rank puts
  // them back from its masters, exactly, so that a retry starts from them;
  // a job of several cannot (no rank holds them whole), nor can one whose
  // resume from a snapshot had begun to overwrite the masters, and its
  // retry is refused rather than started from zeros or a snapshot's part.
  void put_back_initial_values(RankState& rs, bool masters_overwritten) noexcept;
  void restage_initial_values(RankState& rs);

  [[noreturn]] void broken_by(const Error& e) override;
  // The rank's update of step `step` stopped part-way with e: the job breaks
  // with it, and half_applied_step() says so from then on.
  [[noreturn]] void stopped_part_way(int rank, int64_t step, const Error& e) override;
  static Error part_way_error(int rank, int64_t step, const Error& e);
  // Breaks the job with e (the first failure is kept) and, when e is the
  // first, aborts the collectives the other ranks wait in; part_way: e is an
  // update that stopped part-way.
  [[noreturn]] void break_job(const Error& e, bool part_way);
  // A write of the rank's state (`what`: "zd_param_write of 'w'") failed
  // with the exception being handled, after it may have changed part of
  // it: the job breaks, half applied, as for an update that stopped
  // part-way. Called inside the catch block, inside the write phase.
  [[noreturn]] void write_stopped_part_way(int rank, const std::string& what);
  // The rank's rebuild of its working copies (a restart's) failed with the
  // exception being handled: the job breaks, but not half applied, as the
  // masters were only read. Called inside the catch block.
  [[noreturn]] void rebuild_failed(int rank);
  // The local ranks made different numbers of whole-value writes
  // (RankState::whole_writes): which, as an error; none when they agree.
  std::optional<Error> writes_apart() const;
  // The comm plugin's collectives fail at once on every rank, with this
  // code and message. Not under reg_mu_ (it takes comm_mu_).
  void abort_collectives(zd_status code, const std::string& message);
  // The rank's overlapped update: wait for module m (-1: all of it;
  // kPersistentFirst: the parameters it updates first); its failure breaks
  // the job.
  static constexpr zd_module_id kPersistentFirst = -2;
  void wait_update(RankState& rs, zd_module_id m);
  // A boundary whose gradients hold inf or NaN: no update, the window's
  // gradients dropped, the loss scale told (and its overflow logged).
  OverflowOutcome skip_step(RankState& rs, StepFigures& f);
  // Whether the step about to update the rank can leave its host pieces to
  // the overlapped update (offload.overlap, and nothing right after the
  // update reads them all).
  bool can_overlap(const RankState& rs, const zd_optimizer_plan& plan) const;
  // True when this failure is the job's first, which is logged at `level`.
  bool mark_broken_locked(zd_status code, const std::string& message, zd_log_level level = ZD_LOG_ERROR);
  double learning_rate(int64_t step);
  // What zd_model_set_lr's comparison found over all ranks (one collective
  // every rank joins, whatever it passed).
  struct LrAgreement {
    double lowest = 0, highest = 0;
    bool some_unusable = false, some_in_module = false;
  };
  LrAgreement agree_on_lr(RankState& rs, double lr, bool unusable, bool in_module);
  // The plan of the rank's next update (applied + 1), from the optimizer
  // and the job's compression schedules; the window's gradients follow it.
  const zd_optimizer_plan& next_plan(RankState& rs);
  zd_optimizer_plan plan_for(int64_t step);
  // Refuses a restore to `step` that the optimizer's per-tensor scalars,
  // which this model does not hold, would not let go on (set_applied_steps).
  void require_scalars_for_restore(const RankState& rs, int64_t step);
  // Stages 1-2: each rank updated the working copies of its range; every
  // rank needs them all.
  void gather_working_copies(RankState& rs);
  // The rank's state from a checkpoint (a collective: the working copies
  // are handed around), as load_checkpoint and a resume at finalize do.
  void restore_rank(RankState& rs, const ckpt::Source& src, bool verified = false);
  // Training starts over from state a call set (a load, zd_model_set_step):
  // the gradients of backwards no step applied go, and the plan of the next
  // update is asked again. `call` names it in the log when gradients went.
  void discard_gradients(RankState& rs, const char* call);

  JobConfig config_;
  // Declared before the plugins and the ranks, so they go after both: the
  // ranks' threads and the comm plugin record into them to the end.
  std::unique_ptr<observe::Tracer> tracer_;
  std::unique_ptr<observe::CollectiveBoard> board_;
  ModelPlugins plugins_;
  JobPolicy* policy_;
  int world_size_;
  int first_local_ = 0;
  Registry registry_;
  ModelContext ctx_;
  Placement placement_;
  ActivityTable activity_;
  ThreadPool pool_;
  std::mutex pool_mu_;  // the shared optimizer threads serve one rank's loop at a time
  // Declared before the ranks: their streams' gathers wait on it to the end.
  std::unique_ptr<ShardBoard> shard_board_;
  std::unique_ptr<PeerBoard> peer_board_;  // likewise
  std::vector<std::unique_ptr<RankState>> ranks_;
  std::unique_ptr<Snapshots> snapshots_;
  std::shared_ptr<MemoryAdmission> admission_;  // may be null
  double base_lr_ = 0.0;

  std::mutex reg_mu_;  // registration, layout, the broken reason
  // plugins_.comm's replacement (recover) against the threads that are not
  // the ranks': status and metrics (comm_figures), and rank_lost /
  // rank_left from the launcher, a leaving rank or the daemon's stop.
  mutable std::mutex comm_mu_;
  std::atomic<bool> finalized_{false};
  bool laid_out_ = false;
  uint64_t registered_numel_ = 0;  // registry_summary()'s elements, summed as parameters are added
  // drop_initial_values, under reg_mu_: which local ranks have written the
  // initial values, and the parameters whose values were dropped (with the
  // dtype they were staged in), for put_back_initial_values.
  std::vector<char> took_initial_values_;
  std::vector<std::pair<size_t, zd_dtype>> dropped_initial_values_;
  // Not empty once they cannot be put back: why a retried finalize is refused.
  std::string initial_values_lost_;
  // plan() has checked the placement against the device (check_device
  // reads every parameter and is the same for every rank: once, not per
  // rank, or planning 4096 ranks reads them 4096 times).
  std::once_flag plan_device_checked_;
  // The script's schedule hooks (lr, warmup, sync) and their caches: not
  // under reg_mu_, which status and metrics take, while a hook runs (a
  // hook may take up to its instruction budget, about 0.4 s).
  std::mutex schedule_mu_;
  std::vector<std::pair<int64_t, double>> lr_cache_;  // (step, lr), a few recent ones
  std::vector<std::pair<int64_t, zd_optimizer_plan>> plan_cache_;  // (step, plan), a few recent ones
  std::string broken_;
  zd_status broken_code_ = ZD_OK;
  std::atomic<bool> is_broken_{false};
  std::optional<Error> half_applied_;  // under reg_mu_: half_applied_step()
};

}  // namespace zerod
