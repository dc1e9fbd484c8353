// Where bench_comm_mpi's gloo peer meets across nodes: each node's
// interface and IPv4 address, picked so that gloo's traffic takes the
// network the mpi plugin's took (the comparison is of the two on one link),
// and a free port for node 0's rendezvous.
#ifndef ZEROD_BENCH_COMM_MPI_ENDPOINT_H
#define ZEROD_BENCH_COMM_MPI_ENDPOINT_H

#include <string>

namespace zerod::bench {

struct Endpoint {
  std::string ifname;   // for GLOO_SOCKET_IFNAME: gloo binds its connections there
  std::string address;  // its IPv4 address, dotted
  std::string why;      // why there is none; empty when there is
};

// This node's endpoint: the first up interface with an IPv4 address that
// matches an entry (an interface name or an a.b.c.d/n subnet) of
//   GLOO_SOCKET_IFNAME, when the user set it for gloo, else
//   OMPI_MCA_btl_tcp_if_include, the interfaces Open MPI's TCP traffic (the
//     plugin's) is held to, which mpirun passes on from --mca, else
//   the address this host's name resolves to (what gloo picks by itself),
//     a loopback one standing for the loopback interface.
Endpoint local_endpoint();

// A TCP port on `address` that nothing was bound to just now (the kernel's
// pick), or 0 when none could be had. Another process may take it before
// the rendezvous binds it; on an idle test machine none does.
int free_port(const std::string& address);

}  // namespace zerod::bench

#endif  // ZEROD_BENCH_COMM_MPI_ENDPOINT_H
