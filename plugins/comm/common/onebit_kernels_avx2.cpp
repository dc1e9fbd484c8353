// AVX2 + FMA kernels. Built with -mavx2 -mfma; used only after
// isa_supported(Isa::avx2). Bodies of 32 elements (one 32-bit word of signs),
// then 8 (one byte), then the scalar loop for the last partial byte.
//
// The signs go out with movemask (lane j -> bit j) and come back by
// broadcasting a word of bits and comparing each lane with its own bit; a set
// bit leaves the scale positive, a clear one sets its sign bit (xor), which
// is exactly the scalar with_sign().
#include <immintrin.h>

#include <cstring>

#include "onebit_element.h"

namespace zerod::comm::onebit::detail::avx2 {
namespace {

// Lane j of group g (0..3) tests bit 8g + j of a 32-bit word of signs.
inline __m256i lane_bits(int g) {
  const int b = 8 * g;
  return _mm256_setr_epi32(1 << b, 1 << (b + 1), 1 << (b + 2), 1 << (b + 3), 1 << (b + 4), 1 << (b + 5), 1 << (b + 6),
                           static_cast<int>(1u << (b + 7)));
}

struct Consts {
  __m256 zero = _mm256_setzero_ps();
  __m256 sign = _mm256_set1_ps(-0.0f);
  __m256i lanes[4] = {lane_bits(0), lane_bits(1), lane_bits(2), lane_bits(3)};
};

inline uint32_t load_word(const uint8_t* p) {
  uint32_t w;
  std::memcpy(&w, p, 4);
  return w;
}

inline void store_word(uint8_t* p, uint32_t w) { std::memcpy(p, &w, 4); }

// +scale where the word's bit for the lane is set, -scale where it is clear.
inline __m256 signed_by_bits(const Consts& c, __m256 scale, __m256i word, int g) {
  const __m256i set = _mm256_cmpeq_epi32(_mm256_and_si256(word, c.lanes[g]), c.lanes[g]);
  return _mm256_xor_ps(scale, _mm256_andnot_ps(_mm256_castsi256_ps(set), c.sign));
}

// +scale where x is not negative, -scale where it is (NaN: +scale).
inline __m256 signed_by_value(const Consts& c, __m256 scale, __m256 x) {
  const __m256 neg = _mm256_cmp_ps(x, c.zero, _CMP_LT_OQ);
  return _mm256_xor_ps(scale, _mm256_and_ps(neg, c.sign));
}

inline uint32_t sign_bits(const Consts& c, __m256 x) {
  return static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(x, c.zero, _CMP_NLT_UQ)));
}

// Sum of squares in double: fp32 squares would lose the 1e-7 relative
// accuracy of the scale over millions of elements.
struct SquareSum {
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  void add(__m256 x) {
    const __m256d a = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    const __m256d b = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    lo = _mm256_fmadd_pd(a, a, lo);
    hi = _mm256_fmadd_pd(b, b, hi);
  }
};

double total(const SquareSum* sums, int count) {
  __m256d a = _mm256_setzero_pd();
  for (int g = 0; g < count; ++g) a = _mm256_add_pd(a, _mm256_add_pd(sums[g].lo, sums[g].hi));
  alignas(32) double d[4];
  _mm256_store_pd(d, a);
  return (d[0] + d[1]) + (d[2] + d[3]);
}

double worker_pack(const float* buf, const float* err, size_t n, uint8_t* out) {
  const Consts c;
  SquareSum sums[4];
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    uint32_t word = 0;
    for (int g = 0; g < 4; ++g) {
      const size_t o = i + 8 * static_cast<size_t>(g);
      const __m256 x = _mm256_add_ps(_mm256_loadu_ps(buf + o), _mm256_loadu_ps(err + o));
      word |= sign_bits(c, x) << (8 * g);
      sums[g].add(x);
    }
    store_word(out + i / 8, word);
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_add_ps(_mm256_loadu_ps(buf + i), _mm256_loadu_ps(err + i));
    out[i / 8] = static_cast<uint8_t>(sign_bits(c, x));
    sums[0].add(x);
  }
  return total(sums, 4) + worker_pack_loop(buf, err, i, n, out);
}

