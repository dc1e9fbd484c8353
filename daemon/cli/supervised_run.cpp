#include "supervised_run.h"

#include "checkpoint/manifest.h"
#include "error.h"
#include "launcher/launcher.h"
#include "launcher/signal_forwarder.h"
#include "launcher/watchdog.h"
#include "log.h"

#include <fcntl.h>
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
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace zerod::cli {

namespace {

// The daemon child: `zerod serve` on the socket, its banner line (read from
// its stdout) telling when it listens.
struct Daemon {
  pid_t pid = -1;
  int status = 0;
  bool reaped = false;
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
    ::dup2(out[1], STDOUT_FILENO);
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    ::execv(cargv[0], cargv.data());
    std::fprintf(stderr, "zerod run: cannot run the daemon (%s): %s\n", cargv[0], std::strerror(errno));
    ::_exit(127);
  }
  ::close(out[1]);
  // Ready when it says it listens; a daemon that exits first has said why on stderr.
  std::string seen;
  char buf[512];
  for (;;) {
    const ssize_t n = ::read(out[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    seen.append(buf, static_cast<size_t>(n));
    if (seen.find("listening on") != std::string::npos) break;
  }
  ::close(out[0]);  // the daemon's later stdout lines go nowhere; its log is on stderr
  Daemon d;
  d.pid = pid;
  if (seen.find("listening on") == std::string::npos) {
    ::waitpid(pid, &d.status, 0);
    d.reaped = true;
  }
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

}  // namespace

int run_supervised(const DaemonArgs& args, const SnapshotConfig& snapshot, int restarts, launch::Watchdog* watchdog,
                   const std::string& run_id) {
  char tmpl[] = "/tmp/zerod-run-XXXXXX";
  const std::string socket =
      !args.socket.empty() ? args.socket
                           : (mkdtemp(tmpl) ? std::string(tmpl) + "/zerod.sock"
                                            : (std::fprintf(stderr, "zerod run: mkdtemp: %s\n", std::strerror(errno)), ""));
  if (socket.empty()) return 1;
  // The directory of the socket: ours (made above) or the user's. The
  // ranks' files of this run there (ZEROD_RUN_ID: the gloo store) go at the
  // end, before a restart (a restarted rank must not meet its dead
  // predecessor's store), and, with the directory we made, if we die.
  std::error_code abs_ec;
  const std::string dir = std::filesystem::absolute(socket, abs_ec).parent_path().string();
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
      std::fprintf(stderr, "zerod run: the restarted daemon writes its trace to %s (%s keeps the steps before)\n",
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
    // the daemon's end then looks like, it is not restarted.
    std::atomic<bool> user_stop{false};
    {
      launch::Launcher launcher(lo);
      launch::SignalForwarder forwarder(launcher, [&daemon, &user_stop](int received, int sent) {
        std::fprintf(stderr, "zerod run: got signal %d, sent %s to every rank\n", received,
                     launch::signal_description(sent).c_str());
        user_stop = true;
        if (!daemon.reaped) ::kill(daemon.pid, SIGTERM);
      });
      launcher.start();
      result = launcher.wait();
    }
    launch::remove_entries(dir, run_files);
    // The daemon died under the ranks: restart both, from the snapshot.
    if (result.first_failure && reap_within(daemon, 2000)) {
      // `zerod serve` ends with status 0 (or kEndNotSaved: a model's final
      // snapshot failed as it stopped) only when it was told to stop
      // (SIGINT or SIGTERM, which it takes itself; a terminal's Ctrl-C
      // reaches it directly): a stop, not a death. A crash or SIGKILL is.
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
    // The ranks ended (well or not) with the daemon alive: stop it, which
    // writes nothing more (the models ended with their ranks).
    if (!daemon.reaped) {
      ::kill(daemon.pid, SIGTERM);
      reap(daemon, true);
    }
    exit_code = report_ranks(result, args.nproc,
                             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    // The daemon's own word that the job's final snapshot failed (it said
    // why on the stderr it shares with this process).
    if (WIFEXITED(daemon.status) && WEXITSTATUS(daemon.status) == kEndNotSaved)
      exit_code = report_lost_ends("run",
                                   {"its daemon, pid " + std::to_string(daemon.pid) + ", exited with status " +
                                    std::to_string(kEndNotSaved)},
                                   exit_code);
    break;
  }
  if (args.socket.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  return exit_code;
}

}  // namespace zerod::cli
