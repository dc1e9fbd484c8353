// What every part of a model reads and none of them owns: the job's
// configuration, the registry and its layout, the plugins, the world and
// how the state is partitioned across it, and the way a part issues a
// collective on its rank's stream (a failed collective breaks the job).
#pragma once

#include "comm/comm_stream.h"
#include "error.h"
#include "model/job_config.h"
#include "runtime/plugin_host.h"
#include "model/registry.h"

#include <zerod/zerod.h>
#include <zerod/zerod_plugin.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace zerod {

// The plugins a model runs with, configured for its world size.
struct ModelPlugins {
  std::unique_ptr<OptimizerInstance> optimizer;
  std::unique_ptr<PartitionerInstance> partitioner;
  std::unique_ptr<CommInstance> comm;
  // Tier plugins, instantiated per rank when the placement uses them.
  std::shared_ptr<const Plugin> host_tier;
  std::shared_ptr<const Plugin> nvme_tier;
};

// Where a failed collective goes: the model marks itself broken and throws
// the job's failure (every later call on every rank gets it).
class FailureSink {
 public:
  virtual ~FailureSink() = default;
  [[noreturn]] virtual void broken_by(const Error& e) = 0;
  // Likewise for rank `rank`'s update of step `step`, which stopped
  // part-way with e: the step is half applied from then on.
  [[noreturn]] virtual void stopped_part_way(int rank, int64_t step, const Error& e) = 0;
};

// Tags of collectives: what the engine is doing, equal on every rank.
enum class CommOp : uint64_t {
  Finalize = 1,
  Gather = 2,
  Reduce = 3,
  StepReduce = 4,
  Stats = 5,
  GatherWorking = 6,
  Persistent = 7,
  Read = 8,
  SetLr = 9,
};

// What each CommOp is for, by its number: the timeline's names.
inline std::vector<std::string> comm_purposes() {
  return {"", "finalize", "gather", "bucket reduce", "step reduce", "gradient norm", "working copies",
          "persistent parameters", "read", "lr agreement"};
}

inline uint64_t comm_tag(CommOp op, uint64_t group, uint64_t id) {
  return (static_cast<uint64_t>(op) << 56) | ((group & 0xff) << 48) | (id & 0xffffffffffffull);
}

inline zd_comm_dtype comm_dtype(zd_dtype dt) { return static_cast<zd_comm_dtype>(dt); }

class ShardBoard;
class PeerBoard;

class ModelContext {
 public:
  ModelContext(const JobConfig& job, Registry& reg, ModelPlugins& loaded, int world, FailureSink& failures)
      : config(job), registry(reg), plugins(loaded), world_size(world), failures_(failures) {}
  ModelContext(const ModelContext&) = delete;
  ModelContext& operator=(const ModelContext&) = delete;

  const JobConfig& config;
  Registry& registry;
  ModelPlugins& plugins;
  const int world_size;
  uint32_t partitions = 0;  // ZD_PARTITION_* bits of the partitioner, set once at construction
  // Stage 3 with every rank in this process on the local comm plugin: the
  // board of one-sided gathers (shard_board.h); null otherwise. Set once at
  // construction.
  ShardBoard* shards = nullptr;
  // Every rank of the job in this process on devices the host cannot
  // address (a daemon's GPUs): collectives between their device pools meet
  // here (peer_board.h, device_comm.cpp); null otherwise. Set once at
  // construction.
  PeerBoard* peers = nullptr;

  bool partitioned(uint32_t what) const { return (partitions & what) != 0; }
  bool params_partitioned() const { return partitioned(ZD_PARTITION_PARAMS); }
  OptimizerInstance& optimizer() const { return *plugins.optimizer; }
  CommInstance& comm() const { return *plugins.comm; }

  // What the optimizer's state slots are kept in (optimizer.state_dtype):
  // fp32, or bf16 at 2 bytes per element. The master is always fp32.
  zd_dtype state_dtype() const { return config.optimizer_state_dtype; }
  size_t state_size() const { return config.optimizer_state_dtype == ZD_DTYPE_BF16 ? 2 : 4; }
  // The dtype of a group's gradient accumulators.
  zd_dtype grad_dtype(const ParamGroup& g) const {
    return config.grad_accum_dtype ? config.grad_accum_dtype : g.dtype;
  }
  // The range of a group's full layout a rank owns (its master, optimizer
  // state and, from stage 2, gradients): where it begins and how long it is.
  // At stage 3 the owned range is the rank's flat shard buffer.
  uint64_t owned_begin(const ParamGroup& g, int rank) const {
    return registry.partitioning() == Partitioning::Group ? static_cast<uint64_t>(rank) * g.stride : 0;
  }
  uint64_t owned_count(const ParamGroup& g) const {
    switch (registry.partitioning()) {
      case Partitioning::Replicated: return g.full_numel;
      case Partitioning::Group: return g.stride;
      default: return g.flat_numel;
    }
  }
  // The part [lo, hi) of a parameter (in full-layout elements) that falls in
  // the range `rank` owns; lo >= hi when none does. Stages 0-2 only.
  void owned_part(const ParamRecord& p, int rank, uint64_t* lo, uint64_t* hi) const;
  // The real elements of a parameter that `rank` owns, at every stage: they
  // begin at element `at` of the rank's owned range (its flat shard buffer
  // at stage 3) and at element `from` of the parameter; count 0 when none.
  struct OwnedSpan {
    uint64_t at = 0, from = 0, count = 0;
  };
  OwnedSpan owned_span(const ParamRecord& p, int rank) const;
  std::string module_label(zd_module_id m) const { return "module '" + registry.module(m).name + "'"; }

  // --- collectives on a rank's stream ---
  // The call record for a collective; `what` must outlive the call.
  zd_comm_call comm_call(int rank, uint64_t tag, const std::string& what) const;
  CommStream::Ticket issue(CommStream& s, std::function<void()> fn) const { return s.enqueue(std::move(fn)); }
  // Waits for a task; a failure breaks the job and throws its message.
  void wait(const CommStream::Ticket& t) const;
  void run(CommStream& s, std::function<void()> fn) const { wait(issue(s, std::move(fn))); }
  void drain(CommStream& s) const;
  [[noreturn]] void broken_by(const Error& e) const {
    failures_.broken_by(e);
    __builtin_unreachable();  // the virtual is [[noreturn]]; GCC does not carry that through the call
  }
  [[noreturn]] void stopped_part_way(int rank, int64_t step, const Error& e) const {
    failures_.stopped_part_way(rank, step, e);
    __builtin_unreachable();
  }

 private:
  FailureSink& failures_;
};

}  // namespace zerod
