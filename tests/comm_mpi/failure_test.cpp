// How collectives fail across daemons: ranks of different daemons in
// different collectives, a daemon that does not come (timeout), abort() and
// local failures of one daemon reaching the others, rank layouts that do not
// match MPI, daemons that disagree, buffers that overlap other than in
// place, and two instances at once. Every
// process of the mpirun runs the same tests in the same order; the tests
// need at least two nodes.
#include <gmock/gmock.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "mpi_test_util.h"

namespace zerod::comm::test {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

long long ms_since(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

#define NEED_NODES(n)                                                               \
  do {                                                                              \
    if (node_env().nodes < (n)) GTEST_SKIP() << "needs " << (n) << " MPI processes"; \
  } while (0)

TEST(AcrossNodes, DaemonsInDifferentCollectivesFailEveryRank) {
  NEED_NODES(2);
  MpiComm comm(2);
  ASSERT_TRUE(comm.ok());
  std::vector<zd_status> st(2, ZD_OK), later(2, ZD_OK);
  std::vector<std::string> msg(2), later_msg(2);
  std::vector<float> a(8, 1.0f), b(2 * 4 * comm.world(), 1.0f);
  comm.on_my_ranks([&](int r) {
    const int i = r - comm.first();
    if (comm.node() == 0) {
      const zd_comm_call c = mpi_call(r, 3, "step 3: grad norm");
      std::vector<float> x(a);
      st[i] = comm.d().all_reduce(comm.inst(), &c, x.data(), 8, ZD_COMM_F32, ZD_REDUCE_SUM);
    } else {
      const zd_comm_call c = mpi_call(r, 3, "forward_begin('fc2'): all-gather");
      std::vector<float> in(4), out(4 * comm.world());
      st[i] = comm.d().all_gather(comm.inst(), &c, in.data(), out.data(), 4, ZD_COMM_F32);
    }
    msg[i] = comm.error(r);
    const zd_comm_call next = mpi_call(r, 4, "next");
    later[i] = comm.d().barrier(comm.inst(), &next);
    later_msg[i] = comm.error(r);
  });
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(st[i], ZD_ERR_INVALID_STATE);
    // Every daemon finds the disagreement from the headers, or hears it from
    // one that found it first ("node 1 (...) failed: ranks disagree ...").
    EXPECT_THAT(msg[i], HasSubstr("ranks disagree at collective #1: ranks 0, 1 (node 0, host "));
    EXPECT_THAT(msg[i], HasSubstr(" are in \"step 3: grad norm\" (all_reduce sum, 8 f32), ranks 2"));
    EXPECT_THAT(msg[i], HasSubstr(comm.nodes() == 2 ? "ranks 2, 3 (node 1, host " : "ranks 2-5 (nodes 1, 2)"));
    EXPECT_THAT(msg[i], HasSubstr(" are in \"forward_begin('fc2'): all-gather\" (all_gather, 4 f32)"));
    EXPECT_EQ(later[i], ZD_ERR_INVALID_STATE);
    EXPECT_THAT(later_msg[i], HasSubstr("'s collective #2 \"next\" was not run: "));
    EXPECT_THAT(later_msg[i], HasSubstr("ranks disagree at collective #1"));
  }
}

TEST(AcrossNodes, OneDaemonsDisagreementReachesTheOthers) {
  NEED_NODES(2);
  MpiComm comm(2);
  ASSERT_TRUE(comm.ok());
  std::vector<zd_status> st(2, ZD_OK);
  std::vector<std::string> msg(2);
  std::vector<long long> took(2);
  comm.on_my_ranks([&](int r) {
    const int i = r - comm.first();
    const auto t0 = Clock::now();
    float x = 1;
    if (comm.node() == 1 && i == 1) {
      const zd_comm_call c = mpi_call(r, 5, "rank 3's barrier");
      st[i] = comm.d().barrier(comm.inst(), &c);
    } else {
      const zd_comm_call c = mpi_call(r, 5, "loss scale");
      st[i] = comm.d().all_reduce(comm.inst(), &c, &x, 1, ZD_COMM_F32, ZD_REDUCE_MAX);
    }
    took[i] = ms_since(t0);
    msg[i] = comm.error(r);
  });
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(st[i], ZD_ERR_INVALID_STATE);
    EXPECT_LT(took[i], 10000) << "at once, not after the 60 s timeout";
    EXPECT_THAT(msg[i], HasSubstr("ranks disagree at collective #1: rank 2 is in \"loss scale\" (all_reduce max, 1 "
                                  "f32), rank 3 is in \"rank 3's barrier\" (barrier)"));
    if (comm.node() != 1) {
      EXPECT_THAT(msg[i], HasSubstr("node 1 (ranks 2-3, host "));
    }
  }
}

