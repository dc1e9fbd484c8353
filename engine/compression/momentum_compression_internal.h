// What the parts of MomentumCompression share, and nothing else includes:
// the sizes that both the plan and the ledger use
// (momentum_compression_sizing.cpp) and the state of one planned step. The
// class is written in four files, one job each:
//   momentum_compression.cpp           the plan: lifetime, PREPARE, PASS, the
//                                      per-tensor step and statistics, run()
//   momentum_compression_exchange.cpp  the EXCHANGE with its error feedback,
//                                      the kept average, the exchange buffers
//   momentum_compression_replay.cpp    compression.replay
//   momentum_compression_sizing.cpp    bytes for the plan and ledger, refusals
// and the sign packing of the kept average is a kernel beside the others
// (sign_kernels.*).
//
// Per group the buffers hold every tensor's part in the group's packed order
// (registration order, no gaps): worker errors and sign bits at the
// tensor's packed offset, server error chunks and scales one tensor after
// another. A fused exchange packs the whole group as one buffer and uses
// the first chunk and the first world scales.
#pragma once

#include "compression/momentum_compression.h"

#include <cstdint>
#include <vector>

namespace zerod {
namespace compression_detail {

// The owned exchange buffer's length: where the rank owns every element
// (stage 0, or one rank) it holds the group in its packed order, with none
// of the registry's padding between tensors, so a fused group is one piece
// of it whatever the tensors' sizes; else the owned range's layout.
bool owns_every_element(const ModelContext& ctx);
uint64_t exchange_count(const ModelContext& ctx, const ParamGroup& g);
// The server error's elements: each tensor's chunk, or the fused group's.
uint64_t server_elems(const Registry& reg, const ParamGroup& g, int world);
// Where a segment of group g (its tensors `params`, tensor j at element
// in_segment[j] of the segment, `count` elements in all) lies in `rank`'s
// exchange buffer as one piece, in the segment's order: the segment's first
// element there, or -1, and the segment is assembled in a scratch buffer.
// Where the rank owns every element, every segment lies there at its
// packed offset, which the caller knows: this answers for stages 1-3.
int64_t owned_piece(const ModelContext& ctx, int rank, const ParamGroup& g, const std::vector<zd_param_id>& params,
                    const std::vector<uint64_t>& in_segment, uint64_t count);
// The floats of scratch buffer that `rank` needs for group g: its largest
// segment that is not in place, in each layout (a tensor at a time, the
// group fused) that the optimizer's plans exchange in (read from the plans
// of the steps replay_slots() reads, as the plan cannot ask every step);
// 0 where every segment is in place.
uint64_t scratch_count(const ModelContext& ctx, size_t group, int rank);

}  // namespace compression_detail

struct MomentumCompression::StepState {
  const zd_optimizer_plan& plan;
  double grad_scale;
  double lr;
  int64_t t;
  std::vector<TieredBuffer>* owned = nullptr;  // the exchange buffers (owned_) when the plan exchanges
  std::vector<double> stats;        // per tensor, from the last pass
  bool have_stats = false;
  uint32_t pass = 0;
  bool consumed = false;  // the local gradients were read (and zeroed)
  bool replay = false;    // the step is replayed over the elements other ranks own
};

}  // namespace zerod
