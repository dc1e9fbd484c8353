// The one clock every trace event and metric is measured with: the
// monotonic clock in nanoseconds (steady across threads, unaffected by
// wall-clock changes).
#pragma once

#include <chrono>
#include <cstdint>

namespace zerod::observe {

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace zerod::observe
