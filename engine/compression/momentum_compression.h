// The planned steps of an optimizer that compresses what ranks exchange
// (plugin ABI v3, zerod_plugin.h: 1-bit Adam, 0/1 Adam, 1-bit LAMB), on one
// rank, at every ZeRO stage. The plan of a step is a list of ops:
//   PREPARE   the plugin folds the rank's whole local gradient into an
//             exchange buffer, tensor by tensor (1-bit Adam: its local
//             momentum from the kept average of the last one);
//   EXCHANGE  the comm plugin's 1-bit compressed average of that buffer,
//             with error feedback kept here (each tensor on its own, or a
//             parameter group packed as one buffer);
//   PASS      the plugin's update over the rank's owned range (its ZeRO
//             shard), with the exchanged values of the same elements;
// and between ops the plugin's per-tensor step sees the per-tensor
// statistics of the last pass (summed over the owners) and sets per-tensor
// scalars (1-bit LAMB's trust ratios), which StateBuffers keeps with the
// rest of the optimizer's state (checkpoints hold them).
//
// The exchange is the same at every stage: whole tensors, cut into
// world_size chunks as zd_comm_v2 specifies, so every stage computes what
// stage 0 computes. Rank r serves chunk r of each tensor and keeps its
// server error; at stage 3 that chunk is its shard (the layout asks for
// shards of the chunk length), so the error feedback of a shard lives on its
// owner. Every rank keeps a worker error for its whole local tensors, and,
// when the plan asks, the average as it is — a sign bit per element and a
// scale per chunk, 1/32 of an fp32 copy — for the next step's prepare: the
// momentum stays partitioned. The first such step (or one after a
// checkpoint load) gathers the plugin's average slot whole instead. At
// stage 0 the exchange buffer is in the group's packed order and kept
// between steps, so every segment (a fused group too) is prepared and
// exchanged in it without copies, and it still holds the last average when
// the next step prepares: nothing else is kept, and nothing is copied. The
// buffers live in the tier of the group's gradients (the device, or host
// memory beside an offloaded optimizer). The host's loops read and write
// them, the gradients and the operands of a pass through host windows
// (HostWindow, transfers.h): in place where the host writes their memory,
// else (a GPU, the emulated device) as host copies whose new values go back
// after the loop, so every device runs the same host code on the same
// values and ends with the cpu device's bits (compression.replay too).
#pragma once

#include "grad/grad_reducer.h"
#include "model/model_context.h"
#include "optimizer/optimizer_runner.h"
#include "model/rank_resources.h"
#include "memory/residency.h"
#include "memory/state_buffers.h"
#include "memory/tiered_buffer.h"
#include "memory/transfers.h"

#include <array>
#include <string>
#include <vector>

