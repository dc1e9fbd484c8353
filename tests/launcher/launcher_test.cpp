// The launcher with real processes: every trainer is `sh -c '<script>'`.
// Ranks' output goes to memfds (LaunchOptions::stdout_fd/stderr_fd) so a test
// reads it back whole; the driver tests run zerod_launch_driver, a stand-in
// for `zerod run`, as a process of its own. Every test ends with no child of
// ours left, zombie or not.
#include "error.h"
#include "launcher/launcher.h"
#include "launcher/own_environment.h"
#include "launcher/signal_forwarder.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

using namespace std::chrono_literals;
using zerod::launch::Launcher;
using zerod::launch::LaunchOptions;
using zerod::launch::LaunchResult;
using zerod::launch::RankExit;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A file in memory that a rank's output (or the driver's) goes to.
class Capture {
 public:
  Capture() : fd_(memfd_create("launcher_test", MFD_CLOEXEC)) { EXPECT_GE(fd_, 0); }
  ~Capture() { close(fd_); }
  int fd() const { return fd_; }
  std::string text() const {
    struct stat st {};
    fstat(fd_, &st);
    std::string out(static_cast<size_t>(st.st_size), '\0');
    const ssize_t n = pread(fd_, out.data(), out.size(), 0);
    out.resize(n > 0 ? static_cast<size_t>(n) : 0);
    return out;
  }
  std::vector<std::string> lines() const {
    std::vector<std::string> out;
    std::istringstream in(text());
    for (std::string line; std::getline(in, line);) out.push_back(line);
    return out;
  }

 private:
  int fd_;
};

// The number after the first "(pid " in text, or -1.
long pids_in(const std::string& text) {
  const size_t at = text.find("(pid ");
  return at == std::string::npos ? -1 : std::strtol(text.c_str() + at + 5, nullptr, 10);
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Waits until pred() holds, up to `limit`.
template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds limit = 3000ms) {
  const auto end = Clock::now() + limit;
  while (!pred()) {
    if (Clock::now() > end) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

class LauncherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A rank killed by SIGSEGV must not leave a core file behind.
    rlimit core{};
    getrlimit(RLIMIT_CORE, &core);
    core.rlim_cur = 0;
    setrlimit(RLIMIT_CORE, &core);
    char tmpl[] = "/tmp/zerod_launcher_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    // No child of ours is left: not running, not a zombie.
    errno = 0;
    EXPECT_EQ(waitpid(-1, nullptr, WNOHANG), -1);
    EXPECT_EQ(errno, ECHILD);
    std::filesystem::remove_all(dir_);
  }

  LaunchOptions options(int nproc, const std::string& script) {
    LaunchOptions o;
    o.nproc = nproc;
    o.argv = {"sh", "-c", script};
    o.env["D"] = dir_;
    o.stdout_fd = out_.fd();
    o.stderr_fd = err_.fd();
    return o;
  }

  // Starts, waits (at most 10 s) and returns the result.
  LaunchResult run(LaunchOptions o) {
    Launcher launcher(std::move(o));
    launcher.start();
    std::optional<LaunchResult> r = launcher.wait_for(10s);
    EXPECT_TRUE(r.has_value()) << "the ranks did not end";
    return r ? *r : LaunchResult{};
  }

  std::string dir_;
  Capture out_, err_;
};

// --- environment, output ------------------------------------------------------

TEST_F(LauncherTest, RanksGetTheirVariablesOverZerodsEnvironment) {
  setenv("ZEROD_TEST_INHERITED", "yes", 1);
  setenv("ZEROD_TEST_OVER", "old", 1);
  setenv("ZEROD_RANK", "77", 1);  // zerod's own, say: the rank's wins
  LaunchOptions o =
      options(4,
              "echo \"rank=$ZEROD_RANK local=$ZEROD_LOCAL_RANK world=$ZEROD_WORLD_SIZE "
              "lworld=$ZEROD_LOCAL_WORLD_SIZE foo=$ZEROD_TEST_FOO "
              "inherited=$ZEROD_TEST_INHERITED over=$ZEROD_TEST_OVER\"");
  o.env["ZEROD_TEST_FOO"] = "bar";
  o.env["ZEROD_TEST_OVER"] = "new";
  o.env["ZEROD_LOCAL_RANK"] = "99";
  const LaunchResult r = run(std::move(o));
  unsetenv("ZEROD_TEST_INHERITED");
  unsetenv("ZEROD_TEST_OVER");
  unsetenv("ZEROD_RANK");

  EXPECT_EQ(r.exit_code, 0);
  EXPECT_FALSE(r.first_failure.has_value());
  ASSERT_EQ(r.exits.size(), 4u);
  const std::string out = out_.text();
  for (int i = 0; i < 4; ++i) {
    const std::string want = "[rank " + std::to_string(i) + "] rank=" + std::to_string(i) +
                             " local=" + std::to_string(i) +
                             " world=4 lworld=4 foo=bar inherited=yes over=new\n";
    EXPECT_TRUE(contains(out, want)) << "missing: " << want << "in:\n" << out;
    EXPECT_EQ(r.exits[static_cast<size_t>(i)].rank, i);
    EXPECT_TRUE(r.exits[static_cast<size_t>(i)].ok());
  }
  EXPECT_EQ(err_.text(), "");
}

