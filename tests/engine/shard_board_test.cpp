// The board behind stage 3's one-sided gathers (engine/comm/shard_board.h), on
// its own: who waits for whom at a write phase, a read waiting for a peer
// still writing, the comm timeout, a rank that left, an abort, and ranks
// that gather different modules. Ranks are threads here, as in the engine.
#include "comm/shard_board.h"
#include "error.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>

using namespace zerod;
using namespace std::chrono_literals;

namespace {

// Runs fn on another thread; the future says whether it returned yet.
template <typename Fn>
std::future<void> on_thread(Fn fn) {
  return std::async(std::launch::async, fn);
}

bool still_waiting(std::future<void>& f) { return f.wait_for(50ms) == std::future_status::timeout; }

}  // namespace

TEST(ShardBoard, AWriterWaitsUntilEveryRankHasEnteredThePhase) {
  ShardBoard board(2, 0);
  auto writer = on_thread([&] { board.begin_write(0, "zd_step's update"); });
  EXPECT_TRUE(still_waiting(writer)) << "rank 0 entered a write phase while rank 1 may still read version 0";
  board.begin_write(1, "zd_step's update");
  writer.get();
  EXPECT_EQ(board.epoch(0), 0u);  // entered, not completed
  board.end_write(0);
  board.end_write(1);
  EXPECT_EQ(board.epoch(0), 1u);
  EXPECT_EQ(board.epoch(1), 1u);
  EXPECT_TRUE(board.readable(1));
}

TEST(ShardBoard, AReaderWaitsForAPeerStillWritingItsShards) {
  ShardBoard board(2, 0);
  auto peer = on_thread([&] { board.begin_write(1, "zd_param_write"); });
  board.begin_write(0, "zd_param_write");
  peer.get();
  board.end_write(0);  // rank 0 is done and reads version 1; rank 1 is still writing it
  EXPECT_FALSE(board.readable(1));
  auto reader = on_thread([&] { board.await_readable(0, 1, "the gather of h.0"); });
  EXPECT_TRUE(still_waiting(reader)) << "rank 0 read rank 1's shard while rank 1 was writing it";
  board.end_write(1);
  reader.get();
  EXPECT_TRUE(board.readable(1));
}

TEST(ShardBoard, AWaitEndsAtTheCommTimeoutNamingTheRankAndThePhase) {
  ShardBoard board(2, 0.2);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    board.begin_write(0, "zd_step's update");  // rank 1 never comes
    FAIL() << "the wait did not end";
  } catch (const Error& e) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(e.code(), ZD_ERR_TIMEOUT);
    EXPECT_GE(s, 0.2);
    EXPECT_LT(s, 5.0);
    const std::string m = e.what();
    EXPECT_NE(m.find("for rank 1"), std::string::npos) << m;
    EXPECT_NE(m.find("zd_step's update"), std::string::npos) << m;
  }
}

TEST(ShardBoard, ARankThatLeftHoldsNoWriterButFailsAReaderNeedingItsNextVersion) {
  ShardBoard board(2, 0);
  board.rank_left(1, "rank 1 left the job (its connection closed)");
  board.begin_write(0, "zd_step's update");  // returns: a rank that left writes nothing more
  board.end_write(0);
  board.await_readable(0, 0, "the gather of h.0");  // the version it left is still readable
  try {
    board.await_readable(0, 1, "the gather of h.0");
    FAIL() << "a reader waited for a rank that will never write";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ZD_ERR_PEER_LOST);
    const std::string m = e.what();
    EXPECT_NE(m.find("rank 1 left the job"), std::string::npos) << m;
    EXPECT_NE(m.find("the gather of h.0"), std::string::npos) << m;
  }
}

TEST(ShardBoard, AnAbortWakesEveryWaiterWithItsStatusAndResetStartsAgain) {
  ShardBoard board(3, 0);
  const uint64_t k = board.arrive(0, 7);
  std::atomic<int> woken{0};
  auto gather = on_thread([&] {
    try {
      board.await_arrival(0, k, "the gather of h.1");
    } catch (const Error& e) {
      if (e.code() == ZD_ERR_PEER_LOST && std::string(e.what()) == "rank 2 died") woken.fetch_add(1);
    }
  });
  auto reader = on_thread([&] {
    try {
      board.await_readable(1, 1, "the gather of h.1");
    } catch (const Error& e) {
      if (e.code() == ZD_ERR_PEER_LOST) woken.fetch_add(1);
    }
  });
  EXPECT_TRUE(still_waiting(gather));
  board.abort(ZD_ERR_PEER_LOST, "rank 2 died");
  board.abort(ZD_ERR_TIMEOUT, "a later failure");  // the first one is the cause
  gather.get();
  reader.get();
  EXPECT_EQ(woken.load(), 2);
  board.reset();
  EXPECT_EQ(board.epoch(0), 0u);
  EXPECT_TRUE(board.readable(0));
  EXPECT_EQ(board.arrive(1, 7), 0u);  // gather numbers start again
}

TEST(ShardBoard, RanksGatheringDifferentModulesAreTold) {
  ShardBoard board(2, 0);
  const uint64_t a = board.arrive(0, 7), b = board.arrive(1, 9);
  ASSERT_EQ(a, 0u);
  ASSERT_EQ(b, 0u);
  board.await_arrival(0, 0, "the gather of h.0");
  uint64_t other = 0;
  EXPECT_EQ(board.disagreeing(0, 0, 7, &other), 1);
  EXPECT_EQ(other, 9u);
  board.arrive(0, 5);
  board.arrive(1, 5);
  EXPECT_TRUE(board.all_arrived(1));
  EXPECT_EQ(board.disagreeing(0, 1, 5, &other), -1);
  EXPECT_FALSE(board.all_arrived(2));
}
