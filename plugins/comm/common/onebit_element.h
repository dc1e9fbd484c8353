// The per-element operations of the 1-bit kernels and the scalar loops built
// on them: the reference, and the tails of the vector paths.
//
// Internal linkage on purpose: this header is compiled into translation units
// with different -m flags, and a shared out-of-line copy could be an AVX2 one
// running on a baseline CPU. The vector paths must perform exactly these
// fp32 operations (no FMA: the library is built with -ffp-contract=off).
#ifndef ZEROD_PLUGINS_COMM_COMMON_ONEBIT_ELEMENT_H
#define ZEROD_PLUGINS_COMM_COMMON_ONEBIT_ELEMENT_H

#include <cstddef>
#include <cstdint>

#include "onebit_kernels.h"

namespace zerod::comm::onebit::detail {
namespace {

// sign(x) = +1 unless x < 0: zero of either sign (and NaN) count as +1.
inline bool positive(float x) { return !(x < 0.0f); }
// -scale by flipping the sign bit, as the vector paths do; branch-free, since
// the signs are random and a branch on them mispredicts half the time.
inline float with_sign(float scale, bool pos) {
  const uint32_t flip = static_cast<uint32_t>(!pos) << 31;
  return __builtin_bit_cast(float, __builtin_bit_cast(uint32_t, scale) ^ flip);
}

// The loops below start at `begin`, a multiple of 8, so that they can finish
// what a vector path left: whole bytes of bits.
// Each loop walks whole bytes with m = 8, a constant once inlined, then the
// last partial byte: no loop carries a dependency from one element to the
// next (the sums of squares keep one partial per bit position), so the
// compiler can vectorise the scalar path.

inline unsigned worker_pack_byte(const float* buf, const float* err, size_t i, size_t m, double* part) {
  unsigned byte = 0;
  for (size_t j = 0; j < m; ++j) {
    const float x = buf[i + j] + err[i + j];
    part[j] += double{x} * double{x};
    byte |= static_cast<unsigned>(positive(x)) << j;
  }
  return byte;
}

inline void worker_commit_byte(float* buf, float* err, size_t i, size_t m, float s, unsigned bits, float t) {
  for (size_t j = 0; j < m; ++j) {
    const float x = buf[i + j] + err[i + j];
    err[i + j] = x - with_sign(s, positive(x));
    buf[i + j] = with_sign(t, (bits >> j) & 1u);
  }
}

// y for the m <= 8 elements from i: the weighted signs in rank order from
// rank 0, then the error.
inline void server_y(const ServerInput& in, const float* err, size_t i, size_t m, float* y) {
  const unsigned first = in.bits[0][i / 8];
  for (size_t j = 0; j < m; ++j) y[j] = with_sign(in.w[0], (first >> j) & 1u);
  for (int32_t k = 1; k < in.world; ++k) {
    const unsigned bits = in.bits[k][i / 8];
    for (size_t j = 0; j < m; ++j) y[j] = y[j] + with_sign(in.w[k], (bits >> j) & 1u);
  }
  for (size_t j = 0; j < m; ++j) y[j] = y[j] + err[i + j];
}

inline unsigned server_pack_byte(const ServerInput& in, const float* err, size_t i, size_t m, double* part) {
  float y[8];
  server_y(in, err, i, m, y);
  unsigned byte = 0;
  for (size_t j = 0; j < m; ++j) {
    part[j] += double{y[j]} * double{y[j]};
    byte |= static_cast<unsigned>(positive(y[j])) << j;
  }
  return byte;
}

inline void server_commit_byte(const ServerInput& in, float* err, size_t i, size_t m, float t) {
  float y[8];
  server_y(in, err, i, m, y);
  for (size_t j = 0; j < m; ++j) err[i + j] = y[j] - with_sign(t, positive(y[j]));
}

inline double total(const double* part) {
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

inline double worker_pack_loop(const float* buf, const float* err, size_t begin, size_t n, uint8_t* out) {
  double part[8] = {};
  size_t i = begin;
  for (; i + 8 <= n; i += 8) out[i / 8] = static_cast<uint8_t>(worker_pack_byte(buf, err, i, 8, part));
  if (i < n) out[i / 8] = static_cast<uint8_t>(worker_pack_byte(buf, err, i, n - i, part));
  return total(part);
}

inline void worker_commit_loop(float* buf, float* err, size_t begin, size_t n, float s, const uint8_t* server,
                               float t) {
  size_t i = begin;
  for (; i + 8 <= n; i += 8) worker_commit_byte(buf, err, i, 8, s, server[i / 8], t);
  if (i < n) worker_commit_byte(buf, err, i, n - i, s, server[i / 8], t);
}

inline double server_pack_loop(const ServerInput& in, const float* err, size_t begin, size_t n, uint8_t* out) {
  double part[8] = {};
  size_t i = begin;
  for (; i + 8 <= n; i += 8) out[i / 8] = static_cast<uint8_t>(server_pack_byte(in, err, i, 8, part));
  if (i < n) out[i / 8] = static_cast<uint8_t>(server_pack_byte(in, err, i, n - i, part));
  return total(part);
}

inline void server_commit_loop(const ServerInput& in, float* err, size_t begin, size_t n, float t) {
  size_t i = begin;
  for (; i + 8 <= n; i += 8) server_commit_byte(in, err, i, 8, t);
  if (i < n) server_commit_byte(in, err, i, n - i, t);
}

}  // namespace
}  // namespace zerod::comm::onebit::detail

#endif  // ZEROD_PLUGINS_COMM_COMMON_ONEBIT_ELEMENT_H
