#include "supervised_run.h"

#include "checkpoint/manifest.h"
#include "error.h"
#include "launcher/launcher.h"
#include "launcher/signal_forwarder.h"
#include "launcher/watchdog.h"
#include "log.h"
#include "transport/detail/socket_path.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace zerod::cli {

namespace {

// The daemon's stdout after its banner, copied to ours line by line (so as
// not to split a rank's line) until the daemon ends. Its stdout used to be
// closed after the banner, and a daemon that printed later (a job's Lua
// `print`, in an lr function) died of SIGPIPE: restarted until no restart
// was left. A pipe rather than our stdout itself, so that the banner, which
// tells when the daemon listens, can be read off it.
class StdoutRelay {
 public:
  // Takes `fd`, the pipe's read end; `pending`: what was read past the banner.
  StdoutRelay(int fd, std::string pending) : fd_(fd), pending_(std::move(pending)), thread_([this] { run(); }) {}
  // After the daemon is reaped: copies what it left in the pipe, then stops
  // (a process the daemon started may still hold the pipe open).
  ~StdoutRelay() {
    daemon_gone_ = true;
    thread_.join();
    ::close(fd_);
  }
  StdoutRelay(const StdoutRelay&) = delete;
  StdoutRelay& operator=(const StdoutRelay&) = delete;

 private:
  void run();
  void write_lines(bool all);

  const int fd_;
  std::string pending_;
  bool stdout_broken_ = false;
  std::atomic<bool> daemon_gone_{false};
  std::thread thread_;  // last: starts once the rest is set
};

void StdoutRelay::run() {
  // Signals go to the other threads (the forwarder's handler), and a closed
  // stdout of ours is EPIPE here, not SIGPIPE for the whole of `zerod run`.
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
  write_lines(false);
  char buf[4096];
  for (;;) {
    // Once the daemon is gone (read before the poll) the pipe holds all it
    // wrote: read that without waiting.
    const bool gone = daemon_gone_;
    pollfd p{fd_, POLLIN, 0};
    const int ready = ::poll(&p, 1, gone ? 0 : 100);
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0 && gone) break;
    if (ready <= 0) continue;
    const ssize_t n = ::read(fd_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    pending_.append(buf, static_cast<size_t>(n));
    write_lines(false);
  }
  write_lines(true);
}

// Writes pending_'s whole lines (all of it with `all`, or when a line grows
// past 64 KiB). Once our stdout is broken it drops them: the daemon's
// output must not stop the daemon.
void StdoutRelay::write_lines(bool all) {
  const size_t last_newline = pending_.rfind('\n');
  const size_t end = all || pending_.size() > 65536 ? pending_.size()
                     : last_newline == std::string::npos ? 0
                                                         : last_newline + 1;
  size_t done = 0;
  while (!stdout_broken_ && done < end) {
    const ssize_t n = ::write(STDOUT_FILENO, pending_.data() + done, end - done);
    if (n >= 0) {
      done += static_cast<size_t>(n);
    } else if (errno != EINTR) {
      stdout_broken_ = true;
      if (errno == EPIPE) {  // SIGPIPE is blocked here and now pending on this thread: take it
        sigset_t pipe_only;
        sigemptyset(&pipe_only);
        sigaddset(&pipe_only, SIGPIPE);
        const timespec now{0, 0};
        ::sigtimedwait(&pipe_only, nullptr, &now);
      }
    }
  }
  pending_.erase(0, end);
}

// Where the daemon's start ends in what it wrote on its stdout (0: not
// yet): its banner, the line saying it listens and the next (how ranks
// connect), which `zerod serve` prints together. Before it the daemon only
// checked the job, as this process did already (and printed what its
// script prints).
size_t banner_end(const std::string& seen) {
  const size_t listening = seen.find("listening on");
  if (listening == std::string::npos) return 0;
  const size_t first = seen.find('\n', listening);
  if (first == std::string::npos) return 0;
  const size_t second = seen.find('\n', first + 1);
  return second == std::string::npos ? 0 : second + 1;
}

// The daemon child: `zerod serve` on the socket, its banner (read from its
// stdout) telling when it listens, and its stdout after that on ours.
struct Daemon {
  pid_t pid = -1;
  int status = 0;
  bool reaped = false;
  std::unique_ptr<StdoutRelay> relay;  // its stdout after the banner; goes with the Daemon, once reaped
};

// The trace file of the daemon of restart `attempt`: the first daemon's is
// the one asked for; a restarted one writes "<stem>.restart-<k><ext>", so
// the first's (the steps before the crash) is not replaced.
std::string trace_of(const std::string& trace, int attempt) {
  if (trace.empty() || attempt == 0) return trace;
  const std::filesystem::path p(trace);
  return (p.parent_path() / (p.stem().string() + ".restart-" + std::to_string(attempt) + p.extension().string()))
      .string();
}

// A whole snapshot under snapshot.path, told apart from another of the same
// step: its manifest (written last, a new file for every snapshot, renamed
// in with its directory) by device, inode and modification time.
struct SnapshotId {
  int64_t step = 0;
  uint64_t dev = 0, ino = 0;
  int64_t mtime_ns = 0;
  auto operator<=>(const SnapshotId&) const = default;
};

// The whole snapshots under path now, as the engine finds them
// (snapshot_detail::whole_snapshots: step-<N> with its manifest).
std::set<SnapshotId> whole_snapshots(const std::string& path) {
  std::set<SnapshotId> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(path, ec)) {
    const std::string name = e.path().filename().string();
    long long step = 0;
    char rest = 0;
    if (std::sscanf(name.c_str(), "step-%lld%c", &step, &rest) != 1) continue;  // .partial and others
    struct stat st {};
    if (::stat((e.path() / ckpt::kManifestName).c_str(), &st) != 0) continue;
    out.insert({step, static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
                static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec});
  }
  return out;
}

