// A rank's part of a checkpoint: which elements of each parameter's fp32
// buffers (the master, each optimizer state slot) the rank holds, writing
// them into its shard as a stream, and reading what it holds now back from
// any checkpoint — written at any world size and stage.
#pragma once

#include "compression/momentum_compression.h"
#include "optimizer/loss_scaler.h"
#include "manifest.h"
#include "model/model_context.h"
#include "model/rank_resources.h"
#include "shard_file.h"
#include "source.h"
#include "memory/state_buffers.h"

#include <optional>
#include <string>

namespace zerod {

// Elements [first, first + count) of a parameter that a rank's fp32 buffers
// hold, from element `at` of those buffers.
struct OwnedRange {
  uint64_t first = 0, count = 0, at = 0;
};

// What the rank holds of p (nothing: std::nullopt). At stage 0 every rank
// holds everything.
std::optional<OwnedRange> owned_range(const ModelContext& ctx, const ParamRecord& p, int rank);

// Streams the rank's master and state values into the shard, a record per
// parameter and buffer. At stage 0 only rank 0 writes records (every rank
// holds the same), or each node's first rank where every node keeps its own
// part of a snapshot (replicated_writer); the others' shards are empty,
// but for what each rank alone holds (format 5, shard_file.h's
// kRankBuffers): its own master and state where local steps made them its
// own (MomentumCompression::own_copies; rank 0's are the plain records),
// and its error feedback where it is live (errors_live).
void write_rank_shard(const ModelContext& ctx, RankResources& res, StateBuffers& buffers,
                      MomentumCompression& compression, ckpt::ShardWriter& out, bool replicated_writer);
inline void write_rank_shard(const ModelContext& ctx, RankResources& res, StateBuffers& buffers,
                             MomentumCompression& compression, ckpt::ShardWriter& out) {
  write_rank_shard(ctx, res, buffers, compression, out, res.rank == 0);
}

// What of a checkpoint's per-rank records this job reads, the same on every
// rank: each rank's error feedback where the job runs the checkpoint's
// world size and parameter groups (each tensor's chunk on a rank is then
// the one it served); each rank's own copy at stage 0 on the checkpoint's
// world size. `warning` (one line, "" for none) says what a load leaves:
// what the checkpoint holds for another world size, or, from a checkpoint
// written before format 5, the error feedback and own copies it did not
// hold.
struct RankCarry {
  bool errors = false;
  bool copies = false;
  std::string warning;
};
RankCarry rank_carry(const ModelContext& ctx, const ckpt::Manifest& m, const std::string& dir);

// Checks, changing nothing, that a checkpoint holds every value the rank
// would read and that they pass their checksums (throws naming the first
// that does not): its part of the masters and state (its own copy where
// carried), and its error feedback where carried.
void verify_rank_state(const ModelContext& ctx, RankResources& res, StateBuffers& buffers, const ckpt::Source& src);

// Reads what the rank holds now from a checkpoint into its masters and
// state (at stage 0 its own copy, where the checkpoint holds one for it:
// rank_carry), and the optimizer's per-tensor scalars (zero where the
// checkpoint holds none), and derives its working copies from the masters.
// The caller then restarts the compression's state, reads the error
// feedback (read_rank_errors), hands the working copies around (a
// collective) and sets the counters. Everything is verified first
// (verify_rank_state) unless `verified` says the caller did that already.
void read_rank_state(const ModelContext& ctx, RankResources& res, StateBuffers& buffers, const ckpt::Source& src,
                     bool verified = false);

// After read_rank_state and compression.reset(): the rank's error feedback
// where the checkpoint holds it for this job (rank_carry; verified with the
// rest), and whether the rank's copy is its own from now on.
void read_rank_errors(const ModelContext& ctx, RankResources& res, MomentumCompression& compression,
                      const ckpt::Source& src);

// The manifest of the model as it is now: with the optimizer's per-tensor
// scalars, which every rank holds alike, from `buffers` (any rank's), what
// each rank holds alone (compression: any rank's says), and the lr the
// trainer set (zd_model_set_lr; every rank's is the same), if any.
ckpt::Manifest describe_model(const ModelContext& ctx, int64_t step, const LossScaler& scaler,
                              std::optional<double> trainer_lr, const StateBuffers& buffers,
                              const MomentumCompression& compression);

// Refuses (naming what differs) a checkpoint of other parameters or another
// optimizer than the model's. Another world size or stage is fine. So is a
// checkpoint without the optimizer's per-tensor scalars (one written before
// format 4), unless the update after its step reads what earlier updates
// left in them (zd_optimizer_plan.kept_scalars): it would not resume the
// run that wrote it (ZD_ERR_CONFIG).
void check_checkpoint_fits(const ModelContext& ctx, const ckpt::Manifest& m, const std::string& dir);

// The largest `value` any rank gives: one double over the comm plugin, a
// CommOp::Read collective in `group` (its `id` there); `value` with one rank.
// How the ranks of a checkpoint or snapshot agree before they act.
double all_reduce_max(const ModelContext& ctx, RankResources& res, int rank, uint64_t group, uint64_t id,
                      const std::string& what, double value);

}  // namespace zerod
