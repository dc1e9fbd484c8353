// A GPU rank's hangup watch (daemon/server/trainer_gone_watch.h), on the
// CPU: the device is the emulated one with a trainer-done signal of its own,
// a SignalPage in memory shared with a forked process that stands in for
// the trainer. Its record is "queued behind work that never ends": counted
// (issued) and never written (word). A thread stands in for the session's
// thread stuck in a call (zd_step's drain behind zerod's stream, which waits
// for that record): it returns only once the signal is no longer pending.
// What the watch must do: release the signal once the trainer is killed,
// from its own thread, while that call still waits; never while the
// trainer lives (a record a live process queued runs), nor after stop() or
// unwatch(), which end a wait in progress at once; and leave nothing for
// Session::end's own pass to release again.
//
// On a GPU the same path is python.cuda_daemon's kill in zd_step
// (tests/python/test_cuda_daemon.py): the record behind torch.cuda._sleep,
// the daemon's stream and session thread really stuck behind it.
//
// And on every rank (TrainerGoneWatchCalls.*): a hangup during a call marks
// the rank lost on its models, naming the call; end to end that is
// daemon.Ring.ARankKilledInACollectiveIsShownLostAtOnce (ring_test.cpp).
#include "trainer_gone_watch.h"

#include "device/emulated_device.h"
#include "device/signal_page.h"
#include "memory/ledger.h"
#include "runtime/thread_pool.h"
#include "runtime/workers.h"
#include "transport/process_exit.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace zerod;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// A SignalPage the forked trainer shares.
struct SharedPage {
  SharedPage() {
    void* m = mmap(nullptr, sizeof(SignalPage), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) std::abort();
    page = new (m) SignalPage{};
  }
  ~SharedPage() { munmap(page, sizeof(SignalPage)); }
  SharedPage(const SharedPage&) = delete;
  SharedPage& operator=(const SharedPage&) = delete;
  bool pending() const { return signal_pending(*page, kTrainerDone); }
  SignalPage* page = nullptr;
};

// The emulated device with a trainer-done signal: what the cuda device's
// trainer_pending and release_trainer do, on `page`.
class SignalledDevice final : public EmulatedDevice {
 public:
  SignalledDevice(MemoryLedger& ledger, Workers& workers, SignalPage& page)
      : EmulatedDevice(ledger, workers, /*exported=*/false, "signalled", uint64_t{64} << 20), page_(page) {}
  bool trainer_pending() const override { return signal_pending(page_, kTrainerDone); }
  void release_trainer() const override {
    signal_release(page_, kTrainerDone);
    releases.fetch_add(1);
  }
  mutable std::atomic<int> releases{0};

 private:
  SignalPage& page_;
};

// How the stand-in trainer goes on after the fork.
enum class Trainer {
  lives,           // holds its connection until killed
  closes_alive,    // closes its connection, lives on until killed
  closes_and_runs  // closes its connection, then its record runs (200 ms later)
};

// The trainer's process and the daemon's end of its connection. Its
// record is queued before the fork. Killed and reaped on every exit of the
// test; a child whose test process died is killed (PDEATHSIG), and none
// lives past 20 s (the tests take one at most).
struct TrainerProcess {
  TrainerProcess(SharedPage& shared, Trainer how) {
    shared.page->issued[kTrainerDone].store(1);  // its record, queued: the word stays 0
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return;
    pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      alarm(20);
      close(sv[0]);
      if (how != Trainer::lives) close(sv[1]);
      if (how == Trainer::closes_and_runs) {
        usleep(200000);
        shared.page->word[kTrainerDone].store(1);
      }
      for (;;) pause();
    }
    close(sv[1]);
    daemon_end = sv[0];
  }
  ~TrainerProcess() {
    kill_and_reap();
    if (daemon_end >= 0) close(daemon_end);
  }
  TrainerProcess(const TrainerProcess&) = delete;
  TrainerProcess& operator=(const TrainerProcess&) = delete;
  void kill_and_reap() {
    if (pid <= 0) return;
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    pid = -1;
  }
  pid_t pid = -1;
  int daemon_end = -1;
};

// Waits up to `limit` for `what`.
template <typename F>
bool within(milliseconds limit, F&& what) {
  const auto until = Clock::now() + limit;
  while (!what()) {
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(milliseconds(2));
  }
  return true;
}

struct TrainerGoneWatchTest : ::testing::Test {
  MemoryLedger ledger;
  ThreadPool pool{1};
  std::mutex pool_mu;
  Workers workers{pool, pool_mu};
};

