// Every collective of the mpi plugin across the nodes of this mpirun, with
// 1 and 2 ranks per node: values against the plain (hierarchical)
// reference, all-reduce bit-identical on every rank, and the bytes counted,
// including what each daemon hands to MPI (once per daemon, not per rank).
#include <gmock/gmock.h>

#include "mpi_test_util.h"

namespace zerod::comm::test {
namespace {

const size_t kCounts[] = {0, 1, 3, 1000, 5003};
const zd_comm_dtype kDtypes[] = {ZD_COMM_F32, ZD_COMM_BF16, ZD_COMM_F16, ZD_COMM_F64};

class MpiOps : public ::testing::TestWithParam<int> {
 protected:
  int local() const { return GetParam(); }
};

// Every rank's input of one collective, the same on every process.
std::vector<Buffer> inputs(int world, zd_comm_dtype dt, size_t count, int salt, bool specials) {
  std::vector<Buffer> in;
  for (int r = 0; r < world; ++r) in.push_back(random_buffer(dt, count, seed_of(r, count, salt), specials));
  return in;
}

TEST_P(MpiOps, AllReduceMatchesTheReferenceBitForBitOnEveryRank) {
  MpiComm comm(local());
  ASSERT_TRUE(comm.ok());
  int salt = 0;
  for (zd_comm_dtype dt : kDtypes) {
    for (size_t count : kCounts) {
      for (zd_reduce_op op : {ZD_REDUCE_SUM, ZD_REDUCE_MAX}) {
        const bool specials = ++salt % 2 == 0;
        const std::vector<Buffer> in = inputs(comm.world(), dt, count, salt, specials);
        std::vector<const Buffer*> all;
        for (const auto& b : in) all.push_back(&b);
        Buffer want(dt, count);
        hierarchical_reduce(op, all, comm.local(), 0, count, &want, 0);
        std::vector<Buffer> bufs(in.begin() + comm.first(), in.begin() + comm.first() + comm.local());
        comm.on_my_ranks([&](int r) {
          const zd_comm_call c = mpi_call(r, 7, "all_reduce test");
          ASSERT_EQ(comm.d().all_reduce(comm.inst(), &c, bufs[r - comm.first()].data(), count, dt, op), ZD_OK)
              << comm.error(r);
        });
        for (int i = 0; i < comm.local(); ++i) {
          ASSERT_TRUE(same_values(want, bufs[i]))
              << name_of(dt) << " count " << count << " op " << op << " rank " << comm.first() + i;
          // Bits equal on every rank, NaN payloads included.
          ASSERT_EQ(bufs[i].bytes, bufs[0].bytes);
        }
      }
    }
  }
}

// A small segment cuts an all_reduce into many pipelined rounds (and its
// messages into many pieces).
TEST_P(MpiOps, AllReduceInManyRoundsMatchesTheReference) {
  MpiValues v;
  v.segment = 4096;
  MpiComm comm(local(), v);
  ASSERT_TRUE(comm.ok());
  int salt = 50;
  for (zd_comm_dtype dt : {ZD_COMM_F32, ZD_COMM_BF16, ZD_COMM_F64}) {
    for (size_t count : {size_t{5003}, size_t{100000}}) {
      const std::vector<Buffer> in = inputs(comm.world(), dt, count, ++salt, true);
      std::vector<const Buffer*> all;
      for (const auto& b : in) all.push_back(&b);
      Buffer want(dt, count);
      hierarchical_reduce(ZD_REDUCE_SUM, all, comm.local(), 0, count, &want, 0);
      std::vector<Buffer> bufs(in.begin() + comm.first(), in.begin() + comm.first() + comm.local());
      comm.on_my_ranks([&](int r) {
        const zd_comm_call c = mpi_call(r, 7, "all_reduce in rounds");
        ASSERT_EQ(comm.d().all_reduce(comm.inst(), &c, bufs[r - comm.first()].data(), count, dt, ZD_REDUCE_SUM),
                  ZD_OK)
            << comm.error(r);
      });
      for (int i = 0; i < comm.local(); ++i) {
        ASSERT_TRUE(same_values(want, bufs[i])) << name_of(dt) << " count " << count;
        ASSERT_EQ(bufs[i].bytes, bufs[0].bytes);
      }
    }
  }
}

TEST_P(MpiOps, ReduceScatterGivesEveryRankItsChunk) {
  MpiComm comm(local());
  ASSERT_TRUE(comm.ok());
  const int world = comm.world();
  int salt = 100;
  for (zd_comm_dtype dt : kDtypes) {
    for (size_t count : kCounts) {
      for (bool in_place : {false, true}) {
        const zd_reduce_op op = ++salt % 2 ? ZD_REDUCE_SUM : ZD_REDUCE_MAX;
        const std::vector<Buffer> in = inputs(world, dt, count * world, salt, false);
        std::vector<const Buffer*> all;
        for (const auto& b : in) all.push_back(&b);
        std::vector<Buffer> send(in.begin() + comm.first(), in.begin() + comm.first() + comm.local());
        std::vector<Buffer> recv(comm.local(), Buffer(dt, count));
        comm.on_my_ranks([&](int r) {
          const int i = r - comm.first();
          const zd_comm_call c = mpi_call(r, 8, "reduce_scatter test");
          void* out = in_place ? send[i].at(r * count) : recv[i].data();
          ASSERT_EQ(comm.d().reduce_scatter(comm.inst(), &c, send[i].data(), out, count, dt, op), ZD_OK)
              << comm.error(r);
          if (in_place && count > 0) std::memcpy(recv[i].data(), send[i].at(r * count), count * size_of(dt));
        });
        for (int i = 0; i < comm.local(); ++i) {
          const int r = comm.first() + i;
          Buffer want(dt, count);
          hierarchical_reduce(op, all, comm.local(), r * count, count, &want, 0);
          ASSERT_TRUE(same_values(want, recv[i])) << name_of(dt) << " count " << count << " rank " << r;
        }
      }
    }
  }
}

TEST_P(MpiOps, AllGatherPutsChunkKFromRankK) {
  MpiComm comm(local());
  ASSERT_TRUE(comm.ok());
  const size_t w = static_cast<size_t>(comm.world());
  for (zd_comm_dtype dt : {ZD_COMM_U8, ZD_COMM_F32, ZD_COMM_BF16, ZD_COMM_F64}) {
    for (size_t count : kCounts) {
      for (bool in_place : {false, true}) {
        const std::vector<Buffer> in = inputs(comm.world(), dt, count, 200 + in_place, true);
        Buffer want(dt, count * w);
        for (size_t k = 0; k < w && count > 0; ++k) std::memcpy(want.at(k * count), in[k].data(), count * size_of(dt));
        std::vector<Buffer> recv(comm.local(), Buffer(dt, count * w));
        comm.on_my_ranks([&](int r) {
          const int i = r - comm.first();
          if (in_place && count > 0) std::memcpy(recv[i].at(r * count), in[r].data(), count * size_of(dt));
          const void* send = in_place ? recv[i].at(r * count) : in[r].data();
          const zd_comm_call c = mpi_call(r, 9, "all_gather test");
          ASSERT_EQ(comm.d().all_gather(comm.inst(), &c, send, recv[i].data(), count, dt), ZD_OK) << comm.error(r);
        });
        for (int i = 0; i < comm.local(); ++i) {
          ASSERT_EQ(recv[i].bytes, want.bytes) << name_of(dt) << " count " << count << " rank " << comm.first() + i;
        }
      }
    }
  }
}

TEST_P(MpiOps, BroadcastFromEveryRoot) {
  MpiComm comm(local());
  ASSERT_TRUE(comm.ok());
  for (zd_comm_dtype dt : {ZD_COMM_U8, ZD_COMM_F16, ZD_COMM_F64}) {
    for (size_t count : kCounts) {
      for (int root = 0; root < comm.world(); ++root) {
        const std::vector<Buffer> in = inputs(comm.world(), dt, count, 300 + root, true);
        std::vector<Buffer> bufs(in.begin() + comm.first(), in.begin() + comm.first() + comm.local());
        comm.on_my_ranks([&](int r) {
          const zd_comm_call c = mpi_call(r, 10, "broadcast test");
          ASSERT_EQ(comm.d().broadcast(comm.inst(), &c, bufs[r - comm.first()].data(), count, dt, root), ZD_OK)
              << comm.error(r);
        });
        for (int i = 0; i < comm.local(); ++i) {
          ASSERT_EQ(bufs[i].bytes, in[root].bytes) << "root " << root << " count " << count;
        }
      }
    }
  }
}

TEST_P(MpiOps, AllToAllBlockKFromRankK) {
  MpiComm comm(local());
  ASSERT_TRUE(comm.ok());
  const size_t w = static_cast<size_t>(comm.world());
  for (zd_comm_dtype dt : {ZD_COMM_U8, ZD_COMM_F32, ZD_COMM_BF16, ZD_COMM_F64}) {
    for (size_t count : kCounts) {
      const std::vector<Buffer> in = inputs(comm.world(), dt, count * w, 400, true);
      std::vector<Buffer> recv(comm.local(), Buffer(dt, count * w));
      comm.on_my_ranks([&](int r) {
        const zd_comm_call c = mpi_call(r, 11, "all_to_all test");
        ASSERT_EQ(comm.d().all_to_all(comm.inst(), &c, in[r].data(), recv[r - comm.first()].data(), count, dt), ZD_OK)
            << comm.error(r);
      });
      const size_t block = count * size_of(dt);
      for (int i = 0; i < comm.local(); ++i) {
        const int r = comm.first() + i;
        for (size_t k = 0; k < w; ++k) {
          ASSERT_TRUE(block == 0 || std::memcmp(recv[i].bytes.data() + k * block, in[k].bytes.data() + r * block, block) == 0)
              << name_of(dt) << " count " << count << " rank " << r << " block " << k;
        }
      }
    }
  }
}

TEST_P(MpiOps, BarriersInARow) {
  MpiComm comm(local());
  ASSERT_TRUE(comm.ok());
  comm.on_my_ranks([&](int r) {
    for (int i = 0; i < 50; ++i) {
      const zd_comm_call c = mpi_call(r, static_cast<uint64_t>(i), "barrier");
      ASSERT_EQ(comm.d().barrier(comm.inst(), &c), ZD_OK) << comm.error(r);
    }
  });
  EXPECT_EQ(comm.figures(comm.first()).collectives, 50u);
}

// figures: bytes_sent per rank as the ring model counts them over the whole
// job; network_bytes_sent is what the daemon handed to MPI: each
// collective's payload once per daemon, plus a header per collective and
// other daemon (measured on a barrier, which sends nothing else).
TEST_P(MpiOps, FiguresCountRingBytesAndNetworkBytesOncePerDaemon) {
  MpiComm comm(local());
  ASSERT_TRUE(comm.ok());
  const uint64_t n = static_cast<uint64_t>(comm.nodes());
  const uint64_t l = static_cast<uint64_t>(comm.local());
  const uint64_t w = n * l;
  // f32: equal chunks of whole cache lines on every node, and more than an
  // eager all_reduce (wire.h) takes.
  const uint64_t count = 1024 * n;
  std::vector<std::vector<float>> big(l, std::vector<float>(count * w)), out(big);
  const int me = comm.first();
  auto network = [&] { return comm.figures(me).network_bytes_sent; };
  auto sent = [&](int r) { return comm.figures(r).bytes_sent; };
  auto step = [&](const std::function<zd_status(int, std::vector<float>&, std::vector<float>&)>& fn) {
    const uint64_t before = network();
    comm.on_my_ranks([&](int r) {
      const int i = r - comm.first();
      ASSERT_EQ(fn(r, big[i], out[i]), ZD_OK) << comm.error(r);
    });
    return network() - before;
  };
  const uint64_t header = step([&](int r, auto&, auto&) {
    const zd_comm_call c = mpi_call(r, 1, "barrier");
    return comm.d().barrier(comm.inst(), &c);
  });
  if (n == 1) {
    EXPECT_EQ(header, 0u);
  } else {
    EXPECT_GT(header, 0u);
  }
  std::vector<uint64_t> ring(l, 0);
  const uint64_t all_reduce = step([&](int r, auto& b, auto&) {
    const zd_comm_call c = mpi_call(r, 2, "all_reduce");
    return comm.d().all_reduce(comm.inst(), &c, b.data(), count, ZD_COMM_F32, ZD_REDUCE_SUM);
  });
  EXPECT_EQ(all_reduce - header, 2 * (n - 1) * count * 4 / n) << "reduce-scatter and all-gather between daemons";
  // A small all_reduce goes whole with the header to every daemon.
  const uint64_t small = step([&](int r, auto& b, auto&) {
    const zd_comm_call c = mpi_call(r, 2, "small all_reduce");
    return comm.d().all_reduce(comm.inst(), &c, b.data(), 16, ZD_COMM_F32, ZD_REDUCE_MAX);
  });
  EXPECT_EQ(small - header, (n - 1) * 16 * 4);
  const uint64_t reduce_scatter = step([&](int r, auto& b, auto& o) {
    const zd_comm_call c = mpi_call(r, 3, "reduce_scatter");
    return comm.d().reduce_scatter(comm.inst(), &c, b.data(), o.data(), count, ZD_COMM_F32, ZD_REDUCE_SUM);
  });
  EXPECT_EQ(reduce_scatter - header, (n - 1) * l * count * 4);
  const uint64_t all_gather = step([&](int r, auto& b, auto& o) {
    const zd_comm_call c = mpi_call(r, 4, "all_gather");
    return comm.d().all_gather(comm.inst(), &c, b.data(), o.data(), count, ZD_COMM_F32);
  });
  EXPECT_EQ(all_gather - header, (n - 1) * l * count * 4) << "each daemon's ranks' chunks, once per other daemon";
  const uint64_t broadcast = step([&](int r, auto& b, auto&) {
    const zd_comm_call c = mpi_call(r, 5, "broadcast");
    return comm.d().broadcast(comm.inst(), &c, b.data(), count, ZD_COMM_F32, 0);
  });
  EXPECT_EQ(broadcast - header, comm.node() == 0 ? (n - 1) * count * 4 : 0u);
  const uint64_t all_to_all = step([&](int r, auto& b, auto& o) {
    const zd_comm_call c = mpi_call(r, 6, "all_to_all");
    return comm.d().all_to_all(comm.inst(), &c, b.data(), o.data(), count, ZD_COMM_F32);
  });
  EXPECT_EQ(all_to_all - header, (n - 1) * l * l * count * 4);
  for (uint64_t i = 0; i < l; ++i) {
    const int r = me + static_cast<int>(i);
    const uint64_t bytes = count * 4;
    const uint64_t want = 2 * (w - 1) * bytes / w + (w - 1) * bytes * 3 +
                          (w == 1 || static_cast<uint64_t>(r) == w - 1 ? 0 : bytes);
    EXPECT_EQ(sent(r), want + 2 * (w - 1) * 64 / w) << "rank " << r;
    EXPECT_EQ(comm.figures(r).collectives, 7u);
    EXPECT_EQ(comm.figures(r).network_bytes_sent, network()) << "the daemon's figure, the same for its ranks";
  }
}

std::string local_name(const ::testing::TestParamInfo<int>& info) {
  return std::to_string(info.param) + "_ranks_per_node";
}

INSTANTIATE_TEST_SUITE_P(RanksPerNode, MpiOps, ::testing::Values(1, 2), local_name);

}  // namespace
}  // namespace zerod::comm::test
