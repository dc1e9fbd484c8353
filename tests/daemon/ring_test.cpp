// The call ring end to end: a real `zerod serve` and rank_scenario
// processes. A peer that dies while the other waits on the ring is seen
// within a bound (the daemon, and a trainer); a waiting rank sleeps rather
// than spins; two ranks and the daemon squeezed onto one or two CPUs still
// make progress at microsecond pace (bounded spin, then yield and futex).
// And ranks that go while the others wait for them: one whose connection
// closes inside a collective is lost at once (its connection's hangup
// watch), one that goes before its first create once its rank is not
// claimed again within the daemon's reclaim wait.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

// A child process whose stdout and stderr go to a log file.
struct Proc {
  pid_t pid = 0;
  std::string log;
  int status = -1;

  static Proc start(const std::vector<std::string>& argv, const std::vector<std::string>& env_extra,
                    const std::string& log) {
    Proc p;
    p.log = log;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    std::vector<std::string> env_store(env_extra);
    for (char** e = environ; *e; ++e) env_store.emplace_back(*e);  // extras first: they win
    std::vector<char*> env;
    for (auto& e : env_store) env.push_back(e.data());
    env.push_back(nullptr);
    const int rc = posix_spawn(&p.pid, args[0], &fa, nullptr, args.data(), env.data());
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) throw std::runtime_error("posix_spawn " + argv[0] + ": " + std::strerror(rc));
    return p;
  }
  std::string output() const {
    std::ifstream f(log);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }
  // Waits up to `limit` for `pattern` in the output.
  bool wait_for_output(const std::string& pattern, std::chrono::milliseconds limit) const {
    const auto end = Clock::now() + limit;
    const std::regex re(pattern);
    while (Clock::now() < end) {
      if (std::regex_search(output(), re)) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }
  // Waits up to `limit` for the exit; false (and SIGKILL) on timeout.
  bool wait_exit(std::chrono::milliseconds limit) {
    const auto end = Clock::now() + limit;
    while (Clock::now() < end) {
      if (waitpid(pid, &status, WNOHANG) == pid) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return false;
  }
  void kill_now() {
    if (pid > 0 && status == -1) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
    }
  }
  // utime + stime of a live process, in seconds.
  double cpu_seconds() const {
    std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
    std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::istringstream rest(stat.substr(stat.rfind(')') + 2));
    std::string field;
    unsigned long long utime = 0, stime = 0;
    for (int i = 3; i <= 15 && rest >> field; ++i) {
      if (i == 14) utime = std::stoull(field);
      if (i == 15) stime = std::stoull(field);
    }
    return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
  }
};

class Ring : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/zerod-ring-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    socket_ = dir_ + "/zerod.sock";
  }
  void TearDown() override {
    for (Proc* p : {&rank0_, &rank1_, &daemon_}) p->kill_now();
    std::system(("rm -rf '" + dir_ + "'").c_str());
  }

  // daemon_args: how `zerod serve` serves the ranks (one job of two by default).
  void start(const std::string& job, const std::string& scenario, const std::string& arg = "",
             const std::vector<std::string>& env = {},
             const std::vector<std::string>& daemon_args = {"--nproc", "2", "--job"}) {
    std::vector<std::string> serve = {ZEROD_CLI, "serve"};
    serve.insert(serve.end(), daemon_args.begin(), daemon_args.end());
    if (daemon_args.back() == "--job") serve.push_back(job);
    serve.insert(serve.end(), {"--socket", socket_});
    daemon_ = Proc::start(serve, {}, dir_ + "/daemon.log");
    for (int i = 0; i < 500; ++i) {
      struct stat st{};
      if (stat(socket_.c_str(), &st) == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    for (int r = 0; r < 2; ++r) {
      std::vector<std::string> argv = {ZEROD_RANK_SCENARIO, scenario};
      if (!arg.empty()) argv.push_back(arg);
      (r == 0 ? rank0_ : rank1_) =
          Proc::start(argv, with(env, {"ZEROD_ENDPOINT=unix:" + socket_, "ZEROD_RANK=" + std::to_string(r),
                                       "ZEROD_WORLD_SIZE=2", std::string("ZEROD_JOB=") + job}),
                      dir_ + "/rank" + std::to_string(r) + ".log");
    }
  }

  static std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }

  std::string dir_, socket_;
  Proc daemon_, rank0_, rank1_;
};

