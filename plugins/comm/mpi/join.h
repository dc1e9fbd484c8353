// The daemons' world when each was started by an mpirun of its own: they
// find each other by a name published on the Open MPI name server
// (ompi-server) their mpiruns were given, connect, and merge into one
// communicator ordered by node. This is how daemons that no single mpirun
// started (one started on demand by each node's ranks) become one job: Open
// MPI cannot connect singletons (processes not started by mpirun: tried with
// Open MPI 4.1.4, MPI_ERR_INTERN with or without ompi-server), but it
// connects separately launched jobs through a shared ompi-server.
//
// ZEROD_MPI_JOIN=<name>,<node>,<nodes>[,<timeout s>] asks for it: node 0
// opens a port and publishes it as <name>; the others look it up and
// connect; every daemon already in admits the next one (MPI_Comm_accept is
// collective over the group so far) until <nodes> are in.
#ifndef ZEROD_COMM_MPI_JOIN_H
#define ZEROD_COMM_MPI_JOIN_H

#include <zerod/zerod_plugin.h>

#include <mpi.h>

#include <cstddef>
#include <string>

namespace zerod::comm::mpi {

struct JoinRequest {
  std::string name;  // the published service name: the same for every daemon of one job
  int node = 0;
  int nodes = 1;
  double timeout_s = 120;
};

// Reads ZEROD_MPI_JOIN; false when it is not set. A malformed value is
// ZD_ERR_CONFIG with the reason in err.
bool join_requested(JoinRequest* out, zd_status* status, char* err, size_t err_size);

// Joins the daemons named by `r` into *world (ranks in node order). Runs
// right after MPI_Init, before any other thread calls MPI. A daemon that
// does not come within the timeout ends this process (status 1, saying how
// many had joined): MPI_Comm_accept cannot be interrupted, and a daemon that
// cannot reach its job has nothing to serve.
zd_status join_world(const JoinRequest& r, MPI_Comm* world, char* err, size_t err_size);

}  // namespace zerod::comm::mpi

#endif  // ZEROD_COMM_MPI_JOIN_H
