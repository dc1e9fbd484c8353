// A rank's part of a checkpoint: which elements of each parameter's fp32
// buffers (the master, each optimizer state slot) the rank holds, writing
// them into its shard as a stream, and reading what it holds now back from
// any checkpoint — written at any world size and stage.
#pragma once

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
// part of a snapshot (replicated_writer); the others' shards are empty.
void write_rank_shard(const ModelContext& ctx, RankResources& res, StateBuffers& buffers, ckpt::ShardWriter& out,
                      bool replicated_writer);
inline void write_rank_shard(const ModelContext& ctx, RankResources& res, StateBuffers& buffers,
                             ckpt::ShardWriter& out) {
  write_rank_shard(ctx, res, buffers, out, res.rank == 0);
}

// Checks, changing nothing, that a checkpoint holds every value the rank
// would read and that they pass their checksums (throws naming the first
// that does not).
void verify_rank_state(const ModelContext& ctx, RankResources& res, StateBuffers& buffers, const ckpt::Source& src);

// Reads what the rank holds now from a checkpoint into its masters and
// state, and the optimizer's per-tensor scalars (zero where the checkpoint
// holds none), and derives its working copies from the masters. The caller then
// hands the working copies around (a collective) and sets the counters.
// Everything is verified first (verify_rank_state) unless `verified` says
// the caller did that already.
void read_rank_state(const ModelContext& ctx, RankResources& res, StateBuffers& buffers, const ckpt::Source& src,
                     bool verified = false);

// The manifest of the model as it is now: with the optimizer's per-tensor
// scalars, which every rank holds alike, from `buffers` (any rank's).
ckpt::Manifest describe_model(const ModelContext& ctx, int64_t step, const LossScaler& scaler,
                              const StateBuffers& buffers);

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