// The daemon dies while rank 0 waits for its reply on the ring (its end
// call, which its next begin carries, waits for rank 1 to arrive at the
// first begin's gather): rank 0 sees the socket hang up between two sleep
// slices and reports the daemon gone.
TEST_F(Ring, ADaemonDyingWhileARankWaitsIsReported) {
  start(ZEROD_WAIT_JOB, "wait");
  ASSERT_TRUE(rank0_.wait_for_output("rank 0: waiting", std::chrono::seconds(20))) << rank0_.output();
  ASSERT_TRUE(rank1_.wait_for_output("rank 1: idle", std::chrono::seconds(20))) << rank1_.output();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // rank 0 is asleep on the ring by now
  const auto killed = Clock::now();
  kill(daemon_.pid, SIGKILL);
  ASSERT_TRUE(rank0_.wait_exit(std::chrono::seconds(5))) << "rank 0 still waits 5 s after the daemon died";
  const auto seen_ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - killed).count();
  EXPECT_LT(seen_ms, 1000) << "rank 0 took " << seen_ms << " ms to notice";
  EXPECT_NE(rank0_.output().find("rank 0: ZD_ERR_PEER_LOST: zd_forward_begin: the zerod daemon is gone"),
            std::string::npos)
      << rank0_.output();
}

// The same with ZEROD_SYNC_END=1: zd_forward_end waits for the daemon's
// answer, so the end itself (not the begin after it) reports the daemon gone.
TEST_F(Ring, WithASynchronousEndTheEndReportsTheDeadDaemon) {
  start(ZEROD_WAIT_JOB, "wait", "", {"ZEROD_SYNC_END=1"});
  ASSERT_TRUE(rank0_.wait_for_output("rank 0: waiting", std::chrono::seconds(20))) << rank0_.output();
  ASSERT_TRUE(rank1_.wait_for_output("rank 1: idle", std::chrono::seconds(20))) << rank1_.output();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  kill(daemon_.pid, SIGKILL);
  ASSERT_TRUE(rank0_.wait_exit(std::chrono::seconds(5))) << "rank 0 still waits 5 s after the daemon died";
  EXPECT_NE(rank0_.output().find("rank 0: ZD_ERR_PEER_LOST: zd_forward_end: the zerod daemon is gone"),
            std::string::npos)
      << rank0_.output();
}

// A trainer dies while its session sleeps on the ring (and the other rank
// waits in a collective): the session sees the socket hang up within a
// slice, and the other rank is told which rank was lost.
TEST_F(Ring, ARankDyingWhileTheDaemonWaitsOnItsRingIsReported) {
  start(ZEROD_WAIT_JOB, "wait");
  ASSERT_TRUE(rank0_.wait_for_output("rank 0: waiting", std::chrono::seconds(20))) << rank0_.output();
  ASSERT_TRUE(rank1_.wait_for_output("rank 1: idle", std::chrono::seconds(20))) << rank1_.output();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto killed = Clock::now();
  kill(rank1_.pid, SIGKILL);
  ASSERT_TRUE(rank0_.wait_exit(std::chrono::seconds(5))) << "rank 0 still waits 5 s after rank 1 died";
  const auto seen_ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - killed).count();
  EXPECT_LT(seen_ms, 1000) << "rank 0 took " << seen_ms << " ms to hear of it";
  EXPECT_TRUE(std::regex_search(rank0_.output(), std::regex("rank 0: ZD_ERR_PEER_LOST: zd_forward_begin: .*rank 1")))
      << rank0_.output();
}

