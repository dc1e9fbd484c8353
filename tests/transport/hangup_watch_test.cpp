// HangupWatch: its callbacks run once when the peer goes (closes its end, or
// its process is killed), not while it is only quiet; a removed one never
// runs; one added after the hangup runs at once; the watch stops cleanly.
#include "transport/connection.h"
#include "transport/hangup_watch.h"

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <thread>

namespace zerod::transport {
namespace {

using namespace std::chrono_literals;

bool soon(const std::atomic<int>& n, int want) {
  for (int i = 0; i < 500 && n.load() != want; ++i) std::this_thread::sleep_for(10ms);
  return n.load() == want;
}

TEST(HangupWatch, RunsItsCallbacksOnceWhenThePeerClosesNotBefore) {
  auto [mine, theirs] = connection_pair();
  std::optional<Connection> peer(std::move(theirs));
  HangupWatch watch(mine.fd());
  std::atomic<int> ran{0}, removed_ran{0};
  watch.add([&] { ran.fetch_add(1); });
  watch.add([&] { ran.fetch_add(1); });
  const int gone = watch.add([&] { removed_ran.fetch_add(1); });
  watch.remove(gone);

  // The peer writes (a frame nobody reads) and stays: no hangup.
  peer->send(FrameHeader{}, {}, {}, 1000);
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(ran.load(), 0);
  EXPECT_FALSE(watch.hung_up());

  peer.reset();  // closes its end
  EXPECT_TRUE(soon(ran, 2)) << "the callbacks ran " << ran.load() << " times";
  EXPECT_TRUE(watch.hung_up());
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(ran.load(), 2) << "each runs once";
  EXPECT_EQ(removed_ran.load(), 0) << "a removed callback never runs";

  int late = 0;
  watch.add([&] { ++late; });
  EXPECT_EQ(late, 1) << "added after the hangup: runs at once";
}

TEST(HangupWatch, SeesAKilledPeerProcess) {
  auto [mine, theirs] = connection_pair();
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    pause();
    _exit(0);
  }
  { Connection drop(std::move(theirs)); }  // closed here: only the child holds the other end
  HangupWatch watch(mine.fd());
  std::atomic<int> ran{0};
  watch.add([&] { ran.fetch_add(1); });
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(ran.load(), 0) << "the child is alive";
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(soon(ran, 1));
}

TEST(HangupWatch, StopsWhenDestroyedWithThePeerStillThere) {
  auto [mine, theirs] = connection_pair();
  std::atomic<int> ran{0};
  {
    HangupWatch watch(mine.fd());
    watch.add([&] { ran.fetch_add(1); });
  }
  theirs.shutdown();
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(ran.load(), 0) << "a destroyed watch runs nothing";
}

TEST(HangupWatch, AForkedChildDestroysItsCopyWithoutWaitingForTheParentsThread) {
  auto [mine, theirs] = connection_pair();
  auto* watch = new HangupWatch(mine.fd());
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    delete watch;  // the child has no watch thread: this must neither hang nor abort
    _exit(0);
  }
  int status = 0;
  bool ended = false;
  for (int i = 0; i < 500 && !ended; ++i) {
    ended = waitpid(pid, &status, WNOHANG) == pid;
    if (!ended) std::this_thread::sleep_for(10ms);
  }
  if (!ended) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    ADD_FAILURE() << "the child hung destroying its copy";
  }
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  std::atomic<int> ran{0};
  watch->add([&] { ran.fetch_add(1); });
  theirs.shutdown();
  EXPECT_TRUE(soon(ran, 1)) << "the parent's watch still works";
  delete watch;
}

}  // namespace
}  // namespace zerod::transport
