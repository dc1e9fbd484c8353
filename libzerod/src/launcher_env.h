// What another launcher's environment says about this process: torchrun
// (and the launchers built on torch.distributed: Lightning's, `accelerate
// launch`), mpirun and srun tell each process its rank and the world size.
// A process of several that connects to no daemon would train alone as
// rank 0 of 1 while its siblings do the same: two trainings where the user
// asked for one, silently. zd_connect never lets that happen: the ranks of
// a node share a daemon they start on demand (node_daemon.h); across nodes
// the daemons join through MPI (an Open MPI name server the user names or
// node 0 starts); what cannot be served is refused by name.
#pragma once

#include <optional>
#include <string>

namespace zerod::abi {

// This process as one of several ranks another launcher started.
struct LauncherRanks {
  std::string launcher;  // "torchrun (...)", "mpirun (Open MPI)", ...
  std::string where;     // the variables it was read from, e.g. "RANK=1, WORLD_SIZE=2"
  int rank = 0, world = 1;
  int local_rank = 0, local_world = 1;  // on this node; local_world 0: the launcher does not say
  // This node's index among the job's nodes: ZEROD_NODE_RANK, else the
  // launcher's (torchrun's GROUP_RANK, Slurm's SLURM_NODEID); -1 when
  // nothing says (Open MPI and PMI do not).
  int node = -1;
  // The same string in every process of one launch on this node and a
  // different one for the next launch (or a restart under torchrun): the
  // launcher's job id, rendezvous address, restart count ("" if it has none).
  // It names the launch's own daemon (node_daemon.h).
  std::string job_key;
  // The job this rank names in its hello to a daemon serving several jobs
  // (`zerod serve --jobs`, Server::join): job_key, or with ZEROD_JOB_KEY set
  // that alone (torchrun's restart count and the world size beside it), so
  // that a relaunch under mpirun or srun names the job its last launch did
  // and resumes what daemon.keep_state kept for it.
  std::string hello_job_key;
  // The launcher's ids for this launch, without ZEROD_JOB_KEY ("" when it
  // gives none): sent beside hello_job_key so that a daemon serving several
  // jobs refuses a second launch running at once under the same
  // ZEROD_JOB_KEY instead of making one job of the two (Server::join).
  std::string launch_id;
};

// nullopt when the environment says one process (or says nothing). The
// ranks zerod itself names (ZEROD_RANK, ZEROD_WORLD_SIZE, ZEROD_LOCAL_RANK,
// ZEROD_LOCAL_WORLD_SIZE, as Python integrations set them from their
// framework) come first; then torchrun's, Open MPI's, Slurm's and PMI's.
std::optional<LauncherRanks> launcher_ranks();

}  // namespace zerod::abi
