// The 1-bit driver (onebit.h) at world 1-4 over an in-process exchange of
// threads, against a double-precision transcription of the equations in
// zerod_plugin.h (above zd_comm_v2), over consecutive calls that carry the
// error feedback.
//
// Each call is checked as a function of the state it starts from: the
// reference takes the ranks' inputs and error buffers before the call and
// computes the result and the new errors; every value must be within 1e-6,
// except where the compensated server value |y| < 1e-6, whose sign fp32 and
// double may decide differently (DeepSpeed's test has the same exception).
// Starting each call from the implementation's own state keeps the rounding
// differences of one call from being amplified through a sign flip in the
// next; a driver that dropped or mis-updated an error buffer still fails the
// next call's check.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "onebit_kernels.h"
#include "test_print.h"
#include "thread_exchange.h"

namespace zerod::comm::onebit::test {
namespace {

using detail::Isa;

constexpr double kTol = 1e-6;

struct Rank {
  std::vector<float> buf, worker_error, server_error;
};

// The chunk length, written out again here rather than taken from the driver.
uint64_t ref_chunk(uint64_t count, int32_t world) {
  const uint64_t w = static_cast<uint64_t>(world);
  return ((count + w - 1) / w + 7) / 8 * 8;
}

uint64_t ref_elems(uint64_t count, uint64_t chunk, int32_t r) {
  const uint64_t b = static_cast<uint64_t>(r) * chunk;
  return b >= count ? 0 : std::min(chunk, count - b);
}

double sgn(double x) { return x < 0.0 ? -1.0 : 1.0; }

struct Expected {
  std::vector<double> result;                     // count values, the same on every rank
  std::vector<bool> ambiguous;                    // |y| < 1e-6 there
  std::vector<std::vector<double>> worker_error;  // per rank, count values
  std::vector<std::vector<double>> server_error;  // per rank, n_r values
};

Expected reference(const std::vector<Rank>& before, uint64_t count) {
  const int32_t world = static_cast<int32_t>(before.size());
  const uint64_t c = ref_chunk(count, world);
  Expected e;
  e.result.assign(count, 0.0);
  e.ambiguous.assign(count, false);
  // Worker: x = buf + worker_error, s = ||x|| / sqrt(count).
  std::vector<std::vector<double>> x(before.size());
  std::vector<double> s(before.size());
  for (size_t q = 0; q < before.size(); ++q) {
    double sum = 0.0;
    x[q].resize(count);
    for (uint64_t i = 0; i < count; ++i) {
      x[q][i] = double{before[q].buf[i]} + double{before[q].worker_error[i]};
      sum += x[q][i] * x[q][i];
    }
    s[q] = std::sqrt(sum / static_cast<double>(count));
    std::vector<double> we(count);
    for (uint64_t i = 0; i < count; ++i) we[i] = x[q][i] - s[q] * sgn(x[q][i]);
    e.worker_error.push_back(std::move(we));
  }
  // Server r: y = (1/W) sum_q s_q sign(x_q) + server_error over chunk r.
  for (int32_t r = 0; r < world; ++r) {
    const uint64_t b = static_cast<uint64_t>(r) * c, n = ref_elems(count, c, r);
    std::vector<double> y(n);
    double sum = 0.0;
    for (uint64_t i = 0; i < n; ++i) {
      double acc = 0.0;
      for (size_t q = 0; q < before.size(); ++q) acc += s[q] * sgn(x[q][b + i]);
      y[i] = acc / world + double{before[static_cast<size_t>(r)].server_error[i]};
      sum += y[i] * y[i];
    }
    const double t = n == 0 ? 0.0 : std::sqrt(sum / static_cast<double>(n));
    std::vector<double> se(n);
    for (uint64_t i = 0; i < n; ++i) {
      se[i] = y[i] - t * sgn(y[i]);
      e.result[b + i] = t * sgn(y[i]);
      e.ambiguous[b + i] = std::fabs(y[i]) < kTol;
    }
    e.server_error.push_back(std::move(se));
  }
  return e;
}

// World ranks' buffers and the calls on them.
class Ranks {
 public:
  Ranks(int32_t world, uint64_t count) : world_(world), count_(count), ranks_(static_cast<size_t>(world)) {
    const uint64_t c = ref_chunk(count, world);
    for (int32_t q = 0; q < world; ++q) {
      Rank& r = ranks_[static_cast<size_t>(q)];
      r.buf.assign(count, 0.0f);
      r.worker_error.assign(count, 0.0f);
      // Past the chunk's real elements the server error must stay as it is.
      r.server_error.assign(c, 0.0f);
      for (uint64_t i = ref_elems(count, c, q); i < c; ++i) r.server_error[i] = 7.0f;
    }
  }

