#include "schedule.h"

namespace zerod::optim::zero_one {

// DeepSpeed counts variance updates at steps that are multiples of the
// interval and doubles the interval after kappa of them: each doubling
// starts at the next multiple of the new interval after the last variance
// update. Walking the doublings is O(log t).
bool variance_step(int64_t t, int64_t kappa) {
  if (t < 1 || kappa < 1) return false;
  int64_t last = 0, interval = 1;
  for (;;) {
    const int64_t first = (last / interval + 1) * interval;
    const int64_t end = first + (kappa - 1) * interval;
    if (t < first) return false;
    if (t <= end) return (t - first) % interval == 0;
    last = end;
    if (interval > (int64_t{1} << 61)) return false;
    interval *= 2;
  }
}

int64_t local_interval(int64_t k, int64_t scaler, int64_t clipper) {
  if (k < 1 || scaler < 1 || clipper < 1) return 1;
  int64_t interval = 1;
  for (int64_t doublings = (k - 1) / scaler; doublings > 0 && interval < clipper; --doublings) interval *= 2;
  return interval < clipper ? interval : clipper;
}

bool sync_step(int64_t t, int64_t freeze, int64_t scaler, int64_t clipper) {
  return t > freeze && t % local_interval(t - freeze, scaler, clipper) == 0;
}

}  // namespace zerod::optim::zero_one