namespace zerod {

// The chunk length of zd_comm_v2::compressed_all_reduce (its header comment
// is the specification): count / world rounded up to a multiple of 8.
uint64_t compression_chunk(uint64_t count, int world);

// Bytes `rank` keeps for a compressing optimizer, per group, in the group's
// gradient tier: from stage 2 a whole local gradient (grads), the exchange
// buffer (buffers: over its owned range, or at stage 0 the group in packed
// order, without the padding between tensors), the group's need of the
// scratch buffer (scratch), and with several ranks the error feedback and
// kept average (optimizer). For the plan and the ledger: finalize allocates
// every one of them (MomentumCompression::allocate).
struct CompressionBytes {
  uint64_t grads = 0;
  uint64_t params = 0;  // stage 3, compression.replay: the whole copy of the parameters
  uint64_t buffers = 0;
  // The largest segment of the group that the rank assembles outside its
  // exchange buffer (stages 1-3 on several ranks: a tensor split between
  // owners, a fused group), 0 where every segment is in place. One scratch
  // buffer per tier serves every group whose gradients are there, so the
  // plan counts the largest figure of each tier, not their sum.
  uint64_t scratch = 0;
  std::vector<uint64_t> optimizer;  // one figure per buffer (each is allocated, and aligned, on its own)
};
CompressionBytes compression_bytes(const ModelContext& ctx, size_t group, int rank);

// Which of a group's bytes are in memory the host does not write in place
// (the pool of a device the host cannot address), for the windows below.
struct PoolResident {
  bool buffers = false;  // the gradients' tier: gradients, exchange buffers, error feedback, kept average, replay's copies
  bool master = false;
  bool state = false;
  bool working = false;
};
// The most bytes of host windows (HostWindow, transfers.h: host copies of
// pool bytes, each rounded to HostScratch::kAlign) that `rank`'s compressed
// steps hold at once over group `group`, whose bytes lie as `pool` says:
// one segment's prepare and exchange (its exchange buffer beside the
// largest of its gradients, the error feedback and kept average of the
// exchange, the replay of its tensors, the scatter to the owned buffer),
// or one piece of a planned pass (the rank's part of a tensor: master,
// state, working copy, gradient and exchange), or one tensor's whole copy
// (the replay's copies, stage 3's kept parameters). The groups' steps run
// one after another, so the rank's figure is the largest group's; 0 where
// the optimizer never compresses. An upper bound built from the code's
// windows (momentum_compression*.cpp, OptimizerRunner::update_in_memory),
// for the host scratch finalize reserves.
uint64_t compression_window_bytes(const ModelContext& ctx, size_t group, int rank, const PoolResident& pool);

// The state slots the optimizer's compressed steps replay
// (zd_optimizer_plan.replay_slots of a late step), 0 where they cannot be
// replayed or it never compresses.
uint32_t replay_slots(const OptimizerInstance& opt);

// Why compression.replay cannot run with this optimizer, partitions and
// precision, or "" where it can (the job script checks it too).
std::string compression_replay_refusal(const OptimizerInstance& opt, uint32_t partitions, zd_dtype precision);

// Refuses an optimizer where it cannot run (ZD_ERR_CONFIG): the stages its
// configuration refuses, a comm plugin without compression,
// compression.replay where it cannot replay.
void check_compression_support(const ModelContext& ctx);

// What finalize warns of, once the registry is laid out, where an
// optimizer that compresses each parameter group as one fused buffer
// (1-bit LAMB) exchanges between several ranks and one working dtype's
// tensors are in two groups (Placement::state_class: on a device the host
// cannot address, offload.ratio or placement() kept some of their optimizer
// state on the device and the rest off it): the two groups are compressed
// apart, each with its own scales, so the steps differ from the same job's
// with the state in one place. "" where that is not so. Laying the fused
// exchange out per dtype across the groups would touch every buffer kept
// per group (error feedback, the kept average, the stage-0 exchange in
// place, the replay) and the checkpoints' layout of the error feedback;
// refusing would take partial offload away from 1-bit LAMB on GPUs, whose
// steps are still 1-bit LAMB's. So the job is told, and docs/onebit.md says it.
std::string split_fused_exchange_warning(const ModelContext& ctx);

// Where a rank's error feedback lies, as runs of tensors' elements (what
// checkpoints hold of it: checkpoint_io.h): the worker error of each whole
// tensor, and the server error of the chunk of each tensor the rank serves
// (elements [rank c, rank c + n_r)), or, in a group exchanged fused (packed
// as one buffer: `fused`, per group), of the group's chunk, cut at the
// tensors' bounds. `at` is where a span lies in the group's worker or
// server error buffer (fp32 elements).
enum class ErrorPart { Worker, Server, ServerFused };
struct ErrorSpan {
  ErrorPart part;
  size_t group;
  zd_param_id param;
  uint64_t first, count;
  uint64_t at;
};
std::vector<ErrorSpan> error_spans(const ModelContext& ctx, int rank, const std::vector<char>& fused);

class MomentumCompression {
 public:
  MomentumCompression(const ModelContext& ctx, RankResources& res, StateBuffers& buffers, OptimizerRunner& runner,
                      GradReducer& grads)
      : ctx_(ctx), res_(res), buffers_(buffers), runner_(runner), grads_(grads) {}
  ~MomentumCompression() { release(); }
  MomentumCompression(const MomentumCompression&) = delete;
  MomentumCompression& operator=(const MomentumCompression&) = delete;