// Rank 1 begins a second late: rank 0's wait costs it almost no CPU (it
// spins for microseconds, then sleeps), and the daemon, whose threads wait
// on rank 1's ring and in the collective, stays asleep too.
TEST_F(Ring, AWaitingRankAndTheDaemonSleep) {
  start(ZEROD_WAIT_JOB, "sleepy");
  ASSERT_TRUE(rank0_.wait_for_output("rank 0: begins", std::chrono::seconds(30))) << rank0_.output();
  const double daemon_cpu_before = daemon_.cpu_seconds();
  ASSERT_TRUE(rank0_.wait_exit(std::chrono::seconds(30))) << rank0_.output();
  const double daemon_cpu = daemon_.cpu_seconds() - daemon_cpu_before;
  ASSERT_TRUE(rank1_.wait_exit(std::chrono::seconds(30))) << rank1_.output();
  std::smatch m;
  const std::string out = rank0_.output();
  ASSERT_TRUE(std::regex_search(out, m, std::regex("rank 0: 1 pairs, wall ([0-9.]+) ms, cpu ([0-9.]+) ms"))) << out;
  const double wall = std::stod(m[1]), cpu = std::stod(m[2]);
  EXPECT_GT(wall, 800) << "rank 0 did not wait for rank 1";
  EXPECT_LT(cpu, 0.1 * wall) << "rank 0 burned " << cpu << " ms of CPU in a " << wall << " ms wait";
  // Rank 0's wait, about a second: two threads spinning through it would
  // take about two seconds of CPU on two cores.
  EXPECT_LT(daemon_cpu, 0.3) << "the daemon used " << daemon_cpu << " s of CPU while rank 0 waited " << wall << " ms";
}

// Two ranks and the daemon on one CPU: every hand-off must come from a
// yield or a sleep, never from a spinner's time slice running out. 5,000
// stage-3 begin/end pairs (two ring calls and a collective each) take well
// under a second when hand-offs are prompt; a spinner holding the CPU for
// its slice (milliseconds) would take minutes.
TEST_F(Ring, SpinnersDoNotStarveTheDaemonOnOneCpu) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(sched_getcpu(), &one);
  cpu_set_t saved;
  ASSERT_EQ(sched_getaffinity(0, sizeof saved, &saved), 0);
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);  // inherited by the daemon and both ranks
  start(ZEROD_WAIT_JOB, "pairs", "5000");
  ASSERT_EQ(sched_setaffinity(0, sizeof saved, &saved), 0);
  ASSERT_TRUE(rank0_.wait_exit(std::chrono::seconds(60))) << rank0_.output();
  ASSERT_TRUE(rank1_.wait_exit(std::chrono::seconds(60))) << rank1_.output();
  for (const Proc* r : {&rank0_, &rank1_}) {
    std::smatch m;
    const std::string out = r->output();
    ASSERT_TRUE(std::regex_search(out, m, std::regex("5000 pairs, wall ([0-9.]+) ms"))) << out;
    EXPECT_LT(std::stod(m[1]), 10000.0) << out;
  }
}

// The same on two CPUs (this machine's count): 20,000 pairs.
TEST_F(Ring, TwoRanksAndTheDaemonOnTwoCpus) {
  cpu_set_t saved, two;
  ASSERT_EQ(sched_getaffinity(0, sizeof saved, &saved), 0);
  if (CPU_COUNT(&saved) < 2) GTEST_SKIP() << "this process may run on fewer than 2 CPUs";
  CPU_ZERO(&two);
  for (int c = 0, n = 0; c < CPU_SETSIZE && n < 2; ++c)
    if (CPU_ISSET(c, &saved)) CPU_SET(c, &two), ++n;
  ASSERT_EQ(sched_setaffinity(0, sizeof two, &two), 0);
  start(ZEROD_WAIT_JOB, "pairs", "20000");
  ASSERT_EQ(sched_setaffinity(0, sizeof saved, &saved), 0);
  ASSERT_TRUE(rank0_.wait_exit(std::chrono::seconds(60))) << rank0_.output();
  ASSERT_TRUE(rank1_.wait_exit(std::chrono::seconds(60))) << rank1_.output();
  for (const Proc* r : {&rank0_, &rank1_}) {
    std::smatch m;
    const std::string out = r->output();
    ASSERT_TRUE(std::regex_search(out, m, std::regex("20000 pairs, wall ([0-9.]+) ms"))) << out;
    EXPECT_LT(std::stod(m[1]), 20000.0) << out;
  }
}

