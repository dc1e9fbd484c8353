// compressed_all_reduce (1-bit, error feedback) on the local plugin: against
// the plain reference of the header's equations over several steps, its
// traffic against fp16 and fp32 all-reduces, and its failures.
#include <gmock/gmock.h>

#include <random>

#include "comm_test_util.h"
#include "onebit_reference.h"

namespace zerod::comm::test {
namespace {

using ::testing::HasSubstr;

// Runs `steps` compressed averages of fresh random buffers on `world` ranks
// and compares each rank's result and error buffers with the reference.
void check_against_reference(int world, uint64_t count, int steps) {
  Comm comm(world);
  const uint64_t c = ref_chunk(count, world);
  std::vector<OnebitRank> ref(static_cast<size_t>(world));
  std::vector<OnebitRank> got(static_cast<size_t>(world));
  for (auto* v : {&ref, &got}) {
    for (auto& r : *v) {
      r.worker_error.assign(count, 0.0f);
      r.server_error.assign(c, 0.0f);
    }
  }
  std::mt19937 rng(static_cast<unsigned>(world * 1000 + count));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int step = 0; step < steps; ++step) {
    for (int r = 0; r < world; ++r) {
      ref[r].buf.resize(count);
      for (auto& v : ref[r].buf) v = u(rng);
      got[r].buf = ref[r].buf;
    }
    onebit_reference(ref, count);
    std::vector<zd_status> st(static_cast<size_t>(world), ZD_ERR_INTERNAL);
    on_ranks(world, [&](int r) {
      const zd_comm_call call = call_for(r, 40, "step: compressed momentum");
      st[r] = comm.d().compressed_all_reduce(comm.inst(), &call, got[r].buf.data(), count,
                                             got[r].worker_error.data(), got[r].server_error.data());
    });
    size_t skipped = 0;
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(st[r], ZD_OK) << comm.error(r);
      for (uint64_t i = 0; i < count; ++i) {
        ASSERT_NEAR(got[r].worker_error[i], ref[r].worker_error[i], 1e-6) << "rank " << r << " i " << i;
      }
      // Chunk k of the result is server k's; where its compensated value y
      // is within 1e-6 of 0, fp32 and the reference may take other signs.
      for (int k = 0; k < world; ++k) {
        const uint64_t b = std::min<uint64_t>(k * c, count);
        for (uint64_t i = 0; i < ref[k].server_value.size(); ++i) {
          if (std::fabs(ref[k].server_value[i]) < 1e-6f) {
            ++skipped;
            ref[r].buf[b + i] = got[r].buf[b + i];
            continue;
          }
          ASSERT_NEAR(got[r].buf[b + i], ref[r].buf[b + i], 1e-6)
              << "step " << step << " rank " << r << " element " << b + i;
        }
      }
      for (uint64_t i = 0; i < ref[r].server_value.size(); ++i) {
        if (std::fabs(ref[r].server_value[i]) < 1e-6f) {
          ref[r].server_error[i] = got[r].server_error[i];  // resync: the sign was a coin toss
          continue;
        }
        ASSERT_NEAR(got[r].server_error[i], ref[r].server_error[i], 1e-6) << "rank " << r << " i " << i;
      }
      EXPECT_EQ(got[r].buf, got[0].buf) << "every rank gets the same average";
    }
    EXPECT_LT(skipped, count / 100 + 1);
  }
}

TEST(Compressed, TwoRanksMatchTheReference) {
  for (uint64_t count : {uint64_t{4096}, uint64_t{1000}, uint64_t{13}, uint64_t{1}}) {
    SCOPED_TRACE("count " + std::to_string(count));
    check_against_reference(2, count, 5);
  }
}

TEST(Compressed, FourRanksMatchTheReference) {
  // 13 over 4 ranks: chunks of 8, so rank 1's is short and ranks 2-3 have none.
  for (uint64_t count : {uint64_t{4096}, uint64_t{1003}, uint64_t{13}}) {
    SCOPED_TRACE("count " + std::to_string(count));
    check_against_reference(4, count, 5);
  }
}

TEST(Compressed, OneRankIsItsOwnServer) { check_against_reference(1, 100, 3); }

// Bytes on the (ring-model) wire: the packed signs are 1/16 of an fp16
// all-reduce of the same count and 1/32 of an fp32 one; the per-chunk fp32
// scales come on top and are counted apart. (count is a multiple of 32 W,
// so no chunk is padded.)
TEST(Compressed, SendsAThirtySecondOfFp32) {
  for (int world : {2, 4}) {
    const uint64_t n = static_cast<uint64_t>(world);
    const uint64_t count = 32 * n * 64;
    Comm comm(world);
    std::vector<std::vector<float>> buf(n, std::vector<float>(count, 0.5f)), we(buf);
    std::vector<std::vector<float>> se(n, std::vector<float>(ref_chunk(count, world)));
    std::vector<std::vector<uint16_t>> half(n, std::vector<uint16_t>(count));
    std::vector<uint64_t> compressed(n), fp16(n), fp32(n);
    on_ranks(world, [&](int r) {
      const zd_comm_call call = call_for(r, 1, "bytes");
      uint64_t before = comm.sent(r);
      ASSERT_EQ(comm.d().compressed_all_reduce(comm.inst(), &call, buf[r].data(), count, we[r].data(), se[r].data()),
                ZD_OK);
      compressed[r] = comm.sent(r) - before;
      before = comm.sent(r);
      ASSERT_EQ(comm.d().all_reduce(comm.inst(), &call, half[r].data(), count, ZD_COMM_F16, ZD_REDUCE_SUM), ZD_OK);
      fp16[r] = comm.sent(r) - before;
      before = comm.sent(r);
      ASSERT_EQ(comm.d().all_reduce(comm.inst(), &call, buf[r].data(), count, ZD_COMM_F32, ZD_REDUCE_SUM), ZD_OK);
      fp32[r] = comm.sent(r) - before;
    });
    for (int r = 0; r < world; ++r) {
      // Two byte collectives (all_to_all, all_gather), N-1 blocks each; a
      // block is one chunk's signs and its scale.
      const uint64_t scales = 2 * (n - 1) * sizeof(float);
      const uint64_t signs = 2 * (n - 1) * (count / n / 8);
      EXPECT_EQ(compressed[r], signs + scales) << "world " << world;
      EXPECT_EQ(fp16[r], 2 * (n - 1) * count * 2 / n);
      EXPECT_GE(fp16[r], 16 * signs) << "world " << world;
      EXPECT_GE(fp32[r], 32 * signs) << "world " << world;
      EXPECT_EQ(comm.figures(r).collectives, 3u) << "the compressed all-reduce is one collective";
    }
  }
}

