// The optimizer of one rank runs where the state lives. The rank's owned
// range is cut into pieces in which every operand (master, each state slot,
// the working copy) stays in one tier:
//  - pieces whose master and state are in the device tier are updated by
//    the device (the plugin's CPU kernels on the cpu device, its CUDA
//    kernels on a GPU);
//  - pieces in host memory are updated by the CPU kernels on the rank's
//    workers, in tiles;
//  - pieces with an operand on NVMe stream through staging buffers: while
//    the CPU updates tile j, tiles j+1.. are being read and tile j-1 written
//    (ZeRO-Infinity's pipeline), so a step waits on the disk only when the
//    disk is the bottleneck.
// The working copy is written in the same pass wherever it lives.
#pragma once

#include "grad_reducer.h"
#include "model_context.h"
#include "placement.h"
#include "rank_resources.h"
#include "state_buffers.h"

#include <vector>

namespace zerod {

class OptimizerRunner {
 public:
  OptimizerRunner(const ModelContext& ctx, const Placement& placement, RankResources& res, StateBuffers& buffers,
                  GradReducer& grads)
      : ctx_(ctx), placement_(placement), res_(res), buffers_(buffers), grads_(grads) {}
  ~OptimizerRunner() { release_staging(); }
  OptimizerRunner(const OptimizerRunner&) = delete;
  OptimizerRunner& operator=(const OptimizerRunner&) = delete;

  // The NVMe pipeline's staging buffers: offload.buffer_count sets, one
  // buffer per operand, reserved (and charged to the host tier) at finalize
  // and kept, so a step never allocates and the host budget is checked once.
  void reserve_staging();
  void release_staging();

  // The squared norm of the gradients the optimizer will use, summed over
  // ranks as needed, and whether it is finite. local: each rank's whole
  // unreduced gradient (a compressed step), summed over ranks.
  GradStats gradient_stats(bool local);

  // Updates the owned range. with_grad false: the gradients were folded into
  // the momentum already (a compressed step); the plugin gets none. Each
  // gradient range is zeroed after its update.
  void apply(double grad_scale, double lr, int64_t t, bool with_grad);

 private:
  struct Piece {
    size_t group;
    uint64_t begin, count;  // in the rank's owned range
    zd_tier tier;           // where it is updated: device, host (memory), or nvme (staged)
  };
  std::vector<Piece> pieces() const;
  zd_optimizer_update base_update(double grad_scale, double lr, int64_t t) const;
  void update_in_memory(const Piece& pc, std::byte* grad, const zd_optimizer_update& base, bool with_grad);
  void update_staged(const Piece& pc, std::byte* grad, const zd_optimizer_update& base, bool with_grad);

  const ModelContext& ctx_;
  const Placement& placement_;
  RankResources& res_;
  StateBuffers& buffers_;
  GradReducer& grads_;
  std::vector<std::vector<AlignedBuffer>> staging_;
  uint64_t staging_charged_ = 0;
};

}  // namespace zerod
