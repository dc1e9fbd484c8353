// Rounding sizes and offsets up to an alignment, for every engine file that
// lays out buffers (registry, tiers, the NVMe pipeline, the plan).
#pragma once

#include <cstdint>

namespace zerod {

// v rounded up to a multiple of a (a > 0).
inline uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

}  // namespace zerod