void worker_commit(float* buf, float* err, size_t n, float s, const uint8_t* server, float t) {
  const Consts c;
  const __m256 sv = _mm256_set1_ps(s), tv = _mm256_set1_ps(t);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i word = _mm256_set1_epi32(static_cast<int>(load_word(server + i / 8)));
    for (int g = 0; g < 4; ++g) {
      const size_t o = i + 8 * static_cast<size_t>(g);
      const __m256 x = _mm256_add_ps(_mm256_loadu_ps(buf + o), _mm256_loadu_ps(err + o));
      _mm256_storeu_ps(err + o, _mm256_sub_ps(x, signed_by_value(c, sv, x)));
      _mm256_storeu_ps(buf + o, signed_by_bits(c, tv, word, g));
    }
  }
  for (; i + 8 <= n; i += 8) {
    const __m256i word = _mm256_set1_epi32(server[i / 8]);
    const __m256 x = _mm256_add_ps(_mm256_loadu_ps(buf + i), _mm256_loadu_ps(err + i));
    _mm256_storeu_ps(err + i, _mm256_sub_ps(x, signed_by_value(c, sv, x)));
    _mm256_storeu_ps(buf + i, signed_by_bits(c, tv, word, 0));
  }
  worker_commit_loop(buf, err, i, n, s, server, t);
}

// y for 8 * G elements from element i (i a multiple of 8): the weighted signs
// in rank order, then the error, as server_y() does per element.
// The 32 (G = 4) or 8 (G = 1) sign bits of rank k's block from element i.
template <int G>
inline __m256i rank_word(const ServerInput& in, int32_t k, size_t i) {
  const uint32_t word = G == 4 ? load_word(in.bits[k] + i / 8) : uint32_t{in.bits[k][i / 8]};
  return _mm256_set1_epi32(static_cast<int>(word));
}

// y for 8 * G elements from element i (i a multiple of 8): the weighted signs
// in rank order, then the error, as server_y() does per element.
template <int G>
inline void server_block(const Consts& c, const ServerInput& in, const float* err, size_t i, __m256* y) {
  {
    const __m256 w = _mm256_set1_ps(in.w[0]);
    const __m256i word = rank_word<G>(in, 0, i);
    for (int g = 0; g < G; ++g) y[g] = signed_by_bits(c, w, word, g);
  }
  for (int32_t k = 1; k < in.world; ++k) {
    const __m256 w = _mm256_set1_ps(in.w[k]);
    const __m256i word = rank_word<G>(in, k, i);
    for (int g = 0; g < G; ++g) y[g] = _mm256_add_ps(y[g], signed_by_bits(c, w, word, g));
  }
  for (int g = 0; g < G; ++g) y[g] = _mm256_add_ps(y[g], _mm256_loadu_ps(err + i + 8 * static_cast<size_t>(g)));
}

double server_pack(const ServerInput& in, const float* err, size_t n, uint8_t* out) {
  const Consts c;
  SquareSum sums[4];
  size_t i = 0;
  __m256 y[4];
  for (; i + 32 <= n; i += 32) {
    server_block<4>(c, in, err, i, y);
    uint32_t word = 0;
    for (int g = 0; g < 4; ++g) {
      word |= sign_bits(c, y[g]) << (8 * g);
      sums[g].add(y[g]);
    }
    store_word(out + i / 8, word);
  }
  for (; i + 8 <= n; i += 8) {
    server_block<1>(c, in, err, i, y);
    out[i / 8] = static_cast<uint8_t>(sign_bits(c, y[0]));
    sums[0].add(y[0]);
  }
  return total(sums, 4) + server_pack_loop(in, err, i, n, out);
}

void server_commit(const ServerInput& in, float* err, size_t n, float t) {
  const Consts c;
  const __m256 tv = _mm256_set1_ps(t);
  size_t i = 0;
  __m256 y[4];
  for (; i + 32 <= n; i += 32) {
    server_block<4>(c, in, err, i, y);
    for (int g = 0; g < 4; ++g) {
      _mm256_storeu_ps(err + i + 8 * static_cast<size_t>(g), _mm256_sub_ps(y[g], signed_by_value(c, tv, y[g])));
    }
  }
  for (; i + 8 <= n; i += 8) {
    server_block<1>(c, in, err, i, y);
    _mm256_storeu_ps(err + i, _mm256_sub_ps(y[0], signed_by_value(c, tv, y[0])));
  }
  server_commit_loop(in, err, i, n, t);
}

}  // namespace

const Kernels kTable = {worker_pack, worker_commit, server_pack, server_commit};

}  // namespace zerod::comm::onebit::detail::avx2
