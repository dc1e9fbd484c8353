// Element types and the conversions between them. The scalar fp32 <->
// bf16/fp16 conversions are the kit's (zerod/kit/half.h: nearest even,
// PyTorch's NaN rule), the same functions the optimizer and comm kernels use,
// so a value read back equals the working copy a plugin wrote.
#pragma once

#include <zerod/kit/half.h>
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

// numel elements of dt in bytes, without overflow; dt must be valid.
// Throws ZD_ERR_INVALID_ARGUMENT beginning with `what`. Both ends of the
// daemon protocol size a tensor's bytes with it (protocol/proto/sizes.h
// checks the shape: checked_numel).
uint64_t checked_bytes(uint64_t numel, zd_dtype dt, const std::string& what);

// Converts n elements between any two dtypes (src and dst must not overlap).
void convert(const void* src, zd_dtype src_dt, void* dst, zd_dtype dst_dt, size_t n);

// Reads element i of a buffer of dtype dt as float.
inline float load_as_float(const void* p, zd_dtype dt, size_t i) {
  switch (dt) {
    case ZD_DTYPE_F32: return static_cast<const float*>(p)[i];
    case ZD_DTYPE_BF16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    default: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
  }
}

}  // namespace zerod
