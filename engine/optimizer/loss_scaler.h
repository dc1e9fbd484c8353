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
  // Puts back what a checkpoint saved.
  void restore(double scale, int64_t iteration, int64_t last_overflow_iteration, int hysteresis_left) {
    scale_ = scale;
    iter_ = iteration;
    last_overflow_iter_ = last_overflow_iteration;
    hysteresis_left_ = hysteresis_left;
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
