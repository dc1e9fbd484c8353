// Starting one rank: fork, then in the child only async-signal-safe calls
// (the daemon is multithreaded; another thread may hold the malloc lock at
// the fork), then execve.
//
// Why fork and not posix_spawn: each rank must get PR_SET_PDEATHSIG, so that
// the ranks die with zerod, and posix_spawn has no way to set it. The child
// side below makes no allocation, takes no lock and calls only system calls.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

namespace zerod::launch::detail {

// Everything the child needs, prepared before the fork.
struct ExecPlan {
  std::string display;                  // argv[0] as given, for messages
  std::vector<std::string> candidates;  // the paths to execve, in order (the PATH search)
  std::vector<std::string> argv;
  std::vector<std::string> env;  // "NAME=value": zerod's environment plus the extra variables
};

// The plan for `argv` with zerod's environment (read now, with the user's
// values of what zerod set for itself: own_environment.h) overridden by
// `extra_env`, less the variables named in `reserved` (the caller adds its
// own per process); argv[0] is searched in that environment's PATH as
// execvp does.
ExecPlan make_exec_plan(const std::vector<std::string>& argv,
                        const std::map<std::string, std::string>& extra_env,
                        const std::vector<std::string>& reserved);

// The fds that become the child's 0, 1 and 2 (any fds; they may be 0-2).
struct StdioFds {
  int in = -1;
  int out = -1;
  int err = -1;
};

struct Spawned {
  pid_t pid = -1;
  // Empty when execve succeeded. Otherwise why the child could not run the
  // command ("cannot run 'trainer': No such file or directory"); the child
  // has then exited with status 127 and must still be reaped.
  std::string error;
};

// Forks a child that becomes the leader of a new process group, gets
// SIGKILL when the calling thread ends (PR_SET_PDEATHSIG: so call it from a
// thread that lives as long as the child), takes `stdio` as 0-2, closes every
// other fd at exec, resets the signal mask and the dispositions zerod may
// have changed, and execs plan with `env` (plan.env with the rank's variables
// added). With a watchdog_fd (Watchdog::rank_fd, watchdog.h) the child
// registers its process group there before exec, so that nothing it starts
// outlives a zerod that dies. Returns once the child has exec'd or failed
// to. Throws zerod::Error when the child cannot be created.
Spawned spawn_process(const ExecPlan& plan, const std::vector<std::string>& env,
                      const StdioFds& stdio, int watchdog_fd = -1);

}  // namespace zerod::launch::detail