// A wait that timed out (zd_connect_options.timeout_ms) leaves the call
// running in the daemon, whose answer comes later. Rank 0 gives up on its
// finalize after 1 s; rank 1 arrives 3 s in and the daemon answers rank 0's
// finalize then. Rank 0's later calls must each fail at once, naming the
// call that timed out and saying to connect again, and none may take the
// late answer for its own (on the ring it did: forward_begin returned ZD_OK
// in no time, without reaching the daemon).
void expect_out_of_step(const std::string& out) {
  EXPECT_TRUE(std::regex_search(out, std::regex("rank 0: zd_model_finalize: ZD_ERR_TIMEOUT in [0-9.]+ s: "
                                                "zd_model_finalize: no reply from the zerod daemon within 1000 ms")))
      << out;
  for (const char* call : {"zd_forward_begin", "zd_model_memory"}) {
    std::smatch m;
    const std::regex re(std::string("rank 0: ") + call + ": ([A-Z_]+) in ([0-9.]+) s: (.*)");
    ASSERT_TRUE(std::regex_search(out, m, re)) << out;
    EXPECT_EQ(m[1].str(), "ZD_ERR_TIMEOUT") << out;
    EXPECT_LT(std::stod(m[2].str()), 0.5) << call << " waited: " << out;
    const std::string msg = m[3].str();
    EXPECT_NE(msg.find(std::string(call) + ": "), std::string::npos) << msg;
    EXPECT_NE(msg.find("zd_model_finalize"), std::string::npos) << "the message does not name the call: " << msg;
    EXPECT_NE(msg.find("connect again"), std::string::npos) << "the message does not say what to do: " << msg;
  }
}

TEST_F(Ring, ATimedOutCallLeavesTheConnectionRefusingLaterCalls) {
  start(ZEROD_WAIT_JOB, "timeout");
  ASSERT_TRUE(rank0_.wait_exit(std::chrono::seconds(60))) << rank0_.output();
  ASSERT_TRUE(rank1_.wait_exit(std::chrono::seconds(60))) << rank1_.output();
  expect_out_of_step(rank0_.output());
}

// The same with every model call as a socket frame (ZEROD_NO_RING=1): the
// late answer would be read as the next call's, or its arena frame would.
TEST_F(Ring, ATimedOutCallLeavesTheSocketCarrierRefusingLaterCalls) {
  start(ZEROD_WAIT_JOB, "timeout", "", {"ZEROD_NO_RING=1"});
  ASSERT_TRUE(rank0_.wait_exit(std::chrono::seconds(60))) << rank0_.output();
  ASSERT_TRUE(rank1_.wait_exit(std::chrono::seconds(60))) << rank1_.output();
  expect_out_of_step(rank0_.output());
}

// A rank whose call waits in a collective for a rank that never comes (its
// finalize, rank 1 idle) and whose trainer gives up on it (timeout_ms) and
// connects again, as the timeout's message says: the daemon sees the old
// connection hang up during the call and ends it, so the new one gets the
// rank at once. Before, the old session held the rank until the collective
// ended (comm.timeout, here 60 s; 0: never): the reconnect was refused
// after the 5 s reclaim wait with "rank 0 is already connected".
TEST_F(Ring, ARankThatGaveUpOnACallConnectsAgainAtOnce) {
  start(ZEROD_WAIT_JOB, "reconnect");
  ASSERT_TRUE(rank0_.wait_exit(std::chrono::seconds(30))) << rank0_.output();
  const std::string out = rank0_.output();
  EXPECT_TRUE(std::regex_search(out, std::regex("rank 0: zd_model_finalize: ZD_ERR_TIMEOUT in [0-9.]+ s"))) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("rank 0: zd_connect: ([A-Z_]+) in ([0-9.]+) s"))) << out;
  EXPECT_EQ(m[1].str(), "ZD_OK") << out;
  EXPECT_LT(std::stod(m[2].str()), 5.0) << out;
}