// What the daemon sets for its own process (launcher/own_environment.h:
// CUDA_DEVICE_MAX_CONNECTIONS) does not reach the ranks: they get the
// user's value, or none where the user set none.
TEST_F(LauncherTest, RanksDoNotInheritWhatZerodSetForItselfOnly) {
  unsetenv("ZEROD_TEST_OWN");
  setenv("ZEROD_TEST_USERS", "mine", 1);
  EXPECT_EQ(zerod::launch::set_for_this_process_only("ZEROD_TEST_OWN", "32"), "") << "the user set none";
  EXPECT_STREQ(std::getenv("ZEROD_TEST_OWN"), "32") << "set for this process";
  EXPECT_EQ(zerod::launch::set_for_this_process_only("ZEROD_TEST_USERS", "32"), "mine");
  EXPECT_STREQ(std::getenv("ZEROD_TEST_USERS"), "32") << "this process uses its own";
  EXPECT_EQ(zerod::launch::set_for_this_process_only("ZEROD_TEST_USERS", "16"), "mine")
      << "a second call still knows the user's";
  LaunchOptions o = options(2, "echo \"own=${ZEROD_TEST_OWN-unset} users=${ZEROD_TEST_USERS-unset}\"");
  const LaunchResult r = run(std::move(o));
  unsetenv("ZEROD_TEST_OWN");
  unsetenv("ZEROD_TEST_USERS");
  EXPECT_EQ(r.exit_code, 0);
  for (int i = 0; i < 2; ++i) {
    const std::string want = "[rank " + std::to_string(i) + "] own=unset users=mine\n";
    EXPECT_TRUE(contains(out_.text(), want)) << "missing: " << want << "in:\n" << out_.text();
  }
}

TEST_F(LauncherTest, OutputIsPrefixedOnItsOwnStream) {
  const LaunchResult r =
      run(options(2,
                  "echo out-$ZEROD_RANK; echo err-$ZEROD_RANK >&2; "
                  "printf 'par'; sleep 0.05; printf 'tial\\n'; printf 'no newline'"));
  EXPECT_EQ(r.exit_code, 0);
  const std::string out = out_.text();
  const std::string err = err_.text();
  for (const std::string rank : {"0", "1"}) {
    const std::string p = "[rank " + rank + "] ";
    EXPECT_TRUE(contains(out, p + "out-" + rank + "\n")) << out;
    EXPECT_TRUE(contains(out, p + "partial\n")) << out;
    EXPECT_TRUE(contains(out, p + "no newline\n")) << out;  // flushed at end of file
    EXPECT_TRUE(contains(err, p + "err-" + rank + "\n")) << err;
  }
  EXPECT_FALSE(contains(out, "err-")) << out;
  EXPECT_FALSE(contains(err, "out-")) << err;
  EXPECT_EQ(out_.lines().size(), 6u) << out;
  EXPECT_EQ(err_.lines().size(), 2u) << err;
}

TEST_F(LauncherTest, RanksInterleaveOnlyAtLineBoundaries) {
  const std::string pad(120, 'x');
  // printf writes in pieces, so lines arrive split across reads.
  const std::string script =
      "i=0; while [ $i -lt 300 ]; do printf 'rank=%s ' $ZEROD_RANK; "
      "printf 'i=%s " +
      pad + "\\n' $i; i=$((i+1)); done";
  const LaunchResult r = run(options(4, script));
  EXPECT_EQ(r.exit_code, 0);
  int next[4] = {0, 0, 0, 0};
  for (const std::string& line : out_.lines()) {
    // "[rank R] rank=R i=I xxx...": whole, and R the same twice.
    int prefix_rank = -1, rank = -1, i = -1, used = 0;
    const bool parsed =
        std::sscanf(line.c_str(), "[rank %d] rank=%d i=%d %n", &prefix_rank, &rank, &i, &used) == 3;
    ASSERT_TRUE(parsed && line.substr(static_cast<size_t>(used)) == pad && rank == prefix_rank &&
                rank >= 0 && rank < 4)
        << "torn line: " << line;
    EXPECT_EQ(i, next[rank]++) << "out of order for rank " << rank;
  }
  for (int n : next) EXPECT_EQ(n, 300);
}

TEST_F(LauncherTest, LongAndBinaryLinesAreCutNotLost) {
  const LaunchResult r =
      run(options(1,
                  "head -c 200000 /dev/zero | tr '\\0' a; echo; "
                  "printf 'a\\000b\\r\\n'; head -c 70000 /dev/zero | tr '\\0' c"));
  EXPECT_EQ(r.exit_code, 0);
  const std::string out = out_.text();
  const std::string p = "[rank 0] ";
  const std::string want = p + std::string(65536, 'a') + "\n" + p + std::string(65536, 'a') + "\n" +
                           p + std::string(65536, 'a') + "\n" + p +
                           std::string(200000 - 3 * 65536, 'a') + "\n" + p +
                           std::string("a\0b\r\n", 5) + p + std::string(65536, 'c') + "\n" + p +
                           std::string(70000 - 65536, 'c') + "\n";
  EXPECT_EQ(out.size(), want.size());
  EXPECT_TRUE(out == want) << "the long lines came out differently";
}

