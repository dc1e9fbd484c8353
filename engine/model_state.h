// The per-rank state of a Model. Private to engine/model*.cpp.
#pragma once

#include "model.h"
#include "align.h"
#include "tiered_buffer.h"

#include <chrono>

namespace zerod {

// Buffers of one parameter group on one rank. Which ones exist and how long
// they are depends on the stage (see Registry):
//   working: stages 0-2 the full layout (device); stage 3 the rank's flat shards
//   grad:    stages 0-1 the full layout; stage 2 the owned range; stage 3 flat (device)
//   master, state: stage 0 the full layout; stages 1-2 the owned range; stage 3 flat
// Masters, optimizer state and stage-3 shards may live in any tier, in
// segments, as the placement policy decides.
struct Model::GroupBuffers {
  TieredBuffer working;
  Block grad;
  TieredBuffer master;
  std::array<TieredBuffer, ZD_OPTIMIZER_MAX_STATE> state{};
};

// 1-bit compression of a group's momentum (optimizer ABI v2), per rank: the
// error feedback the comm plugin keeps between calls and, at stage 1, the
// last average as signs and per-chunk scales (model_compress.cpp).
struct Model::Compression {
  Block worker_error;  // full_numel floats
  Block server_error;  // one chunk of floats
  Block signs;         // stage 1: (full_numel + 7) / 8 bytes
  Block scales;        // stage 1: world_size floats
  bool have_average = false;
};

struct Model::ParamState {
  Block grad_view;           // a transient gradient buffer, or empty (the view is the accumulator)
  bool view_active = false;  // between backward_begin and backward_end
  bool touched = false;      // a contribution landed in this accumulation window
  Block gathered;            // stage 3: the whole working copy while resident
};

struct Model::ModuleState {
  bool forward = false;
  bool backward = false;
  bool resident = false;      // stage 3: its parameters are gathered (or being gathered)
  CommStream::Ticket gather;  // stage 3: the gather in flight
};

// A gradient contribution waiting in a reduction bucket (stages 2-3).
struct Model::PendingGrad {
  zd_param_id param;
  Block view;
};

// The order modules were begun in the first micro-batch; later micro-batches
// that follow it get the next modules gathered ahead (stage 3).
struct Model::Trace {
  std::vector<std::pair<bool, zd_module_id>> order;  // (backward?, module)
  bool complete = false;  // recorded
  bool valid = true;      // this micro-batch still follows it
  size_t pos = 0;
};

struct Model::RankState {
  MemoryLedger ledger;
  std::unique_ptr<DevicePool> pool;
  std::unique_ptr<TierInstance> host;  // when the placement uses host memory
  std::unique_ptr<TierInstance> nvme;  // when it uses NVMe
  // The rank's optimizer threads, on the CPUs nearest its host memory (when
  // the host tier names them); else the model's shared pool serves it.
  std::unique_ptr<ThreadPool> pool_near;
  TierSet tiers() { return TierSet{pool.get(), host.get(), nvme.get(), &ledger}; }
  std::unique_ptr<CommStream> stream;
  std::vector<GroupBuffers> groups;
  // The NVMe pipeline's staging buffers: buffer_count sets, one buffer per
  // operand (staging_layout), reserved at finalize and kept, so a step never
  // allocates and the host budget is checked once.
  std::vector<std::vector<AlignedBuffer>> staging;
  uint64_t staging_charged = 0;
  std::vector<Compression> compression;  // per group, when the optimizer compresses
  std::vector<ModuleState> modules;
  std::vector<ParamState> params;
  int active_modules = 0;
  int registered = 0;  // parameters this rank registered
  bool finalized = false;

  std::vector<std::vector<PendingGrad>> buckets;  // per group
  std::vector<uint64_t> bucket_elems;             // per group
  uint64_t bucket_seq = 0;                        // tags the bucket collectives

  Trace trace;
  uint64_t live_elems = 0;  // stage 3: gathered, non-persistent elements held

  LossScaler scaler{LossScaleConfig{}};
  int64_t micro_step = 0;
  int64_t applied = 0;
  StepFigures last;
};

// Tags of collectives: what the engine is doing, equal on every rank.
// Elements per in-memory optimizer task: small enough that the arrays of a
// tile stay in L2 while the gradient is zeroed right after its update.
constexpr uint64_t kTile = uint64_t{1} << 15;

enum class CommOp : uint64_t {
  Finalize = 1,
  Gather = 2,
  Reduce = 3,
  StepReduce = 4,
  Stats = 5,
  GatherWorking = 6,
  Persistent = 7,
  Read = 8,
};

inline uint64_t comm_tag(CommOp op, uint64_t group, uint64_t id) {
  return (static_cast<uint64_t>(op) << 56) | ((group & 0xff) << 48) | (id & 0xffffffffffffull);
}

inline zd_comm_dtype comm_dtype(zd_dtype dt) { return static_cast<zd_comm_dtype>(dt); }

// Enters a call on a rank: records it in the activity table, refuses it if
// the job is broken, and records its return.
class Model::Call {
 public:
  Call(Model& m, int rank, const char* name, zd_module_id module = -1);
  ~Call();
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

 private:
  Model& m_;
  int rank_;
};

}  // namespace zerod