// What every case starts from: a trainer behaving as `how`, with its record
// queued on the shared page, and a watch over its connection and the device
// that waits for that record. Destroyed in reverse (the watch first), as a
// session would.
struct WatchedTrainer {
  WatchedTrainer(MemoryLedger& ledger, Workers& workers, Trainer how)
      : trainer(shared, how), device(ledger, workers, *shared.page),
        watch(trainer.daemon_end, trainer.pid, "test: ", 10000) {
    if (trainer.pid > 0) watch.watch(0, device);
  }
  SharedPage shared;
  TrainerProcess trainer;
  SignalledDevice device;
  server::TrainerGoneWatch watch;
};

TEST_F(TrainerGoneWatchTest, AKilledTrainersRecordIsReleasedWhileTheCallStillWaitsForIt) {
  WatchedTrainer w(ledger, workers, Trainer::lives);
  ASSERT_GT(w.trainer.pid, 0);
  auto& [shared, trainer, device, watch] = w;

  // The session's thread in zd_step: back only once zerod's stream, which
  // waits for the record, can go on (bounded, so a failure ends the test).
  std::atomic<bool> returned{false};
  std::thread call([&] {
    returned = within(milliseconds(10000), [&] { return !shared.pending(); });
  });
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_FALSE(returned.load()) << "released while the trainer lived with its connection open";
  EXPECT_EQ(watch.released(), 0);

  // Killed, not reaped: a zombie counts as gone (its launcher may not have
  // looked yet).
  ASSERT_EQ(kill(trainer.pid, SIGKILL), 0);
  const bool released = within(milliseconds(5000), [&] { return watch.released() > 0; });
  call.join();
  EXPECT_TRUE(released) << "the watch did not release the killed trainer's record within 5 s";
  EXPECT_TRUE(returned.load()) << "the call still waited after the release";
  EXPECT_EQ(device.releases.load(), 1);
  EXPECT_FALSE(shared.pending());

  // Session::end's own pass after the watch: nothing left to release.
  watch.stop();
  const std::string again = transport::release_when_gone(
      trainer.pid, -1, 10000, [&] { return device.trainer_pending(); }, [&] { device.release_trainer(); });
  EXPECT_EQ(again, "");
  EXPECT_EQ(device.releases.load(), 1) << "released twice";
}

TEST_F(TrainerGoneWatchTest, ATrainerThatOnlyClosedItsConnectionIsWaitedForUntilStop) {
  WatchedTrainer w(ledger, workers, Trainer::closes_alive);
  ASSERT_GT(w.trainer.pid, 0);
  auto& [shared, trainer, device, watch] = w;

  // Hung up, alive: a record it queued still runs, so the watch waits.
  std::this_thread::sleep_for(milliseconds(400));
  EXPECT_EQ(watch.released(), 0) << "released while the trainer lived";
  EXPECT_TRUE(shared.pending());

  // Session::end: stop() ends that wait at once, and nothing is released
  // here after it, not even once the trainer is gone.
  const auto t0 = Clock::now();
  watch.stop();
  EXPECT_TRUE(Clock::now() - t0 < milliseconds(1000)) << "stop() waited for the trainer";
  trainer.kill_and_reap();
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_EQ(watch.released(), 0);
  EXPECT_EQ(device.releases.load(), 0);
  EXPECT_TRUE(shared.pending());
}

TEST_F(TrainerGoneWatchTest, ARecordThatRunsEndsTheWaitWithoutARelease) {
  WatchedTrainer w(ledger, workers, Trainer::closes_and_runs);
  ASSERT_GT(w.trainer.pid, 0);
  auto& [shared, trainer, device, watch] = w;

  ASSERT_TRUE(within(milliseconds(5000), [&] { return !shared.pending(); })) << "the trainer's record did not run";
  trainer.kill_and_reap();
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_EQ(watch.released(), 0);
  EXPECT_EQ(device.releases.load(), 0) << "a record that ran was released again";
}

TEST_F(TrainerGoneWatchTest, UnwatchEndsAWaitInProgressWithoutARelease) {
  WatchedTrainer w(ledger, workers, Trainer::closes_alive);
  ASSERT_GT(w.trainer.pid, 0);
  auto& [shared, trainer, device, watch] = w;
  std::this_thread::sleep_for(milliseconds(300));  // hung up: the watch waits for the live trainer

  // zd_model_destroy of that model: the session's thread is not held until
  // the trainer exits, and the device, which may be freed next, is left.
  const auto t0 = Clock::now();
  watch.unwatch(0);
  EXPECT_TRUE(Clock::now() - t0 < milliseconds(1000)) << "unwatch() waited for the trainer";
  trainer.kill_and_reap();
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_EQ(device.releases.load(), 0);
  EXPECT_TRUE(shared.pending());
}

