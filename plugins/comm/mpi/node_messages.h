// The failure messages that involve other daemons: disagreement and timeout
// at the arrival across nodes, a stalled exchange, an MPI error, and a
// failure another daemon reported. Collectives are numbered from #1, as in
// messages.h; nodes are described by Topology::describe_node.
#ifndef ZEROD_COMM_MPI_NODE_MESSAGES_H
#define ZEROD_COMM_MPI_NODE_MESSAGES_H

#include <cstdint>
#include <vector>

#include "call.h"
#include "text.h"
#include "topology.h"
#include "wire.h"

namespace zerod::comm::mpi {

// headers[m] is node m's. True (and the message in t) if they are not all
// the same collective: "ranks disagree at collective #3: ranks 0-1 (node 0,
// ...) are in "..." (all_reduce sum, 8 f32), ranks 2-3 (node 1, ...) are
// in "..." (all_gather, 4 f32)".
bool say_if_disagree(Text& t, const std::vector<Header>& headers, const Topology& topo);

// "timeout at collective #3 (all_reduce sum, 8 f32): this daemon's ranks
// waited 100 ms for the other daemons; arrived: ranks 0-1 (node 0) in
// "..."; not arrived: node 1 (ranks 2-3, host b, pid 7), whose last
// collective was #2 "..."". arrived[m]: node m's header came; last[m]: the
// last header node m sent before (seq kNoCollective for none).
void say_node_timeout(Text& t, const Header& mine, uint64_t waited_ms, const std::vector<bool>& arrived,
                      const std::vector<Header>& last, const Topology& topo);

// "collective #3 (all_reduce sum, 8 f32) stalled: no data from node 1 (...)
// for 1000 ms after every daemon had arrived; ...".
void say_stalled(Text& t, const Header& mine, uint64_t idle_ms, const std::vector<int>& nodes,
                 const Topology& topo);

// "MPI failed in collective #3 (...): with node 1: <MPI's message>".
void say_mpi_error(Text& t, const Header& mine, const char* detail);

// "node 1 (ranks 2-3, host b, pid 7) failed: <its message>".
void say_remote_failure(Text& t, const Notice& n, const Topology& topo);

}  // namespace zerod::comm::mpi

#endif  // ZEROD_COMM_MPI_NODE_MESSAGES_H
