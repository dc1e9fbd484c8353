// Where the ranks of a job are: `nodes` daemons (one per MPI process, node =
// MPI rank) of `local` ranks each, node-major, so node n serves ranks
// [n * local, (n + 1) * local). Hosts and pids are for messages.
#ifndef ZEROD_COMM_MPI_TOPOLOGY_H
#define ZEROD_COMM_MPI_TOPOLOGY_H

#include <cstdint>
#include <string>
#include <vector>

#include "text.h"

namespace zerod::comm::mpi {

struct Topology {
  int world = 1;
  int nodes = 1;
  int node = 0;   // this daemon
  int local = 1;  // ranks per daemon
  std::vector<std::string> hosts;  // per node
  std::vector<long> pids;          // per node
  uint64_t segment = 1u << 20;     // the plugin's `segment`: bytes per MPI message

  int first_rank(int n) const { return n * local; }
  int node_of(int rank) const { return rank / local; }

  // "node 1 (ranks 2-3, host b, pid 77)".
  void describe_node(Text& t, int n) const {
    t.add("node %d (", n);
    if (local == 1) t.add("rank %d", first_rank(n));
    else t.add("ranks %d-%d", first_rank(n), first_rank(n) + local - 1);
    if (n < static_cast<int>(hosts.size())) t.add(", host %s, pid %ld", hosts[n].c_str(), pids[n]);
    t.add(")");
  }
};

}  // namespace zerod::comm::mpi

#endif  // ZEROD_COMM_MPI_TOPOLOGY_H
