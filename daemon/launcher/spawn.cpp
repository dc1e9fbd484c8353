#include "launcher/detail/spawn.h"

#include "error.h"
#include "launcher/detail/unique_fd.h"
#include "launcher/own_environment.h"
#include "launcher/watchdog.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>

#ifndef SYS_close_range
#define SYS_close_range 436
#endif
#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

extern char** environ;

namespace zerod::launch::detail {

namespace {

// What the child tells the parent when it cannot exec, over a CLOEXEC pipe:
// end of file without a report means execve succeeded.
enum Stage : int { kStageProcessGroup = 1, kStageDeathSignal, kStageStdio, kStageExec };
struct ChildReport {
  int stage;
  int err;
};

const char* stage_name(int stage) {
  switch (stage) {
    case kStageProcessGroup: return "setpgid";
    case kStageDeathSignal: return "prctl(PR_SET_PDEATHSIG)";
    case kStageStdio: return "setting up stdin/stdout/stderr";
    default: return "execve";
  }
}

// Only plain pointers and ints: the child must not touch a std::string.
struct ChildArgs {
  pid_t parent;
  int report_fd;
  int watchdog_fd;  // -1: none
  int stdio[3];
  char* const* argv;
  char* const* envp;
  char* const* candidates;  // null-terminated
};

// A PATH entry that fails like this means "try the next one" (as execvp).
bool try_next_path(int err) {
  return err == ENOENT || err == ENOTDIR || err == ESTALE || err == ENODEV || err == ETIMEDOUT ||
         err == EACCES;
}

// Ignored dispositions that zerod (or a library in it) may have set and that
// a trainer must not inherit. SIGHUP is left as it is, so nohup still works;
// the job-control signals too, so a rank is stopped only as zerod would be.
bool reset_if_ignored(int sig) {
  switch (sig) {
    case SIGPIPE:
    case SIGINT:
    case SIGTERM:
    case SIGQUIT:
    case SIGCHLD:
    case SIGUSR1:
    case SIGUSR2:
    case SIGALRM:
    case SIGXFSZ: return true;
    default: return false;
  }
}

[[noreturn]] void child_fail(int report_fd, int stage, int err) {
  const ChildReport report{stage, err};
  // 8 bytes to a pipe are written at once or not at all; nothing to do if not.
  const ssize_t n = ::write(report_fd, &report, sizeof report);
  (void)n;
  ::_exit(127);
}

// The forked child of a process that may have many threads: system calls
// only. No allocation, no locks, no exceptions, nothing that returns.
[[noreturn]] void child_main(const ChildArgs& a) {
  if (::setpgid(0, 0) == -1) child_fail(a.report_fd, kStageProcessGroup, errno);
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) == -1) child_fail(a.report_fd, kStageDeathSignal, errno);
  // zerod may have died between fork() and prctl(), and then no signal comes.
  if (::getppid() != a.parent) ::_exit(127);
  // The group is ours from here: the watchdog knows it before anything the
  // rank runs can start a process in it.
  register_rank_group(a.watchdog_fd);

  // Lift the three sources above 2 before any dup2 onto 0-2, so that none is
  // overwritten by another (stdout_fd == 2, or fd 0 closed in zerod...).
  // The copies close at exec; dup2 gives 0-2 without FD_CLOEXEC.
  int high[3];
  for (int i = 0; i < 3; ++i) {
    high[i] = ::fcntl(a.stdio[i], F_DUPFD_CLOEXEC, 3);
    if (high[i] == -1) child_fail(a.report_fd, kStageStdio, errno);
  }
  for (int i = 0; i < 3; ++i) {
    if (::dup2(high[i], i) == -1) child_fail(a.report_fd, kStageStdio, errno);
  }
  // Every fd above 2 closes at exec: ours (already CLOEXEC) and any that
  // another thread or library of the daemon opened without O_CLOEXEC. Before
  // Linux 5.11 this fails and those stay open.
  ::syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC);

  // All signals are blocked here (the supervisor thread blocks them), so no
  // handler of zerod's can run in this child: put back the defaults first,
  // then unblock. exec would reset the handlers too, but only after the
  // unblocking — and a handler of zerod's running here (the signal
  // forwarder's, say) would act for zerod.
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  for (int sig = 1; sig < NSIG; ++sig) {
    struct sigaction old;
    if (::sigaction(sig, nullptr, &old) == -1) continue;  // SIGKILL, glibc's own
    const bool has_handler =
        (old.sa_flags & SA_SIGINFO) || (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN);
    if (has_handler || (old.sa_handler == SIG_IGN && reset_if_ignored(sig))) {
      ::sigaction(sig, &dfl, nullptr);
    }
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);

  int err = ENOENT;
  bool denied = false;
  for (char* const* path = a.candidates; *path; ++path) {
    ::execve(*path, a.argv, a.envp);
    err = errno;
    if (err == EACCES) denied = true;
    if (!try_next_path(err)) break;
  }
  // As execvp: "permission denied" somewhere beats "not found" at the end.
  if (denied && try_next_path(err)) err = EACCES;
  child_fail(a.report_fd, kStageExec, err);
}