TEST(AcrossNodes, ADaemonThatDoesNotComeTimesOutTheOthers) {
  NEED_NODES(2);
  MpiComm comm(1);
  ASSERT_TRUE(comm.ok());
  const int absent = comm.nodes() - 1;
  zd_status st = ZD_OK;
  std::string msg;
  long long took = 0;
  comm.on_my_ranks([&](int r) {
    const zd_comm_call warm = mpi_call(r, 1, "warm-up");
    ASSERT_EQ(comm.d().barrier(comm.inst(), &warm), ZD_OK) << comm.error(r);
    const auto t0 = Clock::now();
    if (comm.node() == absent) {
      // Comes late, after the others gave up: refused at once.
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      const zd_comm_call late = mpi_call(r, 2, "late all_reduce", 0);
      const auto t1 = Clock::now();
      float x = 1;
      st = comm.d().all_reduce(comm.inst(), &late, &x, 1, ZD_COMM_F32, ZD_REDUCE_SUM);
      took = ms_since(t1);
    } else {
      const zd_comm_call c = mpi_call(r, 2, "step 9: grad norm", 300);
      float x = 1;
      st = comm.d().all_reduce(comm.inst(), &c, &x, 1, ZD_COMM_F32, ZD_REDUCE_SUM);
      took = ms_since(t0);
    }
    msg = comm.error(r);
  });
  EXPECT_EQ(st, ZD_ERR_TIMEOUT);
  EXPECT_THAT(msg, HasSubstr("timeout at collective #2 (all_reduce sum, 1 f32): this daemon's ranks waited "));
  EXPECT_THAT(msg, HasSubstr("not arrived: node " + std::to_string(absent) + " (rank " + std::to_string(absent) +
                             ", host "));
  EXPECT_THAT(msg, HasSubstr("whose ranks were last all in collective #1 \"warm-up\""));
  if (comm.node() == absent) {
    EXPECT_LT(took, 100) << "a late rank finds the collective failed";
    EXPECT_THAT(msg, HasSubstr("'s collective #2 \"late all_reduce\" was not run: node "));
  } else {
    EXPECT_GE(took, 250);
    EXPECT_LT(took, 5000);
  }
}

// The arrival across nodes waits until the earliest deadline of the ranks'
// calls (rank 0's: 800 ms from its call), and says how long the ranks whose
// deadline that is waited, not the earliest deadline less the smallest
// timeout (rank 1's 500 ms, from a call 400 ms later), which read 500 ms.
TEST(AcrossNodes, ATimeoutSaysHowLongTheRankWhoseDeadlinePassedWaited) {
  NEED_NODES(2);
  MpiComm comm(2);
  ASSERT_TRUE(comm.ok());
  const int absent = comm.nodes() - 1;
  std::vector<zd_status> st(2, ZD_OK);
  std::vector<std::string> msg(2);
  comm.on_my_ranks([&](int r) {
    const int i = r - comm.first();
    if (comm.node() == absent) {
      // Comes after the others gave up: refused at once.
      std::this_thread::sleep_for(std::chrono::milliseconds(2000));
      const zd_comm_call late = mpi_call(r, 2, "late barrier", 0);
      st[i] = comm.d().barrier(comm.inst(), &late);
    } else if (i == 0) {
      const zd_comm_call c = mpi_call(r, 2, "barrier", 800);
      st[i] = comm.d().barrier(comm.inst(), &c);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(400));
      const zd_comm_call c = mpi_call(r, 2, "barrier", 500);
      st[i] = comm.d().barrier(comm.inst(), &c);
    }
    msg[i] = comm.error(r);
  });
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(st[i], ZD_ERR_TIMEOUT) << msg[i];
    const std::string waited = "this daemon's ranks waited ";
    const size_t at = msg[i].find(waited);
    ASSERT_NE(at, std::string::npos) << msg[i];
    const long long ms = std::atoll(msg[i].c_str() + at + waited.size());
    EXPECT_GE(ms, 750) << msg[i];
    EXPECT_LT(ms, 5000) << msg[i];
  }
}

