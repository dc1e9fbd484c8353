// The engine's model: a job's parameters, their state in memory tiers, the
// call-order rules of a training step, and the step itself.
//
// Calls name the rank they come from, so one Model can serve every rank a
// daemon hosts; embedded mode is one rank. Every public call either completes
// or throws zerod::Error leaving the model as it was (nothing half-done), so
// a trainer that gets an error can carry on.
#pragma once

#include "arena.h"
#include "job_config.h"
#include "ledger.h"
#include "loss_scaler.h"
#include "plugin_host.h"
#include "registry.h"
#include "thread_pool.h"

#include <zerod/zerod.h>

#include <array>
#include <memory>
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

class Model {
 public:
  // policy may be null (constant lr); it is not owned and must outlive the model.
  Model(JobConfig config, std::unique_ptr<OptimizerInstance> optimizer, JobPolicy* policy,
        int world_size = 1);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // --- registration -------------------------------------------------------
  zd_param_id register_param(const std::string& name, const std::string& module, zd_dtype dtype,
                             std::vector<int64_t> shape, const void* init, zd_dtype init_dtype);
  void finalize();
  bool finalized() const { return finalized_; }
  const Registry& registry() const { return registry_; }

  // --- one step, per rank -------------------------------------------------
  void forward_begin(int rank, zd_module_id module);
  void forward_end(int rank, zd_module_id module);
  void backward_begin(int rank, zd_module_id module);
  void backward_end(int rank, zd_module_id module);
  ViewInfo param_view(int rank, zd_param_id param) const;
  ViewInfo grad_view(int rank, zd_param_id param) const;
  StepFigures step(int rank);
  double loss_scale() const { return scaler_.scale(); }

  // --- whole parameters ---------------------------------------------------
  void read_param(zd_param_id param, zd_dtype dtype, void* dst, uint64_t bytes) const;
  void write_param(zd_param_id param, zd_dtype dtype, const void* src, uint64_t bytes);

  // --- introspection ------------------------------------------------------
  int world_size() const { return world_size_; }
  const JobConfig& config() const { return config_; }
  const OptimizerInstance& optimizer() const { return *optimizer_; }
  const MemoryLedger& ledger(int rank) const;
  const DevicePool& device_pool(int rank) const;
  unsigned threads() const { return pool_.size(); }

 private:
  struct GroupBuffers {
    Block master;    // f32, the rank's shards (flat layout)
    Block grad;      // accumulated gradients (grad dtype)
    Block working;   // working copies (group dtype, full layout)
    std::array<Block, ZD_OPTIMIZER_MAX_STATE> state{};
  };
  struct ModuleActivity {
    bool forward = false;
    bool backward = false;
  };
  struct GradView {
    Block block;          // a transient buffer, or empty when the view is the accumulator
    bool active = false;
  };
  struct RankState {
    MemoryLedger ledger;
    std::unique_ptr<DevicePool> pool;
    std::vector<GroupBuffers> groups;
    std::vector<ModuleActivity> modules;
    std::vector<GradView> grad_views;    // per parameter
    std::vector<uint8_t> grad_touched;   // per parameter: a contribution landed this window
    int active_modules = 0;
  };

  RankState& rank_state(int rank);
  const RankState& rank_state(int rank) const;
  void require_finalized(const char* call) const;
  zd_dtype grad_dtype(const ParamGroup& g) const;
  std::string module_label(zd_module_id m) const;
  std::byte* grad_accumulator(RankState& rs, const ParamRecord& p) const;
  void check_budget_table(const std::vector<std::array<uint64_t, ZD_MEM_KIND_COUNT>>& need) const;
  void allocate_rank(RankState& rs, int rank);
  void release_rank(RankState& rs);

  // Global statistics of the accumulated gradients: sum of squares and
  // whether every value is finite.
  void gradient_stats(RankState& rs, double* sumsq, bool* finite);
  void apply_optimizer(RankState& rs, double grad_scale, double lr, int64_t t);
  void zero_gradients(RankState& rs);
  double learning_rate(int64_t step) const;

  JobConfig config_;
  std::unique_ptr<OptimizerInstance> optimizer_;
  JobPolicy* policy_;
  int world_size_;
  Registry registry_;
  bool finalized_ = false;
  std::vector<std::unique_ptr<RankState>> ranks_;
  LossScaler scaler_;
  ThreadPool pool_;
  int64_t micro_step_ = 0;
  int64_t applied_steps_ = 0;
  double base_lr_ = 0.0;
};

}  // namespace zerod
