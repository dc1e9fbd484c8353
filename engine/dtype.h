// Element types and the scalar conversions between them. Conversions to
// 16-bit round to nearest even and keep NaN a NaN, matching what the
// optimizer kernels write, so a value read back equals the working copy.
#pragma once

#include <zerod/zerod.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace zerod {

bool dtype_valid(zd_dtype dt);
size_t dtype_size(zd_dtype dt);        // 0 for an invalid dtype
const char* dtype_name(zd_dtype dt);   // "f32", "bf16", "f16", or "invalid"
// The job-script spelling of a precision: "fp32", "bf16", "fp16".
const char* precision_name(zd_dtype dt);
// Parses "fp32"/"f32"/"float32", "bf16"/"bfloat16", "fp16"/"f16"/"float16"; 0 if unknown.
zd_dtype dtype_from_name(const std::string& name);

inline float bf16_to_float(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float f16_to_float(uint16_t h);
uint16_t float_to_f16(float f);

// Converts n elements between any two dtypes (src and dst must not overlap).
void convert(const void* src, zd_dtype src_dt, void* dst, zd_dtype dst_dt, size_t n);

// Reads element i of a buffer of dtype dt as float.
inline float load_as_float(const void* p, zd_dtype dt, size_t i) {
  switch (dt) {
    case ZD_DTYPE_F32: return static_cast<const float*>(p)[i];
    case ZD_DTYPE_BF16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    default: return f16_to_float(static_cast<const uint16_t*>(p)[i]);
  }
}

}  // namespace zerod
