// Adding byte counts that can pass 2^64: a plan of 1e18 parameters needs
// some 20 bytes for each. The sum stops at the largest count instead of
// wrapping to a small one, so a total too large to count is over every
// budget (and still under none: MemoryLedger::kNoBudget is that same count).
#pragma once

#include <cstdint>
#include <limits>

namespace zerod {

// What a saturated sum is: no count of bytes reaches it.
inline constexpr uint64_t kSaturatedBytes = std::numeric_limits<uint64_t>::max();

// a + b, or kSaturatedBytes where that does not fit in 64 bits.
inline constexpr uint64_t saturating_add(uint64_t a, uint64_t b) {
  return a > kSaturatedBytes - b ? kSaturatedBytes : a + b;
}

}  // namespace zerod
