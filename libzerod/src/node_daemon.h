// A daemon started on demand by the ranks of another launcher (torchrun,
// accelerate launch, Lightning's launcher, mpirun, srun): the ranks of one
// launch on a node share one `zerod serve`, started by whichever of them
// comes first, and it ends when they are gone (`--until-done`).
//
// Where: $XDG_RUNTIME_DIR/zerod-launch (else /tmp/zerod-launch-<uid>), a
// directory of this user's only (mode 0700, checked), holding per launch
// job-<hash>.lock (who starts it), job-<hash>.sock (the daemon's socket)
// and job-<hash>.log (its output). The hash is of the launch's key
// (LauncherRanks::job_key), so two jobs of one user on a node get two
// daemons, and all ranks of one launch find the same one.
#pragma once

#include "launcher_env.h"

#include <string>

namespace zerod::abi {

// The socket path of the launch's daemon, started now if none serves it
// yet. `job` is the job script's path (checked by the daemon before it
// listens; its errors come back in the thrown Error). Throws Error.
std::string node_daemon_socket(const LauncherRanks& ranks, const std::string& job, int timeout_ms);

}  // namespace zerod::abi