  void allocate();
  void release();
  // The error feedback restarts at zero, and the kept average and the
  // copies compression.replay keeps are stale (a checkpoint load, a state
  // write, a new step count). The optimizer's per-tensor scalars are its
  // state, in StateBuffers: a load sets them, nothing here clears them.
  void reset();
  // A plain step (a warm-up between compressed ones, say) moves the
  // optimizer's state on: the average kept before and the replicas are
  // stale. run() sees to its own steps.
  void forget_average();
  // Runs a step that is not plain (OptimizerInstance::is_plain): the
  // gradients are averaged already (ZD_GRADS_AVERAGED) or local. True when
  // the step was replayed over the elements other ranks own
  // (compression.replay): every rank's working copy is whole and current,
  // and the all-gather of the working copies is not needed.
  bool run(const zd_optimizer_plan& plan, double grad_scale, double lr, int64_t t);
  // Stage 3 with compression.replay: the whole current fp32 value of p,
  // which a replayed step kept on this rank, so that forward and backward
  // copy it instead of all-gathering it; nullptr when there is none (before
  // the first replayed step, after any step or write that was not
  // replayed); the memory that holds it comes with it. Every rank answers
  // alike, so all or none of them gather.
  Residency::WholeValue whole_param(const ParamRecord& p) const;
  // zd_param_write of p's whole value: the kept copy takes it too.
  void write_whole_param(const ParamRecord& p, const float* whole);

  // What checkpoints hold of this rank (checkpoint_io.h). The error
  // feedback is zero but where an exchange ran since it last restarted
  // (reset, a plan's reset_errors); the ranks run the same plans, so every
  // rank's answer is the same.
  bool errors_live() const { return errors_live_; }
  // Per group, whether its server error holds the fused group's chunk (the
  // layout of its last exchange): error_spans' `fused`.
  std::vector<char> errors_fused() const;
  // The buffer a span of error_spans lies in; nullptr where the rank keeps
  // no error feedback (one rank, no compression).
  TieredBuffer* error_buffer(const ErrorSpan& span);
  // After a load (and reset()) wrote the spans of error_spans(fused) back.
  void errors_restored(const std::vector<char>& fused);
  // At ZeRO stage 0 on several ranks, a pass over each rank's own local
  // gradient (0/1 Adam's local steps) makes the rank's parameters and state
  // its own, and they stay so: a sync undoes each rank's moves in floating
  // point, so the copies never agree to the bit again. Every rank's answer
  // is the same; a load sets it (whether each rank read its own copy).
  bool own_copies() const { return own_copies_; }
  void set_own_copies(bool own) { own_copies_ = own; }

 private:
  // Tensors exchanged together: one, or a whole group (fused), packed.
  struct Segment {
    std::vector<zd_param_id> params;
    uint64_t dense = 0;      // first element in the group's packed order
    uint64_t count = 0;
    uint64_t server_at = 0;  // this rank's server error chunk
    uint64_t scales_at = 0;  // world scales of the kept average
    uint64_t tag = 0;
    bool fused = false;      // the group's tensors packed as one buffer
  };
  struct Group {
    std::vector<uint64_t> dense;  // per parameter of the group: where it starts in the packed order
    uint64_t dense_count = 0;
    TieredBuffer worker_error;  // dense_count floats
    TieredBuffer server_error;  // the chunks this rank serves
    bool errors_fused = false;  // the server error holds the fused group's chunk (the last exchange's layout)
    TieredBuffer signs;         // the kept average: a bit per element (packed order)
    TieredBuffer scales;        // and world scales per tensor (or per group when fused)
    bool have_average = false;
    // Where the rank owns every element (stage 0): the packed exchange
    // buffer still holds the average the last exchange left in it, which
    // that step's pass read and made its average slot from. The next
    // prepare starts from it as it is (ZD_EXCHANGE_IN_AVERAGE): no copy of
    // the slot. So does the scratch buffer of a replayed step whose model
    // is one fused segment (stages 1-2, compression.replay: 1-bit LAMB),
    // in place of the kept bits. Anything that moves the optimizer's state
    // clears it.
    bool average_in_buffer = false;
    // compression.replay: whole copies of the slots a replayed step reads
    // (full-layout elements of the group), filled at the first such step.
    TieredBuffer replica[ZD_OPTIMIZER_MAX_STATE];
    // Stage 3, compression.replay: a whole copy of the group's fp32
    // parameters (full layout), which replayed steps update.
    TieredBuffer params;
  };
  struct StepState;

