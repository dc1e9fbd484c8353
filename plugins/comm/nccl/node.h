// The nccl comm plugin's instance: this daemon's ranks, each an NCCL rank
// of one communicator that spans every daemon of the job.
//
// The ranks model: one NCCL rank per zerod rank, the daemon creating its
// local ranks' communicators together (ncclGroupStart, one
// ncclCommInitRankConfig per local rank, ncclGroupEnd), rank i of a daemon
// on GPU i mod the GPUs it sees. Why not one NCCL rank per daemon (the mpi
// plugin's shape, the daemon's ranks reduced in host memory first): on a
// GPU node each rank's buffers live on that rank's GPU, and NCCL is the
// piece that moves bytes between GPUs of a node (NVLink, P2P) and across
// nodes in one algorithm; funnelling a daemon's ranks through one GPU or
// the host would copy every byte once more and serialise the node on one
// link. The cost: NCCL 2.28 refuses two ranks of one process on one GPU,
// so a daemon serves at most as many ranks as it sees GPUs (create() says
// so); two ranks on one GPU need two daemons (processes) with distinct
// NCCL_HOSTID, which NCCL then treats as two hosts over loopback sockets.
//
// Each rank's calls run on the rank's own thread, as the engine makes them:
// the call's inputs go to the rank's GPU (a device pointer as it is, host
// memory copied into the rank's device scratch), NCCL runs on the rank's
// stream, and the thread polls the stream, NCCL's asynchronous error and the
// instance's failure state until the call completes, fails or passes its
// deadline. Communicators are non-blocking (ncclConfig_t.blocking = 0), so
// no NCCL call holds a thread that an abort must reach.
//
// Failures: a rank that times out, an NCCL error, a mismatched call, a
// local abort() or a notice from another daemon breaks the instance on
// every daemon: each aborts its communicators (ncclCommAbort), records the
// first message, and tells the others over the bootstrap connections
// (bootstrap.h); a daemon whose connection closes without a goodbye is
// named as lost.
//
// Compiled, never run: no GPU was at hand where this was written
// (docs/multinode.md says what has and has not run).
#ifndef ZEROD_COMM_NCCL_NODE_H
#define ZEROD_COMM_NCCL_NODE_H

#include <zerod/zerod.h>
#include <zerod/zerod_plugin.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap.h"
#include "call.h"

namespace zerod::comm::nccl {

struct Settings {
  double timeout_s = 300;
  double spin_us = 0;
  int port = 0;             // 0: from the environment (resolve_root)
  bool check_calls = true;  // compare every call across ranks first
};

struct RankState;

class Node {
 public:
  static zd_status create(const zd_host_services* host, const Settings& s, const zd_comm_config& cfg,
                          std::unique_ptr<Node>* out, char* err, size_t err_size) noexcept;
  ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  zd_status run(const zd_comm_call* call, Call c) noexcept;
  zd_status compressed_all_reduce(const zd_comm_call* call, float* buf, uint64_t count, float* worker_error,
                                  float* server_error) noexcept;
  void abort(zd_status status, const char* reason) noexcept;
  const char* last_error(int rank) const noexcept;
  zd_comm_figures figures(int rank) const noexcept;

 private:
  Node() = default;
  // The first failure wins; the communicators are aborted; `tell` sends
  // the notice to the other daemons (not when the failure came from one).
  void fail(zd_status status, const std::string& message, bool tell) noexcept;
  zd_status failed(int index) noexcept;  // this rank's copy of the failure
  zd_status execute(int index, const zd_comm_call& call, const Call& c) noexcept;
  zd_status check_across(int index, const zd_comm_call& call, const Call& c, bool valid, const char* why) noexcept;
  zd_status wait(int index, const zd_comm_call& call, const Call& c) noexcept;
  // An enqueue NCCL refused (an ncclResult_t): the instance fails.
  zd_status refused(int index, const zd_comm_call& call, const Call& c, int result) noexcept;
  void monitor() noexcept;
  void watch();  // monitor()'s loop

  int world_ = 1, first_ = 0, local_ = 1, node_ = 0, nodes_ = 1;
  Settings settings_;
  std::vector<PeerInfo> peers_;
  std::vector<int> fds_;  // bootstrap connections (bootstrap.h)
  std::vector<std::unique_ptr<RankState>> ranks_;
  std::atomic<bool> broken_{false};
  mutable std::mutex fail_mu_;
  zd_status fail_status_ = ZD_OK;
  std::string fail_message_;
  std::mutex send_mu_;  // notices written from several threads
  int wake_[2] = {-1, -1};
  std::thread monitor_;
  std::atomic<uint64_t> network_bytes_{0};
};

}  // namespace zerod::comm::nccl

#endif  // ZEROD_COMM_NCCL_NODE_H