  // New inputs as DeepSpeed's test draws them: uniform(-0.5, 0.5) + 0.01 rank.
  void draw(std::mt19937_64& rng) {
    std::uniform_real_distribution<float> u(-0.5f, 0.5f);
    for (size_t q = 0; q < ranks_.size(); ++q) {
      for (auto& v : ranks_[q].buf) v = u(rng) + 0.01f * static_cast<float>(q);
    }
  }

  std::vector<zd_status> call(Isa isa, ThreadExchange& ex, Fail fail = Fail::none) {
    std::vector<zd_status> st(ranks_.size(), ZD_ERR_INTERNAL);
    const detail::Kernels& k = detail::kernels(isa);
    ex.run([&](int32_t r) {
      Rank& me = ranks_[static_cast<size_t>(r)];
      st[static_cast<size_t>(r)] = detail::compressed_all_reduce_with(
          k, r, world_, me.buf.data(), count_, me.worker_error.data(), me.server_error.data(), ex.for_rank(r, fail));
    });
    return st;
  }

  std::vector<zd_status> call(Isa isa, Fail fail = Fail::none) {
    ThreadExchange ex(world_);
    return call(isa, ex, fail);
  }

  std::vector<Rank>& ranks() { return ranks_; }
  int32_t world() const { return world_; }
  uint64_t count() const { return count_; }

 private:
  int32_t world_;
  uint64_t count_;
  std::vector<Rank> ranks_;
};

// Checks one call's outcome against the reference of its starting state.
void expect_matches(const Expected& e, const std::vector<Rank>& before, const std::vector<Rank>& after,
                    uint64_t count) {
  const int32_t world = static_cast<int32_t>(after.size());
  const uint64_t c = ref_chunk(count, world);
  size_t bad = 0;
  auto check = [&](double got, double want, const char* what, size_t rank, uint64_t i) {
    if (std::fabs(got - want) <= kTol) return;
    if (bad++ < 5) ADD_FAILURE() << what << " of rank " << rank << " [" << i << "]: " << got << ", want " << want;
  };
  for (size_t q = 0; q < after.size(); ++q) {
    // The result is identical on every rank, bit for bit.
    ASSERT_EQ(std::memcmp(after[q].buf.data(), after[0].buf.data(), count * sizeof(float)), 0)
        << "rank " << q << " has another result than rank 0";
    for (uint64_t i = 0; i < count; ++i) {
      if (!e.ambiguous[i]) check(after[q].buf[i], e.result[i], "result", q, i);
      check(after[q].worker_error[i], e.worker_error[q][i], "worker_error", q, i);
    }
    const uint64_t n = ref_elems(count, c, static_cast<int32_t>(q)), b = q * c;
    for (uint64_t i = 0; i < c; ++i) {
      if (i >= n) {
        EXPECT_EQ(after[q].server_error[i], before[q].server_error[i]) << "past the chunk, rank " << q;
      } else if (!e.ambiguous[b + i]) {
        check(after[q].server_error[i], e.server_error[q][i], "server_error", q, i);
      }
    }
  }
  EXPECT_EQ(bad, 0u) << "values off by more than " << kTol;
}

std::vector<uint64_t> counts_for(int32_t world) {
  const uint64_t w8 = 8 * static_cast<uint64_t>(world);
  std::vector<uint64_t> out = {1, 2, 3, 7, w8, 5 * w8, 5 * w8 - 1, 37 * w8 + 5, 1000, 4099, 65536 + 3};
  if (world > 1) out.push_back(static_cast<uint64_t>(world) - 1);  // fewer elements than ranks
  return out;
}

using Param = std::tuple<Isa, int32_t>;

class Driver : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    if (!detail::isa_supported(isa())) GTEST_SKIP() << "this CPU cannot run the " << detail::isa_name(isa()) << " path";
  }
  Isa isa() const { return std::get<0>(GetParam()); }
  int32_t world() const { return std::get<1>(GetParam()); }
};

