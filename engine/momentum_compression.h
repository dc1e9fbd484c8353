// Steps of an optimizer that averages its momentum compressed instead of
// the gradients (plugin ABI v2: 1-bit Adam), on one rank. Per group, the
// rank folds its local gradient into the momentum (the plugin's
// momentum()), the comm plugin averages that momentum with 1-bit
// compression and error feedback, and the plugin's update() applies it with
// its frozen second moment.
//
// Stage 0 keeps the whole momentum on every rank. Stage 1 keeps only the
// owned range of it (like every optimizer state at stage 1); the whole
// previous average every rank needs for its next local momentum is kept as
// what the compressed average is exactly — one sign bit per element and one
// scale per chunk — so it costs 1/32 of the fp32 momentum. The first
// compressed step after the warm-up (or a checkpoint load) gathers the fp32
// shards once instead. Stages 2-3 are refused: they keep only a shard of the
// gradient, and the local momentum needs all of it. The host reads and
// writes these buffers: the cpu device only (refused on others).
#pragma once

#include "arena.h"
#include "model_context.h"
#include "optimizer_runner.h"
#include "rank_resources.h"
#include "state_buffers.h"

#include <vector>

namespace zerod {

// The chunk length of zd_comm_v2::compressed_all_reduce (its header comment
// is the specification): count / world rounded up to a multiple of 8.
uint64_t compression_chunk(uint64_t count, int world);

// Device-pool bytes of the error feedback (and at stage 1 the packed
// average) of a group on a rank, for the plan and the ledger.
uint64_t compression_bytes(const ModelContext& ctx, size_t group);

// Refuses a compressing optimizer where it cannot run (ZD_ERR_CONFIG).
void check_compression_support(const ModelContext& ctx);

class MomentumCompression {
 public:
  MomentumCompression(const ModelContext& ctx, RankResources& res, StateBuffers& buffers, OptimizerRunner& runner)
      : ctx_(ctx), res_(res), buffers_(buffers), runner_(runner) {}
  ~MomentumCompression() { release(); }
  MomentumCompression(const MomentumCompression&) = delete;
  MomentumCompression& operator=(const MomentumCompression&) = delete;

  // Whether the optimizer compresses at all, and from the next update on.
  bool enabled() const;
  bool active(int64_t applied) const;

  void allocate();
  void release();
  // The error feedback restarts at zero (a checkpoint load, a new step count).
  void reset();
  // A compressed step: local momentum, its compressed average, the update.
  void step(double grad_scale, double lr, int64_t t);

 private:
  struct Buffers {
    Block worker_error;  // full_numel floats
    Block server_error;  // one chunk of floats per parameter
    Block signs;         // stage 1: (full_numel + 7) / 8 bytes
    Block scales;        // stage 1: world_size floats per parameter
    bool have_average = false;
  };

  const ModelContext& ctx_;
  RankResources& res_;
  StateBuffers& buffers_;
  OptimizerRunner& runner_;
  std::vector<Buffers> groups_;
};

}  // namespace zerod
