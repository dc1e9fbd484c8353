// The local comm plugin's instance: world_size rank threads of one process
// meet at each collective (rendezvous.h says how a collective starts and
// fails) and do its memory work themselves once every rank has arrived.
//
// Work, then completion. Every rank does its 1/N of the work (work.h) on
// all ranks' buffers, then meets the others again before returning, so no
// rank returns, and lets its buffers go, while another may still read or
// write them. Collectives that touch no other rank's memory (barrier, count
// 0, one rank) skip that meeting. A collective that started succeeds on
// every rank.
//
// So the only ways a call blocks forever are a rank that never calls its
// collective with timeout_ms = 0 and no abort; and the only thing that can
// hold a started collective is a rank thread that is descheduled.
#ifndef ZEROD_COMM_LOCAL_COMMUNICATOR_H
#define ZEROD_COMM_LOCAL_COMMUNICATOR_H

#include <zerod/zerod.h>
#include <zerod/zerod_plugin.h>

#include <memory>

#include "call.h"
#include "compressed.h"
#include "rendezvous.h"
#include "work.h"

namespace zerod::comm {

class Communicator final : public Runner, private Rendezvous::Body {
 public:
  // Throws std::bad_alloc.
  Communicator(int world, double spin_us);

  int world() const { return rv_.world(); }

  // One rank's side of a collective. c carries everything but the tag,
  // which comes from call. Never throws, never allocates.
  zd_status run(const zd_comm_call* call, Call c) noexcept override { return rv_.run(call, c, *this); }
  zd_status compressed_all_reduce(const zd_comm_call* call, float* buf, uint64_t count, float* worker_error,
                                  float* server_error) noexcept {
    return comm::compressed_all_reduce(*this, rv_, call, buf, count, worker_error, server_error);
  }

  void abort(zd_status status, const char* reason) noexcept { rv_.abort(status, reason); }
  // "" for a rank that has not failed, or a rank outside the world.
  const char* last_error(int rank) const noexcept { return rv_.last_error(rank); }
  // network_bytes_sent is 0: one daemon.
  zd_comm_figures figures(int rank) const noexcept;

 private:
  zd_status started(const Rendezvous::Started& s) noexcept override;

  Rendezvous rv_;
  // Per rank: `world` source and destination pointers, made once so the
  // work never allocates.
  std::unique_ptr<const void*[]> srcs_;
  std::unique_ptr<void*[]> dsts_;
};

}  // namespace zerod::comm

#endif  // ZEROD_COMM_LOCAL_COMMUNICATOR_H