// "5,10" (--resume-snapshots), "none" for no step.
std::string step_list(const std::vector<int64_t>& steps) {
  std::string out;
  for (const int64_t s : steps) out += (out.empty() ? "" : ",") + std::to_string(s);
  return out.empty() ? "none" : out;
}

Daemon start_daemon(const DaemonArgs& args, const std::string& socket, int attempt,
                    const std::optional<std::vector<int64_t>>& resume_steps) {
  int out[2];
  ZD_CHECK_SYS(::pipe2(out, O_CLOEXEC), "zerod run: a pipe to the daemon");
  const std::string nproc = std::to_string(args.nproc);
  // This very binary, by its real path, so that `ps` shows "…/zerod serve".
  std::error_code ec;
  std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) self = "/proc/self/exe";
  std::vector<std::string> argv = {self, "serve", "--nproc", nproc, "--job", args.job, "--socket", socket};
  // What `zerod run` was told for its daemon goes to the one it supervises
  // (a restarted daemon serves the same address and writes a trace of its
  // own beside the first: trace_of).
  if (!args.trace.empty()) argv.insert(argv.end(), {"--trace", trace_of(args.trace, attempt)});
  if (!args.metrics.empty()) argv.insert(argv.end(), {"--metrics", args.metrics});
  if (resume_steps) argv.insert(argv.end(), {"--resume-snapshots", step_list(*resume_steps)});
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  ZD_CHECK_SYS(pid, "zerod run: starting the daemon");
  if (pid == 0) {
    // The daemon stops (SIGTERM: it writes what it must and exits) when
    // `zerod run` dies, even by SIGKILL: no daemon, or ranks it serves,
    // left training without a launcher (the ranks end as their daemon
    // goes). Forked from the main thread, whose end is the process's.
    if (::prctl(PR_SET_PDEATHSIG, SIGTERM) == -1 || ::getppid() != parent) ::_exit(1);
    // A process group of its own, as each rank has: a terminal's Ctrl-C
    // reaches `zerod run` alone, which passes it to the ranks once; the
    // daemon serves them until they end (a trainer saving a checkpoint on
    // KeyboardInterrupt) and is stopped then. In `zerod run`'s group it
    // stopped at once, and the ranks lost it mid-save. SIGTTOU ignored: as
    // a background group it still writes its log to the terminal under
    // `stty tostop`, instead of being stopped.
    ::setpgid(0, 0);
    ::signal(SIGTTOU, SIG_IGN);
    ::dup2(out[1], STDOUT_FILENO);
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    ::execv(cargv[0], cargv.data());
    std::fprintf(stderr, "zerod run: cannot run the daemon (%s): %s\n", cargv[0], std::strerror(errno));
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here, so that it holds before a Ctrl-C right after the fork (EACCES once it runs)
  ::close(out[1]);
  // Ready when it says it listens; a daemon that exits first has said why on stderr.
  std::string seen;
  char buf[4096];
  size_t banner = 0;
  while (banner == 0) {
    const ssize_t n = ::read(out[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    seen.append(buf, static_cast<size_t>(n));
    banner = banner_end(seen);
  }
  Daemon d;
  d.pid = pid;
  if (banner == 0) {
    ::close(out[0]);
    ::waitpid(pid, &d.status, 0);
    d.reaped = true;
    return d;
  }
  d.relay = std::make_unique<StdoutRelay>(out[0], seen.substr(banner));
  return d;
}

bool reap(Daemon& d, bool block) {
  if (d.reaped) return true;
  pid_t got;
  do {
    got = ::waitpid(d.pid, &d.status, block ? 0 : WNOHANG);
  } while (got < 0 && errno == EINTR);
  if (got == d.pid) d.reaped = true;
  return d.reaped;
}

// reap(d, false) for up to `ms`: a daemon whose ranks saw it go may still
// be on its way out (a stop's shutdown, a crash's core dump).
bool reap_within(Daemon& d, int ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (!reap(d, false)) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

std::string how(int status) {
  if (WIFSIGNALED(status)) return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
                                  strsignal(WTERMSIG(status)) + ")";
  return "exited with status " + std::to_string(WEXITSTATUS(status));
}

// "the newest whole snapshot under P is of step 5" (or that there is none).
std::string newest_snapshot(const std::string& path) {
  const std::set<SnapshotId> kept = whole_snapshots(path);
  if (kept.empty()) return "no whole snapshot is under " + path;
  return "the newest whole snapshot under " + path + " is of step " + std::to_string(kept.rbegin()->step);
}

// How the daemon ended once the ranks had, said on stderr when it was not
// a clean stop; returns the run's exit status (`code`: the ranks'). A
// `zerod serve` told to stop exits 0, or kEndNotSaved with its own word
// that the job's final snapshot failed (it said why on the stderr it
// shares with this process). Anything else (killed, a crash, an exit of 1)
// is a daemon that may have died before the job's end was saved, with no
// word of it: kEndNotSaved too, rather than the 0 of ranks whose
// zd_model_destroy could not tell them. `died_before_stop`: it was dead
// before this process told it to stop.
int report_daemon_end(const Daemon& daemon, bool died_before_stop, const std::string& snapshot_path, int code) {
  if (WIFEXITED(daemon.status) && WEXITSTATUS(daemon.status) == 0) return code;
  const std::string pid = std::to_string(daemon.pid);
  if (WIFEXITED(daemon.status) && WEXITSTATUS(daemon.status) == kEndNotSaved)
    return report_lost_ends("run", {"its daemon, pid " + pid + ", exited with status " + std::to_string(kEndNotSaved)},
                            code);
  const std::string status = code == 0 ? "; exit status " + std::to_string(kEndNotSaved) : "";
  std::fprintf(stderr,
               "zerod run: the daemon (pid %s) %s %s, so the job's end may NOT have been saved (its final snapshot "
               "is written as the ranks destroy their models; %s)%s\n",
               pid.c_str(), how(daemon.status).c_str(), died_before_stop ? "before it was told to stop" : "as it stopped",
               newest_snapshot(snapshot_path).c_str(), status.c_str());
  return code == 0 ? kEndNotSaved : code;
}

// The socket the daemon serves, by an absolute path (a rank that changes
// its working directory still finds it, as with the daemon in `zerod run`'s
// own process): the user's, or one in a private directory made as the
// daemon's own Listener makes it (under $XDG_RUNTIME_DIR when usable, else
// /tmp). "" when neither can be had, said why.
std::string socket_to_serve(const std::string& asked) {
  if (asked.empty()) {
    try {
      return transport::detail::make_private_directory() + "/" + transport::detail::kPrivateSocketName;
    } catch (const Error& e) {
      std::fprintf(stderr, "zerod run: %s\n", e.what());
      return "";
    }
  }
  std::error_code ec;  // absolute() needs the working directory, which can be gone
  const std::filesystem::path full = std::filesystem::absolute(asked, ec);
  if (ec) {
    std::fprintf(stderr, "zerod run: cannot create the zerod socket %s: %s\n", asked.c_str(), ec.message().c_str());
    return "";
  }
  return full.lexically_normal().string();
}

}  // namespace

int run_supervised(const DaemonArgs& args, const SnapshotConfig& snapshot, int restarts, launch::Watchdog* watchdog,
                   const std::string& run_id) {
  const std::string socket = socket_to_serve(args.socket);
  if (socket.empty()) return 1;
  // The directory of the socket: ours (made above) or the user's. The
  // ranks' files of this run there (ZEROD_RUN_ID: the gloo store) go at the
  // end, before a restart (a restarted rank must not meet its dead
  // predecessor's store), and, with the directory we made, if we die.
  const std::string dir = std::filesystem::path(socket).parent_path().string();
  const std::string run_files = launch::run_file_prefix(run_id);
  if (watchdog) {
    if (args.socket.empty())
      watchdog->remove_directory_on_death(dir);
    else
      watchdog->remove_entries_on_death(dir, run_files);
  }
  // snapshot.resume = false keeps the job off the snapshots an earlier run
  // left, not off its own: a restarted daemon resumes from those this run
  // wrote (passed as --resume-snapshots), told from the earlier ones by
  // what was there before the first daemon started. With resume = true a
  // restart resumes from the newest, as any new job over the path does.
  const std::set<SnapshotId> before = snapshot.resume ? std::set<SnapshotId>{} : whole_snapshots(snapshot.path);
  std::optional<std::vector<int64_t>> resume_steps;
  const auto t0 = std::chrono::steady_clock::now();
  int exit_code = 1;
  for (int attempt = 0;; ++attempt) {
    Daemon daemon = start_daemon(args, socket, attempt, resume_steps);
    if (attempt > 0 && !args.trace.empty())
      std::fprintf(stderr,
                   "zerod run: the restarted daemon writes its trace, if it runs a step of the traced window, to %s "
                   "(%s keeps the steps before)\n",
                   trace_of(args.trace, attempt).c_str(), args.trace.c_str());
    if (daemon.reaped) {
      std::fprintf(stderr, "zerod run: the daemon did not start (it %s)\n", how(daemon.status).c_str());
      break;
    }
    std::fprintf(stderr, "zerod run: daemon pid %d serving %d ranks on %s%s\n", static_cast<int>(daemon.pid),
                 args.nproc, socket.c_str(),
                 attempt ? (" (restart " + std::to_string(attempt) + " of " + std::to_string(restarts) + ")").c_str()
                         : "");
    launch::LaunchOptions lo;
    lo.nproc = args.nproc;
    lo.argv = args.command;
    lo.prefix_output = args.prefix;
    lo.peer_exit_seconds = 2;
    lo.env["ZEROD_ENDPOINT"] = "unix:" + socket;
    lo.env["ZEROD_JOB"] = args.job;
    lo.env["ZEROD_RUN_ID"] = run_id;
    lo.watchdog = watchdog;
    launch::LaunchResult result;
    // Set when the user stops the job (a signal to this process): whatever
    // the daemon's end then looks like, it is not restarted. The signal
    // goes to the ranks alone, as without snapshots: the daemon serves them
    // until they end (what they do on the way out, a checkpoint, needs it)
    // and is stopped below.
    std::atomic<bool> user_stop{false};
    {
      launch::Launcher launcher(lo);
      launch::SignalForwarder forwarder(launcher, [&user_stop](int received, int sent) {
        std::fprintf(stderr, "zerod run: got signal %d, sent %s to every rank\n", received,
                     launch::signal_description(sent).c_str());
        user_stop = true;
      });
      launcher.start();
      result = launcher.wait();
    }
    launch::remove_entries(dir, run_files);
    // The daemon died under the ranks: restart both, from the snapshot. One
    // still alive after a stop is not waited for: it is stopped below.
    if (result.first_failure && reap_within(daemon, user_stop ? 0 : 2000)) {
      // `zerod serve` ends with status 0 (or kEndNotSaved: a model's final
      // snapshot failed as it stopped) only when it was told to stop
      // (SIGINT, SIGTERM or SIGHUP, which it takes itself, sent to it by
      // hand): a stop, not a death. A crash or SIGKILL is.
      const bool exited_stopping =
          WIFEXITED(daemon.status) && (WEXITSTATUS(daemon.status) == 0 || WEXITSTATUS(daemon.status) == kEndNotSaved);
      const bool stopped_by_user =
          user_stop || exited_stopping || (WIFSIGNALED(daemon.status) && WTERMSIG(daemon.status) == SIGTERM);
      std::fprintf(stderr, "zerod run: the daemon (pid %d) %s; the ranks lost it\n", static_cast<int>(daemon.pid),
                   how(daemon.status).c_str());
      if (!stopped_by_user && attempt < restarts) {
        if (snapshot.resume) {
          std::fprintf(stderr,
                       "zerod run: restarting the daemon and the ranks; they resume from the newest snapshot\n");
          continue;
        }
        // The dead daemon wrote nothing more (reaped above): what is new
        // since the start is this run's.
        resume_steps.emplace();
        for (const SnapshotId& id : whole_snapshots(snapshot.path))
          if (!before.count(id)) resume_steps->push_back(id.step);
        if (resume_steps->empty())
          std::fprintf(stderr, "zerod run: restarting the daemon and the ranks; this run wrote no snapshot yet, so "
                               "they start the job over (snapshot.resume = false: not from the snapshots under %s "
                               "of an earlier run)\n",
                       snapshot.path.c_str());
        else
          std::fprintf(stderr, "zerod run: restarting the daemon and the ranks; they resume from this run's newest "
                               "snapshot (step %lld under %s; snapshot.resume = false keeps them off an earlier "
                               "run's)\n",
                       static_cast<long long>(resume_steps->back()), snapshot.path.c_str());
        continue;
      }
      if (!stopped_by_user)
        std::fprintf(stderr, "zerod run: no restarts left (--restarts %d)\n", restarts);
      exit_code = result.exit_code ? result.exit_code : 1;
      break;
    }
    // The ranks ended (well or not): stop the daemon, which writes nothing
    // more (the models ended with their ranks). One already dead is looked
    // at first: it died as the ranks ended, in zd_model_destroy, which
    // writes the job's final snapshot and returns nothing a trainer could
    // fail on, so every rank exited 0 (the run exited 0, its end lost).
    const bool died_before_stop = reap(daemon, false);
    if (!daemon.reaped) {
      ::kill(daemon.pid, SIGTERM);
      reap(daemon, true);
    }
    exit_code = report_ranks(result, args.nproc,
                             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    exit_code = report_daemon_end(daemon, died_before_stop, snapshot.path, exit_code);
    break;
  }
  if (args.socket.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  return exit_code;
}

}  // namespace zerod::cli
