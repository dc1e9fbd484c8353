// How collectives fail: ranks that disagree, a rank that never arrives
// (timeout), abort(), invalid calls. Each fails on every rank that called
// the collective, names who was where, and leaves the instance broken.
#include <gmock/gmock.h>

#include <atomic>
#include <chrono>

#include "comm_test_util.h"

namespace zerod::comm::test {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

long long ms_since(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

TEST(Disagreement, DifferentOpsFailBothRanksNamingBothCalls) {
  Comm comm(2);
  std::vector<float> send(2048), recv(1024);
  std::vector<float> gather(1024), gathered(1024);
  zd_status st[2];
  on_ranks(2, [&](int r) {
    if (r == 0) {
      const zd_comm_call c = call_for(0, 5, "backward_end('fc1'): reduce-scatter");
      st[0] = comm.d().reduce_scatter(comm.inst(), &c, send.data(), recv.data(), 1024, ZD_COMM_F32, ZD_REDUCE_SUM);
    } else {
      const zd_comm_call c = call_for(1, 5, "forward_begin('fc2'): all-gather");
      st[1] = comm.d().all_gather(comm.inst(), &c, gather.data(), gathered.data(), 512, ZD_COMM_F32);
    }
  });
  const std::string want =
      "ranks disagree at collective #1: rank 0 is in \"backward_end('fc1'): reduce-scatter\" "
      "(reduce_scatter sum, 1024 f32), rank 1 is in \"forward_begin('fc2'): all-gather\" (all_gather, 512 f32)";
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(st[r], ZD_ERR_INVALID_STATE);
    EXPECT_EQ(comm.error(r), want);
  }
}

TEST(Disagreement, DifferentTagsFailAndShowTheTags) {
  Comm comm(2);
  float x[2] = {1, 2};
  zd_status st[2];
  on_ranks(2, [&](int r) {
    const zd_comm_call c = call_for(r, r == 0 ? 0x11 : 0x22, r == 0 ? "step 1: grad norm" : "step 1: loss scale");
    st[r] = comm.d().all_reduce(comm.inst(), &c, &x[r], 1, ZD_COMM_F32, ZD_REDUCE_SUM);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(st[r], ZD_ERR_INVALID_STATE);
    EXPECT_THAT(comm.error(r), HasSubstr("rank 0 is in \"step 1: grad norm\" (all_reduce sum, 1 f32, tag 0x11)"));
    EXPECT_THAT(comm.error(r), HasSubstr("rank 1 is in \"step 1: loss scale\" (all_reduce sum, 1 f32, tag 0x22)"));
  }
}

TEST(Disagreement, DifferentCountFailsAllThreeRanksAndLaterCalls) {
  Comm comm(3);
  std::vector<std::vector<float>> bufs(3, std::vector<float>(1024));
  zd_status st[3], later[3];
  std::string msg[3], later_msg[3];
  on_ranks(3, [&](int r) {
    // Three collectives that agree, so the failure is collective #4.
    for (int i = 0; i < 3; ++i) {
      const zd_comm_call ok = call_for(r, 1, "warm-up");
      ASSERT_EQ(comm.d().barrier(comm.inst(), &ok), ZD_OK);
    }
    const uint64_t count = r == 2 ? 512 : 1024;
    const zd_comm_call c = call_for(r, 2, r == 2 ? "rank two's sum" : "the sum");
    st[r] = comm.d().all_reduce(comm.inst(), &c, bufs[r].data(), count, ZD_COMM_F32, ZD_REDUCE_SUM);
    msg[r] = comm.error(r);
    const zd_comm_call next = call_for(r, 3, "next step");
    later[r] = comm.d().barrier(comm.inst(), &next);
    later_msg[r] = comm.error(r);
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(st[r], ZD_ERR_INVALID_STATE) << r;
    EXPECT_THAT(msg[r], HasSubstr("ranks disagree at collective #4: "));
    EXPECT_THAT(msg[r], HasSubstr("\"rank two's sum\" (all_reduce sum, 512 f32)"));
    EXPECT_THAT(msg[r], HasSubstr("\"the sum\" (all_reduce sum, 1024 f32)"));
    // Broken: the next call fails at once, naming itself and quoting the cause.
    EXPECT_EQ(later[r], ZD_ERR_INVALID_STATE);
    EXPECT_THAT(later_msg[r], HasSubstr("rank " + std::to_string(r) + "'s collective #5 \"next step\" was not run: "
                                        "ranks disagree at collective #4"));
  }
}

TEST(Timeout, MissingRankFailsTheWaitersAndTheLateRank) {
  Comm comm(3);
  float x[3] = {1, 2, 3};
  zd_status st[3] = {ZD_OK, ZD_OK, ZD_OK};
  long long waited[3] = {0, 0, 0};
  on_ranks(3, [&](int r) {
    const zd_comm_call warm = call_for(r, 1, r == 2 ? "rank 2 warm-up" : "warm-up");
    ASSERT_EQ(comm.d().barrier(comm.inst(), &warm), ZD_OK);
    if (r == 2) return;  // never arrives at #2
    const zd_comm_call c = call_for(r, 2, "forward_begin('fc1'): all-gather", 100);
    const auto t0 = Clock::now();
    st[r] = comm.d().all_reduce(comm.inst(), &c, &x[r], 1, ZD_COMM_F32, ZD_REDUCE_SUM);
    waited[r] = ms_since(t0);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(st[r], ZD_ERR_TIMEOUT);
    EXPECT_GE(waited[r], 95) << "rank " << r;
    EXPECT_LT(waited[r], 2000) << "rank " << r;
    const std::string m = comm.error(r);
    EXPECT_THAT(m, HasSubstr("timeout at collective #2 (all_reduce sum, 1 f32): rank "));
    EXPECT_THAT(m, HasSubstr(" ms; arrived: ranks 0, 1 in \"forward_begin('fc1'): all-gather\"; "
                             "not arrived: rank 2 (last seen in collective #1, \"rank 2 warm-up\")"));
  }
  // The late rank finds the collective gone, at once, even with no timeout.
  const zd_comm_call late = call_for(2, 2, "forward_begin('fc1'): all-gather (late)");
  const auto t0 = Clock::now();
  EXPECT_EQ(comm.d().all_reduce(comm.inst(), &late, &x[2], 1, ZD_COMM_F32, ZD_REDUCE_SUM), ZD_ERR_TIMEOUT);
  EXPECT_LT(ms_since(t0), 50);
  EXPECT_THAT(comm.error(2), HasSubstr("rank 2's collective #2 \"forward_begin('fc1'): all-gather (late)\" was not "
                                       "run: timeout at collective #2"));
  EXPECT_EQ(x[0], 1.0f) << "a failed collective leaves the buffer alone";
}

TEST(Timeout, OneRanksLimitFailsRanksWaitingWithoutOne) {
  Comm comm(3);
  zd_status st[2];
  on_ranks(2, [&](int r) {
    // Rank 1 would wait forever; rank 0's timeout ends the collective for both.
    const zd_comm_call c = call_for(r, 1, "barrier", r == 0 ? 50 : 0);
    st[r] = comm.d().barrier(comm.inst(), &c);
  });
  EXPECT_EQ(st[0], ZD_ERR_TIMEOUT);
  EXPECT_EQ(st[1], ZD_ERR_TIMEOUT);
  EXPECT_EQ(comm.error(0), comm.error(1));
  EXPECT_THAT(comm.error(1), HasSubstr("not arrived: rank 2 (no collective yet)"));
}

TEST(Timeout, RanksThatAllArriveInTimeSucceed) {
  Comm comm(3);
  on_ranks(3, [&](int r) {
    for (int i = 0; i < 20; ++i) {
      const zd_comm_call c = call_for(r, 1, "quick", 5000);
      ASSERT_EQ(comm.d().barrier(comm.inst(), &c), ZD_OK) << comm.error(r);
    }
  });
}

TEST(Abort, WakesWaitersAndFailsLaterCalls) {
  Comm comm(3);
  zd_status st[2];
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    comm.d().abort(comm.inst(), ZD_ERR_PEER_LOST, "rank 2's connection dropped");
  });
  on_ranks(2, [&](int r) {
    float x = 1;
    const zd_comm_call c = call_for(r, 1, "waits forever");
    st[r] = comm.d().all_reduce(comm.inst(), &c, &x, 1, ZD_COMM_F32, ZD_REDUCE_SUM);
  });
  aborter.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(st[r], ZD_ERR_PEER_LOST);
    EXPECT_EQ(comm.error(r), "rank 2's connection dropped");
  }
  const zd_comm_call c = call_for(2, 1, "late");
  EXPECT_EQ(comm.d().barrier(comm.inst(), &c), ZD_ERR_PEER_LOST);
  EXPECT_EQ(comm.error(2), "rank 2's connection dropped");
}

TEST(Abort, BeforeAnyCallAndWithoutAReason) {
  Comm comm(2);
  comm.d().abort(comm.inst(), ZD_OK, nullptr);  // a failed call never reports success
  const zd_comm_call c = call_for(0);
  EXPECT_EQ(comm.d().barrier(comm.inst(), &c), ZD_ERR_INVALID_STATE);
  EXPECT_EQ(comm.error(0), "aborted");
}

TEST(Abort, EveryRankSeesTheSameOutcomeForEachCollective) {
  // Collectives run back to back while another thread aborts at a random
  // moment: a collective that started succeeds everywhere, one that did not
  // fails everywhere, so all ranks stop at the same collective.
  for (int trial = 0; trial < 5; ++trial) {
    Comm comm(4);
    std::vector<std::vector<zd_status>> seen(4);
    std::thread aborter([&] {
      std::this_thread::sleep_for(std::chrono::microseconds(200 + 700 * trial));
      comm.d().abort(comm.inst(), ZD_ERR_PEER_LOST, "stop");
    });
    on_ranks(4, [&](int r) {
      std::vector<float> buf(64, 1.0f);
      for (int i = 0; i < 100000; ++i) {
        const zd_comm_call c = call_for(r, static_cast<uint64_t>(i), "loop");
        const zd_status st = comm.d().all_reduce(comm.inst(), &c, buf.data(), buf.size(), ZD_COMM_F32, ZD_REDUCE_MAX);
        seen[r].push_back(st);
        if (st != ZD_OK) break;
      }
    });
    aborter.join();
    for (int r = 1; r < 4; ++r) EXPECT_EQ(seen[r], seen[0]) << "rank " << r << ", trial " << trial;
    ASSERT_FALSE(seen[0].empty());
    EXPECT_EQ(seen[0].back(), ZD_ERR_PEER_LOST);
  }
}

TEST(Invalid, NullBufferFailsTheCallerAndTheWaiters) {
  Comm comm(2);
  float x = 1;
  zd_status st[2];
  on_ranks(2, [&](int r) {
    const zd_comm_call c = call_for(r, 1, r == 0 ? "good" : "bad");
    st[r] = comm.d().all_reduce(comm.inst(), &c, r == 0 ? &x : nullptr, 1, ZD_COMM_F32, ZD_REDUCE_SUM);
  });
  EXPECT_EQ(st[1], ZD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(st[0], ZD_ERR_INVALID_STATE);
  const std::string why = "rank 1's call \"bad\" at collective #1 is invalid: buf is NULL with count 1";
  EXPECT_EQ(comm.error(1), why);
  // Rank 0 was either waiting (the message as is) or came later (its call
  // named, then the message).
  EXPECT_THAT(comm.error(0), ::testing::EndsWith(why));
}

TEST(Invalid, BadDtypeOpRootAndRank) {
  struct Bad {
    const char* want;
    std::function<zd_status(const Comm&, const zd_comm_call&)> call;
  };
  static float x[4];
  const Bad cases[] = {
      {"dtype 5 is not a zd_comm_dtype",
       [](const Comm& c, const zd_comm_call& k) { return c.d().all_reduce(c.inst(), &k, x, 1, 5, ZD_REDUCE_SUM); }},
      {"op 3 is not a zd_reduce_op",
       [](const Comm& c, const zd_comm_call& k) { return c.d().reduce_scatter(c.inst(), &k, x, x, 1, ZD_COMM_F32, 3); }},
      {"root 2 is outside 0..1",
       [](const Comm& c, const zd_comm_call& k) { return c.d().broadcast(c.inst(), &k, x, 1, ZD_COMM_F32, 2); }},
      {"recv is NULL with count 1",
       [](const Comm& c, const zd_comm_call& k) { return c.d().all_gather(c.inst(), &k, x, nullptr, 1, ZD_COMM_F32); }},
      {"count 9223372036854775807 overflows a buffer size",
       [](const Comm& c, const zd_comm_call& k) {
         return c.d().all_gather(c.inst(), &k, x, x, INT64_MAX, ZD_COMM_F32);
       }},
  };
  for (const auto& bad : cases) {
    Comm comm(2);
    const zd_comm_call c = call_for(0, 1, "bad");
    EXPECT_EQ(bad.call(comm, c), ZD_ERR_INVALID_ARGUMENT) << bad.want;
    EXPECT_THAT(comm.error(0), HasSubstr(bad.want));
    // The other rank will not wait for a collective that cannot happen.
    const zd_comm_call other = call_for(1, 1, "other");
    EXPECT_EQ(comm.d().barrier(comm.inst(), &other), ZD_ERR_INVALID_STATE);
    EXPECT_THAT(comm.error(1), HasSubstr(bad.want));
  }
}

// send and recv that overlap other than in place: the other ranks read this
// rank's send while it writes its recv, so they would have reduced or
// gathered its results (rank 1's recv = send gave rank 0 301 for 3 in most
// elements, with ZD_OK everywhere). Refused on every rank at once; the good
// ranks' outputs are left as they were.
TEST(Invalid, OverlapOtherThanInPlaceFailsEveryRank) {
  constexpr size_t n = 256;  // elements per chunk
  for (int world : {2, 3}) {
    const int bad = world - 1;
    const size_t in_place = static_cast<size_t>(bad) * n;
    for (bool scatter : {true, false}) {
      // Element offsets of the bad rank's smaller buffer from its larger one
      // (0: recv = send, the reviewer's case; one element either side of the
      // in-place chunk: a partial overlap).
      for (size_t offset : {size_t{0}, in_place - 1, in_place + 1}) {
        Comm comm(world);
        // The bad rank's buffers, both inside one allocation: the larger
        // one starts at element n.
        std::vector<float> mine((static_cast<size_t>(world) + 2) * n, 1.0f);
        std::vector<std::vector<float>> send(world), recv(world);
        for (int r = 0; r < world; ++r) {
          send[r].assign(scatter ? world * n : n, static_cast<float>(r + 1));
          recv[r].assign(scatter ? n : world * n, -1.0f);
        }
        std::vector<zd_status> st(world, ZD_OK);
        on_ranks(world, [&](int r) {
          const zd_comm_call c = call_for(r, 1, r == bad ? "overlapping" : "good");
          if (scatter) {
            const float* from = r == bad ? mine.data() + n : send[r].data();
            float* to = r == bad ? mine.data() + n + offset : recv[r].data();
            st[r] = comm.d().reduce_scatter(comm.inst(), &c, from, to, n, ZD_COMM_F32, ZD_REDUCE_SUM);
          } else {
            float* to = r == bad ? mine.data() + n : recv[r].data();
            const float* from = r == bad ? mine.data() + n + offset : send[r].data();
            st[r] = comm.d().all_gather(comm.inst(), &c, from, to, n, ZD_COMM_F32);
          }
        });
        const std::string why = scatter ? "send and recv overlap, not in place (recv = send + rank * recv_count)"
                                        : "send and recv overlap, not in place (send = recv + rank * send_count)";
        const std::string where =
            "world " + std::to_string(world) + (scatter ? ", reduce_scatter" : ", all_gather") + ", offset " +
            std::to_string(offset);
        for (int r = 0; r < world; ++r) {
          EXPECT_EQ(st[r], r == bad ? ZD_ERR_INVALID_ARGUMENT : ZD_ERR_INVALID_STATE) << where << ", rank " << r;
          EXPECT_THAT(comm.error(r), HasSubstr(why)) << where << ", rank " << r;
          if (r != bad) {
            EXPECT_EQ(recv[r], std::vector<float>(recv[r].size(), -1.0f)) << where << ", rank " << r;
          }
        }
        EXPECT_THAT(comm.error(bad), HasSubstr("rank " + std::to_string(bad) + "'s call \"overlapping\""));
      }
    }
  }
}

// The in-place chunk and buffers that touch without overlapping are
// accepted, and give the reference's values.
TEST(Invalid, InPlaceAndAdjacentBuffersAreAccepted) {
  constexpr int world = 3;
  constexpr size_t n = 64;
  for (bool scatter : {true, false}) {
    // Per rank: one allocation holding the larger buffer at element n and
    // the smaller one where `at` says, relative to the larger one.
    const long long ats[] = {-static_cast<long long>(n), 0, world * static_cast<long long>(n)};
    for (long long at_choice : ats) {
      Comm comm(world);
      std::vector<std::vector<float>> mem(world, std::vector<float>((world + 2) * n, 0.0f));
      std::vector<zd_status> st(world, ZD_ERR_INTERNAL);
      std::vector<float*> big(world), small(world);
      for (int r = 0; r < world; ++r) {
        big[r] = mem[r].data() + n;
        // 0 stands for the rank's in-place chunk.
        small[r] = at_choice == 0 ? big[r] + static_cast<size_t>(r) * n : big[r] + at_choice;
        if (scatter) {
          for (size_t i = 0; i < world * n; ++i) big[r][i] = static_cast<float>((r + 1) * 100 + static_cast<int>(i / n));
        } else {
          for (size_t i = 0; i < n; ++i) small[r][i] = static_cast<float>(r + 1);
        }
      }
      on_ranks(world, [&](int r) {
        const zd_comm_call c = call_for(r, 1, "accepted");
        st[r] = scatter ? comm.d().reduce_scatter(comm.inst(), &c, big[r], small[r], n, ZD_COMM_F32, ZD_REDUCE_SUM)
                        : comm.d().all_gather(comm.inst(), &c, small[r], big[r], n, ZD_COMM_F32);
      });
      for (int r = 0; r < world; ++r) {
        ASSERT_EQ(st[r], ZD_OK) << comm.error(r);
        for (size_t i = 0; i < (scatter ? n : world * n); ++i) {
          // reduce_scatter: chunk r summed over ranks 1..3 times 100, plus 3 r;
          // all_gather: chunk k is rank k's value, k + 1.
          const float want = scatter ? static_cast<float>(600 + 3 * r) : static_cast<float>(i / n + 1);
          ASSERT_EQ(scatter ? small[r][i] : big[r][i], want) << (scatter ? "reduce_scatter" : "all_gather")
                                                             << ", at " << at_choice << ", rank " << r << ", i " << i;
        }
      }
    }
  }
}

TEST(Invalid, RankOutsideTheWorldWakesWaiters) {
  Comm comm(2);
  zd_status waiter = ZD_OK;
  std::thread t([&] {
    const zd_comm_call c = call_for(0, 1, "waiting");
    waiter = comm.d().barrier(comm.inst(), &c);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const zd_comm_call c = call_for(7, 1, "stray");
  EXPECT_EQ(comm.d().barrier(comm.inst(), &c), ZD_ERR_INVALID_ARGUMENT);
  t.join();
  EXPECT_EQ(waiter, ZD_ERR_INVALID_STATE);
  EXPECT_THAT(comm.error(0), HasSubstr("was called with rank 7, outside 0..1"));
  EXPECT_EQ(comm.error(7), "");
}

TEST(Invalid, TwoThreadsForOneRankBreakTheInstance) {
  Comm comm(2);
  zd_status first = ZD_OK;
  std::thread t([&] {
    const zd_comm_call c = call_for(0, 1, "first");
    first = comm.d().barrier(comm.inst(), &c);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const zd_comm_call c = call_for(0, 1, "second");
  EXPECT_EQ(comm.d().barrier(comm.inst(), &c), ZD_ERR_INVALID_STATE);
  t.join();
  EXPECT_EQ(first, ZD_ERR_INVALID_STATE);
  // Which call is "another" depends on which thread got in first.
  EXPECT_THAT(comm.error(0), HasSubstr("while another call of rank 0 had not returned: one call per rank at a time"));
}

TEST(Invalid, NullInstanceAndCall) {
  const zd_comm_v2* d = local_plugin();
  ASSERT_NE(d, nullptr);
  const zd_comm_call c = call_for(0);
  EXPECT_EQ(d->barrier(nullptr, &c), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(d->last_error(nullptr, 0), "");
  zd_comm_figures f = ZD_COMM_FIGURES_INIT;
  f.bytes_sent = 7;
  d->figures(nullptr, 0, &f);
  EXPECT_EQ(f.bytes_sent, 0u);
  d->figures(nullptr, 0, nullptr);
  d->abort(nullptr, ZD_ERR_PEER_LOST, "x");
  d->destroy(nullptr);
  Comm comm(1);
  EXPECT_EQ(comm.d().barrier(comm.inst(), nullptr), ZD_ERR_INVALID_ARGUMENT);
  zd_comm_call short_call = call_for(0);
  short_call.struct_size = 8;
  EXPECT_EQ(comm.d().barrier(comm.inst(), &short_call), ZD_ERR_INVALID_ARGUMENT);
  const zd_comm_call good = call_for(0);
  EXPECT_EQ(comm.d().barrier(comm.inst(), &good), ZD_ERR_INVALID_STATE) << "broken by the NULL call";
  EXPECT_THAT(comm.error(0), HasSubstr("a collective was called with a NULL zd_comm_call"));
}

TEST(LastError, EmptyUntilAFailure) {
  Comm comm(2);
  on_ranks(2, [&](int r) {
    const zd_comm_call c = call_for(r);
    EXPECT_EQ(comm.d().barrier(comm.inst(), &c), ZD_OK);
  });
  EXPECT_EQ(comm.error(0), "");
  EXPECT_EQ(comm.error(1), "");
  EXPECT_EQ(comm.error(-1), "");
}

}  // namespace
}  // namespace zerod::comm::test
