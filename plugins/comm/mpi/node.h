// The mpi comm plugin's instance: the ranks of one daemon (node), threads
// of this process, and the daemon's side of each collective with the other
// daemons. A collective goes through
//
//   arrival     the rendezvous of the daemon's ranks (rendezvous.h); the
//               rank that completes it posts the collective to the network
//               thread, which starts the arrival across nodes (net.h)
//   stage in    each rank moves its share of the inputs into the daemon's
//               staging buffer (staging.h), then they meet
//   exchange    the network thread exchanges the staging with the other
//               daemons (exchange.h) while the ranks wait
//   stage out   each rank copies its outputs from the staging buffer
//
// so the daemon's ranks reduce over shared memory, one thread talks MPI per
// collective, and each byte crosses the network once per daemon. A failure
// anywhere fails the collective on every rank of every daemon (net.h says
// how it travels), leaves every output as it was, and breaks the instance.
#ifndef ZEROD_COMM_MPI_NODE_H
#define ZEROD_COMM_MPI_NODE_H

#include <zerod/zerod.h>
#include <zerod/zerod_plugin.h>

#include <cstdint>
#include <memory>

#include "compressed.h"
#include "link.h"
#include "net.h"
#include "rendezvous.h"
#include "topology.h"

namespace zerod::comm::mpi {

struct Settings {
  double timeout_s = 300;       // see the `timeout` hyperparameter
  double spin_us = 0;
  uint64_t segment = 1u << 20;  // the largest MPI message
};

class Node final : public Runner, private Rendezvous::Body {
 public:
  // Initialises MPI (once per process), checks the rank layout against it
  // and against the other daemons', and opens the instance's communicator;
  // every daemon of the job creates its instances in the same order. A
  // refusal says what was expected; across nodes every daemon fails with
  // it at once (a daemon whose layout is wrong still joins the exchange to
  // say so), and a failed create arms MPI's finalize watchdog (mpi_env.cpp).
  static zd_status create(const zd_host_services* host, const Settings& s, const zd_comm_config& cfg,
                          std::unique_ptr<Node>* out, char* err, size_t err_size) noexcept;
  ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  zd_status run(const zd_comm_call* call, Call c) noexcept override { return rv_.run(call, c, *this); }
  zd_status compressed_all_reduce(const zd_comm_call* call, float* buf, uint64_t count, float* worker_error,
                                  float* server_error) noexcept {
    return comm::compressed_all_reduce(*this, rv_, call, buf, count, worker_error, server_error);
  }
  void abort(zd_status status, const char* reason) noexcept { rv_.abort(status, reason); }
  const char* last_error(int rank) const noexcept { return rv_.last_error(rank); }
  // network_bytes_sent is the daemon's: the same for each of its ranks.
  zd_comm_figures figures(int rank) const noexcept;
  const Topology& topology() const { return topo_; }

 private:
  Node(Topology topo, const Settings& s, std::unique_ptr<Link> link);
  // create() once MPI is up.
  static zd_status open(const zd_host_services* host, const Process& p, const Settings& s, const zd_comm_config& cfg,
                        std::unique_ptr<Node>* out, char* err, size_t err_size) noexcept;

  zd_status started(const Rendezvous::Started& s) noexcept override;
  // Every rank calls it with the same size: the staging grows (index 0
  // allocates between two meetings). False when it could not.
  bool reserve(int index, uint64_t bytes) noexcept;

  const Topology topo_;
  const Settings settings_;
  Rendezvous rv_;
  std::shared_ptr<uint8_t[]> staging_;
  uint64_t capacity_ = 0;
  bool reserve_failed_ = false;
  std::unique_ptr<const void*[]> srcs_;  // local_ranks pointers per rank
  std::unique_ptr<void*[]> dsts_;
  std::unique_ptr<Net> net_;  // last: stopped first
};

}  // namespace zerod::comm::mpi

#endif  // ZEROD_COMM_MPI_NODE_H
