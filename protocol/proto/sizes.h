// Sizes that cross the socket, checked before anything is allocated or
// mapped: the staging memfd's, and the bytes a tensor's shape and dtype
// imply. Both sides use these, so a client never asks for what the daemon
// would refuse, and the daemon never trusts a client's arithmetic.
#pragma once

#include <zerod/zerod.h>

#include <cstdint>
#include <span>
#include <string>

namespace zerod::wire {

// The largest staging memfd either side makes or maps. It holds one whole
// tensor at a time (zd_param_read, the initial values of a registration),
// so this bounds the tensors that move through it; 1 TiB is far above any
// real parameter and far below the address space.
inline constexpr uint64_t kMaxStagingBytes = uint64_t{1} << 40;

// The most elements a tensor may have: the engine's registry refuses larger
// ones too (engine/model/registry.cpp), so this only moves the refusal before any
// arithmetic on the size.
inline constexpr uint64_t kMaxNumel = uint64_t{1} << 47;

// The most ranks a job may have: the world size a hello claims is refused
// above it before the daemon makes anything for the job, and libzerod
// refuses ZEROD_WORLD_SIZE, ZEROD_RANK and the like above it.
inline constexpr int kMaxWorldSize = 1 << 20;

// Elements of a tensor of this shape: 1..ZD_MAX_DIMS extents, each > 0,
// their product at most kMaxNumel, computed without overflow. Throws
// ZD_ERR_INVALID_ARGUMENT beginning with `what` ("parameter 'w1'").
uint64_t checked_numel(std::span<const int64_t> shape, const std::string& what);

// (The bytes of numel elements of a dtype: checked_bytes, engine/runtime/dtype.h,
// beside the dtype table it reads.)

// Checks that [offset, offset + bytes) lies inside a region of `size`
// bytes, without computing offset + bytes (which may wrap). Throws
// ZD_ERR_INVALID_ARGUMENT beginning with `what`.
void check_range(uint64_t offset, uint64_t bytes, uint64_t size, const std::string& what);

}  // namespace zerod::wire