TEST_F(LauncherTest, WithoutPrefixRanksWriteStraightThrough) {
  LaunchOptions o = options(1, "echo plain; echo plain-err >&2; printf 'no newline'");
  o.prefix_output = false;
  const LaunchResult r = run(std::move(o));
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(out_.text(), "plain\nno newline");
  EXPECT_EQ(err_.text(), "plain-err\n");
}

TEST_F(LauncherTest, ARankMayCloseItsStdoutAndRunOn) {
  const LaunchResult r = run(options(1, "echo early; exec 1>&-; sleep 0.2; echo late >&2; exit 0"));
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(out_.text(), "[rank 0] early\n");
  EXPECT_EQ(err_.text(), "[rank 0] late\n");
}

TEST_F(LauncherTest, AProcessLeftBehindDoesNotHoldUpTheEnd) {
  // The background sleep keeps the rank's pipes open after the rank ended.
  const auto t0 = Clock::now();
  LaunchOptions o = options(1, "sleep 5 & echo $! > \"$D/bg\"; echo done");
  const LaunchResult r = run(std::move(o));
  EXPECT_LT(since(t0), 2.0);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(out_.text(), "[rank 0] done\n");
  std::ifstream bg(dir_ + "/bg");
  pid_t pid = 0;
  bg >> pid;
  if (pid > 0) kill(pid, SIGKILL);
}

TEST_F(LauncherTest, StdinIsDevNullAndEachRankLeadsItsOwnGroup) {
  Launcher launcher(options(2, "cat; echo stdin-done; exec sleep 30"));
  launcher.start();
  const std::vector<pid_t> pids = launcher.pids();
  ASSERT_EQ(pids.size(), 2u);
  for (pid_t pid : pids) {
    EXPECT_GT(pid, 0);
    EXPECT_EQ(getpgid(pid), pid);
  }
  EXPECT_NE(pids[0], pids[1]);
  EXPECT_TRUE(eventually([&] { return out_.lines().size() == 2; })) << out_.text();
  launcher.terminate(SIGTERM);
  const std::optional<LaunchResult> r = launcher.wait_for(5s);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->exit_code, 128 + SIGTERM);
}

TEST_F(LauncherTest, OutputToAClosedPipeIsDroppedAndTheRanksRunOn) {
  int p[2];
  ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
  close(p[0]);
  LaunchOptions o =
      options(2, "i=0; while [ $i -lt 2000 ]; do echo line $i; i=$((i+1)); done; exit 4");
  o.stdout_fd = p[1];
  const LaunchResult r = run(std::move(o));
  close(p[1]);
  EXPECT_EQ(r.exit_code, 4);  // zerod was not killed by SIGPIPE, and the ranks finished
  EXPECT_TRUE(r.exits[0].code == 4 || r.exits[1].code == 4);
}

// --- failures -------------------------------------------------------------------

TEST_F(LauncherTest, AFailureStopsTheOthersWithSigterm) {
  const auto t0 = Clock::now();
  LaunchOptions o =
      options(4, "if [ $ZEROD_RANK = 1 ]; then sleep 0.1; echo bye; exit 3; fi; exec sleep 30");
  std::mutex mu;
  std::vector<RankExit> seen;
  o.on_exit = [&](const RankExit& e) {
    std::lock_guard<std::mutex> lock(mu);
    seen.push_back(e);
  };
  const LaunchResult r = run(std::move(o));
  EXPECT_LT(since(t0), 2.0);
  EXPECT_EQ(r.exit_code, 3);
  ASSERT_TRUE(r.first_failure.has_value());
  EXPECT_EQ(r.first_failure->rank, 1);
  EXPECT_EQ(r.first_failure->describe(),
            "rank 1 (pid " + std::to_string(r.first_failure->pid) + ") exited with status 3");
  for (int i : {0, 2, 3}) {
    const RankExit& e = r.exits[static_cast<size_t>(i)];
    EXPECT_TRUE(e.signaled) << e.describe();
    EXPECT_EQ(e.code, SIGTERM) << e.describe();
    EXPECT_EQ(e.status(), 143);
  }
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(seen[0].rank, 1);                // the failure is reported first...
  EXPECT_EQ(out_.text(), "[rank 1] bye\n");  // ...after its output
}

// Gone, or a zombie that is not ours to reap.
bool process_ended(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'Z';
}

