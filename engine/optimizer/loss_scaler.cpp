#include "optimizer/loss_scaler.h"

#include <algorithm>
#include <cmath>

namespace zerod {

LossScaler::LossScaler(const LossScaleConfig& cfg)
    : cfg_(cfg),
      dynamic_(cfg.enabled && cfg.static_scale <= 0.0),
      scale_(!cfg.enabled ? 1.0
             : cfg.static_scale > 0.0 ? cfg.static_scale
                                      : std::ldexp(1.0, cfg.initial_scale_power)),
      hysteresis_left_(cfg.hysteresis) {}

OverflowOutcome LossScaler::update(bool overflow) {
  if (!dynamic_) return OverflowOutcome::kNone;
  OverflowOutcome outcome = OverflowOutcome::kNone;
  if (overflow) {
    if (cfg_.hysteresis <= 1 || hysteresis_left_ <= 1) {
      // DeepSpeed's test (update_scale): exactly at the minimum, where
      // halving changes nothing. A scale below it (2^initial_scale_power
      // under min_scale) is lifted to it instead.
      outcome = scale_ == cfg_.min_scale ? OverflowOutcome::kAtMinimum : OverflowOutcome::kHalved;
      scale_ = std::max(scale_ / 2.0, cfg_.min_scale);
    } else {
      --hysteresis_left_;
      outcome = OverflowOutcome::kTolerated;
    }
    last_overflow_iter_ = iter_;
  } else {
    if (cfg_.consecutive_hysteresis) hysteresis_left_ = cfg_.hysteresis;
    // Clean updates since the last overflow, this one included (>= 1);
    // DeepSpeed counts one fewer, so it doubles an update later and never
    // on a job's first update.
    const int64_t clean = iter_ - last_overflow_iter_ - (cfg_.deepspeed_window ? 1 : 0);
    if (clean > 0 && clean % cfg_.window == 0) {
      if (!cfg_.consecutive_hysteresis) hysteresis_left_ = cfg_.hysteresis;
      scale_ *= 2.0;
    }
  }
  ++iter_;
  return outcome;
}

}  // namespace zerod
