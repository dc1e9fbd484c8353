// Internal. One deadline for a whole operation (a frame, a connect), so a
// peer trickling bytes cannot stretch a timeout by restarting it per read.
#pragma once

#include <chrono>

namespace zerod::transport::detail {

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;

  // timeout_ms < 0: no deadline.
  explicit Deadline(int timeout_ms)
      : forever_(timeout_ms < 0),
        end_(Clock::now() + std::chrono::milliseconds(forever_ ? 0 : timeout_ms)) {}

  bool forever() const { return forever_; }

  // For poll(): -1 without a deadline, else the milliseconds left rounded up
  // (so poll never wakes just before the deadline and spins), 0 once past it.
  int poll_timeout() const {
    if (forever_) return -1;
    const auto left = end_ - Clock::now();
    if (left <= Clock::duration::zero()) return 0;
    return static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(left).count());
  }

  bool expired() const { return !forever_ && Clock::now() >= end_; }

 private:
  bool forever_;
  Clock::time_point end_;
};

}  // namespace zerod::transport::detail