TEST_P(Driver, MatchesTheEquationsOverConsecutiveCalls) {
  std::mt19937_64 rng(1000 + static_cast<uint64_t>(world()));
  for (const uint64_t count : counts_for(world())) {
    SCOPED_TRACE("count = " + std::to_string(count));
    Ranks ranks(world(), count);
    for (int call = 0; call < 4; ++call) {
      SCOPED_TRACE("call " + std::to_string(call));
      ranks.draw(rng);
      const std::vector<Rank> before = ranks.ranks();
      for (const zd_status st : ranks.call(isa())) ASSERT_EQ(st, ZD_OK);
      expect_matches(reference(before, count), before, ranks.ranks(), count);
      if (HasFailure()) return;
    }
  }
}

// Error feedback: with the same inputs every call, the compression errors
// cancel over time, and the mean of the results approaches the true average
// (the sum over T calls differs from T * average by the error buffers only).
TEST_P(Driver, ErrorFeedbackAveragesOut) {
  const uint64_t count = 777;
  Ranks ranks(world(), count);
  std::mt19937_64 rng(7);
  ranks.draw(rng);
  const std::vector<Rank> inputs = ranks.ranks();
  std::vector<double> truth(count, 0.0), mean(count, 0.0);
  for (const Rank& r : inputs) {
    for (uint64_t i = 0; i < count; ++i) truth[i] += double{r.buf[i]} / world();
  }
  constexpr int kCalls = 300;
  double first_worst = 0.0;
  for (int call = 0; call < kCalls; ++call) {
    for (size_t q = 0; q < inputs.size(); ++q) ranks.ranks()[q].buf = inputs[q].buf;
    for (const zd_status st : ranks.call(isa())) ASSERT_EQ(st, ZD_OK);
    for (uint64_t i = 0; i < count; ++i) {
      mean[i] += double{ranks.ranks()[0].buf[i]} / kCalls;
      if (call == 0) first_worst = std::max(first_worst, std::fabs(ranks.ranks()[0].buf[i] - truth[i]));
    }
  }
  double worst = 0.0;
  for (uint64_t i = 0; i < count; ++i) worst = std::max(worst, std::fabs(mean[i] - truth[i]));
  EXPECT_GT(first_worst, 0.1) << "one call should be visibly lossy";
  EXPECT_LT(worst, 0.02) << "the mean of " << kCalls << " results should approach the average";
}

// A failed exchange, in either phase, leaves buf and both error buffers as
// they were; the next successful call then gives what it would have given
// had the failure never happened.
TEST_P(Driver, FailedExchangeLeavesBuffersUntouched) {
  for (const uint64_t count : {uint64_t{1001}, uint64_t{2}}) {
    SCOPED_TRACE("count = " + std::to_string(count));
    Ranks ranks(world(), count), twin(world(), count);
    std::mt19937_64 rng(11), twin_rng(11);
    for (int call = 0; call < 2; ++call) {
      ranks.draw(rng);
      twin.draw(twin_rng);
      ranks.call(isa());
      twin.call(isa());
    }
    ranks.draw(rng);
    twin.draw(twin_rng);
    for (const Fail fail : {Fail::phase1, Fail::phase2}) {
      const std::vector<Rank> before = ranks.ranks();
      for (const zd_status st : ranks.call(isa(), fail)) EXPECT_EQ(st, ZD_ERR_TIMEOUT);
      for (size_t q = 0; q < before.size(); ++q) {
        const Rank &a = ranks.ranks()[q], &b = before[q];
        EXPECT_EQ(a.buf, b.buf) << "phase " << (fail == Fail::phase1 ? 1 : 2) << ", rank " << q;
        EXPECT_EQ(a.worker_error, b.worker_error) << "phase " << (fail == Fail::phase1 ? 1 : 2);
        EXPECT_EQ(a.server_error, b.server_error) << "phase " << (fail == Fail::phase1 ? 1 : 2);
      }
    }
    ranks.call(isa());
    twin.call(isa());
    for (size_t q = 0; q < ranks.ranks().size(); ++q) {
      EXPECT_EQ(ranks.ranks()[q].buf, twin.ranks()[q].buf);
      EXPECT_EQ(ranks.ranks()[q].worker_error, twin.ranks()[q].worker_error);
      EXPECT_EQ(ranks.ranks()[q].server_error, twin.ranks()[q].server_error);
    }
  }
}

