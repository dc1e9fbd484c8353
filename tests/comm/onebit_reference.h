// A plain reference of compressed_all_reduce, written from the equations in
// zerod_plugin.h above zd_comm_v2 (not from the plugins' driver): one
// compressed average of W ranks' buffers, with each rank's error feedback.
// fp32 element arithmetic as the header states it, norms in double.
#ifndef ZEROD_TESTS_COMM_ONEBIT_REFERENCE_H
#define ZEROD_TESTS_COMM_ONEBIT_REFERENCE_H

#include <cmath>
#include <cstdint>
#include <vector>

namespace zerod::comm::test {

struct OnebitRank {
  std::vector<float> buf;           // in: values; out: the average
  std::vector<float> worker_error;  // count
  std::vector<float> server_error;  // chunk elements (this rank's chunk)
  std::vector<float> server_value;  // out: y of this rank's chunk (for the tolerance rule)
};

// c = count / W rounded up to a multiple of 8.
inline uint64_t ref_chunk(uint64_t count, int world) {
  const uint64_t w = static_cast<uint64_t>(world);
  return ((count + w - 1) / w + 7) / 8 * 8;
}

inline float ref_sign(float v) { return v >= 0.0f ? 1.0f : -1.0f; }  // sign(0) = +1

// One call on every rank at once; ranks[r] is rank r's state.
inline void onebit_reference(std::vector<OnebitRank>& ranks, uint64_t count) {
  const int world = static_cast<int>(ranks.size());
  const uint64_t c = ref_chunk(count, world);
  auto begin = [&](int r) { return std::min<uint64_t>(static_cast<uint64_t>(r) * c, count); };
  auto end = [&](int r) { return std::min<uint64_t>(static_cast<uint64_t>(r + 1) * c, count); };
  // Workers: x = buf + worker_error; s = ||x|| / sqrt(count);
  // worker_error = x - s sign(x).
  std::vector<float> s(ranks.size());
  std::vector<std::vector<float>> signs(ranks.size(), std::vector<float>(count));
  for (int k = 0; k < world; ++k) {
    OnebitRank& w = ranks[k];
    double sq = 0;
    std::vector<float> x(count);
    for (uint64_t i = 0; i < count; ++i) {
      x[i] = w.buf[i] + w.worker_error[i];
      sq += static_cast<double>(x[i]) * x[i];
      signs[k][i] = ref_sign(x[i]);
    }
    s[k] = static_cast<float>(std::sqrt(sq / static_cast<double>(count)));
    for (uint64_t i = 0; i < count; ++i) w.worker_error[i] = x[i] - s[k] * signs[k][i];
  }
  // Servers: y = (1/W) sum_k s_k sign_k + server_error; t = ||y|| / sqrt(n_r);
  // server_error = y - t sign(y); chunk r of the result = t sign(y).
  std::vector<std::vector<float>> result(ranks.size());
  for (int r = 0; r < world; ++r) {
    OnebitRank& sv = ranks[r];
    const uint64_t n = end(r) - begin(r);
    sv.server_value.assign(n, 0.0f);
    double sq = 0;
    for (uint64_t i = 0; i < n; ++i) {
      double sum = 0;
      for (int k = 0; k < world; ++k) sum += static_cast<double>(s[k]) * signs[k][begin(r) + i];
      const float y = static_cast<float>(sum / world) + sv.server_error[i];
      sv.server_value[i] = y;
      sq += static_cast<double>(y) * y;
    }
    const float t = n == 0 ? 0.0f : static_cast<float>(std::sqrt(sq / static_cast<double>(n)));
    result[r].resize(n);
    for (uint64_t i = 0; i < n; ++i) {
      const float y = sv.server_value[i];
      result[r][i] = t * ref_sign(y);
      sv.server_error[i] = y - result[r][i];
    }
  }
  for (auto& w : ranks) {
    for (int r = 0; r < world; ++r) {
      for (uint64_t i = 0; i < end(r) - begin(r); ++i) w.buf[begin(r) + i] = result[r][i];
    }
  }
}

}  // namespace zerod::comm::test

#endif  // ZEROD_TESTS_COMM_ONEBIT_REFERENCE_H