TEST_F(LauncherTest, AFailureAlsoStopsWhatTheOtherRanksStarted) {
  // Rank 1's background sleep is in rank 1's process group, so it gets the SIGTERM too.
  const LaunchResult r = run(
      options(2,
              "if [ $ZEROD_RANK = 0 ]; then while [ ! -e \"$D/bg\" ]; do sleep 0.01; done; "
              "exit 3; fi; sleep 30 & echo $! > \"$D/bg.tmp\"; mv \"$D/bg.tmp\" \"$D/bg\"; wait"));
  EXPECT_EQ(r.exit_code, 3);
  std::ifstream bg(dir_ + "/bg");
  pid_t pid = 0;
  bg >> pid;
  ASSERT_GT(pid, 0);
  EXPECT_TRUE(eventually([&] { return process_ended(pid); }, 2000ms))
      << "the rank's child outlived it";
  if (!process_ended(pid)) kill(pid, SIGKILL);
}

TEST_F(LauncherTest, RanksIgnoringSigtermGetSigkillAfterGrace) {
  LaunchOptions o =
      options(2,
              "if [ $ZEROD_RANK = 0 ]; then while [ ! -e \"$D/ready\" ]; do sleep 0.01; done; "
              "exit 5; fi; trap '' TERM; touch \"$D/ready\"; while :; do sleep 0.05; done");
  o.grace_seconds = 0.3;
  const auto t0 = Clock::now();
  const LaunchResult r = run(std::move(o));
  const double took = since(t0);
  EXPECT_GE(took, 0.3);
  EXPECT_LT(took, 2.0);
  EXPECT_EQ(r.exit_code, 5);
  ASSERT_TRUE(r.first_failure.has_value());
  EXPECT_EQ(r.first_failure->rank, 0);
  EXPECT_TRUE(r.exits[1].signaled);
  EXPECT_EQ(r.exits[1].code, SIGKILL);
}

TEST_F(LauncherTest, ARankKilledBySigsegvIsNamed) {
  const LaunchResult r =
      run(options(2, "if [ $ZEROD_RANK = 1 ]; then kill -SEGV $$; fi; exec sleep 30"));
  EXPECT_EQ(r.exit_code, 128 + SIGSEGV);
  ASSERT_TRUE(r.first_failure.has_value());
  const RankExit& f = *r.first_failure;
  EXPECT_EQ(f.rank, 1);
  EXPECT_TRUE(f.signaled);
  EXPECT_EQ(f.code, SIGSEGV);
  EXPECT_EQ(f.describe(), "rank 1 (pid " + std::to_string(f.pid) +
                              ") was killed by signal 11 (SIGSEGV: Segmentation fault)");
  EXPECT_EQ(r.exits[0].code, SIGTERM);
}

TEST_F(LauncherTest, ARankKilledBySigkillIsNamed) {
  const LaunchResult r = run(options(1, "kill -KILL $$"));
  EXPECT_EQ(r.exit_code, 128 + SIGKILL);
  ASSERT_TRUE(r.first_failure.has_value());
  EXPECT_TRUE(contains(r.first_failure->describe(), "was killed by signal 9 (SIGKILL: Killed)"))
      << r.first_failure->describe();
}

TEST_F(LauncherTest, ACommandNotFoundIs127WithAClearMessage) {
  LaunchOptions o = options(2, "");
  o.argv = {"zerod-no-such-trainer", "--flag"};
  std::atomic<int> calls{0};
  o.on_exit = [&](const RankExit&) { ++calls; };
  const auto t0 = Clock::now();
  const LaunchResult r = run(std::move(o));
  EXPECT_LT(since(t0), 2.0);
  EXPECT_EQ(r.exit_code, 127);
  EXPECT_EQ(calls.load(), 2);
  ASSERT_TRUE(r.first_failure.has_value());
  const int rank = r.first_failure->rank;
  EXPECT_EQ(r.first_failure->describe(),
            "rank " + std::to_string(rank) +
                ": cannot run 'zerod-no-such-trainer': No such file or directory");
  for (const RankExit& e : r.exits) {
    EXPECT_EQ(e.status(), 127);
    EXPECT_EQ(e.error, "cannot run 'zerod-no-such-trainer': No such file or directory");
  }
  EXPECT_EQ(out_.text(), "");
  EXPECT_EQ(err_.text(), "");
}

TEST_F(LauncherTest, ACommandNotExecutableIs127WithAClearMessage) {
  const std::string path = dir_ + "/trainer.sh";
  std::ofstream(path) << "#!/bin/sh\necho hi\n";
  chmod(path.c_str(), 0644);
  LaunchOptions o = options(1, "");
  o.argv = {path};
  const LaunchResult r = run(std::move(o));
  EXPECT_EQ(r.exit_code, 127);
  ASSERT_TRUE(r.first_failure.has_value());
  EXPECT_EQ(r.first_failure->describe(), "rank 0: cannot run '" + path + "': Permission denied");
}

TEST_F(LauncherTest, PathFromTheOptionsIsSearched) {
  const std::string path = dir_ + "/my-trainer";
  std::ofstream(path) << "#!/bin/sh\necho found rank $ZEROD_RANK\n";
  chmod(path.c_str(), 0755);
  LaunchOptions o = options(1, "");
  o.argv = {"my-trainer"};
  o.env["PATH"] = "/nonexistent:" + dir_ + ":/usr/bin:/bin";
  const LaunchResult r = run(std::move(o));
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(out_.text(), "[rank 0] found rank 0\n");
}

