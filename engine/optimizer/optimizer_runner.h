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

#include "grad/grad_reducer.h"
#include "model/model_context.h"
#include "memory/placement.h"
#include "model/rank_resources.h"
#include "memory/state_buffers.h"

#include <functional>
#include <optional>
#include <vector>

namespace zerod {

class OptimizerRunner {
 public:
  OptimizerRunner(const ModelContext& ctx, const Placement& placement, RankResources& res, StateBuffers& buffers,
                  GradReducer& grads)
      : ctx_(ctx), placement_(placement), res_(res), buffers_(buffers), grads_(grads),
        work_staging_(res.transfers.working_staging()) {}
  ~OptimizerRunner() {
    uploads_.lease.reset();
    release_staging();
  }
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

  // One pass of the optimizer over the owned range.
  struct PassArgs {
    double grad_scale = 1.0;
    double lr = 0.0;
    int64_t t = 1;
    // false: the plugin gets no gradient (it was folded in already, or the
    // pass does not read it). Each gradient range is zeroed after its update.
    bool with_grad = true;
    // A pass of a planned step (zd_optimizer_v3): the range is cut at tensor
    // boundaries (elements outside tensors, zero and staying zero, are
    // skipped) and each call gets the fields below.
    bool planned = false;
    uint32_t kind = 0;
    uint32_t pass = 1;
    // Where the exchange buffer's values of tensor `tensor` from element
    // `at` of the rank's owned range of group `group` are (the caller's
    // layout): a buffer and its element, which the pass reaches through a
    // HostWindow (it may be in a pool the host cannot write); empty when the
    // plan has no exchange.
    struct ExchangeAt {
      const TieredBuffer* buffer = nullptr;
      uint64_t at = 0;
    };
    std::function<ExchangeAt(size_t group, zd_param_id tensor, uint64_t at)> exchange;
    const float* scalars = nullptr;        // per tensor (registry order), tensor_scalars() each
    std::vector<double>* stats = nullptr;  // per tensor, tensor_stats() each, combined here
  };
  void pass(const PassArgs& a);
  // A plain update of the owned range (with_grad: see PassArgs).
  void apply(double grad_scale, double lr, int64_t t, bool with_grad) { pass(plain_args(grad_scale, lr, t, with_grad)); }
  static PassArgs plain_args(double grad_scale, double lr, int64_t t, bool with_grad) {
    PassArgs a;
    a.grad_scale = grad_scale;
    a.lr = lr;
    a.t = t;
    a.with_grad = with_grad;
    return a;
  }

  // A part of the owned range in which every operand stays in one tier.
  struct Piece {
    size_t group;
    uint64_t begin, count;  // in the rank's owned range
    zd_tier tier;           // where it is updated: device, host (memory), or nvme (staged)
    int64_t tensor = -1;    // cut per tensor: the parameter it lies in
    Memory* memory = nullptr;  // the memory that updates it (in memory; null when staged)
  };

  // --- a plain pass in two halves (OverlappedUpdate): what the CPU updates
  // in memory, one tensor at a time and in any order, and the rest. Each
  // element gets the same arithmetic as in pass(), so the results are the
  // same bits. ---
  // The pieces whose state is in host memory, cut per tensor (the elements
  // between tensors, zero and staying zero, left out).
  std::vector<Piece> host_pieces() const;
  // Everything else of a plain pass: the device's pieces and the staged ones.
  void pass_off_host(const PassArgs& a);
  // Updates of host pieces happen between these two calls, from one thread.
  // update_host_piece returns the ticket of the upload of the piece's new
  // working copy (0: none, it is in host memory). end_host_updates waits for
  // every upload; with stream_waits, zerod's stream waits for them too.
  void begin_host_updates();
  uint64_t update_host_piece(const PassArgs& a, const Piece& pc);
  void end_host_updates(bool stream_waits);
  // end_host_updates for updates that failed part-way: waits for the
  // uploads issued and gives the ring back, and never throws (the failure
  // that ended them is the one to report).
  void abandon_host_updates() noexcept;

 private:
  // The owned range of a group cut where any operand changes tier; with
  // per_tensor, pieces in memory are also cut at tensor boundaries (the
  // elements between tensors skipped), staged ones split per tile.
  std::vector<Piece> pieces(bool per_tensor) const;
  struct TensorSpan {
    uint64_t at, count;  // in the owned range
    int64_t tensor;
  };
  std::vector<TensorSpan> tensor_spans(size_t group) const;
  zd_optimizer_update base_update(const PassArgs& a, const Piece& pc) const;
  // Returns the ticket of the working copy's last upload (0: none).
  uint64_t update_in_memory(const Piece& pc, std::byte* grad, const zd_optimizer_update& base, const PassArgs& a,
                            double* stats);
  std::byte* grad_of(const Piece& pc) const;
  // Waits for every upload of the ring and gives its buffer back, even when
  // a wait fails (that failure is rethrown after): a lease left held makes
  // the next one, and the model's release of the buffer, wait forever.
  void release_upload_ring();
  // begin_host_updates .. end_host_updates of one pass, ended by
  // abandon_host_updates when the pass throws.
  class HostUpdates;
  void update_staged(const Piece& pc, std::byte* grad, const zd_optimizer_update& base, const PassArgs& a);

  const ModelContext& ctx_;
  const Placement& placement_;
  RankResources& res_;
  StateBuffers& buffers_;
  GradReducer& grads_;
  std::vector<std::vector<AlignedBuffer>> staging_;
  uint64_t staging_charged_ = 0;
  // The new working copy on its way to a device the host cannot write: a
  // ring of slots in a page-locked buffer, each reused once its upload is
  // done, so the update of one chunk overlaps the upload of the chunk before.
  HostStaging& work_staging_;  // the rank's (Transfers::working_staging)
  // Two slots of 8 MiB: a slot's upload (PCIe, tens of GB/s) ends well
  // before the next chunk's update (the host's memory, 30 bytes a
  // parameter) does, so two keep the copy hidden, and halving the passes
  // of four 4 MiB slots halves the workers' barriers (2M elements of bf16
  // each, about 0.7 ms on 16 cores, with a tile's tail idle at each).
  static constexpr size_t kUploadSlots = 2;
  struct UploadRing {
    std::optional<HostStaging::Lease> lease;  // held between begin_ and end_host_updates
    uint64_t ticket[kUploadSlots] = {};
    size_t next = 0;
    uint64_t last = 0;
  } uploads_;
};

}  // namespace zerod
