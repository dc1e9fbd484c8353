// Each collective on 1-4 rank threads, every dtype, SUM and MAX, counts that
// do not divide by the world size and that span several kernel tiles: every
// rank ends with the plain reference's bits (so all ranks agree bit for bit).
#include <atomic>
#include <tuple>

#include "comm_test_util.h"

namespace zerod::comm::test {
namespace {

const size_t kCounts[] = {0, 1, 3, 31, 1000, 5003};
const zd_reduce_op kOps[] = {ZD_REDUCE_SUM, ZD_REDUCE_MAX};

uint64_t seed_of(int rank, size_t count, int salt) {
  return (static_cast<uint64_t>(rank) << 40) ^ (static_cast<uint64_t>(count) << 8) ^ static_cast<uint64_t>(salt);
}

class Ops : public ::testing::TestWithParam<std::tuple<int, zd_comm_dtype>> {
 protected:
  int world() const { return std::get<0>(GetParam()); }
  zd_comm_dtype dtype() const { return std::get<1>(GetParam()); }
};

// specials: the data holds NaN, infinities, signed zeros and subnormals.
void check_all_reduce(int world, zd_comm_dtype dt, bool specials) {
  for (size_t count : kCounts) {
    for (zd_reduce_op op : kOps) {
      std::vector<Buffer> in, bufs;
      for (int r = 0; r < world; ++r) in.push_back(random_buffer(dt, count, seed_of(r, count, op), specials));
      bufs = in;
      std::vector<const Buffer*> srcs;
      for (const auto& b : in) srcs.push_back(&b);
      Buffer want(dt, count);
      reference_reduce(op, srcs, 0, count, &want, 0);

      Comm comm(world);
      std::vector<zd_status> st(world, ZD_ERR_INTERNAL);
      on_ranks(world, [&](int r) {
        const zd_comm_call c = call_for(r, 7, "all_reduce test");
        st[r] = comm.d().all_reduce(comm.inst(), &c, bufs[r].data(), count, dt, op);
      });
      for (int r = 0; r < world; ++r) {
        ASSERT_EQ(st[r], ZD_OK) << comm.error(r);
        EXPECT_TRUE(same_values(want, bufs[r])) << "rank " << r << ", count " << count << ", op " << op;
        EXPECT_EQ(bufs[r].bytes, bufs[0].bytes) << "rank " << r << " differs from rank 0, count " << count;
      }
    }
  }
}

TEST_P(Ops, AllReduceMatchesReferenceOnEveryRank) { check_all_reduce(world(), dtype(), false); }

TEST_P(Ops, AllReduceWithNanInfZerosAndSubnormals) { check_all_reduce(world(), dtype(), true); }

void check_reduce_scatter(int world, zd_comm_dtype dt, bool in_place) {
  for (size_t count : kCounts) {
    for (zd_reduce_op op : kOps) {
      const size_t total = count * static_cast<size_t>(world);
      std::vector<Buffer> send;
      for (int r = 0; r < world; ++r) send.push_back(random_buffer(dt, total, seed_of(r, count, 10 + op)));
      std::vector<const Buffer*> srcs;
      for (const auto& b : send) srcs.push_back(&b);
      std::vector<Buffer> want(world, Buffer(dt, count)), recv(world, Buffer(dt, count));
      for (int r = 0; r < world; ++r) reference_reduce(op, srcs, r * count, count, &want[r], 0);

      Comm comm(world);
      std::vector<zd_status> st(world, ZD_ERR_INTERNAL);
      on_ranks(world, [&](int r) {
        const zd_comm_call c = call_for(r, 8, "reduce_scatter test");
        void* out = in_place ? send[r].at(r * count) : recv[r].data();
        st[r] = comm.d().reduce_scatter(comm.inst(), &c, send[r].data(), out, count, dt, op);
      });
      for (int r = 0; r < world; ++r) {
        ASSERT_EQ(st[r], ZD_OK) << comm.error(r);
        if (in_place && count > 0) {
          std::memcpy(recv[r].data(), send[r].at(r * count), count * size_of(dt));
        }
        EXPECT_TRUE(same_values(want[r], recv[r])) << "rank " << r << ", count " << count << ", op " << op;
      }
    }
  }
}

TEST_P(Ops, ReduceScatterGivesRankRItsChunk) { check_reduce_scatter(world(), dtype(), false); }

TEST_P(Ops, ReduceScatterInPlace) { check_reduce_scatter(world(), dtype(), true); }

void check_all_gather(int world, zd_comm_dtype dt, bool in_place) {
  for (size_t count : kCounts) {
    const size_t total = count * static_cast<size_t>(world);
    std::vector<Buffer> send, recv(world, Buffer(dt, total));
    Buffer want(dt, total);
    for (int r = 0; r < world; ++r) {
      send.push_back(random_buffer(dt, count, seed_of(r, count, 20), true));
      if (count == 0) continue;  // memcpy of NULL, 0 is undefined
      std::memcpy(want.at(r * count), send[r].data(), count * size_of(dt));
      // In place: the rank's own chunk of recv is its send.
      if (in_place) std::memcpy(recv[r].at(r * count), send[r].data(), count * size_of(dt));
    }
    Comm comm(world);
    std::vector<zd_status> st(world, ZD_ERR_INTERNAL);
    on_ranks(world, [&](int r) {
      const zd_comm_call c = call_for(r, 9, "all_gather test");
      const void* from = in_place ? recv[r].at(r * count) : send[r].data();
      st[r] = comm.d().all_gather(comm.inst(), &c, from, recv[r].data(), count, dt);
    });
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(st[r], ZD_OK) << comm.error(r);
      EXPECT_EQ(recv[r].bytes, want.bytes) << "rank " << r << ", count " << count;
    }
  }
}

TEST_P(Ops, AllGatherPutsChunkKFromRankK) { check_all_gather(world(), dtype(), false); }

TEST_P(Ops, AllGatherInPlace) { check_all_gather(world(), dtype(), true); }

TEST_P(Ops, BroadcastFromEveryRoot) {
  for (size_t count : kCounts) {
    for (int root = 0; root < world(); ++root) {
      std::vector<Buffer> bufs;
      for (int r = 0; r < world(); ++r) bufs.push_back(random_buffer(dtype(), count, seed_of(r, count, 30), true));
      const Buffer want = bufs[root];
      Comm comm(world());
      std::vector<zd_status> st(world(), ZD_ERR_INTERNAL);
      on_ranks(world(), [&](int r) {
        const zd_comm_call c = call_for(r, 10, "broadcast test");
        st[r] = comm.d().broadcast(comm.inst(), &c, bufs[r].data(), count, dtype(), root);
      });
      for (int r = 0; r < world(); ++r) {
        ASSERT_EQ(st[r], ZD_OK) << comm.error(r);
        EXPECT_EQ(bufs[r].bytes, want.bytes) << "rank " << r << ", root " << root << ", count " << count;
      }
    }
  }
}

std::string param_name(const ::testing::TestParamInfo<std::tuple<int, zd_comm_dtype>>& info) {
  return "world" + std::to_string(std::get<0>(info.param)) + "_" + name_of(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(WorldsAndDtypes, Ops,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(ZD_COMM_F32, ZD_COMM_BF16, ZD_COMM_F16, ZD_COMM_F64)),
                         param_name);

TEST(ReduceScatter, LargeShardsWrittenPastTheCache) {
  // Shards of 4 MiB and more are written with non-temporal stores; recv one
  // element into its allocation and an odd count give an unaligned head and
  // tail. Plain floats with exact sums keep this quick under sanitizers.
  const size_t count = (size_t{1} << 20) + 5;
  const int world = 2;
  std::vector<std::vector<float>> send(world, std::vector<float>(count * world));
  std::vector<std::vector<float>> out(world, std::vector<float>(count + 1, -1.0f));
  for (int r = 0; r < world; ++r) {
    for (size_t i = 0; i < send[r].size(); ++i) send[r][i] = static_cast<float>((i * 7 + r) % 1024);
  }
  Comm comm(world);
  on_ranks(world, [&](int r) {
    const zd_comm_call c = call_for(r, 1, "big reduce_scatter");
    ASSERT_EQ(comm.d().reduce_scatter(comm.inst(), &c, send[r].data(), out[r].data() + 1, count, ZD_COMM_F32,
                                      ZD_REDUCE_SUM),
              ZD_OK);
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(out[r][0], -1.0f) << "written before recv";
    size_t wrong = 0;
    for (size_t i = 0; i < count; ++i) wrong += out[r][1 + i] != send[0][r * count + i] + send[1][r * count + i];
    EXPECT_EQ(wrong, 0u) << "rank " << r;
  }
}

TEST(Barrier, NoRankLeavesBeforeAllArrive) {
  for (int world = 1; world <= 4; ++world) {
    Comm comm(world);
    std::atomic<int> arrived{0};
    on_ranks(world, [&](int r) {
      for (int round = 1; round <= 20; ++round) {
        arrived.fetch_add(1);
        const zd_comm_call c = call_for(r, static_cast<uint64_t>(round), "barrier test");
        ASSERT_EQ(comm.d().barrier(comm.inst(), &c), ZD_OK) << comm.error(r);
        EXPECT_GE(arrived.load(), round * world);
        // A second barrier so no rank starts the next round's count early.
        ASSERT_EQ(comm.d().barrier(comm.inst(), &c), ZD_OK) << comm.error(r);
      }
    });
  }
}

// Rounding: 16-bit values are summed in fp32 in rank order and rounded once.
struct RoundingCase {
  zd_comm_dtype dtype;
  std::vector<uint16_t> ranks;  // one element per rank
  uint16_t want;
};

TEST(Rounding, SixteenBitSumsRoundOnceToNearestEven) {
  const RoundingCase cases[] = {
      // 1 + 2^-8 + 2^-8 = 1 + 2^-7 exactly; rounding after each add would give 1.
      {ZD_COMM_BF16, {0x3F80, 0x3B80, 0x3B80}, 0x3F81},
      // Ties go to even: 1 + 2^-8 -> 1; (1 + 2^-7) + 2^-8 -> 1 + 2^-6.
      {ZD_COMM_BF16, {0x3F80, 0x3B80}, 0x3F80},
      {ZD_COMM_BF16, {0x3F81, 0x3B80}, 0x3F82},
      // fp16: 1 + 2^-11 + 2^-11 = 1 + 2^-10.
      {ZD_COMM_F16, {0x3C00, 0x1000, 0x1000}, 0x3C01},
      {ZD_COMM_F16, {0x3C00, 0x1000}, 0x3C00},
      {ZD_COMM_F16, {0x3C01, 0x1000}, 0x3C02},
      // Overflow to infinity: 65504 + 16 = 65520 rounds to inf in fp16.
      {ZD_COMM_F16, {0x7BFF, 0x4C00}, 0x7C00},
  };
  for (const auto& tc : cases) {
    const int world = static_cast<int>(tc.ranks.size());
    std::vector<uint16_t> bufs = tc.ranks;
    Comm comm(world);
    on_ranks(world, [&](int r) {
      const zd_comm_call c = call_for(r);
      EXPECT_EQ(comm.d().all_reduce(comm.inst(), &c, &bufs[r], 1, tc.dtype, ZD_REDUCE_SUM), ZD_OK);
    });
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(bufs[r], tc.want) << name_of(tc.dtype) << " case starting 0x" << std::hex << tc.ranks[0];
    }
  }
}

TEST(Rounding, SixteenBitNanStaysNan) {
  for (zd_comm_dtype dt : {ZD_COMM_BF16, ZD_COMM_F16}) {
    for (zd_reduce_op op : kOps) {
      const uint16_t nan = dt == ZD_COMM_BF16 ? 0x7FC1 : 0x7E01;
      const uint16_t one = dt == ZD_COMM_BF16 ? 0x3F80 : 0x3C00;
      for (int nan_rank = 0; nan_rank < 3; ++nan_rank) {
        std::vector<uint16_t> bufs(3, one);
        bufs[nan_rank] = nan;
        Comm comm(3);
        on_ranks(3, [&](int r) {
          const zd_comm_call c = call_for(r);
          EXPECT_EQ(comm.d().all_reduce(comm.inst(), &c, &bufs[r], 1, dt, op), ZD_OK);
        });
        for (int r = 0; r < 3; ++r) {
          const uint16_t mag = bufs[r] & 0x7FFF;
          EXPECT_GT(mag, dt == ZD_COMM_BF16 ? 0x7F80 : 0x7C00) << name_of(dt) << " op " << op << " rank " << r;
        }
      }
    }
  }
}

TEST(Rounding, Fp32SumsInRankOrder) {
  // (1 + 1e8) - 1e8 = 0 in fp32; any other order gives 1.
  std::vector<float> bufs = {1.0f, 1e8f, -1e8f};
  Comm comm(3);
  on_ranks(3, [&](int r) {
    const zd_comm_call c = call_for(r);
    EXPECT_EQ(comm.d().all_reduce(comm.inst(), &c, &bufs[r], 1, ZD_COMM_F32, ZD_REDUCE_SUM), ZD_OK);
  });
  for (float v : bufs) EXPECT_EQ(v, 0.0f);
}

}  // namespace
}  // namespace zerod::comm::test