// A rank killed while its finalize waits for rank 1: `zerod status` shows
// it lost, naming the call, at once, not its dead pid still in finalize
// until comm.timeout (60 s here).
TEST_F(Ring, ARankKilledInACollectiveIsShownLostAtOnce) {
  start(ZEROD_WAIT_JOB, "finalize_alone");
  ASSERT_TRUE(rank0_.wait_for_output("rank 0: finalizing", std::chrono::seconds(20))) << rank0_.output();
  ASSERT_TRUE(rank1_.wait_for_output("rank 1: idle", std::chrono::seconds(20))) << rank1_.output();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // in the finalize's barrier by now
  const auto killed = Clock::now();
  rank0_.kill_now();
  const std::regex lost("\n  0 +[0-9]+ +[0-9]+ +lost: rank 0 \\(pid [0-9]+\\) is gone: its connection closed");
  std::string status;
  for (int i = 0; Clock::now() - killed < std::chrono::seconds(10); ++i) {
    Proc st = Proc::start({ZEROD_CLI, "status", "--socket", socket_}, {}, dir_ + "/status" + std::to_string(i) + ".log");
    ASSERT_TRUE(st.wait_exit(std::chrono::seconds(10)));
    status = st.output();
    if (std::regex_search(status, lost)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const auto seen_ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - killed).count();
  ASSERT_TRUE(std::regex_search(status, lost)) << status;
  // The model's first word on it names the call.
  EXPECT_NE(status.find("BROKEN: rank 0 was lost: rank 0 (pid " + std::to_string(rank0_.pid) +
                        ") is gone: its connection closed during zd_model_finalize"),
            std::string::npos)
      << status;
  // About a second even under a sanitizer; comm.timeout is 60 s.
  EXPECT_LT(seen_ms, 3000) << "zerod status showed rank 0 lost only after " << seen_ms << " ms:\n" << status;
}

// A rank that connects and exits before its zd_model_create, its rank not
// claimed again within the daemon's reclaim wait (5 s): the model rank 0
// made before it left, and one rank 0 makes after, count it lost, naming it
// and its pid, so rank 0's finalize fails with ZD_ERR_PEER_LOST within
// seconds of it, not after comm.timeout (60 s) saying "not arrived: rank 1
// (no collective yet)".
void expect_lost_early(const std::string& out, double at_most_s) {
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("rank 0: (zd_[a-z_]+: ZD_ERR_PEER_LOST in ([0-9.]+) s: |"
                                                   "ZD_ERR_PEER_LOST: )zd_[a-z_]+: rank 1 was lost: rank 1 \\(pid "
                                                   "[0-9]+\\) is gone: its connection closed, and no connection "
                                                   "claimed rank 1 again within 5 s")))
      << out;
  if (m[2].matched) {
    EXPECT_LT(std::stod(m[2].str()), at_most_s) << out;
  }
}

TEST_F(Ring, ARankThatLeftBeforeItsCreateIsLostToAModelMadeBefore) {
  const auto t0 = Clock::now();
  start(ZEROD_WAIT_JOB, "leave_early");
  ASSERT_TRUE(rank0_.wait_exit(std::chrono::seconds(30))) << rank0_.output();
  const auto s = std::chrono::duration<double>(Clock::now() - t0).count();
  expect_lost_early(rank0_.output(), 12.0);
  EXPECT_LT(s, 15.0) << rank0_.output();  // rank 1 leaves at 2 s, and is lost 5 s later
}

TEST_F(Ring, ARankThatLeftBeforeItsCreateIsLostToAModelMadeAfter) {
  start(ZEROD_WAIT_JOB, "leave_early", "9");  // rank 1 was lost at 7 s
  ASSERT_TRUE(rank0_.wait_exit(std::chrono::seconds(30))) << rank0_.output();
  expect_lost_early(rank0_.output(), 3.0);
}

// A rank's connection ends: the daemon lets go of the memory the rank
// shared with it (the staging memfd, as large as its largest tensor, and the
// call ring) at once, not when the next connection comes (a long-running
// `zerod serve --jobs` may see none for hours).
TEST_F(Ring, AFinishedRanksSharedMemoryIsReleasedAtOnce) {
  start(ZEROD_WAIT_JOB, "resume", "", {"ZEROD_JOB_KEY=release-test"}, {"--jobs"});
  ASSERT_TRUE(rank0_.wait_exit(std::chrono::seconds(60))) << rank0_.output();
  ASSERT_TRUE(rank1_.wait_exit(std::chrono::seconds(60))) << rank1_.output();
  ASSERT_NE(rank0_.output().find("rank 0: checksum"), std::string::npos) << rank0_.output();
  const std::string maps = "/proc/" + std::to_string(daemon_.pid) + "/maps";
  const auto held = [&] {
    std::ifstream f(maps);
    std::string line, out;
    while (std::getline(f, line))
      if (line.find("memfd:zerod-staging") != std::string::npos || line.find("memfd:zerod-ring") != std::string::npos)
        out += line + "\n";
    return out;
  };
  const auto end = Clock::now() + std::chrono::seconds(3);
  while (!held().empty() && Clock::now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(held(), "") << "the daemon still maps the finished ranks' shared memory 3 s after they exited";
}

}  // namespace
