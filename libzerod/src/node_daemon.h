// A daemon started on demand by the ranks of another launcher (torchrun,
// accelerate launch, Lightning's launcher, mpirun, srun): the ranks of one
// launch on a node share one `zerod serve`, started by whichever of them
// comes first, and it ends when they are gone (`--until-done`).
//
// Where: $XDG_RUNTIME_DIR/zerod-launch (else /tmp/zerod-launch-<uid>), a
// directory of this user's only (mode 0700, checked), holding per launch
// job-<hash>.lock (who starts it), job-<hash>.sock (the daemon's socket)
// and job-<hash>.log (its output; the starter records in the lock the
// daemon's pid, the kernel's boot id and the pid namespace). The hash is of
// the launch's key (LauncherRanks::job_key), so two jobs of one user on a
// node get two daemons, and all ranks of one launch find the same one.
// Most launches have a key of their own, so the rank that starts a daemon
// removes the files of launches of its boot and pid namespace whose daemon
// has ended, keeping for a week a log that says more than its start and
// stop (of another host's or container's launch, only a log older than a
// week goes); a log of the launch before on the same key (a fixed
// MASTER_PORT) is set aside as job-<hash>.<when>.log, kept a week too.
//
// Several nodes (the launcher's world larger than this node's ranks): each
// node's daemon is `zerod serve --nnodes N --node-rank K` under an `mpirun
// -np 1` of its own, with ZEROD_MPI_JOIN set, so the mpi comm plugins of the
// nodes' daemons find each other through an Open MPI name server
// (plugins/comm/mpi/join.h): the one ZEROD_OMPI_SERVER names (what `mpirun
// --ompi-server` takes: `file:PATH` or the server's URI), else one that
// node 0 starts and hands to the other nodes over TCP (`zerod join` wraps
// the mpirun: daemon/cli/join_command.cpp; the rendezvous is
// ZEROD_RENDEZVOUS, else MASTER_ADDR:MASTER_PORT+1). Open MPI cannot
// connect daemons that no mpirun started, so the mpirun is not optional.
#pragma once

#include "launcher_env.h"

#include <string>

namespace zerod::abi {

// The socket path of the launch's daemon, started now if none serves it
// yet. `job` is the job script's path (checked by the daemon before it
// listens; its errors come back in the thrown Error). Throws Error.
std::string node_daemon_socket(const LauncherRanks& ranks, const std::string& job, int timeout_ms);

// Several nodes: this node's index and the node count, checked against the
// ranks' numbering (node-major: node k has ranks k*L .. k*L+L-1, as `zerod
// serve --nnodes` serves them). Throws ZD_ERR_CONFIG saying what is missing.
struct NodePlace {
  int node = 0, nodes = 1;
};
NodePlace node_place(const LauncherRanks& ranks);

}  // namespace zerod::abi
