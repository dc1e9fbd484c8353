// Each 1-bit kernel path against the scalar reference (onebit_kernels.h):
// signs and fp32 values bit for bit, sums of squares within 1e-12 relative
// (only their summation order may differ), nothing written past a piece's
// last byte of signs; and the bit order itself.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "onebit_kernels.h"
#include "test_print.h"

namespace zerod::comm::onebit::detail {
namespace {

constexpr uint8_t kGuard = 0xCC;
constexpr size_t kSizes[] = {0, 1, 7, 8, 9, 31, 32, 33, 63, 64, 65, 1000, 4099};

std::vector<float> random_floats(std::mt19937_64& rng, size_t n) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  // Zeros of both signs must pack as +1 on every path.
  if (n > 5) v[5] = 0.0f;
  if (n > 40) v[40] = -0.0f;
  return v;
}

std::vector<uint8_t> random_bits(std::mt19937_64& rng, size_t n) {
  std::vector<uint8_t> v((n + 7) / 8 + 4, kGuard);
  for (size_t i = 0; i < (n + 7) / 8; ++i) v[i] = static_cast<uint8_t>(rng());
  return v;
}

bool bits_equal(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) { return a == b; }

bool floats_identical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

void expect_sum_close(double got, double want) {
  EXPECT_LE(std::fabs(got - want), 1e-12 * std::max(1.0, std::fabs(want))) << "got " << got << ", want " << want;
}

class Paths : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!isa_supported(GetParam())) GTEST_SKIP() << "this CPU cannot run the " << isa_name(GetParam()) << " path";
  }
  const Kernels& k() const { return kernels(GetParam()); }
  const Kernels& ref() const { return kernels(Isa::scalar); }
};

TEST_P(Paths, WorkerPackMatchesScalar) {
  std::mt19937_64 rng(1);
  for (const size_t n : kSizes) {
    SCOPED_TRACE("n = " + std::to_string(n));
    const auto buf = random_floats(rng, n), err = random_floats(rng, n);
    std::vector<uint8_t> got((n + 7) / 8 + 4, kGuard), want = got;
    const double gs = k().worker_pack(buf.data(), err.data(), n, got.data());
    const double ws = ref().worker_pack(buf.data(), err.data(), n, want.data());
    EXPECT_TRUE(bits_equal(got, want));
    expect_sum_close(gs, ws);
    // The guard bytes past the signs are intact.
    for (size_t i = (n + 7) / 8; i < got.size(); ++i) ASSERT_EQ(got[i], kGuard) << "byte " << i;
  }
}

TEST_P(Paths, WorkerCommitMatchesScalar) {
  std::mt19937_64 rng(2);
  for (const size_t n : kSizes) {
    SCOPED_TRACE("n = " + std::to_string(n));
    auto buf = random_floats(rng, n), err = random_floats(rng, n);
    const auto server = random_bits(rng, n);
    auto buf2 = buf, err2 = err;
    k().worker_commit(buf.data(), err.data(), n, 0.37f, server.data(), 0.11f);
    ref().worker_commit(buf2.data(), err2.data(), n, 0.37f, server.data(), 0.11f);
    EXPECT_TRUE(floats_identical(buf, buf2));
    EXPECT_TRUE(floats_identical(err, err2));
  }
}

// World sizes that reach the first-rank and the accumulating code.
constexpr int32_t kWorlds[] = {1, 2, 3, 5};

struct Server {
  std::vector<std::vector<uint8_t>> blocks;
  std::vector<const uint8_t*> bits;
  std::vector<float> w;
  Server(std::mt19937_64& rng, int32_t world, size_t n) {
    for (int32_t r = 0; r < world; ++r) {
      blocks.push_back(random_bits(rng, n));
      w.push_back(0.1f * static_cast<float>(r + 1));
    }
    for (const auto& b : blocks) bits.push_back(b.data());
  }
  ServerInput input() const { return {bits.data(), w.data(), static_cast<int32_t>(w.size())}; }
};