// --- supervision ----------------------------------------------------------------

TEST_F(LauncherTest, OnExitIsCalledOncePerRank) {
  LaunchOptions o = options(4, "sleep 0.0$ZEROD_RANK; exit 0");
  std::mutex mu;
  std::vector<int> calls(4, 0);
  Launcher* self = nullptr;
  o.on_exit = [&](const RankExit& e) {
    {
      std::lock_guard<std::mutex> lock(mu);
      ++calls.at(static_cast<size_t>(e.rank));
    }
    self->terminate(SIGCONT);  // allowed from the callback, harmless here
  };
  Launcher launcher(std::move(o));
  self = &launcher;
  launcher.start();
  const LaunchResult r = launcher.wait();
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(calls, std::vector<int>(4, 1));
  EXPECT_EQ(launcher.wait().exits.size(), 4u);  // the same result again
}

TEST_F(LauncherTest, TerminateEndsAllRanks) {
  Launcher launcher(options(4, "exec sleep 30"));
  const auto t0 = Clock::now();
  launcher.start();
  launcher.terminate(SIGTERM);
  const std::optional<LaunchResult> r = launcher.wait_for(5s);
  ASSERT_TRUE(r.has_value());
  EXPECT_LT(since(t0), 2.0);
  EXPECT_EQ(r->exit_code, 128 + SIGTERM);
  for (const RankExit& e : r->exits) {
    EXPECT_TRUE(e.signaled);
    EXPECT_EQ(e.code, SIGTERM);
  }
}

TEST_F(LauncherTest, TerminateFromAnotherThreadWhileStarting) {
  Launcher launcher(options(4, "exec sleep 30"));
  std::thread stopper([&] {
    launcher.terminate(SIGTERM);  // before start() too: the ranks get it as they come
    std::this_thread::sleep_for(1ms);
    launcher.terminate(SIGTERM);
  });
  launcher.start();
  stopper.join();
  const std::optional<LaunchResult> r = launcher.wait_for(5s);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->exit_code, 128 + SIGTERM);
}

TEST_F(LauncherTest, TheDestructorKillsAndReaps) {
  const auto t0 = Clock::now();
  {
    Launcher launcher(options(3, "exec sleep 30"));
    launcher.start();
    EXPECT_FALSE(launcher.wait_for(10ms).has_value());
  }
  EXPECT_LT(since(t0), 2.0);
  // TearDown checks that nothing is left.
}

TEST_F(LauncherTest, OneRankThatSucceeds) {
  const LaunchResult r = run(options(1, "echo hello"));
  EXPECT_EQ(r.exit_code, 0);
  ASSERT_EQ(r.exits.size(), 1u);
  EXPECT_TRUE(r.exits[0].ok());
  EXPECT_GT(r.exits[0].pid, 0);
  EXPECT_GE(r.exits[0].seconds, 0.0);
  EXPECT_EQ(r.exits[0].describe(),
            "rank 0 (pid " + std::to_string(r.exits[0].pid) + ") exited with status 0");
  EXPECT_EQ(out_.text(), "[rank 0] hello\n");
}

TEST_F(LauncherTest, BadOptionsAndMisuseAreErrors) {
  auto code_of = [](auto&& fn) -> zd_status {
    try {
      fn();
    } catch (const zerod::Error& e) {
      return e.code();
    }
    return ZD_OK;
  };
  LaunchOptions o = options(0, "true");
  EXPECT_EQ(code_of([&] { Launcher l(o); }), ZD_ERR_INVALID_ARGUMENT);
  o = options(1, "true");
  o.argv.clear();
  EXPECT_EQ(code_of([&] { Launcher l(o); }), ZD_ERR_INVALID_ARGUMENT);
  o = options(1, "true");
  o.grace_seconds = -1;
  EXPECT_EQ(code_of([&] { Launcher l(o); }), ZD_ERR_INVALID_ARGUMENT);
  o = options(1, "true");
  o.env["A=B"] = "c";
  EXPECT_EQ(code_of([&] { Launcher l(o); }), ZD_ERR_INVALID_ARGUMENT);
  o = options(1, "true");
  o.stdout_fd = 987;
  EXPECT_EQ(code_of([&] {
              Launcher l(o);
              l.start();
            }),
            ZD_ERR_INVALID_ARGUMENT);

  Launcher launcher(options(1, "true"));
  EXPECT_EQ(code_of([&] { launcher.wait(); }), ZD_ERR_INVALID_STATE);
  EXPECT_EQ(code_of([&] { launcher.terminate(0); }), ZD_ERR_INVALID_ARGUMENT);
  launcher.start();
  EXPECT_EQ(code_of([&] { launcher.start(); }), ZD_ERR_INVALID_STATE);
  EXPECT_EQ(launcher.wait().exit_code, 0);
}

TEST_F(LauncherTest, WaitFromOnExitIsRefused) {
  LaunchOptions o = options(1, "true");
  Launcher* self = nullptr;
  std::atomic<int> code{-1};
  o.on_exit = [&](const RankExit&) {
    try {
      self->wait();
    } catch (const zerod::Error& e) {
      code = e.code();
    }
  };
  Launcher launcher(std::move(o));
  self = &launcher;
  launcher.start();
  launcher.wait();
  EXPECT_EQ(code.load(), ZD_ERR_INVALID_STATE);
}

