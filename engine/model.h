// The engine's model: a job's parameters, their state on every rank, the
// call-order rules of a training step, ZeRO partitioning, and the step.
//
// Every call names the rank it comes from; one Model serves all the ranks a
// daemon hosts (each rank's calls arrive on a thread of its own), and
// embedded mode is a job of one rank. Collectives go through the comm
// plugin; what is split across ranks and how comes from the partitioner
// plugin (the ZeRO stage).
//
// A call either completes or throws zerod::Error. A call made out of order
// changes nothing and the model stays usable. A failed collective (a rank
// timed out, ranks disagree, a rank was lost) breaks the job: every later
// call on every rank fails with the same message, which says which rank was
// where.
#pragma once

#include "activity.h"
#include "arena.h"
#include "comm_stream.h"
#include "error.h"
#include "job_config.h"
#include "ledger.h"
#include "loss_scaler.h"
#include "plugin_host.h"
#include "registry.h"
#include "thread_pool.h"
#include "tiered_buffer.h"

#include <zerod/zerod.h>

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace zerod {

struct ViewInfo {
  void* data = nullptr;
  uint64_t bytes = 0;
  int32_t arena = -1;
  uint64_t offset = 0;
  zd_dtype dtype = ZD_DTYPE_F32;
  const std::vector<int64_t>* shape = nullptr;
  bool read_only = false;
};

struct StepFigures {
  bool boundary = false;
  bool applied = false;
  bool skipped = false;
  int64_t step = 0;
  int64_t micro_step = 0;
  double lr = 0.0;
  double loss_scale = 1.0;
  double grad_norm = 0.0;
};

// The plugins a model runs with, configured for its world size.
struct ModelPlugins {
  std::unique_ptr<OptimizerInstance> optimizer;
  std::unique_ptr<PartitionerInstance> partitioner;
  std::unique_ptr<CommInstance> comm;
  // Tier plugins, instantiated per rank when the placement uses them.
  std::shared_ptr<const Plugin> host_tier;
  std::shared_ptr<const Plugin> nvme_tier;
};

// Checks a whole-parameter buffer: a valid dtype, exactly numel elements of
// it, not NULL. `call` names the C function in the message.
void check_whole_param(const char* call, const ParamRecord& p, zd_dtype dtype, const void* ptr,
                       uint64_t bytes);

// What a test may look at inside a rank's shard (padding included).
enum class ShardBuffer { Master, Gradient, WorkingShard };

class Model {
 public:
  // policy may be null (constant lr); it is not owned and must outlive the
  // model. Its lr() is called under a lock, once per step.
  // This process (daemon) serves ranks [first_local_rank, first_local_rank
  // + local_ranks) of world_size (-1: all of them); with several nodes each
  // daemon holds its own ranks' state and the comm plugin joins them.
  Model(JobConfig config, ModelPlugins plugins, JobPolicy* policy, int world_size, int first_local_rank = 0,
        int local_ranks = -1);
  ~Model();
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
  const Registry& registry() const { return registry_; }

  // --- one step, per rank ---------------------------------------------------
  void forward_begin(int rank, zd_module_id module);
  void forward_end(int rank, zd_module_id module);
  void backward_begin(int rank, zd_module_id module);
  void backward_end(int rank, zd_module_id module);
  ViewInfo param_view(int rank, zd_param_id param);
  ViewInfo grad_view(int rank, zd_param_id param);
  StepFigures step(int rank);
  double loss_scale(int rank) const;

  // --- whole parameters -----------------------------------------------------
  // With the optimizer state partitioned (stage >= 1) on several ranks,
  // read_param is a collective: every rank reads the same parameter.
  void read_param(int rank, zd_param_id param, zd_dtype dtype, void* dst, uint64_t bytes);
  // Every rank writes the same value; each updates its own copies.
  void write_param(int rank, zd_param_id param, zd_dtype dtype, const void* src, uint64_t bytes);

  // --- optimizer state, for checkpoints (model_state_io.cpp) -----------------
  // One state slot of a parameter, whole, like read_param (a collective with
  // the state partitioned on several ranks) and write_param.
  void read_state(int rank, zd_param_id param, int slot, zd_dtype dtype, void* dst, uint64_t bytes);
  void write_state(int rank, zd_param_id param, int slot, zd_dtype dtype, const void* src, uint64_t bytes);
  // Optimizer updates applied so far on the rank.
  int64_t applied_steps(int rank) const;
  // Restores the count of applied updates (a checkpoint's); every rank the
  // same value, between steps. Error feedback of a compressing optimizer
  // restarts at zero.
  void set_applied_steps(int rank, int64_t step);

  // --- failures ---------------------------------------------------------------
  // The rank's trainer went away: its collectives fail everywhere, and every
  // later call on every rank gets ZD_ERR_PEER_LOST. Thread-safe.
  void rank_lost(int rank, const std::string& reason);
  // The rank left the job cleanly (destroyed its model): calls that need no
  // other rank go on; collectives fail with ZD_ERR_PEER_LOST naming it.
  void rank_left(int rank, const std::string& reason);
  // "" while the job is healthy.
  std::string broken_reason() const;

  // --- restart (a job that keeps its state when ranks die) ------------------
  // Clears everything a failed step left (modules begun, gradients not yet
  // applied, gathers, the failure itself) and takes a fresh comm instance;
  // the masters, optimizer state and step counters stay. Only while no rank
  // is inside the model. Then every rank calls rebuild_working_copies.
  void recover(std::unique_ptr<CommInstance> comm);
  // A collective: rebuilds the rank's working copies from its masters (the
  // source of truth) and hands them to the ranks that need them.
  void rebuild_working_copies(int rank);

  // --- planning -----------------------------------------------------------
  using NeedTable = std::vector<std::array<uint64_t, ZD_MEM_KIND_COUNT>>;  // [tier][kind] bytes
  // What finalize would place on each tier, per rank and kind, without
  // allocating anything: the same placement code, so the plan is the real
  // figure. Registration must be complete; the model is laid out by it.
  struct TierPlan {
    NeedTable need;                      // [tier][kind] bytes for this rank
    std::array<uint64_t, ZD_TIER_COUNT> budget{};
  };
  TierPlan plan(int rank);
  // The budget table text (as finalize refuses with), and whether it fits.
  std::string plan_table(const TierPlan& p, bool* fits) const;

  // --- introspection ------------------------------------------------------
  int world_size() const { return world_size_; }
  int first_local_rank() const { return first_local_; }
  int local_ranks() const { return static_cast<int>(ranks_.size()); }
  bool is_local(int rank) const { return rank >= first_local_ && rank < first_local_ + local_ranks(); }
  const JobConfig& config() const { return config_; }
  const OptimizerInstance& optimizer() const { return *plugins_.optimizer; }
  const PartitionerInstance& partitioner() const { return *plugins_.partitioner; }
  const CommInstance& comm() const { return *plugins_.comm; }
  uint32_t partitions() const { return partitions_; }
  const MemoryLedger& ledger(int rank) const;
  const DevicePool& device_pool(int rank) const;
  const ActivityTable& activity() const { return activity_; }
  StepFigures last_step(int rank) const;
  unsigned threads() const { return pool_.size(); }
  // The CPUs the rank's optimizer threads were placed on (empty: the shared
  // pool, unpinned), and a tier's own description ("" when not in use).
  std::vector<int> optimizer_cpus(int rank) const;
  std::string tier_description(int rank, zd_tier tier) const;
  // For tests: a rank's shard of a parameter as fp32, padding included, and
  // whether its working copy is gathered now (always true below stage 3).
  std::vector<float> shard_values(int rank, zd_param_id param, ShardBuffer which) const;
  bool resident(int rank, zd_param_id param) const;
  // Waits until the rank's collectives in flight (prefetches, gradient
  // buckets) are done; from the rank's own thread.
  void sync(int rank);

 private:
  struct GroupBuffers;
  struct Compression;
  struct ParamState;
  struct ModuleState;
  struct PendingGrad;
  struct Trace;
  struct RankState;
  class Call;

  RankState& rank_state(int rank);
  const RankState& rank_state(int rank) const;
  void require_finalized(const char* call) const;
  void require_healthy() const;
  std::string module_label(zd_module_id m) const;
  zd_dtype grad_dtype(const ParamGroup& g) const;
  bool partitioned(uint32_t what) const { return (partitions_ & what) != 0; }
  uint64_t owned_begin(const ParamGroup& g, int rank) const;
  uint64_t owned_count(const ParamGroup& g) const;

  // finalize and placement (model_placement.cpp)
  void check_registrations();
  void check_registrations_across_nodes(RankState& rs, int rank);
  void share_initial_values(RankState& rs, int rank);
  void lay_out_once();
  void decide_placement();
  // The tier runs of one of a rank's buffers, in element order.
  enum class Holds { Params, Master, Optimizer };
  std::vector<TierRun> tier_runs(size_t group, int rank, Holds what) const;
  uint64_t tier_granule() const;
  NeedTable need_table(int rank) const;
  // Bytes of one staging buffer per optimizer operand (master, each state
  // slot, the working shard; 0 = never on NVMe for this rank): the NVMe
  // pipeline holds offload.buffer_count sets of them from finalize on.
  std::vector<uint64_t> staging_layout(int rank) const;
  uint64_t nvme_alignment() const { return tier_granule() * 2; }
  void check_budget_table() const;
  void set_up_tiers(RankState& rs, int rank);
  void allocate_rank(RankState& rs, int rank);
  void release_rank(RankState& rs);

  // collectives: run fn on the rank's stream; a failure breaks the job
  zd_comm_call comm_call(int rank, uint64_t tag, const std::string& what) const;
  CommStream::Ticket issue(RankState& rs, std::function<void()> fn);
  void wait(const CommStream::Ticket& t);
  void drain(RankState& rs);
  [[noreturn]] void broken_by(const Error& e);
  void mark_broken_locked(zd_status code, const std::string& message);
  std::byte* owned_grad(RankState& rs, int rank, size_t gi, const std::vector<Block>& stage1_shards) const;

  // whole values of a parameter's fp32 buffers (master, a state slot)
  using BufferPick = TieredBuffer& (*)(GroupBuffers&, int slot);
  static TieredBuffer& pick_master(GroupBuffers& b, int slot);
  static TieredBuffer& pick_state(GroupBuffers& b, int slot);
  std::vector<float> whole_value(RankState& rs, int rank, zd_param_id param, BufferPick pick, int slot,
                                 const std::string& call);
  void set_own_part(RankState& rs, int rank, zd_param_id param, BufferPick pick, int slot, const float* whole);

  // compressed momentum averaging (model_compress.cpp)
  bool compressing(const RankState& rs) const;
  void check_compression_support() const;
  uint64_t compression_bytes(size_t group) const;
  void allocate_compression(RankState& rs, int rank);
  void release_compression(RankState& rs);
  void reset_compression(RankState& rs);
  void compressed_step(RankState& rs, int rank, double grad_scale, double lr, int64_t t);

  // stage 3 residency
  void make_resident(RankState& rs, int rank, zd_module_id m, bool backward);
  void gather_module(RankState& rs, int rank, zd_module_id m);
  void release_module(RankState& rs, zd_module_id m);
  void gather_persistent(RankState& rs, int rank);
  const std::byte* shard_for_send(RankState& rs, const ParamRecord& p, std::vector<std::byte>* staged);
  void release_all_gathered(RankState& rs);

  // gradients
  std::byte* grad_accumulator(RankState& rs, const ParamRecord& p) const;
  void flush_bucket(RankState& rs, int rank);
  void reduce_for_step(RankState& rs, int rank, std::vector<Block>* stage1_shards);

  // step
  double learning_rate(int64_t step);
  // The squared norm of the gradients the optimizer will use (local: each
  // rank's whole unreduced gradient, summed over ranks) and whether it is finite.
  void gradient_stats(RankState& rs, int rank, const std::vector<Block>& stage1_shards,
                      double* sumsq, bool* finite, bool local = false);
  // with_grad false: the gradients were folded into the momentum already
  // (a compressed step); the plugin gets no gradient.
  void apply_optimizer(RankState& rs, int rank, const std::vector<Block>& stage1_shards,
                       double grad_scale, double lr, int64_t t, bool with_grad = true);
  struct Piece;
  void update_staged(RankState& rs, int rank, const Piece& piece, std::byte* grad,
                     double grad_scale, double lr, int64_t t, bool with_grad);
  // Runs fn over n tasks on the rank's optimizer threads.
  void run_on_pool(RankState& rs, size_t n, const std::function<void(size_t)>& fn);
  void zero_gradients(RankState& rs);
  void gather_working_copies(RankState& rs, int rank);

  JobConfig config_;
  ModelPlugins plugins_;
  JobPolicy* policy_;
  int world_size_;
  int first_local_ = 0;
  uint32_t partitions_;
  Registry registry_;
  std::vector<std::unique_ptr<RankState>> ranks_;
  ActivityTable activity_;
  ThreadPool pool_;
  std::mutex pool_mu_;  // the optimizer threads serve one rank's step at a time
  double base_lr_ = 0.0;

  // Per parameter: the tier of its stage-3 shard, master and optimizer
  // state, and whether the policy chose the master/optimizer tiers itself
  // (the offload ratio applies only to the default ones).
  struct Placement {
    zd_tier params = ZD_TIER_DEVICE, master = ZD_TIER_DEVICE, optimizer = ZD_TIER_DEVICE;
    bool master_explicit = false, optimizer_explicit = false;
  };
  std::vector<Placement> placement_;

  std::mutex reg_mu_;  // registration, layout, the lr cache, the broken reason
  std::atomic<bool> finalized_{false};
  // The largest transfer alignment of the ranks' nvme tier instances (the
  // same paths on every rank, so the same figure): each rank raises it when
  // it creates its own, and reads it without touching another rank's state.
  std::atomic<uint64_t> nvme_tier_align_{4096};
  bool laid_out_ = false;
  std::vector<std::pair<int64_t, double>> lr_cache_;  // (step, lr), a few recent ones
  std::string broken_;
  zd_status broken_code_ = ZD_OK;
  std::atomic<bool> is_broken_{false};
};

}  // namespace zerod
