#include "runtime/dtype.h"

#include "error.h"

#include <cstring>

namespace zerod {

bool dtype_valid(zd_dtype dt) {
  return dt == ZD_DTYPE_F32 || dt == ZD_DTYPE_BF16 || dt == ZD_DTYPE_F16;
}

size_t dtype_size(zd_dtype dt) {
  switch (dt) {
    case ZD_DTYPE_F32: return 4;
    case ZD_DTYPE_BF16:
    case ZD_DTYPE_F16: return 2;
    default: return 0;
  }
}

const char* dtype_name(zd_dtype dt) {
  switch (dt) {
    case ZD_DTYPE_F32: return "f32";
    case ZD_DTYPE_BF16: return "bf16";
    case ZD_DTYPE_F16: return "f16";
    default: return "invalid";
  }
}

uint64_t checked_bytes(uint64_t numel, zd_dtype dt, const std::string& what) {
  if (!dtype_valid(dt))
    fail(ZD_ERR_INVALID_ARGUMENT, what + " has an invalid dtype (" + std::to_string(dt) + ")");
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(dt)), &bytes))
    fail(ZD_ERR_INVALID_ARGUMENT, what + ": " + std::to_string(numel) + " elements of " +
                                      dtype_name(dt) + " do not fit in 64 bits of bytes");
  return bytes;
}

const char* precision_name(zd_dtype dt) {
  switch (dt) {
    case ZD_DTYPE_F32: return "fp32";
    case ZD_DTYPE_BF16: return "bf16";
    case ZD_DTYPE_F16: return "fp16";
    default: return "invalid";
  }
}

zd_dtype dtype_from_name(const std::string& name) {
  if (name == "fp32" || name == "f32" || name == "float32") return ZD_DTYPE_F32;
  if (name == "bf16" || name == "bfloat16") return ZD_DTYPE_BF16;
  if (name == "fp16" || name == "f16" || name == "float16") return ZD_DTYPE_F16;
  return 0;
}

void convert(const void* src, zd_dtype src_dt, void* dst, zd_dtype dst_dt, size_t n) {
  if (src_dt == dst_dt) {
    std::memcpy(dst, src, n * dtype_size(src_dt));
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    const float v = load_as_float(src, src_dt, i);
    switch (dst_dt) {
      case ZD_DTYPE_F32: static_cast<float*>(dst)[i] = v; break;
      case ZD_DTYPE_BF16: static_cast<uint16_t*>(dst)[i] = f32_to_bf16(v); break;
      default: static_cast<uint16_t*>(dst)[i] = f32_to_f16(v); break;
    }
  }
}

}  // namespace zerod
