// Whole values of a parameter's fp32 state — its master copy, each of its
// optimizer state slots — assembled from every rank's part (zd_param_read,
// checkpoints), and written back part by part (zd_optimizer_state_write,
// restores). State kept in bf16 (optimizer.state_dtype) is read widened to
// fp32 and written rounded to nearest even.
#pragma once

#include "model/model_context.h"
#include "model/rank_resources.h"
#include "memory/state_buffers.h"

#include <string>
#include <vector>

namespace zerod {

// Which fp32 buffer of a parameter: the master, or an optimizer state slot.
constexpr int kMasterSlot = -1;

// The whole value. With the state partitioned on several ranks this is a
// collective (every rank reads the same parameter); `call` names it in
// failures.
std::vector<float> read_whole(const ModelContext& ctx, RankResources& res, StateBuffers& buffers, zd_param_id param,
                              int slot, const std::string& call);
// The same into `whole` (numel floats), without a vector of its own where
// the rank holds the whole value.
void read_whole_into(const ModelContext& ctx, RankResources& res, StateBuffers& buffers, zd_param_id param, int slot,
                     const std::string& call, float* whole);
// Writes this rank's part of the buffer from the whole value.
void write_own_part(const ModelContext& ctx, RankResources& res, StateBuffers& buffers, zd_param_id param, int slot,
                    const float* whole);

}  // namespace zerod
