// A rank's model state, per parameter group. Which buffers exist and how
// long they are depends on the stage (see Registry):
//   working: stages 0-2 the full layout (device); stage 3 the rank's flat shards
//   grad:    stages 0-1 the full layout; stage 2 the owned range; stage 3 flat
//   master, state: stage 0 the full layout; stages 1-2 the owned range; stage 3 flat
// Masters, optimizer state and stage-3 shards may live in any tier, in
// segments, as the placement decides; gradients in the device tier or in
// host memory (Placement::grad_tier), in one segment.
#pragma once

#include "model/model_context.h"
#include "memory/placement.h"
#include "model/rank_resources.h"
#include "memory/tiered_buffer.h"

#include <array>
#include <vector>

namespace zerod {

struct GroupBuffers {
  TieredBuffer working;
  TieredBuffer grad;
  TieredBuffer master;
  std::array<TieredBuffer, ZD_OPTIMIZER_MAX_STATE> state{};

  zd_tier grad_tier() const { return grad.segments().front().tier; }
  std::byte* grad_data() const { return grad.segments().front().ptr; }
  const Block& grad_block() const { return grad.segments().front().block; }
  Memory& grad_memory() const { return *grad.segments().front().memory; }
};

// A buffer of fp32 values kept as `stored` (a master: fp32; an optimizer
// state slot: the job's state dtype), whatever its tiers: read widened to
// fp32 (exact), written from fp32 rounded to nearest even. What reads and
// writes whole values (zd_optimizer_state_read/_write, checkpoints) goes
// through these, so a bf16 state is fp32 to everything outside the update.
void read_as_f32(const TierSet& tiers, const TieredBuffer& buf, zd_dtype stored, uint64_t begin, uint64_t n,
                 float* dst);
void write_from_f32(const TierSet& tiers, TieredBuffer& buf, zd_dtype stored, uint64_t begin, uint64_t n,
                    const float* src);

class StateBuffers {
 public:
  StateBuffers(const ModelContext& ctx, RankResources& res) : ctx_(ctx), res_(res) {}
  ~StateBuffers() { release(); }
  StateBuffers(const StateBuffers&) = delete;
  StateBuffers& operator=(const StateBuffers&) = delete;

  // Allocates every group's buffers where the placement puts them, in two
  // parts, so that finalize can drop the registered initial values between
  // them (Model::drop_initial_values): what finalize holds at its highest is
  // then the state itself, not the state and the initial values beside it.
  // First the working copies and masters, with the registered initial
  // values (rank 0's) written into this rank's part; on failure nothing
  // stays allocated.
  void allocate_values(const Placement& placement);
  // Then the gradients and the optimizer state. On failure what it took
  // stays, with the working copies and masters, until release(): a failed
  // finalize reads the initial values back from the masters first.
  void allocate_state(const Placement& placement);
  void release();

  std::vector<GroupBuffers>& groups() { return groups_; }
  const std::vector<GroupBuffers>& groups() const { return groups_; }
  GroupBuffers& of(const ParamRecord& p) { return groups_[static_cast<size_t>(p.group)]; }

  // The optimizer's per-tensor scalars (zd_optimizer_v3::tensor_scalars()
  // per parameter, registry order; zero at first): its state beside the
  // slots, which its tensor_step() sets (1-bit LAMB's frozen trust ratios,
  // 0/1 Adam's sum of learning rates since the last sync). Every rank's
  // agree. Checkpoints hold them and a load restores them; nothing else
  // clears them.
  std::vector<float>& tensor_scalars() { return tensor_scalars_; }
  const std::vector<float>& tensor_scalars() const { return tensor_scalars_; }
  // Whether they hold a run's values: an update's tensor_step ran, or a
  // checkpoint that holds them was loaded. Until then they are the zeros
  // allocate_values left, which no restore through zd_model_set_step can
  // go on from where the next update reads them.
  bool tensor_scalars_set() const { return tensor_scalars_set_; }
  void note_tensor_scalars_set() { tensor_scalars_set_ = true; }
  void note_tensor_scalars_cleared() { tensor_scalars_set_ = false; }

  // Writes a parameter's whole fp32 value into this rank's part of its
  // master and working copies (initial values, zd_param_write, restore).
  void write_value(const ParamRecord& p, const float* whole);
  // write_value's inverse: this rank's part of a parameter's master, into
  // its place in `whole` (every part, in a job of one rank).
  void read_value(const ParamRecord& p, float* whole) const;
  // The working copies of the rank's owned range from its masters (the
  // source of truth), after a restart.
  void working_from_master();

 private:
  const ModelContext& ctx_;
  RankResources& res_;
  std::vector<GroupBuffers> groups_;
  std::vector<float> tensor_scalars_;
  bool tensor_scalars_set_ = false;
};

}  // namespace zerod