// send and recv that overlap other than in place are refused, on every
// rank of every daemon at once (this plugin stages through its own buffer,
// so it would compute them right, but the local and nccl plugins cannot:
// one contract for all).
TEST(AcrossNodes, OverlapOtherThanInPlaceIsRefusedOnEveryRank) {
  NEED_NODES(2);
  constexpr size_t n = 16;
  for (bool scatter : {true, false}) {
    MpiComm comm(2);
    ASSERT_TRUE(comm.ok());
    const size_t w = static_cast<size_t>(comm.world());
    std::vector<zd_status> st(2, ZD_OK);
    std::vector<std::string> msg(2);
    comm.on_my_ranks([&](int r) {
      const int i = r - comm.first();
      std::vector<float> send(scatter ? w * n : n, 1.0f), recv(scatter ? n : w * n, 0.0f);
      const zd_comm_call c = mpi_call(r, 6, r == 1 ? "overlapping" : "good");
      if (scatter) {
        // Rank 1's in-place recv is send + n; send itself overlaps chunk 0.
        void* to = r == 1 ? static_cast<void*>(send.data()) : recv.data();
        st[i] = comm.d().reduce_scatter(comm.inst(), &c, send.data(), to, n, ZD_COMM_F32, ZD_REDUCE_SUM);
      } else {
        const void* from = r == 1 ? static_cast<const void*>(recv.data()) : send.data();
        st[i] = comm.d().all_gather(comm.inst(), &c, from, recv.data(), n, ZD_COMM_F32);
      }
      msg[i] = comm.error(r);
    });
    const std::string why = scatter ? "send and recv overlap, not in place (recv = send + rank * recv_count)"
                                    : "send and recv overlap, not in place (send = recv + rank * send_count)";
    for (int i = 0; i < 2; ++i) {
      const int r = comm.first() + i;
      if (r == 1) {
        EXPECT_EQ(st[i], ZD_ERR_INVALID_ARGUMENT);
      } else {
        EXPECT_NE(st[i], ZD_OK) << "rank " << r;
      }
      EXPECT_THAT(msg[i], HasSubstr(why)) << "rank " << r;
      EXPECT_THAT(msg[i], HasSubstr("rank 1's call \"overlapping\"")) << "rank " << r;
    }
  }
}

TEST(AcrossNodes, AbortOnOneDaemonFailsTheOthersAtOnce) {
  NEED_NODES(2);
  MpiComm comm(2);
  ASSERT_TRUE(comm.ok());
  const int aborter = comm.nodes() - 1;
  std::vector<zd_status> st(2, ZD_OK);
  std::vector<std::string> msg(2);
  std::vector<long long> took(2);
  std::thread abort_thread;
  if (comm.node() == aborter) {
    abort_thread = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      comm.d().abort(comm.inst(), ZD_ERR_PEER_LOST, "rank 3 left the job: killed by signal 9");
    });
  }
  comm.on_my_ranks([&](int r) {
    const int i = r - comm.first();
    if (comm.node() == aborter && i == 1) return;  // the rank that "died"
    const zd_comm_call c = mpi_call(r, 6, "waits without a limit", 0);
    const auto t0 = Clock::now();
    st[i] = comm.d().barrier(comm.inst(), &c);
    took[i] = ms_since(t0);
    msg[i] = comm.error(r);
  });
  if (abort_thread.joinable()) abort_thread.join();
  for (int i = 0; i < 2; ++i) {
    if (comm.node() == aborter && i == 1) continue;
    EXPECT_EQ(st[i], ZD_ERR_PEER_LOST);
    EXPECT_LT(took[i], 5000);
    if (comm.node() == aborter) {
      EXPECT_EQ(msg[i], "rank 3 left the job: killed by signal 9");
    } else {
      EXPECT_THAT(msg[i], HasSubstr("node " + std::to_string(aborter) + " (ranks "));
      EXPECT_THAT(msg[i], HasSubstr(") failed: rank 3 left the job: killed by signal 9"));
    }
  }
}

