#include "grad_math.h"

#include "dtype.h"

#include <cmath>

namespace zerod {

namespace {

inline void store_float(void* p, zd_dtype dt, uint64_t i, float v) {
  switch (dt) {
    case ZD_DTYPE_F32: static_cast<float*>(p)[i] = v; break;
    case ZD_DTYPE_BF16: static_cast<uint16_t*>(p)[i] = float_to_bf16(v); break;
    default: static_cast<uint16_t*>(p)[i] = float_to_f16(v); break;
  }
}

}  // namespace

void accumulate(const void* src, zd_dtype src_dt, void* dst, zd_dtype dst_dt, uint64_t n) {
  if (src_dt == ZD_DTYPE_F32 && dst_dt == ZD_DTYPE_F32) {
    const float* s = static_cast<const float*>(src);
    float* d = static_cast<float*>(dst);
    for (uint64_t i = 0; i < n; ++i) d[i] += s[i];
    return;
  }
  if (src_dt == ZD_DTYPE_BF16 && dst_dt == ZD_DTYPE_F32) {
    // 16-bit gradients into fp32 accumulators, the usual mixed-precision
    // case (a GPU's bf16 gradients added on the host): the widening is a
    // shift, so the loop vectorises, where the generic one below switches
    // on both dtypes per element. The same sums, bit for bit.
    const uint16_t* __restrict s = static_cast<const uint16_t*>(src);
    float* __restrict d = static_cast<float*>(dst);
    for (uint64_t i = 0; i < n; ++i) d[i] += bf16_to_float(s[i]);
    return;
  }
  for (uint64_t i = 0; i < n; ++i)
    store_float(dst, dst_dt, i, load_as_float(dst, dst_dt, i) + load_as_float(src, src_dt, i));
}

void assign_to_zero(const void* src, zd_dtype src_dt, void* dst, zd_dtype dst_dt, uint64_t n) {
  if (src_dt == ZD_DTYPE_BF16 && dst_dt == ZD_DTYPE_F32) {
    const uint16_t* __restrict s = static_cast<const uint16_t*>(src);
    float* __restrict d = static_cast<float*>(dst);
    for (uint64_t i = 0; i < n; ++i) d[i] = 0.0f + bf16_to_float(s[i]);
    return;
  }
  for (uint64_t i = 0; i < n; ++i) store_float(dst, dst_dt, i, 0.0f + load_as_float(src, src_dt, i));
}

void accumulate_scaled(const void* src, zd_dtype src_dt, void* dst, zd_dtype dst_dt, uint64_t n,
                       float factor) {
  if (src_dt == ZD_DTYPE_F32 && dst_dt == ZD_DTYPE_F32) {
    const float* s = static_cast<const float*>(src);
    float* d = static_cast<float*>(dst);
    for (uint64_t i = 0; i < n; ++i) d[i] += factor * s[i];
    return;
  }
  for (uint64_t i = 0; i < n; ++i)
    store_float(dst, dst_dt, i, load_as_float(dst, dst_dt, i) + factor * load_as_float(src, src_dt, i));
}

void scale_in_place(void* p, zd_dtype dt, uint64_t n, float factor) {
  if (dt == ZD_DTYPE_F32) {
    float* d = static_cast<float*>(p);
    for (uint64_t i = 0; i < n; ++i) d[i] *= factor;
    return;
  }
  for (uint64_t i = 0; i < n; ++i) store_float(p, dt, i, factor * load_as_float(p, dt, i));
}

GradStats grad_stats(const void* data, zd_dtype dt, uint64_t n) {
  // Four partial sums let the loop pipeline; their order is fixed, so the
  // result is the same on every run.
  double acc[4] = {0, 0, 0, 0};
  uint64_t i = 0;
  if (dt == ZD_DTYPE_F32) {
    const float* p = static_cast<const float*>(data);
    for (; i + 4 <= n; i += 4)
      for (int k = 0; k < 4; ++k) acc[k] += static_cast<double>(p[i + k]) * p[i + k];
    for (; i < n; ++i) acc[0] += static_cast<double>(p[i]) * p[i];
  } else {
    for (; i < n; ++i) {
      const double v = load_as_float(data, dt, i);
      acc[i & 3] += v * v;
    }
  }
  GradStats s;
  s.sumsq = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  s.finite = std::isfinite(s.sumsq);
  return s;
}

}  // namespace zerod
