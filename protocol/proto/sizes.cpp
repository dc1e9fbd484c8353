#include "sizes.h"

#include "error.h"

namespace zerod::wire {

uint64_t checked_numel(std::span<const int64_t> shape, const std::string& what) {
  if (shape.empty() || shape.size() > ZD_MAX_DIMS)
    fail(ZD_ERR_INVALID_ARGUMENT, what + " has " + std::to_string(shape.size()) + " dimensions; 1.." +
                                      std::to_string(ZD_MAX_DIMS) + " are allowed");
  uint64_t numel = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] <= 0)
      fail(ZD_ERR_INVALID_ARGUMENT, what + " has extent " + std::to_string(shape[i]) + " in dimension " +
                                        std::to_string(i) + "; extents must be positive");
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(shape[i]), &numel) || numel > kMaxNumel)
      fail(ZD_ERR_INVALID_ARGUMENT, what + " is too large: its extents multiply to more than " +
                                        std::to_string(kMaxNumel) + " elements");
  }
  return numel;
}

void check_range(uint64_t offset, uint64_t bytes, uint64_t size, const std::string& what) {
  if (offset > size || bytes > size - offset)
    fail(ZD_ERR_INVALID_ARGUMENT, what + ": the range [" + std::to_string(offset) + ", +" +
                                      std::to_string(bytes) + ") is outside its " + std::to_string(size) +
                                      " bytes");
}

}  // namespace zerod::wire
