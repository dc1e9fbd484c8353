// What a job script resolves to: plain data the engine runs from. The
// scripting layer fills it (after checking the script against the schema);
// tests may fill it directly.
#pragma once

#include "error.h"
#include "memory/ledger.h"
#include "optimizer/loss_scaler.h"

#include <zerod/zerod.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace zerod {

// Where state lives beyond the device pool (offload).
struct OffloadConfig {
  zd_tier optimizer = ZD_TIER_DEVICE;  // fp32 master and optimizer state
  zd_tier params = ZD_TIER_DEVICE;     // stage-3 parameter shards
  double ratio = 1.0;                  // the share of the optimizer's elements on `optimizer`
  std::vector<std::string> nvme_paths; // absolute directories
  std::vector<double> host_values;     // the host tier plugin's hyperparameters
  std::vector<double> nvme_values;     // the nvme tier plugin's
  uint64_t nvme_tile_elems = uint64_t{1} << 20;  // elements streamed per NVMe transfer
  int buffer_count = 4;                // staging buffer sets for NVMe (read ahead, compute, write behind)
  // The host's update runs behind zd_step, overlapped with the next forward
  // (OverlappedUpdate); false: inside zd_step. The same bits either way.
  bool overlap = true;
  // Where stages 2-3 accumulate the gradients of the micro-batches before a
  // window's last when the optimizer is off the device: in host memory
  // (every micro-batch's gradients leave the device), on the device (only
  // the last micro-batch's sum leaves), or auto (Placement::decide_window).
  enum class Accumulate { Auto, Device, Host };
  Accumulate accumulate = Accumulate::Auto;
};

// A timeline of some steps (docs/observability.md): off while path is "".
struct TraceConfig {
  std::string path;                 // the Chrome trace JSON file to write
  int64_t from_step = 2;            // the steps recorded, inclusive (step 1 records the
  int64_t to_step = 6;              //   module order; prefetch starts at step 2)
  uint64_t events_per_thread = uint64_t{1} << 16;  // each recording thread's ring
};

// The daemon's live metrics (Prometheus text): off while listen is "".
struct MetricsConfig {
  std::string listen;  // "127.0.0.1:9400", "[::1]:9400", or a unix socket path ("/run/..", "unix:..")
};

// A tensor the placement policy decides a tier for.
struct TensorInfo {
  std::string name;    // the parameter's
  std::string kind;    // "params" (stage-3 shards), "master", "optimizer"
  std::string module;
  uint64_t numel = 0;  // of the whole parameter
  uint64_t bytes = 0;  // of this kind for the whole parameter
};

// Snapshots the daemon (or embedded engine) writes by itself, so that a
// crash of the daemon or the node loses at most `every` steps.
struct SnapshotConfig {
  std::string path;   // absolute directory; "" = no snapshots
  int64_t every = 0;  // steps between snapshots; 0 = only at a clean exit
  int keep = 2;       // the newest this many are kept
  bool resume = true; // a new job over the path resumes from the newest
  // Never from a script: set in a daemon that `zerod run` restarted after
  // its daemon died (`zerod serve --resume-snapshots`), the steps of the
  // snapshots under `path` that this run wrote. The job then resumes from
  // the newest of them every rank can read, whatever `resume` says, and
  // from no other (none: it starts over), so that `resume = false` still
  // keeps it off an earlier run's snapshots.
  std::optional<std::vector<int64_t>> restart_steps;
  // Never from a script: set by a daemon (ModelHost). While the model waits
  // for the path's lock another model holds (Snapshots), asked once before
  // the first wait and then every 50 ms: an error ends the wait, and the
  // model is refused with its code, its message after the path and the
  // holder. The daemon's answers: it is stopping (its stop would otherwise
  // wait comm.timeout for the model's build), or the holder is a model it
  // keeps for a restart (daemon.keep_state), which waiting does not end.
  // Null or none: the wait goes on, up to comm.timeout.
  std::function<std::optional<Error>()> lock_wait_ends;
};

struct JobConfig {
  std::string source;                   // script path or name, for messages
  // The device each rank computes on: "cpu" (a shared-memory pool standing
  // in for a GPU), "cuda", or "auto" (cuda where the process sees a GPU).
  std::string device = "cpu";
  zd_dtype precision = ZD_DTYPE_F32;    // the 16-bit type params may use, or f32
  // Gradient accumulation buffers: 0 = the parameter's working dtype (what
  // DeepSpeed does for fp16), or ZD_DTYPE_F32 for exact accumulation.
  zd_dtype grad_accum_dtype = 0;
  int64_t gradient_accumulation_steps = 1;
  double gradient_clipping = 0.0;       // max global L2 norm; 0 = off
  LossScaleConfig loss_scale;           // enabled when precision is fp16
  int zero_stage = 0;
  std::string partitioner = "stage0";   // plugin name (zero.partitioner, else "stage<N>")
  std::vector<double> partitioner_values;
  std::string comm = "local";           // comm plugin name (comm.backend)
  std::vector<double> comm_values;
  double comm_timeout_s = 300;          // a collective waiting longer fails, naming who is where; 0 = never
  bool keep_state_on_disconnect = false;  // daemon: keep a model whose ranks all left, for a restart
  uint32_t threads = 0;                 // CPU threads for the optimizer; 0 = all available
  uint64_t device_budget = MemoryLedger::kNoBudget;  // bytes per rank
  uint64_t host_budget = MemoryLedger::kNoBudget;
  uint64_t nvme_budget = MemoryLedger::kNoBudget;
  OffloadConfig offload;
  SnapshotConfig snapshot;
  std::vector<std::string> plugin_path; // absolute directories
  // compression.replay: at ZeRO stages 1-2 every rank replays a compressed
  // step over the elements others own (zd_optimizer_plan::replay_slots)
  // instead of all-gathering the working copies afterwards.
  bool compression_replay = false;
  std::string optimizer;                // plugin name
  std::vector<double> optimizer_values; // resolved hyperparameters, spec order
  // optimizer.state_dtype: what the optimizer's state slots are kept in,
  // ZD_DTYPE_F32 or ZD_DTYPE_BF16 (2 bytes per element; a plugin of optimizer
  // ABI v4 that supports it widens, updates in fp32 and rounds back). The
  // master copy is fp32 either way, and checkpoints hold fp32 values.
  zd_dtype optimizer_state_dtype = ZD_DTYPE_F32;
  TraceConfig trace;
  MetricsConfig metrics;
};

// The parts of a job that are code: called by the engine at a few points.
class JobPolicy {
 public:
  virtual ~JobPolicy() = default;
  // The learning rate for the update that follows `step` applied updates
  // (0 for the first), or nothing to use the optimizer's own lr.
  virtual std::optional<double> lr(int64_t step) = 0;
  // The tier for a tensor, or nothing for the offload table's default.
  // Called once per parameter and kind at finalize.
  virtual std::optional<zd_tier> placement(const TensorInfo&) { return std::nullopt; }
  // A compressing optimizer's schedules for the update that follows `step`
  // applied updates: whether it is a full-precision (warm-up) step, and
  // whether it syncs (0/1 Adam's local steps); nothing where the job has no
  // such schedule and the optimizer's own holds. Called once per step.
  virtual std::optional<bool> warmup(int64_t) { return std::nullopt; }
  virtual std::optional<bool> sync(int64_t) { return std::nullopt; }
};

}  // namespace zerod
