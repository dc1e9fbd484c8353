// The daemon's release of a GPU stream that waits for a trainer which is
// gone (trainer_exit.h), with the device's two questions played by the test:
// whether the trainer's last record is pending, and the release itself. The
// real device's side (an interprocess event released after its recorder was
// SIGKILLed) is device.CudaShared.AWaitOnARecordAKilledProcessNeverRanIsReleased,
// which needs a GPU.
#include "trainer_exit.h"

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

using namespace zerod::server;
using namespace std::chrono_literals;

namespace {

pid_t sleeping_child() {
  const pid_t pid = fork();
  if (pid == 0) {
    pause();
    _exit(0);
  }
  return pid;
}

int elapsed_ms(std::chrono::steady_clock::time_point since) {
  return static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - since).count());
}

TEST(TrainerExit, WaitForExitSeesAKilledProcessAndTimesOutOnALiveOne) {
  const pid_t pid = sleeping_child();
  ASSERT_GT(pid, 0);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(wait_for_exit(pid, 100));
  EXPECT_GE(elapsed_ms(t0), 90);
  std::thread killer([pid] {
    std::this_thread::sleep_for(50ms);
    kill(pid, SIGKILL);
  });
  EXPECT_TRUE(wait_for_exit(pid, 10000)) << "a zombie has exited";
  killer.join();
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(wait_for_exit(pid, 10)) << "reaped: no such process";
  EXPECT_FALSE(wait_for_exit(0, 10)) << "an unknown pid is never known to have exited";
}

TEST(TrainerExit, NothingPendingReleasesNothingAndDoesNotWait) {
  const pid_t pid = sleeping_child();
  int released = 0;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(release_trainer_waits(pid, 5000, [] { return false; }, [&] { ++released; }), "");
  EXPECT_LT(elapsed_ms(t0), 1000);
  EXPECT_EQ(released, 0);
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

TEST(TrainerExit, APendingRecordOfAKilledTrainerIsReleasedOnceItsProcessIsGone) {
  const pid_t pid = sleeping_child();
  std::atomic<bool> dead{false};
  std::atomic<int> released{0};
  std::thread killer([&] {
    std::this_thread::sleep_for(200ms);
    dead = true;
    kill(pid, SIGKILL);
  });
  const std::string said = release_trainer_waits(
      pid, 10000, [] { return true; },
      [&] {
        EXPECT_TRUE(dead.load()) << "released while the trainer could still run work";
        released.fetch_add(1);
      });
  killer.join();
  waitpid(pid, nullptr, 0);
  EXPECT_EQ(released.load(), 1);
  EXPECT_NE(said.find("never ran"), std::string::npos) << said;
}

TEST(TrainerExit, ARecordThatRunsWhileTheTrainerLivesNeedsNoRelease) {
  const pid_t pid = sleeping_child();
  std::atomic<bool> pending{true};
  std::thread runs([&] {
    std::this_thread::sleep_for(150ms);
    pending = false;  // a trainer that closed its connection but computes on
  });
  int released = 0;
  EXPECT_EQ(release_trainer_waits(pid, 10000, [&] { return pending.load(); }, [&] { ++released; }), "");
  runs.join();
  EXPECT_EQ(released, 0);
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

TEST(TrainerExit, ALiveTrainerIsNotReleasedAndTheLogSaysSo) {
  const pid_t pid = sleeping_child();
  int released = 0;
  const std::string said = release_trainer_waits(pid, 200, [] { return true; }, [&] { ++released; });
  EXPECT_EQ(released, 0);
  EXPECT_NE(said.find("still alive"), std::string::npos) << said;
  EXPECT_NE(said.find(std::to_string(pid)), std::string::npos) << said;
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

TEST(TrainerExit, AnUnknownPidIsTakenForDeadAfterTheTimeout) {
  int released = 0;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string said = release_trainer_waits(0, 200, [] { return true; }, [&] { ++released; });
  EXPECT_GE(elapsed_ms(t0), 190);
  EXPECT_EQ(released, 1);
  EXPECT_NE(said.find("pid namespace"), std::string::npos) << said;
}

}  // namespace