TEST(Compressed, CountZeroIsACollectiveThatChangesNothing) {
  Comm comm(2);
  float x[2] = {3, 4};
  on_ranks(2, [&](int r) {
    const zd_comm_call call = call_for(r, 1, "empty");
    EXPECT_EQ(comm.d().compressed_all_reduce(comm.inst(), &call, &x[r], 0, &x[r], &x[r]), ZD_OK) << comm.error(r);
  });
  EXPECT_EQ(x[0], 3.0f);
  EXPECT_EQ(x[1], 4.0f);
  EXPECT_EQ(comm.figures(0).collectives, 1u);
  EXPECT_EQ(comm.sent(0), 0u);
}

// A rank in a compressed all-reduce and one in a byte all-to-all of the same
// block size disagree, and every rank is told so.
TEST(Compressed, DisagreementWithAPlainCollectiveFailsBothRanks) {
  Comm comm(2);
  const uint64_t count = 1024;
  std::vector<float> buf(count, 1.0f), we(count), se(ref_chunk(count, 2));
  std::vector<uint8_t> send(2 * 68), recv(2 * 68);
  zd_status st[2];
  on_ranks(2, [&](int r) {
    if (r == 0) {
      const zd_comm_call c = call_for(0, 9, "step: compressed momentum");
      st[0] = comm.d().compressed_all_reduce(comm.inst(), &c, buf.data(), count, we.data(), se.data());
    } else {
      const zd_comm_call c = call_for(1, 9, "something else");
      st[1] = comm.d().all_to_all(comm.inst(), &c, send.data(), recv.data(), 68, ZD_COMM_U8);
    }
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(st[r], ZD_ERR_INVALID_STATE);
    EXPECT_THAT(comm.error(r), HasSubstr("ranks disagree at collective #1"));
    EXPECT_THAT(comm.error(r), HasSubstr("rank 0 is in \"step: compressed momentum\" (compressed_all_reduce of 1024 "
                                         "f32 (its all_to_all, 68 u8 per rank))"));
    EXPECT_THAT(comm.error(r), HasSubstr("rank 1 is in \"something else\" (all_to_all, 68 u8 per rank)"));
  }
  EXPECT_EQ(buf[0], 1.0f) << "a failed call leaves buf alone";
  EXPECT_EQ(we[0], 0.0f);
}

TEST(Compressed, NullErrorBufferFailsEveryRank) {
  Comm comm(2);
  std::vector<float> buf(64, 1.0f), we(64), se(32);
  zd_status st[2];
  on_ranks(2, [&](int r) {
    const zd_comm_call c = call_for(r, 9, r == 1 ? "bad" : "good");
    st[r] = comm.d().compressed_all_reduce(comm.inst(), &c, buf.data(), 64, r == 1 ? nullptr : we.data(), se.data());
  });
  EXPECT_EQ(st[1], ZD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(st[0], ZD_ERR_INVALID_STATE);
  EXPECT_THAT(comm.error(1), HasSubstr("rank 1's call \"bad\" at collective #1 is invalid: worker_error is NULL"));
  EXPECT_THAT(comm.error(0), HasSubstr("worker_error is NULL"));
}

TEST(Compressed, MissingRankTimesOut) {
  Comm comm(3);
  std::vector<std::vector<float>> buf(3, std::vector<float>(96, 1.0f)), we(buf), se(3, std::vector<float>(32));
  zd_status st[2];
  on_ranks(2, [&](int r) {
    const zd_comm_call c = call_for(r, 9, "step 7: compressed momentum", 100);
    st[r] = comm.d().compressed_all_reduce(comm.inst(), &c, buf[r].data(), 96, we[r].data(), se[r].data());
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(st[r], ZD_ERR_TIMEOUT);
    EXPECT_THAT(comm.error(r), HasSubstr("timeout at collective #1 (compressed_all_reduce of 96 f32 (its all_to_all, "
                                         "8 u8 per rank))"));
    EXPECT_THAT(comm.error(r), HasSubstr("not arrived: rank 2 (no collective yet)"));
    EXPECT_EQ(buf[r][0], 1.0f);
  }
}

}  // namespace
}  // namespace zerod::comm::test
