// What `zerod run` leaves behind when it dies (SIGKILL, a crash, the OOM
// killer) is cleaned up by a small process of its own: the watchdog.
//
// When zerod dies, its ranks die with it (PR_SET_PDEATHSIG, spawn.h), and a
// supervised daemon is told to stop (supervised_run.cpp). What the ranks
// started themselves is not: `zerod run -- bash -c 'sleep 1000 & python
// train.py'`'s sleep, a DataLoader's workers, a compile server. Nor is what
// zerod would have removed on its way out: the private directory of its
// socket, and the files its ranks keep there for this run (the gloo store,
// bindings/python/zerod/_gloo.py). The watchdog is forked when zerod starts,
// before any rank, and waits on a socket whose other end only zerod holds.
// When that socket reads end of file without zerod having said goodbye
// (zerod is gone, however it went), the watchdog
//   - sends SIGKILL to the process group of every rank (each rank leads one,
//     launcher.h), which reaches whatever the rank started and left in it,
//     even after the rank itself has ended;
//   - removes the directories and the run's files it was told of;
// and exits. When zerod ends normally (~Watchdog), the watchdog exits and
// touches nothing: the launcher has reaped its ranks and zerod removes its
// own files.
//
// Why this design, and not the others at hand:
//   - PR_SET_CHILD_SUBREAPER adopts the orphans of a process's descendants.
//     zerod is the ranks' parent and the one that dies; a subreaper that
//     outlives it would have to sit between zerod and each rank, so that
//     the launcher's children (the pids it reaps, reports and signals) would
//     be shims instead of the ranks. The process groups the ranks lead
//     already name everything they start, and the launcher already signals
//     them as such (a forwarded Ctrl-C, the stop after a failure).
//   - The supervised daemon (`zerod serve` under `zerod run`) exists only
//     for jobs that take snapshots; plain `zerod run` serves in-process. The
//     watchdog covers both the same way.
//   - A rank registers its own process group, from its child before exec
//     (spawn.cpp): nothing it runs can start a process before the watchdog
//     knows the group, even if zerod dies in the same instant.
//   - Process group ids are pids. A group id cannot be reused while any
//     process of the group lives, but once the group is empty it may be the
//     pid of a new process. Before signalling a group whose leader (the
//     rank) still exists, the watchdog checks that leader's start time
//     against the one it read when the rank registered; a group whose
//     leader is gone can only be ours, as long as some member holds the id.
//   - It sits in a process group of its own, and ignores SIGINT, SIGTERM,
//     SIGHUP and SIGQUIT: a Ctrl-C at the terminal, a `kill -- -PGID` or
//     `timeout -s KILL` of zerod's group must not take it along with zerod.
//     It ends by itself when zerod does.
//   - It is forked, not exec'd (this library is linked into test drivers as
//     well as zerod), and so makes system calls only, like the child side of
//     spawn.cpp: zerod may have threads when it is forked.
//
// What it cannot reach: a process that left its rank's process group
// (setsid, setpgid: a daemon that detaches itself on purpose). A cgroup
// (systemd-run --scope, Slurm's task plugin) holds those.
#pragma once

#include "launcher/detail/unique_fd.h"

#include <sys/types.h>

#include <string>

namespace zerod::launch {

class Watchdog {
 public:
  // Forks the watchdog process. Throws zerod::Error (ZD_ERR_IO) when it
  // cannot. The watchdog holds no file descriptor of zerod's but its socket
  // and stderr (stdin and stdout are /dev/null: a pipe that zerod's stdout
  // is does not wait for it).
  Watchdog();
  // zerod ends normally: tells the watchdog to exit without doing anything
  // and reaps it (waitpid by pid, as the launcher's rules ask).
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // When zerod dies, remove `dir` and all it holds (a directory zerod made
  // for itself: the private one of its socket).
  void remove_directory_on_death(const std::string& dir);
  // When zerod dies, remove what `dir` holds whose name begins with
  // `prefix` (the files of this run in a directory the user chose).
  void remove_entries_on_death(const std::string& dir, const std::string& prefix);

  // The descriptor a rank's child registers its process group on, before
  // exec (Launcher, through LaunchOptions::watchdog). Close-on-exec.
  int rank_fd() const { return socket_.get(); }
  pid_t pid() const { return pid_; }

 private:
  void send_path(int kind, const std::string& dir, const std::string& prefix);

  detail::UniqueFd socket_;
  pid_t pid_ = -1;
};

// What a rank's child sends the watchdog: its pid, which is its process
// group. Async-signal-safe; a watchdog that is gone or not reading is
// ignored (the rank still runs).
void register_rank_group(int watchdog_fd);

// A name for a run's files, unique to this run: 16 hex digits from the
// kernel's random source (ZEROD_RUN_ID in the ranks' environment).
std::string new_run_id();
// The prefix of the names of a run's files in its socket's directory, as
// bindings/python/zerod/_gloo.py makes them: "zerod-run-<id>-".
std::string run_file_prefix(const std::string& run_id);
// Removes what `dir` holds whose name begins with `prefix` (a run's files
// at its end); what cannot be removed is logged.
void remove_entries(const std::string& dir, const std::string& prefix);

}  // namespace zerod::launch
