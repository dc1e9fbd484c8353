// torch.distributed's gloo backend between nodes, the figure a user on CPUs
// would otherwise get (DeepSpeed's comm runs on it there): one
// torch_gloo_nodes.py process per node, run by the project's venv python,
// on the all-reduce sizes and latencies bench_comm_mpi measures.
#ifndef ZEROD_BENCH_COMM_MPI_GLOO_NODES_H
#define ZEROD_BENCH_COMM_MPI_GLOO_NODES_H

#include <cstddef>
#include <map>
#include <string>
#include <vector>

namespace zerod::bench {

struct GlooNodesRun {
  std::string python;  // the peer python (peer_python), known to be there
  std::string script;  // torch_gloo_nodes.py
  std::vector<size_t> mib;
  int iters = 0;
  int node = 0;
  int nodes = 1;
  std::string master;  // node 0's ADDR:PORT, where the rendezvous is
  std::string ifname;  // this node's interface for gloo's connections
};

struct GlooNodesResult {
  std::string version;                    // torch's
  std::map<size_t, double> seconds;       // MiB -> node 0's median all_reduce time, checked on every node
  double all_reduce_latency = 0;          // node 0's seconds per 1-element all_reduce
  double barrier_latency = 0;             // and per barrier
  std::string error;  // why there are no figures; empty when there are (on node 0: all of them)
};

// Runs this node's gloo process and waits for it: every node's must run at
// once, as they meet at `master`.
GlooNodesResult run_gloo_nodes(const GlooNodesRun& run);

}  // namespace zerod::bench

#endif  // ZEROD_BENCH_COMM_MPI_GLOO_NODES_H
