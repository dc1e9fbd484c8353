#include "dtype.h"

#include <cmath>

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

float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: value = mant * 2^-24
      float f = std::ldexp(static_cast<float>(mant), -24);
      return sign ? -f : f;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t float_to_f16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;  // NaN stays a (quiet) NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u; // rounds to or beyond inf
  if (abs < 0x38800000u) {                       // below the smallest normal half
    // Scale into the subnormal range and let the FPU round to nearest even.
    float a;
    std::memcpy(&a, &abs, sizeof a);
    const float scaled = a * 16777216.0f;  // 2^24: one unit of the half subnormal
    const uint32_t m = static_cast<uint32_t>(std::nearbyint(scaled));
    return sign | static_cast<uint16_t>(m);
  }
  // Normal: rebias the exponent, round the 13 dropped mantissa bits to even.
  uint32_t h = ((abs >> 13) - (112u << 10));
  const uint32_t rest = abs & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h += 1;
  return sign | static_cast<uint16_t>(h);
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
      case ZD_DTYPE_BF16: static_cast<uint16_t*>(dst)[i] = float_to_bf16(v); break;
      default: static_cast<uint16_t*>(dst)[i] = float_to_f16(v); break;
    }
  }
}

}  // namespace zerod