TEST(AcrossNodes, ALocalTimeoutOnOneDaemonReachesTheOthers) {
  NEED_NODES(2);
  MpiComm comm(2);
  ASSERT_TRUE(comm.ok());
  std::vector<zd_status> st(2, ZD_OK);
  std::vector<std::string> msg(2);
  std::vector<long long> took(2);
  comm.on_my_ranks([&](int r) {
    const int i = r - comm.first();
    if (r == 3) {
      // Arrives long after rank 2 gave up.
      std::this_thread::sleep_for(std::chrono::milliseconds(1200));
      const zd_comm_call c = mpi_call(r, 7, "rank 3, late");
      st[i] = comm.d().barrier(comm.inst(), &c);
      msg[i] = comm.error(r);
      return;
    }
    const zd_comm_call c = mpi_call(r, 7, "barrier", r == 2 ? 200 : 20000);
    const auto t0 = Clock::now();
    st[i] = comm.d().barrier(comm.inst(), &c);
    took[i] = ms_since(t0);
    msg[i] = comm.error(r);
  });
  for (int i = 0; i < 2; ++i) {
    const int r = comm.first() + i;
    EXPECT_EQ(st[i], ZD_ERR_TIMEOUT) << "rank " << r;
    EXPECT_THAT(msg[i], HasSubstr("timeout at collective #1 (barrier): rank 2 waited "));
    EXPECT_THAT(msg[i], HasSubstr("not arrived: rank 3 (no collective yet)"));
    if (comm.node() != 1) {
      EXPECT_THAT(msg[i], HasSubstr("node 1 (ranks 2-3, host "));
      EXPECT_LT(took[i], 5000) << "told by node 1, long before its own 20 s";
    }
  }
}

TEST(AcrossNodes, TwoInstancesAtOnceKeepTheirOwnCollectives) {
  NEED_NODES(2);
  MpiComm a(1), b(1);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(b.ok());
  a.on_my_ranks([&](int r) {
    // Opposite orders across the two instances would deadlock one shared
    // communicator; each instance has its own.
    float x = static_cast<float>(r + 1), y = 10.0f * static_cast<float>(r + 1);
    const zd_comm_call c = mpi_call(r, 1, "two instances");
    ASSERT_EQ(b.d().all_reduce(b.inst(), &c, &y, 1, ZD_COMM_F32, ZD_REDUCE_SUM), ZD_OK) << b.error(r);
    ASSERT_EQ(a.d().all_reduce(a.inst(), &c, &x, 1, ZD_COMM_F32, ZD_REDUCE_SUM), ZD_OK) << a.error(r);
    const float n = static_cast<float>(a.world());
    EXPECT_EQ(x, n * (n + 1) / 2);
    EXPECT_EQ(y, 10 * n * (n + 1) / 2);
  });
}

zd_status try_create(const zd_comm_config& cfg, MpiValues v, std::string* err) {
  const zd_comm_v2* d = mpi_plugin();
  char buf[1024] = "";
  void* inst = nullptr;
  const double values[] = {v.timeout_s, v.spin_us, v.segment};
  const zd_status st = d->create(nullptr, values, 3, &cfg, &inst, buf, sizeof buf);
  *err = buf;
  if (st == ZD_OK) d->destroy(inst);
  return st;
}

