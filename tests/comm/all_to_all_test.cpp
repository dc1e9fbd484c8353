// all_to_all on 1-4 rank threads in every dtype (u8 included), u8 in the
// other collectives, and how all_to_all fails: disagreement, timeout, and
// arguments it refuses.
#include <gmock/gmock.h>

#include <chrono>

#include "comm_test_util.h"

namespace zerod::comm::test {
namespace {

using ::testing::HasSubstr;

class AllToAll : public ::testing::TestWithParam<std::tuple<int, zd_comm_dtype>> {};

// Block k of rank r's recv is block r of rank k's send, bit for bit.
TEST_P(AllToAll, BlockKFromRankK) {
  const int world = std::get<0>(GetParam());
  const zd_comm_dtype dt = std::get<1>(GetParam());
  const size_t w = static_cast<size_t>(world);
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, size_t{5003}}) {
    std::vector<Buffer> send, recv(w, Buffer(dt, count * w));
    for (int r = 0; r < world; ++r) send.push_back(random_buffer(dt, count * w, 100 * count + r, true));
    Comm comm(world);
    std::vector<zd_status> st(w, ZD_ERR_INTERNAL);
    on_ranks(world, [&](int r) {
      const zd_comm_call c = call_for(r, 11, "all_to_all test");
      st[r] = comm.d().all_to_all(comm.inst(), &c, send[r].data(), recv[r].data(), count, dt);
    });
    const size_t block = count * size_of(dt);
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(st[r], ZD_OK) << comm.error(r);
      for (int k = 0; k < world; ++k) {
        EXPECT_TRUE(block == 0 || std::memcmp(recv[r].bytes.data() + k * block, send[k].bytes.data() + r * block, block) == 0)
            << "rank " << r << " block " << k << ", count " << count;
      }
      EXPECT_EQ(comm.sent(r), (w - 1) * block);
    }
  }
}

std::string param_name(const ::testing::TestParamInfo<std::tuple<int, zd_comm_dtype>>& info) {
  return "world" + std::to_string(std::get<0>(info.param)) + "_" + name_of(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(WorldsAndDtypes, AllToAll,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(ZD_COMM_U8, ZD_COMM_F32, ZD_COMM_BF16, ZD_COMM_F16,
                                                              ZD_COMM_F64)),
                         param_name);

TEST(U8, GatheredAndBroadcastAsBytes) {
  const int world = 3;
  Comm comm(world);
  std::vector<Buffer> send, gathered(3, Buffer(ZD_COMM_U8, 3 * 77)), bcast;
  for (int r = 0; r < world; ++r) {
    send.push_back(random_buffer(ZD_COMM_U8, 77, r));
    bcast.push_back(random_buffer(ZD_COMM_U8, 50, 10 + r));
  }
  const Buffer root = bcast[2];
  on_ranks(world, [&](int r) {
    const zd_comm_call c = call_for(r, 1, "u8");
    ASSERT_EQ(comm.d().all_gather(comm.inst(), &c, send[r].data(), gathered[r].data(), 77, ZD_COMM_U8), ZD_OK);
    ASSERT_EQ(comm.d().broadcast(comm.inst(), &c, bcast[r].data(), 50, ZD_COMM_U8, 2), ZD_OK);
  });
  for (int r = 0; r < world; ++r) {
    for (int k = 0; k < world; ++k) {
      EXPECT_EQ(0, std::memcmp(gathered[r].bytes.data() + 77 * k, send[k].data(), 77)) << r << " " << k;
    }
    EXPECT_EQ(bcast[r].bytes, root.bytes);
  }
  EXPECT_EQ(comm.sent(0), 2u * 77 + 50);
}

TEST(U8, RefusedInReductionsOnEveryRank) {
  for (bool scatter : {false, true}) {
    Comm comm(2);
    std::vector<uint8_t> a(16), b(16);
    zd_status st[2];
    on_ranks(2, [&](int r) {
      const zd_comm_call c = call_for(r, 1, "bytes summed");
      st[r] = scatter ? comm.d().reduce_scatter(comm.inst(), &c, a.data(), b.data(), 8, ZD_COMM_U8, ZD_REDUCE_SUM)
                      : comm.d().all_reduce(comm.inst(), &c, r == 0 ? a.data() : b.data(), 16, ZD_COMM_U8,
                                            ZD_REDUCE_MAX);
    });
    const char* want = scatter ? "u8 is not reduced: reduce_scatter takes f32, bf16, f16 or f64"
                               : "u8 is not reduced: all_reduce takes f32, bf16, f16 or f64";
    // The first caller is refused as invalid, the other finds it failed.
    EXPECT_TRUE((st[0] == ZD_ERR_INVALID_ARGUMENT) || (st[1] == ZD_ERR_INVALID_ARGUMENT));
    for (int r = 0; r < 2; ++r) {
      EXPECT_NE(st[r], ZD_OK);
      EXPECT_THAT(comm.error(r), HasSubstr(want));
    }
  }
}

TEST(AllToAllFails, OverlappingBuffersAreRefused) {
  Comm comm(2);
  std::vector<float> buf(64);
  const zd_comm_call c = call_for(0, 1, "in place");
  EXPECT_EQ(comm.d().all_to_all(comm.inst(), &c, buf.data(), buf.data() + 8, 16, ZD_COMM_F32),
            ZD_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(comm.error(0), HasSubstr("send and recv overlap: all_to_all does not run in place"));
}

TEST(AllToAllFails, DisagreementFailsEveryRank) {
  Comm comm(3);
  std::vector<std::vector<float>> send(3, std::vector<float>(3 * 64)), recv(send);
  zd_status st[3];
  on_ranks(3, [&](int r) {
    const zd_comm_call c = call_for(r, 4, r == 1 ? "experts: tokens (rank 1)" : "experts: tokens");
    st[r] = comm.d().all_to_all(comm.inst(), &c, send[r].data(), recv[r].data(), r == 1 ? 32 : 64, ZD_COMM_F32);
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(st[r], ZD_ERR_INVALID_STATE) << r;
    EXPECT_THAT(comm.error(r), HasSubstr("ranks disagree at collective #1"));
    EXPECT_THAT(comm.error(r), HasSubstr("\"experts: tokens (rank 1)\" (all_to_all, 32 f32 per rank)"));
    EXPECT_THAT(comm.error(r), HasSubstr("\"experts: tokens\" (all_to_all, 64 f32 per rank)"));
  }
}

TEST(AllToAllFails, MissingRankTimesOut) {
  Comm comm(3);
  std::vector<std::vector<uint8_t>> send(3, std::vector<uint8_t>(30)), recv(send);
  zd_status st[2];
  long long ms[2];
  on_ranks(2, [&](int r) {
    const zd_comm_call c = call_for(r, 4, "experts: tokens", 80);
    const auto t0 = std::chrono::steady_clock::now();
    st[r] = comm.d().all_to_all(comm.inst(), &c, send[r].data(), recv[r].data(), 10, ZD_COMM_U8);
    ms[r] = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(st[r], ZD_ERR_TIMEOUT);
    EXPECT_GE(ms[r], 75);
    EXPECT_THAT(comm.error(r), HasSubstr("timeout at collective #1 (all_to_all, 10 u8 per rank)"));
    EXPECT_THAT(comm.error(r), HasSubstr("not arrived: rank 2 (no collective yet)"));
  }
  EXPECT_EQ(comm.figures(0).collectives, 0u);
}

}  // namespace
}  // namespace zerod::comm::test