TEST_F(TrainerGoneWatchTest, AnUnwatchedDeviceIsLeftAlone) {
  WatchedTrainer w(ledger, workers, Trainer::lives);
  ASSERT_GT(w.trainer.pid, 0);
  auto& [shared, trainer, device, watch] = w;
  watch.unwatch(0);  // zd_model_destroy: the model may be freed next

  trainer.kill_and_reap();
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_EQ(watch.released(), 0);
  EXPECT_EQ(device.releases.load(), 0) << "the watch released a device it no longer watched";
}

// Every rank, GPU or not: the hangup during a call marks the rank lost on
// the models the watch has (ModelHost::rank_gone in a session), which ends
// the collective the call waits in; a hangup between calls waits for the
// next call (the session's own reader sees it first), and a socket that is
// only quiet (a client waiting on its call ring) or that the daemon itself
// shut (its stop) is no hangup. A connection and the models' losses, told
// as the calls they came in.
struct WatchedCalls {
  WatchedCalls() {
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) std::abort();
    watch = std::make_unique<server::TrainerGoneWatch>(sv[0], getpid(), "test: ", 10000,
                                                       [this] { return closed_here.load(); });
    watch->watch_model(1, [this](const std::string& call) { told(call); });
  }
  ~WatchedCalls() {
    watch.reset();
    close(sv[0]);
    if (sv[1] >= 0) close(sv[1]);
  }
  WatchedCalls(const WatchedCalls&) = delete;
  WatchedCalls& operator=(const WatchedCalls&) = delete;
  void hang_up() {
    close(sv[1]);
    sv[1] = -1;
  }
  void told(const std::string& call) {
    std::lock_guard<std::mutex> lock(mu);
    losses.push_back(call);
  }
  std::vector<std::string> lost() {
    std::lock_guard<std::mutex> lock(mu);
    return losses;
  }
  int sv[2] = {-1, -1};
  std::atomic<bool> closed_here{false};
  std::mutex mu;
  std::vector<std::string> losses;
  std::unique_ptr<server::TrainerGoneWatch> watch;
};

TEST(TrainerGoneWatchCalls, AHangupDuringACallMarksTheRankLostOnceNamingTheCall) {
  WatchedCalls w;
  w.watch->begin_call("zd_model_finalize");
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_TRUE(w.lost().empty()) << "a quiet connection was taken for a hangup";
  w.hang_up();
  EXPECT_TRUE(within(milliseconds(5000), [&] { return !w.lost().empty(); })) << "no loss 5 s after the hangup";
  w.watch->end_call();
  w.watch->begin_call("zd_step");
  w.watch->end_call();
  EXPECT_EQ(w.lost(), std::vector<std::string>{"zd_model_finalize"});
}

TEST(TrainerGoneWatchCalls, AHangupBetweenCallsMarksTheRankLostAtTheNextCall) {
  WatchedCalls w;
  w.hang_up();
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_TRUE(w.lost().empty()) << "lost between calls, where the session's own reader sees the hangup";
  w.watch->begin_call("zd_step");  // a request the trainer wrote as it died
  EXPECT_EQ(w.lost(), std::vector<std::string>{"zd_step"}) << "not lost at once at the call's start";
  w.watch->end_call();
}

TEST(TrainerGoneWatchCalls, NeitherTheDaemonsOwnCloseNorAnUnwatchedModelIsTold) {
  WatchedCalls w;
  w.watch->watch_model(2, [&](const std::string& call) { w.told("model 2: " + call); });
  w.watch->unwatch(1);  // zd_model_destroy: that model may go next
  w.watch->begin_call("zd_step");
  w.closed_here = true;  // Session::stop: the daemon stops and shuts the socket itself
  shutdown(w.sv[0], SHUT_RDWR);
  std::this_thread::sleep_for(milliseconds(300));
  w.watch->end_call();
  EXPECT_TRUE(w.lost().empty()) << w.lost().front();
  w.closed_here = false;
  w.watch->begin_call("zd_step");
  w.watch->end_call();
  EXPECT_TRUE(w.lost().empty()) << "the daemon's own close counted as a hangup: " << w.lost().front();
}

}  // namespace
