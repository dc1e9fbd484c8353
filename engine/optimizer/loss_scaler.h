// fp16 loss scaling. With a static scale the scale never changes; with the
// dynamic scaler (DeepSpeed's rules) an overflow halves the scale once the
// hysteresis is used up (with `hysteresis` 2 the first overflow only skips
// its step), never below `min_scale`, and `window` clean steps since the
// last overflow double it and refill the hysteresis.
#pragma once

#include <cstdint>

namespace zerod {

struct LossScaleConfig {
  bool enabled = false;            // false: the scale is 1 and never changes
  double static_scale = 0.0;       // > 0: a fixed scale (no dynamic updates)
  int initial_scale_power = 16;    // dynamic: starts at 2^power
  int64_t window = 1000;           // clean steps before the scale doubles
  // false: on the window-th clean update since the last overflow (torch's
  // GradScaler); true: on the update after it (DeepSpeed's
  // DynamicLossScaler: its `stable_interval` leaves out the update itself).
  bool deepspeed_window = false;
  // The first hysteresis - 1 overflows are tolerated (their steps skipped,
  // the scale kept); then each overflow halves the scale until a doubling
  // (or, consecutive_hysteresis, any clean step) refills the count.
  int hysteresis = 2;
  bool consecutive_hysteresis = false;  // refill hysteresis after every clean step
  double min_scale = 1.0;
  // An overflow at min_scale with no hysteresis left fails zd_step
  // (DeepSpeed's DynamicLossScaler raises there): the run would otherwise
  // skip every step from then on. The scaler only reports it; the Model fails.
  bool raise_error_at_min_scale = true;
};

// What an update did about an overflow.
enum class OverflowOutcome {
  kNone,       // no overflow, or a scale that is not dynamic
  kTolerated,  // hysteresis used up by one: the scale holds
  kHalved,     // the scale halved (no lower than min_scale)
  kAtMinimum,  // the scale was min_scale already with no hysteresis left: no lower scale to try
};

class LossScaler {
 public:
  explicit LossScaler(const LossScaleConfig& cfg);

  double scale() const { return scale_; }
  bool dynamic() const { return dynamic_; }

  // Called once per accumulation boundary with whether the gradients held an
  // inf or NaN.
  OverflowOutcome update(bool overflow);

  // State, for checkpoints and tests.
  int64_t iteration() const { return iter_; }
  int64_t last_overflow_iteration() const { return last_overflow_iter_; }
  int hysteresis_left() const { return hysteresis_left_; }
  // Puts back what a checkpoint saved, where it is a dynamic scaler's state
  // and this scaler is dynamic too: a static scale or scaling off (bf16,
  // fp32) is the job's setting, which a checkpoint of another setting must
  // not change (a dynamic fp16 run's 65536 would stay forever, and the
  // gradients of a trainer that does not scale its loss would be divided by
  // it). A checkpoint of no dynamic update (iteration 0: a static or
  // disabled scaler's, whose counters never move, or a dynamic one's before
  // its first update) holds nothing learned: this scaler starts over from
  // its own configured start. Whether the checkpoint's state was taken.
  bool restore(double scale, int64_t iteration, int64_t last_overflow_iteration, int hysteresis_left) {
    if (!dynamic_) return false;
    if (iteration <= 0) {
      *this = LossScaler(cfg_);
      return false;
    }
    scale_ = scale;
    iter_ = iteration;
    last_overflow_iter_ = last_overflow_iteration;
    hysteresis_left_ = hysteresis_left;
    return true;
  }

 private:
  LossScaleConfig cfg_;
  bool dynamic_;
  double scale_;
  int64_t iter_ = 0;
  int64_t last_overflow_iter_ = -1;
  int hysteresis_left_;
};

}  // namespace zerod