TEST(Create, LayoutsThatDoNotMatchMpiAreRefusedSayingWhatWasExpected) {
  NEED_NODES(2);
  const NodeEnv e = node_env();
  std::string err;
  // One node too many in world_size.
  EXPECT_EQ(try_create(config_of((e.nodes + 1) * 2, e.node * 2, 2), {}, &err), ZD_ERR_CONFIG);
  EXPECT_THAT(err, HasSubstr("MPI process " + std::to_string(e.node) + " of " + std::to_string(e.nodes)));
  EXPECT_THAT(err, HasSubstr("it should serve ranks " + std::to_string(e.node * 2) + "-" +
                             std::to_string(e.node * 2 + 1) + " of world_size " + std::to_string(e.nodes * 2)));
  // Another daemon's ranks.
  const int other = (e.node + 1) % e.nodes;
  EXPECT_EQ(try_create(config_of(e.nodes * 2, other * 2, 2), {}, &err), ZD_ERR_CONFIG);
  EXPECT_THAT(err, HasSubstr("one daemon per node in node order"));
  // Not a block of ranks at all.
  EXPECT_EQ(try_create(config_of(4, 3, 2), {}, &err), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(err, HasSubstr("not a block of ranks"));
  // A bad hyperparameter is named.
  MpiValues bad;
  bad.segment = 100;
  EXPECT_EQ(try_create(config_of(e.nodes, e.node, 1), bad, &err), ZD_ERR_CONFIG);
  EXPECT_THAT(err, HasSubstr("segment = 100"));
}

TEST(Create, DaemonsThatDisagreeAreRefusedOnEveryDaemon) {
  NEED_NODES(2);
  const NodeEnv e = node_env();
  MpiValues v;
  if (e.node == 1) v.segment = 65536;
  std::string err;
  EXPECT_EQ(try_create(config_of(e.nodes * 2, e.node * 2, 2), v, &err), ZD_ERR_CONFIG);
  EXPECT_THAT(err, HasSubstr("the daemons disagree: node "));
  EXPECT_THAT(err, HasSubstr(e.node == 1 ? "segment 1048576; node 1 (this one) has world_size " +
                                               std::to_string(e.nodes * 2) + ", ranks 2-3, segment 65536"
                                         : "segment 65536; node " + std::to_string(e.node) + " (this one)"));
}

// A daemon whose layout is wrong still takes part in the exchange, so the
// others fail at once with its words instead of waiting for it until their
// timeout (without one, for ever); the daemons stay in step for the next
// instance.
TEST(Create, OneDaemonsRefusalFailsEveryDaemonAtOnceWithItsWords) {
  NEED_NODES(2);
  const NodeEnv e = node_env();
  MpiValues v;
  v.timeout_s = 30;
  // Node 1 says it serves node 0's ranks (both were given --node-rank 0).
  const zd_comm_config cfg = config_of(e.nodes * 2, e.node == 1 ? 0 : e.node * 2, 2);
  std::string err;
  const auto t0 = Clock::now();
  EXPECT_EQ(try_create(cfg, v, &err), ZD_ERR_CONFIG);
  EXPECT_LT(ms_since(t0), 5000) << "waited for the refusing daemon";
  const std::string words = "MPI process 1 of " + std::to_string(e.nodes) + " serves ranks 0-1 of " +
                            std::to_string(e.nodes * 2) + ", but the mpi comm plugin expects one daemon per node";
  EXPECT_THAT(err, HasSubstr(words));
  if (e.node == 1) {
    EXPECT_THAT(err, ::testing::Not(HasSubstr("refused the mpi comm instance"))) << "its own words, as they were";
  } else {
    EXPECT_THAT(err, HasSubstr("node 1 (host "));
    EXPECT_THAT(err, HasSubstr("refused the mpi comm instance, so no daemon can open it: " + words));
  }
  MpiComm next(2, v);
  EXPECT_TRUE(next.ok()) << "the daemons are out of step after the refusal";
}

}  // namespace
}  // namespace zerod::comm::test