TEST_F(LauncherTest, TheForwarderSendsTheFirstSignalOnAndThenSigkill) {
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  struct sigaction old_hup {};
  sigaction(SIGHUP, &ignore, &old_hup);  // as under nohup

  Launcher launcher(options(2,
                            "trap 'echo got-term' TERM; touch \"$D/ready.$ZEROD_RANK\"; "
                            "while :; do sleep 0.05; done"));
  std::mutex mu;
  std::vector<std::pair<int, int>> forwarded;
  {
    zerod::launch::SignalForwarder forwarder(launcher, [&](int received, int sent) {
      std::lock_guard<std::mutex> lock(mu);
      forwarded.emplace_back(received, sent);
    });
    struct sigaction now {};
    sigaction(SIGHUP, nullptr, &now);
    EXPECT_EQ(now.sa_handler, SIG_IGN);  // an ignored signal stays ignored
    try {
      zerod::launch::SignalForwarder second(launcher);
      ADD_FAILURE() << "a second forwarder was installed";
    } catch (const zerod::Error& e) {
      EXPECT_EQ(e.code(), ZD_ERR_INVALID_STATE);
    }

    launcher.start();
    namespace fs = std::filesystem;
    ASSERT_TRUE(
        eventually([&] { return fs::exists(dir_ + "/ready.0") && fs::exists(dir_ + "/ready.1"); }));
    kill(getpid(), SIGTERM);  // to us: forwarded as it is
    ASSERT_TRUE(eventually([&] { return out_.lines().size() == 2; }))
        << out_.text();  // both shrugged
    EXPECT_EQ(forwarder.received(), 1);
    kill(getpid(), SIGINT);  // the second: SIGKILL
    const std::optional<LaunchResult> r = launcher.wait_for(5s);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->exit_code, 128 + SIGKILL);
    EXPECT_EQ(forwarder.received(), 2);
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    const std::vector<std::pair<int, int>> want = {{SIGTERM, SIGTERM}, {SIGINT, SIGKILL}};
    EXPECT_EQ(forwarded, want);
  }
  struct sigaction now {};
  sigaction(SIGINT, nullptr, &now);
  EXPECT_EQ(now.sa_handler, SIG_DFL);  // put back
  sigaction(SIGTERM, nullptr, &now);
  EXPECT_EQ(now.sa_handler, SIG_DFL);
  sigaction(SIGHUP, &old_hup, nullptr);
}

TEST(SignalDescription, NamesSignals) {
  EXPECT_EQ(zerod::launch::signal_description(SIGSEGV), "SIGSEGV: Segmentation fault");
  EXPECT_EQ(zerod::launch::signal_description(SIGKILL), "SIGKILL: Killed");
  EXPECT_EQ(zerod::launch::signal_description(200), "signal 200");
}

// --- zerod_launch_driver: a zerod process of its own -----------------------------

class DriverTest : public LauncherTest {
 protected:
  // Starts the driver with its stdout and stderr in out_ and err_.
  void TearDown() override {
    if (driver_ > 0) {  // a test that stopped early
      kill(driver_, SIGKILL);
      waitpid(driver_, nullptr, 0);
    }
    LauncherTest::TearDown();
  }

  // Starts the driver with its stdout and stderr in out_ and err_, and
  // D=<the test's directory> in the ranks' environment.
  // own_group: the driver leads a process group of its own, as a shell's job does.
  pid_t spawn_driver(const std::vector<std::string>& args, bool own_group = false) {
    std::vector<std::string> all = {ZEROD_LAUNCH_DRIVER, "--env", "D=" + dir_, "--die-with",
                                    std::to_string(getpid())};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out_.fd(), STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, err_.fd(), STDERR_FILENO);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    if (own_group) {
      posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
      posix_spawnattr_setpgroup(&attr, 0);
    }
    pid_t pid = -1;
    EXPECT_EQ(posix_spawn(&pid, argv[0], &actions, &attr, argv.data(), environ), 0);
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&actions);
    driver_ = pid;
    return pid;
  }

  // The driver's exit status (128 + signal when killed), or -1 after 5 s.
  int wait_exit(pid_t pid, std::chrono::milliseconds limit = 5000ms) {
    int status = 0;
    const bool ended = eventually([&] { return waitpid(pid, &status, WNOHANG) == pid; }, limit);
    if (!ended) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
    }
    if (pid == driver_) driver_ = -1;
    if (!ended) return -1;
    return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
  }

  pid_t driver_ = -1;
};

