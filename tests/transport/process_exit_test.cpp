// What each side of a daemon's GPU rank does when the other is gone with a
// record still queued on its stream (process_exit.h), with the device's two
// questions played by the test: whether that record is pending, and the
// release itself. The GPU's side (a stream signal released after its
// recorder was SIGKILLed, both ways round) is
// device.CudaShared.AWaitOnARecordAKilled*, which needs a GPU.
#include "transport/process_exit.h"

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

namespace zerod::transport {
namespace {

using namespace std::chrono_literals;

pid_t sleeping_child() {
  const pid_t pid = fork();
  if (pid == 0) {
    pause();
    _exit(0);
  }
  return pid;
}

void end(pid_t pid) {
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

int elapsed_ms(std::chrono::steady_clock::time_point since) {
  return static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - since).count());
}

TEST(ProcessExit, SeesAKilledProcessAndTimesOutOnALiveOne) {
  const pid_t pid = sleeping_child();
  ASSERT_GT(pid, 0);
  ProcessExit process(pid);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(process.wait(100));
  EXPECT_GE(elapsed_ms(t0), 90);
  std::thread killer([pid] {
    std::this_thread::sleep_for(50ms);
    kill(pid, SIGKILL);
  });
  EXPECT_TRUE(process.wait(10000)) << "a zombie has exited";
  killer.join();
  waitpid(pid, nullptr, 0);
  EXPECT_TRUE(process.wait(10)) << "and stays so once reaped";
  EXPECT_TRUE(ProcessExit(pid).wait(10)) << "reaped before the look: no such process";
  EXPECT_FALSE(ProcessExit(0).wait(10)) << "an unknown pid is never known to have exited";
}

TEST(ProcessExit, NothingPendingReleasesNothingAndDoesNotWait) {
  const pid_t pid = sleeping_child();
  int released = 0;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(release_when_gone(pid, 5000, 1000, [] { return false; }, [&] { ++released; }), "");
  EXPECT_LT(elapsed_ms(t0), 1000);
  EXPECT_EQ(released, 0);
  end(pid);
}

TEST(ProcessExit, APendingRecordOfAKilledProcessIsReleasedOnceItIsGone) {
  const pid_t pid = sleeping_child();
  std::atomic<bool> dead{false};
  std::atomic<int> released{0};
  std::thread killer([&] {
    std::this_thread::sleep_for(200ms);
    dead = true;
    kill(pid, SIGKILL);
  });
  const std::string said = release_when_gone(
      pid, -1, 10000, [] { return true; },
      [&] {
        EXPECT_TRUE(dead.load()) << "released while the process could still run work";
        released.fetch_add(1);
      });
  killer.join();
  waitpid(pid, nullptr, 0);
  EXPECT_EQ(released.load(), 1);
  EXPECT_NE(said.find("never ran"), std::string::npos) << said;
}

TEST(ProcessExit, ARecordThatRunsWhileTheProcessLivesNeedsNoRelease) {
  const pid_t pid = sleeping_child();
  std::atomic<bool> pending{true};
  std::thread runs([&] {
    std::this_thread::sleep_for(150ms);
    pending = false;  // a trainer that closed its connection but computes on
  });
  int released = 0;
  EXPECT_EQ(release_when_gone(pid, -1, 10000, [&] { return pending.load(); }, [&] { ++released; }), "");
  runs.join();
  EXPECT_EQ(released, 0);
  end(pid);
}

TEST(ProcessExit, ALiveProcessIsWaitedForNotReleasedAndTheLogSaysSo) {
  const pid_t pid = sleeping_child();
  int released = 0;
  std::string slow;
  const std::string said = release_when_gone(
      pid, 300, 100, [] { return true; }, [&] { ++released; }, [&](const std::string& s) { slow += s; });
  EXPECT_EQ(released, 0);
  EXPECT_NE(slow.find("is alive"), std::string::npos) << slow;
  EXPECT_NE(said.find("still alive"), std::string::npos) << said;
  EXPECT_NE(said.find(std::to_string(pid)), std::string::npos) << said;
  end(pid);
}

TEST(ProcessExit, AProcessKilledAfterTheSlowMarkIsStillReleased) {
  const pid_t pid = sleeping_child();
  std::atomic<int> released{0};
  std::thread killer([pid] {
    std::this_thread::sleep_for(300ms);
    kill(pid, SIGKILL);
  });
  const std::string said = release_when_gone(pid, -1, 100, [] { return true; }, [&] { released.fetch_add(1); });
  killer.join();
  waitpid(pid, nullptr, 0);
  EXPECT_EQ(released.load(), 1) << said;
}

TEST(ProcessExit, AnUnknownPidIsTakenForDeadAfterTheSlowMark) {
  int released = 0;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string said = release_when_gone(0, -1, 200, [] { return true; }, [&] { ++released; });
  EXPECT_GE(elapsed_ms(t0), 190);
  EXPECT_EQ(released, 1);
  EXPECT_NE(said.find("pid namespace"), std::string::npos) << said;
}

}  // namespace
}  // namespace zerod::transport
