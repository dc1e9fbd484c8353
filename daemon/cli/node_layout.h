// Which node this daemon is, when a job spans several: one `zerod run` (or
// `zerod serve`) per node, started by the launcher the cluster already has.
// Ranks are numbered node-major: node k of K, with N ranks each, serves
// ranks k*N .. k*N+N-1 of K*N.
#pragma once

#include <map>
#include <string>

namespace zerod::cli {

struct NodeLayout {
  int node = 0;    // this daemon's index
  int nodes = 1;   // daemons in the job
  std::string source = "one node";  // where the figures came from, for messages
};

// From --node-rank/--nnodes when given (both or neither), else from the
// environment of the launcher that started us: Open MPI's mpirun
// (OMPI_COMM_WORLD_RANK/SIZE), MPICH and Intel MPI (PMI_RANK/PMI_SIZE), Slurm's
// srun (SLURM_PROCID/SLURM_STEP_NUM_TASKS); else one node. Throws
// ZD_ERR_INVALID_ARGUMENT for figures that make no sense.
NodeLayout detect_node_layout(int flag_node, int flag_nodes, const std::map<std::string, std::string>& env);

// The job's ranks and this node's first one when each of the layout's nodes
// runs nproc ranks; throws ZD_ERR_INVALID_ARGUMENT when they do not fit an
// int (up to 4096 ranks per node and 2^20 nodes are allowed, whose product is not).
struct RankSpan {
  int world = 1;
  int first = 0;
};
RankSpan rank_span(const NodeLayout& node, int nproc);

// "" when the job's comm backend can serve this layout, else why not and
// what to change: the `local` backend runs one daemon's collectives only.
// Checked before anything starts, so that no rank is launched to fail.
std::string layout_problem(const NodeLayout& node, const std::string& comm_backend, const std::string& job_path);

// The environment of this process as a map.
std::map<std::string, std::string> process_environment();

}  // namespace zerod::cli