std::vector<char*> pointers(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (const std::string& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

}  // namespace

ExecPlan make_exec_plan(const std::vector<std::string>& argv,
                        const std::map<std::string, std::string>& extra_env,
                        const std::vector<std::string>& reserved) {
  ExecPlan plan;
  plan.display = argv.at(0);
  plan.argv = argv;

  std::map<std::string, std::string> env;
  for (char** entry = environ; entry && *entry; ++entry) {
    const std::string_view kv(*entry);
    const size_t eq = kv.find('=');
    if (eq == std::string_view::npos || eq == 0) continue;
    // emplace keeps the first of duplicates, as getenv() does.
    env.emplace(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
  }
  restore_user_values(env);  // the user's, not what zerod set for itself (own_environment.h)
  for (const auto& [name, value] : extra_env) env.insert_or_assign(name, value);
  for (const std::string& name : reserved) env.erase(name);
  plan.env.reserve(env.size());
  for (const auto& [name, value] : env) plan.env.push_back(name + "=" + value);

  const std::string& file = argv[0];
  if (file.find('/') != std::string::npos) {
    plan.candidates.push_back(file);
  } else {
    const auto it = env.find("PATH");
    // glibc's execvp default when PATH is unset.
    const std::string path = it != env.end() ? it->second : "/bin:/usr/bin";
    size_t start = 0;
    for (;;) {
      const size_t colon = path.find(':', start);
      const std::string dir =
          path.substr(start, colon == std::string::npos ? colon : colon - start);
      plan.candidates.push_back(dir.empty() ? file : dir + "/" + file);  // "" is the current dir
      if (colon == std::string::npos) break;
      start = colon + 1;
    }
  }
  return plan;
}

Spawned spawn_process(const ExecPlan& plan, const std::vector<std::string>& env,
                      const StdioFds& stdio, int watchdog_fd) {
  // Everything the child reads is allocated now, before the fork.
  std::vector<char*> argv = pointers(plan.argv);
  std::vector<char*> envp = pointers(env);
  std::vector<char*> candidates = pointers(plan.candidates);

  int report[2];
  ZD_CHECK_SYS(::pipe2(report, O_CLOEXEC),
               "launcher: cannot create a pipe to start '" + plan.display + "'");
  UniqueFd report_read(report[0]);
  UniqueFd report_write(report[1]);

  ChildArgs args{};
  args.parent = ::getpid();
  args.report_fd = report_write.get();
  args.watchdog_fd = watchdog_fd;
  args.stdio[0] = stdio.in;
  args.stdio[1] = stdio.out;
  args.stdio[2] = stdio.err;
  args.argv = argv.data();
  args.envp = envp.data();
  args.candidates = candidates.data();
  const pid_t pid = ::fork();
  if (pid == 0) child_main(args);
  ZD_CHECK_SYS(pid, "launcher: cannot fork to start '" + plan.display + "'");
  report_write.reset();

  // Blocks until the child has exec'd (end of file) or reported why not.
  ChildReport got{};
  size_t have = 0;
  while (have < sizeof got) {
    const ssize_t n =
        ::read(report_read.get(), reinterpret_cast<char*>(&got) + have, sizeof got - have);
    if (n == -1 && errno == EINTR) continue;
    if (n <= 0) break;
    have += static_cast<size_t>(n);
  }

  Spawned spawned;
  spawned.pid = pid;
  if (have == sizeof got) {
    if (got.stage == kStageExec) {
      spawned.error = "cannot run '" + plan.display + "': " + errno_text(got.err);
    } else {
      spawned.error = "cannot start '" + plan.display + "': " + stage_name(got.stage) + ": " +
                      errno_text(got.err);
    }
  } else if (have > 0) {
    spawned.error = "cannot start '" + plan.display + "': its report of what failed was cut short";
  }
  return spawned;
}

}  // namespace zerod::launch::detail