TEST_F(DriverTest, WritesToItsOwnStdoutAndStderrAndReportsTheFailure) {
  const pid_t pid = spawn_driver(
      {"--nproc", "2", "--", "sh", "-c",
       "if [ $ZEROD_RANK = 1 ]; then while [ ! -e \"$D/0.done\" ]; do sleep 0.01; done; fi; "
       "echo out-$ZEROD_RANK; echo err-$ZEROD_RANK >&2; touch \"$D/$ZEROD_RANK.done\"; "
       "exit $ZEROD_RANK"});
  EXPECT_EQ(wait_exit(pid), 1);
  const std::string out = out_.text();
  const std::string err = err_.text();
  EXPECT_TRUE(contains(out, "[rank 0] out-0\n")) << out;
  EXPECT_TRUE(contains(out, "[rank 1] out-1\n")) << out;
  EXPECT_TRUE(contains(err, "[rank 0] err-0\n")) << err;
  EXPECT_TRUE(contains(err, "[rank 1] err-1\n")) << err;
  const std::string report = "zerod: rank 1 (pid " + std::to_string(pids_in(err)) +
                             ") exited with status 1; stopping the other ranks\n";
  EXPECT_TRUE(contains(err, report)) << err;
}

TEST_F(DriverTest, ACommandNotFoundExits127) {
  const pid_t pid = spawn_driver({"--nproc", "1", "--", "zerod-no-such-trainer"});
  EXPECT_EQ(wait_exit(pid), 127);
  EXPECT_TRUE(contains(
      err_.text(), "zerod: rank 0: cannot run 'zerod-no-such-trainer': No such file or directory"))
      << err_.text();
}

TEST_F(DriverTest, CtrlCIsForwardedToEveryRankOnce) {
  const pid_t pid =
      spawn_driver({"--nproc", "2", "--forward-signals", "--", "sh", "-c",
                    "trap 'echo got-int; exit 7' INT; touch \"$D/ready.$ZEROD_RANK\"; "
                    "while :; do sleep 0.05; done"});
  namespace fs = std::filesystem;
  ASSERT_TRUE(
      eventually([&] { return fs::exists(dir_ + "/ready.0") && fs::exists(dir_ + "/ready.1"); }));
  kill(pid, SIGINT);
  EXPECT_EQ(wait_exit(pid), 7);
  EXPECT_TRUE(contains(out_.text(), "[rank 0] got-int\n")) << out_.text();
  EXPECT_TRUE(contains(out_.text(), "[rank 1] got-int\n")) << out_.text();
  EXPECT_TRUE(
      contains(err_.text(), "zerod: SIGINT: Interrupt; stopping the ranks (again to kill them)"))
      << err_.text();
}

TEST_F(DriverTest, ASecondCtrlCKills) {
  const pid_t pid = spawn_driver({"--nproc", "2", "--forward-signals", "--", "sh", "-c",
                                  "trap 'echo got-int' INT; touch \"$D/ready.$ZEROD_RANK\"; "
                                  "while :; do sleep 0.05; done"});
  namespace fs = std::filesystem;
  ASSERT_TRUE(
      eventually([&] { return fs::exists(dir_ + "/ready.0") && fs::exists(dir_ + "/ready.1"); }));
  kill(pid, SIGINT);
  ASSERT_TRUE(eventually([&] { return out_.lines().size() == 2; }))
      << out_.text();  // both shrugged it off
  kill(pid, SIGINT);
  EXPECT_EQ(wait_exit(pid), 128 + SIGKILL);
  EXPECT_TRUE(contains(err_.text(), "zerod: SIGINT: Interrupt again; killing the ranks"))
      << err_.text();
}

TEST_F(DriverTest, RanksDieWithZerod) {
  // Orphans come to us, so we can see how they ended.
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  const pid_t pid = spawn_driver({"--nproc", "2", "--", "sh", "-c", "echo pid=$$; exec sleep 30"});
  ASSERT_TRUE(eventually([&] { return out_.lines().size() == 2; })) << out_.text();
  std::vector<pid_t> ranks;
  for (const std::string& line : out_.lines()) {
    const size_t eq = line.find("pid=");
    ASSERT_NE(eq, std::string::npos) << line;
    ranks.push_back(std::stoi(line.substr(eq + 4)));
  }
  kill(pid, SIGKILL);
  EXPECT_EQ(wait_exit(pid), 128 + SIGKILL);
  for (pid_t rank : ranks) {
    int status = 0;
    const bool died = eventually([&] { return waitpid(rank, &status, WNOHANG) == rank; }, 2000ms);
    EXPECT_TRUE(died) << "rank pid " << rank << " outlived zerod";
    if (!died) {
      kill(rank, SIGKILL);
      waitpid(rank, &status, 0);
    }
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  }
  prctl(PR_SET_CHILD_SUBREAPER, 0);
}

// The pids the ranks wrote to $D/<name>.<rank>, once every rank has.
std::vector<pid_t> read_pids(const std::string& dir, const std::string& name, int nproc) {
  namespace fs = std::filesystem;
  std::vector<pid_t> out;
  const bool all = eventually([&] {
    for (int r = 0; r < nproc; ++r)
      if (!fs::exists(dir + "/" + name + "." + std::to_string(r))) return false;
    return true;
  });
  if (!all) return out;
  for (int r = 0; r < nproc; ++r) {
    std::ifstream in(dir + "/" + name + "." + std::to_string(r));
    pid_t pid = 0;
    in >> pid;
    out.push_back(pid);
  }
  return out;
}

