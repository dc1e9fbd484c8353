// Tests that each need a run of their own (ctest runs them by filter):
//   Singleton.*      started without mpirun (one MPI process)
//   CreateTimeout.*  under mpirun -np 2: one daemon never creates its instance
//   DeadPeer.*       under mpirun -np 3: the last daemon stops (SIGSTOP) or
//                    dies (SIGKILL) mid-collective, as $ZEROD_TEST_DEATH says;
//                    dead_peer_test.sh runs both and checks the outcome
#include <gmock/gmock.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "mpi_test_util.h"

namespace zerod::comm::test {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

long long ms_since(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

TEST(Singleton, WithoutMpirunOnlyAWholeJobIsAccepted) {
  if (node_env().nodes != 1) GTEST_SKIP() << "run without mpirun";
  const zd_comm_v2* d = mpi_plugin();
  ASSERT_NE(d, nullptr);
  char err[1024] = "";
  void* inst = nullptr;
  const double values[] = {60, 20, 1 << 20};
  const zd_comm_config half = config_of(4, 0, 2);
  EXPECT_EQ(d->create(nullptr, values, 3, &half, &inst, err, sizeof err), ZD_ERR_CONFIG);
  EXPECT_EQ(inst, nullptr);
  EXPECT_THAT(err, HasSubstr("this daemon is the only MPI process, so it would serve all 4 ranks, but it serves 2 of "
                             "the job's 4 (ranks 0-1): start one daemon per node under MPI, e.g. mpirun -np 2"));
}

// One daemon with every rank: the daemon's ranks reduce over shared memory
// and nothing goes to MPI.
TEST(Singleton, OneDaemonRunsItsRanksAlone) {
  if (node_env().nodes != 1) GTEST_SKIP() << "run without mpirun";
  MpiComm comm(3);
  ASSERT_TRUE(comm.ok());
  std::vector<float> x = {1.0f, 1e8f, -1e8f};
  comm.on_my_ranks([&](int r) {
    const zd_comm_call c = mpi_call(r, 1, "sum in rank order");
    ASSERT_EQ(comm.d().all_reduce(comm.inst(), &c, &x[r], 1, ZD_COMM_F32, ZD_REDUCE_SUM), ZD_OK) << comm.error(r);
  });
  for (float v : x) EXPECT_EQ(v, 0.0f) << "(1 + 1e8) - 1e8 in rank order";
  EXPECT_EQ(comm.figures(0).network_bytes_sent, 0u);
  EXPECT_EQ(comm.figures(0).bytes_sent, 2u * 2 * 4 / 3);
}

TEST(CreateTimeout, ADaemonThatNeverCreatesItsInstanceIsNamed) {
  const NodeEnv e = node_env();
  if (e.nodes != 2) GTEST_SKIP() << "run under mpirun -np 2";
  const zd_comm_v2* d = mpi_plugin();
  ASSERT_NE(d, nullptr);
  char err[1024] = "";
  void* inst = nullptr;
  const double values[] = {1, 20, 1 << 20};
  {
    // MPI up on both (MPI_Init waits for every process), and a first
    // instance that both create.
    MpiComm first(1);
    ASSERT_TRUE(first.ok());
  }
  if (e.node == 1) {
    // Stuck for longer than node 0's timeout: it comes only once node 0 has
    // given up, and then waits in vain itself. (A daemon that refuses its
    // layout takes part in the exchange, and is named at once: Create.* in
    // failure_test.cpp.)
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    const zd_comm_config late = config_of(2, 1, 1);
    EXPECT_EQ(d->create(nullptr, values, 3, &late, &inst, err, sizeof err), ZD_ERR_TIMEOUT) << err;
    return;
  }
  const zd_comm_config cfg = config_of(2, 0, 1);
  const auto t0 = Clock::now();
  EXPECT_EQ(d->create(nullptr, values, 3, &cfg, &inst, err, sizeof err), ZD_ERR_TIMEOUT);
  EXPECT_GE(ms_since(t0), 950);
  EXPECT_LT(ms_since(t0), 5000);
  EXPECT_THAT(err, HasSubstr("waited 1 s for the other 1 daemons (MPI processes) to create their mpi comm instance"));
}

// The last daemon stops (or dies) while every daemon runs large all-reduces
// back to back. The others must fail within the call's timeout (1.5 s)
// with a message that names that daemon, never hang. (A daemon that dies
// can also make Open MPI's TCP transport abort the others on its own:
// dead_peer_test.sh says what it checks then.)
TEST(DeadPeer, TheOthersNameTheDeadDaemonWithinTheTimeout) {
  const NodeEnv e = node_env();
  if (e.nodes < 2) GTEST_SKIP() << "run under mpirun -np 2 or more";
  MpiValues v;
  v.timeout_s = 30;
  MpiComm comm(2, v);
  ASSERT_TRUE(comm.ok());
  const int victim = e.nodes - 1;
  const uint64_t count = uint64_t{4} << 20;  // 16 MiB of f32 per rank
  std::vector<std::vector<float>> bufs(2, std::vector<float>(count, 1.0f));
  std::atomic<int> started{0};
  if (e.node == victim) {
    std::thread([&] {
      while (started.load() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      // Into the exchange: the header is sent at once, the 32 MiB a rank
      // pair moves take longer than this.
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      const char* death = std::getenv("ZEROD_TEST_DEATH");
      const bool stop = death != nullptr && std::string(death) == "stop";
      std::printf("node %d: %s myself (pid %ld) in the middle of all-reduce #3\n", e.node,
                  stop ? "stopping" : "killing", static_cast<long>(getpid()));
      std::fflush(stdout);
      raise(stop ? SIGSTOP : SIGKILL);
    }).detach();
  }
  std::vector<zd_status> st(2, ZD_OK);
  std::vector<std::string> msg(2);
  std::vector<long long> since_last_ok(2);
  comm.on_my_ranks([&](int r) {
    const int i = r - comm.first();
    Clock::time_point last_ok = Clock::now();
    for (int k = 0; k < 1000; ++k) {
      if (i == 0) started.fetch_add(1);
      const zd_comm_call c = mpi_call(r, static_cast<uint64_t>(k), "big all_reduce", 1500);
      st[i] = comm.d().all_reduce(comm.inst(), &c, bufs[i].data(), count, ZD_COMM_F32, ZD_REDUCE_MAX);
      if (st[i] != ZD_OK) break;
      last_ok = Clock::now();
    }
    since_last_ok[i] = ms_since(last_ok);
    msg[i] = comm.error(r);
  });
  const std::string dead = "node " + std::to_string(victim) + " (ranks ";
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(st[i], ZD_ERR_TIMEOUT) << msg[i];
    EXPECT_THAT(msg[i], HasSubstr(dead));
    EXPECT_LT(since_last_ok[i], 1500 + 3000) << "failed within the timeout (plus a loaded machine's slack)";
    std::printf("node %d rank %d saw: %s\n", e.node, comm.first() + i, msg[i].c_str());
  }
}

}  // namespace
}  // namespace zerod::comm::test
