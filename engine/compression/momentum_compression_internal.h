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