// A rank's background process: announced through a file written whole.
constexpr const char* kBackground =
    "sleep 1000 & echo $! > \"$D/bg.tmp.$ZEROD_RANK\"; mv \"$D/bg.tmp.$ZEROD_RANK\" \"$D/bg.$ZEROD_RANK\"; ";

TEST_F(DriverTest, WhatTheRanksStartedDiesWithZerodUnderAWatchdog) {
  // Rank 0 runs on; rank 1 has ended, its background sleep left in its group.
  namespace fs = std::filesystem;
  const std::string priv = dir_ + "/private", user = dir_ + "/user";
  fs::create_directories(priv + "/sub");
  std::ofstream(priv + "/zerod.sock") << "x";
  std::ofstream(priv + "/sub/file") << "x";
  fs::create_directories(user + "/zerod-run-abc-dir/deeper");
  std::ofstream(user + "/zerod-run-abc-dir/deeper/f") << "x";
  std::ofstream(user + "/zerod-run-abc-gloo-store") << "x";
  std::ofstream(user + "/zerod-run-abd-other-run") << "x";
  std::ofstream(user + "/keep") << "x";
  const pid_t pid = spawn_driver({"--nproc", "2", "--watchdog-dir", priv, "--watchdog-entries", user,
                                  "zerod-run-abc-", "--", "sh", "-c",
                                  std::string(kBackground) + "[ $ZEROD_RANK = 1 ] && exit 0; exec sleep 1000"});
  const std::vector<pid_t> bg = read_pids(dir_, "bg", 2);
  ASSERT_EQ(bg.size(), 2u) << err_.text();
  // Rank 1 has exited (its exit is reported to nobody: it succeeded).
  std::this_thread::sleep_for(200ms);
  kill(pid, SIGKILL);
  EXPECT_EQ(wait_exit(pid), 128 + SIGKILL);
  for (pid_t p : bg) {
    EXPECT_TRUE(eventually([&] { return process_ended(p); }, 3000ms))
        << "pid " << p << ", started by a rank, outlived zerod";
    if (!process_ended(p)) kill(p, SIGKILL);
  }
  // Its last word, once everything is done.
  EXPECT_TRUE(eventually([&] { return contains(err_.text(), "ended without cleaning up"); }, 3000ms))
      << err_.text();
  EXPECT_TRUE(contains(err_.text(), "(2 process groups) and removed " + priv + ", " + user + "/zerod-run-abc-*"))
      << err_.text();
  EXPECT_FALSE(fs::exists(priv)) << "the watchdog left " << priv;
  EXPECT_FALSE(fs::exists(user + "/zerod-run-abc-dir"));
  EXPECT_FALSE(fs::exists(user + "/zerod-run-abc-gloo-store"));
  EXPECT_TRUE(fs::exists(user + "/zerod-run-abd-other-run")) << "another run's file was removed";
  EXPECT_TRUE(fs::exists(user + "/keep")) << "a file of the user's was removed";
}

TEST_F(DriverTest, TheWatchdogIsNotInZerodsProcessGroup) {
  // `kill -KILL -- -PGID` or `timeout -s KILL` of zerod's group must leave
  // the watchdog to clean up: the driver leads a group here, as under a shell.
  const pid_t pid = spawn_driver({"--nproc", "1", "--watchdog", "--", "sh", "-c",
                                  std::string(kBackground) + "exec sleep 1000"},
                                 true);
  ASSERT_EQ(getpgid(pid), pid);
  const std::vector<pid_t> bg = read_pids(dir_, "bg", 1);
  ASSERT_EQ(bg.size(), 1u) << err_.text();
  kill(-pid, SIGKILL);
  EXPECT_EQ(wait_exit(pid), 128 + SIGKILL);
  EXPECT_TRUE(eventually([&] { return process_ended(bg[0]); }, 3000ms))
      << "pid " << bg[0] << ", started by a rank, outlived zerod's process group";
  if (!process_ended(bg[0])) kill(bg[0], SIGKILL);
}

TEST_F(DriverTest, ANormalEndLeavesWhatTheRanksStartedAndTheFilesAlone) {
  namespace fs = std::filesystem;
  const std::string priv = dir_ + "/private";
  fs::create_directories(priv);
  const pid_t pid = spawn_driver({"--nproc", "2", "--watchdog-dir", priv, "--", "sh", "-c",
                                  std::string(kBackground) + "exit 0"});
  EXPECT_EQ(wait_exit(pid), 0);
  const std::vector<pid_t> bg = read_pids(dir_, "bg", 2);
  ASSERT_EQ(bg.size(), 2u);
  std::this_thread::sleep_for(300ms);
  for (pid_t p : bg) {
    EXPECT_FALSE(process_ended(p)) << "zerod ended normally, yet " << p << " was killed";
    kill(p, SIGKILL);
  }
  EXPECT_TRUE(fs::exists(priv));
  EXPECT_FALSE(contains(err_.text(), "without cleaning up")) << err_.text();
}

}  // namespace