std::string param_name(const ::testing::TestParamInfo<Param>& i) {
  return std::string(detail::isa_name(std::get<0>(i.param))) + "_world" + std::to_string(std::get<1>(i.param));
}

INSTANTIATE_TEST_SUITE_P(All, Driver,
                         ::testing::Combine(::testing::Values(Isa::scalar, Isa::avx2), ::testing::Values(1, 2, 3, 4)),
                         param_name);

// Blocks carry 1 bit per chunk element, padded to 4 bytes, and one fp32
// scale: both exchanges are asked for exactly that many bytes per rank.
TEST(DriverBytes, BlocksAreOneBitPerElementPlusAScale) {
  struct Case {
    uint64_t count;
    int32_t world;
    uint64_t chunk, block;
  };
  const Case cases[] = {
      {1, 4, 8, 8},                                 // 1 byte of signs, padded to 4, + scale
      {100, 3, 40, 12},                             // ceil(100 / 3) = 34 -> 40: 5 bytes -> 8, + 4
      {1u << 20, 4, 1u << 18, 32772},               // 32768 bytes of signs + 4
      {(1u << 20) + 1, 1, (1u << 20) + 8, 131080},  // 131073 bytes of signs -> 131076, + 4
  };
  for (const Case& c : cases) {
    SCOPED_TRACE("count = " + std::to_string(c.count) + ", world = " + std::to_string(c.world));
    EXPECT_EQ(chunk_elems(c.count, c.world), c.chunk);
    EXPECT_EQ(block_bytes(c.count, c.world), c.block);
    Ranks ranks(c.world, c.count);
    std::mt19937_64 rng(3);
    ranks.draw(rng);
    ThreadExchange ex(c.world);
    for (const zd_status st : ranks.call(detail::best_isa(), ex)) ASSERT_EQ(st, ZD_OK);
    EXPECT_EQ(ex.a2a_bytes, std::vector<uint64_t>{c.block});
    EXPECT_EQ(ex.gather_bytes, std::vector<uint64_t>{c.block});
  }
  // 32x fewer bytes than the fp32 values, give or take the padding and scales.
  const uint64_t n = 1u << 24;
  EXPECT_LE(4 * block_bytes(n, 4) * 32, n * 4 + 4 * 8 * 32);
}

// The public entry point uses the best kernels, which give the same bits.
TEST(DriverEntry, PublicEntryMatchesBestKernels) {
  const uint64_t count = 5000;
  Ranks a(2, count), b(2, count);
  std::mt19937_64 ra(5), rb(5);
  a.draw(ra);
  b.draw(rb);
  b.call(detail::best_isa());
  ThreadExchange ex(2);
  std::vector<zd_status> st(2, ZD_ERR_INTERNAL);
  ex.run([&](int32_t r) {
    Rank& me = a.ranks()[static_cast<size_t>(r)];
    st[static_cast<size_t>(r)] = compressed_all_reduce(r, 2, me.buf.data(), count, me.worker_error.data(),
                                                       me.server_error.data(), ex.for_rank(r));
  });
  EXPECT_EQ(st, (std::vector<zd_status>{ZD_OK, ZD_OK}));
  for (size_t q = 0; q < 2; ++q) {
    EXPECT_EQ(a.ranks()[q].buf, b.ranks()[q].buf);
    EXPECT_EQ(a.ranks()[q].worker_error, b.ranks()[q].worker_error);
  }
}

