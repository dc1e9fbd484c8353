// fp16 loss scaling. With a static scale the scale never changes; with the
// dynamic scaler (DeepSpeed's rules) an overflow lowers the scale — after
// `hysteresis` overflows in a row unless the scale is already at its minimum —
// and `window` clean steps since the last overflow double it.
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
  int hysteresis = 2;              // overflows tolerated before the scale halves
  bool consecutive_hysteresis = false;  // refill hysteresis after every clean step
  double min_scale = 1.0;
};

class LossScaler {
 public:
  explicit LossScaler(const LossScaleConfig& cfg);

  double scale() const { return scale_; }
  bool dynamic() const { return dynamic_; }

  // Called once per accumulation boundary with whether the gradients held an
  // inf or NaN.
  void update(bool overflow);

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
