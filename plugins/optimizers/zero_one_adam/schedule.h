// 0/1 Adam's default schedules (DeepSpeed's ZeroOneAdam), as pure functions
// of the update number t (1-based), so that a restart or a checkpoint
// resumes them exactly. A job replaces either with a Lua function of the
// step (compression.warmup, compression.sync).
#ifndef ZEROD_OPTIM_ZERO_ONE_SCHEDULE_H
#define ZEROD_OPTIM_ZERO_ONE_SCHEDULE_H

#include <cstdint>

namespace zerod::optim::zero_one {

// Whether update t updates the variance (full-precision gradients): the
// variance interval starts at 1 and doubles after every `kappa` variance
// updates (var_update_scaler), each at a multiple of the interval:
// kappa = 2 gives 1, 2, 4, 6, 8, 12, 16, 24, ...
bool variance_step(int64_t t, int64_t kappa);

// The local steps' sync interval at the k-th update (1-based) after the
// variance freezes: 1, doubled every `scaler` updates (local_step_scaler),
// at most `clipper` (local_step_clipper).
int64_t local_interval(int64_t k, int64_t scaler, int64_t clipper);

// Whether update t > freeze syncs: t is a multiple of its local interval.
bool sync_step(int64_t t, int64_t freeze, int64_t scaler, int64_t clipper);

}  // namespace zerod::optim::zero_one

#endif  // ZEROD_OPTIM_ZERO_ONE_SCHEDULE_H
