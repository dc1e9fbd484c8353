// The rank launcher and supervisor behind `zerod run --nproc N -- <trainer…>`:
// spawns N trainer processes, prefixes their output line by line, reaps
// them, and after the first failure stops the rest (SIGTERM, then SIGKILL).
//
// Thread-safety: one Launcher is driven by one owner (start, wait, the
// destructor); terminate(), pids() and wait_for() may be called from any
// thread, on_exit included. Every Launcher runs one supervisor thread of its
// own from start() until the last rank has been reaped. That thread also
// writes the ranks' output: while our stdout blocks (a terminal paused with
// Ctrl-S, a pipe nobody reads) reaping and the grace timer wait as well.
//
// Each rank: the leader of its own process group (so a terminal's Ctrl-C
// reaches zerod alone; see signal_forwarder.h), stdin /dev/null (N ranks
// cannot share a terminal, and one in a background group reading it would
// be stopped), SIGKILL when zerod dies (PR_SET_PDEATHSIG), every fd above 2
// closed, zerod's environment plus LaunchOptions::env plus its rank's
// variables. With LaunchOptions::watchdog, what a rank starts in its group
// is killed too when zerod dies (watchdog.h).
//
// Process-wide rules while a Launcher runs (it reaps its children by pid):
//   - nothing else in the process may reap with wait(), waitpid(-1, ...) or
//     waitid(P_ALL, ...), nor set SIGCHLD to SIG_IGN or SA_NOCLDWAIT, or
//     ranks are reaped behind the launcher's back;
//   - SIGPIPE may be left at its default: the supervisor thread blocks it and
//     treats EPIPE on our stdout/stderr as "discard the ranks' output".
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace zerod::launch {

class Watchdog;

// How one rank ended.
struct RankExit {
  int rank = -1;
  pid_t pid = 0;
  bool signaled = false;     // killed by a signal (code is its number)
  int code = 0;              // exit status, or the signal number when signaled
  bool core_dumped = false;  // when signaled
  double seconds = 0;        // from spawn to reap
  // Set when the rank did not end as a process normally does: the command
  // could not be run ("cannot run 'trainer': No such file or directory";
  // code 127), or its status was lost because something else in zerod reaped
  // it (code 255).
  std::string error;

  bool ok() const { return !signaled && code == 0; }
  // As a shell reports it: the exit status, or 128 + the signal number.
  int status() const { return signaled ? 128 + code : code; }
  // "rank 1 (pid 1234) exited with status 3"
  // "rank 1 (pid 1234) was killed by signal 11 (SIGSEGV: Segmentation fault)"
  // "rank 0: cannot run 'trainer': No such file or directory"
  std::string describe() const;
};

struct LaunchOptions {
  int nproc = 1;                  // >= 1: the ranks this launcher starts
  // With several nodes (one launcher per node): the global rank of this
  // node's first rank and the job's rank count (0 = nproc). Rank i started
  // here gets ZEROD_RANK = first_rank + i, ZEROD_LOCAL_RANK = i.
  int first_rank = 0;
  int world_size = 0;
  std::vector<std::string> argv;  // the trainer command; argv[0] is looked up in PATH
  // Added to every rank's environment, over zerod's own (PATH here is also
  // the one argv[0] is looked up in). zerod then sets ZEROD_RANK,
  // ZEROD_LOCAL_RANK, ZEROD_WORLD_SIZE and ZEROD_LOCAL_WORLD_SIZE itself.
  std::map<std::string, std::string> env;
  // true: each rank's stdout and stderr are read through pipes and written
  // to stdout_fd / stderr_fd as "[rank 3] <line>\n", whole lines only.
  // false: the ranks write to stdout_fd / stderr_fd directly.
  bool prefix_output = true;
  // Where ranks' output goes (a log file, a test's memfd). Not owned; must
  // stay open until wait() returns.
  int stdout_fd = STDOUT_FILENO;
  int stderr_fd = STDERR_FILENO;
  // After the first failure the other ranks get SIGTERM, and SIGKILL when
  // this much later they still run.
  double grace_seconds = 5;
  // After the first failure the other ranks get this long to end on their
  // own (zerod tells them their peer is gone, and they report it) before
  // SIGTERM. 0: SIGTERM at once.
  double peer_exit_seconds = 0;
  // Called on the supervisor thread as each rank ends, after that rank's
  // output has been written out and, for the first failure, before the
  // others are stopped; the first call with !exit.ok() is that failure. It
  // may call terminate(); it must not call wait(). What it throws is logged.
  std::function<void(const RankExit&)> on_exit;
  // Not owned; must outlive the Launcher. Each rank registers its process
  // group with it before exec, so that when zerod dies what the ranks
  // started dies too (watchdog.h). nullptr: ranks die with zerod, what they
  // started lives on.
  Watchdog* watchdog = nullptr;
};

struct LaunchResult {
  std::vector<RankExit> exits;            // one per rank, by rank
  int exit_code = 0;                      // 0 if all ranks exited 0, else first_failure->status()
  std::optional<RankExit> first_failure;  // the first rank to end other than with status 0
};

class Launcher {
 public:
  // Checks the options (zerod::Error ZD_ERR_INVALID_ARGUMENT); starts nothing.
  explicit Launcher(LaunchOptions options);
  // Kills (SIGKILL) the process group of every rank still running and reaps
  // them: a Launcher never leaves a child behind.
  ~Launcher();
  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;

  // Reads zerod's environment, spawns every rank and returns once each has
  // exec'd (or failed to). A command that cannot be executed is not an
  // error here: that rank ends with status 127 and RankExit::error. Throws
  // zerod::Error when a rank cannot be spawned at all (pipe, fork); the ranks
  // already spawned are killed and reaped first. Once only.
  void start();

  // Blocks until every rank has been reaped and returns what happened (the
  // same result on every call). Rethrows what stopped the supervisor, if
  // anything did (the ranks are killed and reaped first).
  LaunchResult wait();
  // wait() with a limit: nullopt when ranks still run after `timeout`.
  std::optional<LaunchResult> wait_for(std::chrono::milliseconds timeout);

  // Sends `signal` to the process group of every rank not yet reaped, and to
  // any rank spawned after this call. Any thread, before start() too; a
  // no-op once all ranks have been reaped. Not an escalation by itself: a
  // rank that dies of it is a failure, which starts the grace period; the
  // ranks already sent SIGINT, SIGTERM, SIGHUP or SIGQUIT are left to finish
  // their own shutdown then (no SIGTERM on top) until SIGKILL at its end.
  void terminate(int signal);

  // The pid of each rank, by rank; 0 before it is spawned. A pid stays in
  // the list after its rank has been reaped, when it may be reused.
  std::vector<pid_t> pids() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// "SIGSEGV: Segmentation fault"; "signal 77" for a number without a name.
std::string signal_description(int signal);

}  // namespace zerod::launch