TEST_P(Paths, ServerPackMatchesScalar) {
  std::mt19937_64 rng(3);
  for (const int32_t world : kWorlds) {
    for (const size_t n : kSizes) {
      SCOPED_TRACE("world = " + std::to_string(world) + ", n = " + std::to_string(n));
      const Server s(rng, world, n);
      const auto err = random_floats(rng, n);
      std::vector<uint8_t> got((n + 7) / 8 + 4, kGuard), want = got;
      const double gs = k().server_pack(s.input(), err.data(), n, got.data());
      const double ws = ref().server_pack(s.input(), err.data(), n, want.data());
      EXPECT_TRUE(bits_equal(got, want));
      expect_sum_close(gs, ws);
      for (size_t i = (n + 7) / 8; i < got.size(); ++i) ASSERT_EQ(got[i], kGuard) << "byte " << i;
    }
  }
}

TEST_P(Paths, ServerCommitMatchesScalar) {
  std::mt19937_64 rng(4);
  for (const int32_t world : kWorlds) {
    for (const size_t n : kSizes) {
      SCOPED_TRACE("world = " + std::to_string(world) + ", n = " + std::to_string(n));
      const Server s(rng, world, n);
      auto err = random_floats(rng, n);
      auto err2 = err;
      k().server_commit(s.input(), err.data(), n, 0.23f);
      ref().server_commit(s.input(), err2.data(), n, 0.23f);
      EXPECT_TRUE(floats_identical(err, err2));
    }
  }
}

// Bit j of byte i is element 8i + j, set for not negative: +0, -0 and NaN
// included. The pattern is placed in a 32-element body and in a tail.
TEST_P(Paths, BitOrderAndZeros) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float pattern[9] = {1.0f, -1.0f, 0.0f, -0.0f, nan, -2.0f, 3.0f, -4.0f, 5.0f};
  for (const size_t at : {size_t{0}, size_t{32}}) {
    const size_t n = at + 9;
    std::vector<float> buf(n, 1.0f), err(n, 0.0f);
    for (size_t j = 0; j < 9; ++j) buf[at + j] = pattern[j];
    std::vector<uint8_t> out((n + 7) / 8, 0xAA);
    k().worker_pack(buf.data(), err.data(), n, out.data());
    EXPECT_EQ(out[at / 8], 0x5D) << "at " << at;      // 0b01011101: elements 0, 2, 3, 4, 6
    EXPECT_EQ(out[at / 8 + 1], 0x01) << "at " << at;  // element 8; the unused high bits are 0
  }
}

// The values the commit writes: err = x - s sign(x), buf = +-t by the bits.
TEST_P(Paths, CommitValues) {
  std::vector<float> buf = {0.5f, -0.25f, 0.0f, -0.0f, 2.0f, -3.0f, 1.0f, -1.0f, 0.75f};
  std::vector<float> err(9, 0.25f);
  const std::vector<uint8_t> server = {0x0F, 0x01};
  k().worker_commit(buf.data(), err.data(), 9, 0.5f, server.data(), 2.0f);
  const std::vector<float> want_err = {0.25f, -0.5f, -0.25f, -0.25f, 1.75f, -2.25f, 0.75f, -0.25f, 0.5f};
  const std::vector<float> want_buf = {2, 2, 2, 2, -2, -2, -2, -2, 2};
  EXPECT_EQ(err, want_err);
  EXPECT_EQ(buf, want_buf);
}

INSTANTIATE_TEST_SUITE_P(Isas, Paths, ::testing::Values(Isa::scalar, Isa::avx2),
                         [](const ::testing::TestParamInfo<Isa>& i) { return std::string(isa_name(i.param)); });

TEST(Dispatch, BestIsSupported) {
  EXPECT_TRUE(isa_supported(best_isa()));
  EXPECT_TRUE(isa_supported(Isa::scalar));
}

}  // namespace
}  // namespace zerod::comm::onebit::detail