// Kept scratch: the same bits as a call that allocates its own, the size the
// header promises, grown only when a call needs more.
TEST(DriverScratch, KeptScratchGivesTheSameResultAndOnlyGrows) {
  std::vector<Scratch> scratch(2);
  for (const uint64_t count : {uint64_t{4099}, uint64_t{100}, uint64_t{20000}}) {
    SCOPED_TRACE("count = " + std::to_string(count));
    Ranks a(2, count), b(2, count);
    std::mt19937_64 ra(9), rb(9);
    const uint64_t held = scratch[0].bytes();
    for (int call = 0; call < 2; ++call) {
      a.draw(ra);
      b.draw(rb);
      b.call(detail::best_isa());
      ThreadExchange ex(2);
      ex.run([&](int32_t r) {
        Rank& me = a.ranks()[static_cast<size_t>(r)];
        EXPECT_EQ(compressed_all_reduce(r, 2, me.buf.data(), count, me.worker_error.data(), me.server_error.data(),
                                        ex.for_rank(r), &scratch[static_cast<size_t>(r)]),
                  ZD_OK);
      });
      for (size_t q = 0; q < 2; ++q) {
        EXPECT_EQ(a.ranks()[q].buf, b.ranks()[q].buf);
        EXPECT_EQ(a.ranks()[q].worker_error, b.ranks()[q].worker_error);
        EXPECT_EQ(a.ranks()[q].server_error, b.ranks()[q].server_error);
      }
    }
    EXPECT_EQ(scratch[0].bytes(), std::max(held, 7 * block_bytes(count, 2)));
  }
  Scratch s;
  EXPECT_NE(s.reserve(64), nullptr);
  EXPECT_EQ(s.bytes(), 64u);
  s.release();
  EXPECT_EQ(s.bytes(), 0u);
}

TEST(DriverArgs, RefusesBadArgumentsAndSkipsEmpty) {
  std::vector<float> buf(16, 1.0f), we(16, 0.0f), se(16, 0.0f);
  int calls = 0;
  Exchange counting;
  counting.all_to_all = [&](const void*, void*, uint64_t) {
    ++calls;
    return ZD_OK;
  };
  counting.all_gather = counting.all_to_all;
  EXPECT_EQ(compressed_all_reduce(0, 0, buf.data(), 16, we.data(), se.data(), counting), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(compressed_all_reduce(2, 2, buf.data(), 16, we.data(), se.data(), counting), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(compressed_all_reduce(-1, 2, buf.data(), 16, we.data(), se.data(), counting), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(compressed_all_reduce(0, 1, nullptr, 16, we.data(), se.data(), counting), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(compressed_all_reduce(0, 1, buf.data(), 16, nullptr, se.data(), counting), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(compressed_all_reduce(0, 1, buf.data(), 16, we.data(), nullptr, counting), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(compressed_all_reduce(0, 1, buf.data(), 16, we.data(), se.data(), Exchange{}), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(calls, 0);
  // Nothing to average: every rank returns at once, with no exchange.
  EXPECT_EQ(compressed_all_reduce(0, 2, nullptr, 0, nullptr, nullptr, counting), ZD_OK);
  EXPECT_EQ(calls, 0);
}

// An exchange that throws becomes ZD_ERR_INTERNAL, with nothing written.
TEST(DriverArgs, ThrowingExchangeIsAStatus) {
  std::vector<float> buf(40, 0.5f), we(40, 0.25f), se(40, 0.125f);
  const auto b0 = buf, w0 = we, s0 = se;
  Exchange throwing;
  throwing.all_to_all = [](const void*, void*, uint64_t) -> zd_status { throw std::runtime_error("transport"); };
  throwing.all_gather = throwing.all_to_all;
  EXPECT_EQ(compressed_all_reduce(0, 1, buf.data(), 40, we.data(), se.data(), throwing), ZD_ERR_INTERNAL);
  EXPECT_EQ(buf, b0);
  EXPECT_EQ(we, w0);
  EXPECT_EQ(se, s0);
}

}  // namespace
}  // namespace zerod::comm::onebit::test