  std::vector<Segment> segments(size_t group, bool fused) const;
  bool owns_all() const;
  // Whether a plan's keep_average keeps the average here (several ranks,
  // the momentum partitioned); at stage 0 the slot holds it whole.
  bool keeps() const;
  // The exchange buffers and the scratch buffers, at the sizes the plan
  // counts (compression_bytes), so that a budget that cannot hold them
  // refuses at finalize, not at the first compressed step.
  void allocate_exchange_buffers();
  // The scratch buffer of the group's gradient tier, at least count floats.
  TieredBuffer& scratch(size_t group, uint64_t count);
  // A host window over the floats a segment is prepared and exchanged in:
  // the owned exchange buffer where the segment lies there as one piece
  // (*in_place set), else the scratch buffer.
  HostWindow segment_window(StepState& st, size_t group, const Segment& s, HostWindow::Access access,
                            bool* in_place);
  void lay_out_groups();
  zd_optimizer_update step_update(const StepState& st, const ParamGroup& g, zd_param_id pid, uint32_t pass);
  void prepare(StepState& st, bool then_exchange);
  void exchange_in_place(StepState& st);
  void exchange(size_t group, const Segment& s, float* x, bool keep);
  void fill_from_average(size_t group, const Segment& s, float* x) const;
  // Where the segment lies in the owned exchange buffer as one piece: its
  // first element there, or -1.
  int64_t owned_whole(StepState& st, size_t group, const Segment& s) const;
  OptimizerRunner::PassArgs::ExchangeAt exchange_of(const StepState& st, size_t group, zd_param_id pid,
                                                    uint64_t at) const;
  static uint64_t in_segment(const Group& c, const Segment& s, size_t j);
  std::vector<std::pair<uint64_t, ModelContext::OwnedSpan>> owned_parts(size_t group, const Segment& s) const;
  void read_slot(size_t group, const Segment& s, int slot, float* x);
  void scatter_owned(StepState& st, size_t group, const Segment& s, const float* x) const;
  void gather_owned(StepState& st, size_t group, const Segment& s, float* x) const;
  void pass(StepState& st, bool with_grad);
  void combine_stats(StepState& st);
  bool replays(const zd_optimizer_plan& plan) const;
  void fill_replica(uint32_t slots);
  void fill_params();
  void copy_owned_params();
  // Where p starts in its group's whole copy of the parameters (stage 3).
  float* params_of(const ParamRecord& p) const;
  void replay(StepState& st, size_t group, const Segment& s, const float* x, uint32_t pass);
  void tensor_step(StepState& st, zd_plan_op op);

  const ModelContext& ctx_;
  RankResources& res_;
  StateBuffers& buffers_;
  OptimizerRunner& runner_;
  GradReducer& grads_;
  std::vector<Group> groups_;
  std::vector<uint64_t> packed_at_;  // per parameter (registry order): where it starts in its group's packed order
  // The exchange buffer over each group's owned range, allocated at
  // finalize and kept: a fresh one per step cost a page fault per 4 KiB of
  // it every step.
  std::vector<TieredBuffer> owned_;
  // Where a segment is assembled when the owned buffer cannot hold it as
  // one piece (a fused group, a tensor split between owners), one per tier
  // of gradients (by zd_tier): allocated at finalize at the largest segment
  // of the groups there that the optimizer's plans exchange in
  // (CompressionBytes::scratch), and kept, for the same reason.
  std::array<TieredBuffer, ZD_TIER_COUNT> scratch_;
  bool errors_live_ = false;    // an exchange ran since the error feedback last restarted
  bool own_copies_ = false;     // stage 0: the ranks' parameters and state are their own
  uint32_t replica_valid_ = 0;  // the slots whose replicas hold the owners' values
  bool params_valid_ = false;   // Group::params holds every owner's current parameters
  mutable bool replay_hinted_ = false;  // the log line saying compression.replay exists
};

}  // namespace zerod
