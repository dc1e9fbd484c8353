// The memory work inside one daemon, done by its rank threads: each rank's
// share of moving the served ranks' inputs into the staging buffer before
// the exchange with other daemons (stage_in), and its own outputs out of it
// after (stage_out).
//
//   all_reduce      local rank i reduces its 1/L of the elements across the
//                   L buffers (rank order) into the node partial
//   reduce_scatter  likewise over the L send buffers (world * count each)
//   all_gather      rank i copies its send to its chunk of the gathered ranks
//   broadcast       the root copies its buffer to the payload
//   all_to_all      rank i copies each of its blocks to its place among the
//                   blocks for the destination's node
// stage_out reads only the staging buffer and writes only the rank's own
// outputs, so a rank returns as soon as it is done; a failed collective
// never gets there and leaves every output as it was.
#ifndef ZEROD_COMM_MPI_STAGING_H
#define ZEROD_COMM_MPI_STAGING_H

#include <cstdint>

#include "call.h"
#include "exchange.h"
#include "topology.h"
#include "work.h"

namespace zerod::comm::mpi {

// calls: the daemon's ranks' calls, by local index; scratch: L pointers
// each way.
void stage_in(const Call* calls, const Topology& t, int index, uint8_t* staging, const Layout& l,
              const Scratch& scratch);
void stage_out(const Call& mine, const Topology& t, int index, const uint8_t* staging, const Layout& l);

}  // namespace zerod::comm::mpi

#endif  // ZEROD_COMM_MPI_STAGING_H
