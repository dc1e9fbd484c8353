// The network side of one instance: a thread that alone talks MPI for it
// (so ranks never wait on MPI, and only one thread per collective does).
// The rank that starts a collective locally posts a Job; the thread then
//
//  1. exchanges headers with every other daemon: the arrival across nodes
//     (a small all_reduce waits for step 2 first and sends its data with
//     the header, and is then done: wire.h, kEagerBytes).
//     All headers must name the same collective, else every daemon fails it
//     with the same message naming where each daemon's ranks are. The
//     arrival waits until the earliest deadline of the ranks' calls (their
//     timeout_ms; with none, the plugin's `timeout`), then fails the
//     collective with ZD_ERR_TIMEOUT naming the daemons that did not come;
//  2. waits until this daemon's ranks have staged their data (bounded
//     memory work), then runs exchange() with the other daemons; a wait in
//     it fails with ZD_ERR_TIMEOUT when nothing moves for the smallest
//     timeout_ms of the ranks' calls (with none, the plugin's `timeout`), so
//     a dead or stopped daemon is named within that time, never a hang;
//  3. marks the collective done, which releases the ranks to copy their
//     outputs.
//
// Failures. Any failure of this daemon's rendezvous (a local disagreement
// or timeout, abort(), a failure here) is sent to every other daemon as a
// notice, once, as soon as it happens (the rendezvous wakes the thread), and
// at the latest when the instance is destroyed; a notice from another
// daemon fails this one's rendezvous with "node 1 (...) failed: <its
// message>". The thread looks for notices while it waits, and every 2 ms
// while idle. After a failure the instance
// is broken (rendezvous.h): requests still posted are abandoned.
//
// With one daemon (nodes == 1) there is no thread: staged() marks the
// collective done.
#ifndef ZEROD_COMM_MPI_NET_H
#define ZEROD_COMM_MPI_NET_H

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "call.h"
#include "exchange.h"
#include "link.h"
#include "rendezvous.h"
#include "topology.h"
#include "wire.h"

namespace zerod::comm::mpi {

struct NetSettings {
  double timeout_s = 300;  // the wait limit where a call gives none (0: none)
  double spin_us = 0;
};

// net.cpp: the thread, jobs and failures; net_arrival.cpp: the arrival
// across nodes and the eager all_reduce.
class Net final : private Link::Watch, private Wire {
 public:
  using Clock = std::chrono::steady_clock;

  struct Job {
    uint64_t seq = 0;
    Call call;                  // the daemon's ranks' collective (buffers unused)
    char what[kWhatMax] = "";   // its first rank's `what`
    Clock::time_point deadline = Clock::time_point::max();  // for the arrival across nodes
    Clock::time_point since{};  // when the ranks whose deadline that is began to wait
    uint32_t timeout_ms = 0;    // the no-progress limit of the exchange (0: the plugin's)
  };

  // link is NULL when nodes == 1. Starts the thread when nodes > 1.
  Net(Rendezvous& rv, const Topology& topo, std::unique_ptr<Link> link, NetSettings settings);
  // Stops the thread and abandons requests still posted; true when one may
  // still touch this instance's memory (the staging buffer must then
  // outlive it). The destructor does it too.
  bool shutdown();
  ~Net();
  Net(const Net&) = delete;
  Net& operator=(const Net&) = delete;

  // By the rank whose arrival started collective job.seq on this daemon.
  void post(const Job& job);
  // By one rank once every rank of this daemon has staged collective seq.
  void staged(uint64_t seq, uint8_t* staging);
  // Collectives this daemon has finished with the others (seq + 1).
  const std::atomic<uint64_t>& done() const { return done_; }
  // Bytes handed to MPI for other daemons.
  uint64_t network_bytes() const { return link_ ? link_->bytes_sent() : 0; }

 private:
  void loop();
  void run(const Job& job);
  // The arrival across nodes; `payload` (eager) goes with the header.
  bool arrive(const Job& job, const uint8_t* payload, uint32_t payload_bytes);
  // An eager all_reduce: the node-order reduction of every daemon's partial.
  void reduce_eager(const Job& job, uint8_t* staging);
  bool await_staged(const Job& job, uint8_t** staging);
  void housekeep();
  // The rendezvous's failure hook: wakes the thread to tell the others.
  static void kick(void* self) noexcept;
  // Fails the collective with this daemon as the origin, and abandons what
  // is posted.
  void fail(zd_status status, const char* message);

  // Link::Watch: a failure elsewhere (notice, abort) ends a wait.
  bool interrupted() noexcept override;
  // Wire, for exchange().
  void send(int node, const void* data, uint64_t bytes) override;
  void recv(int node, void* data, uint64_t bytes) override;
  uint64_t mark() const override { return link_->mark(); }
  bool flush(uint64_t until) override;

  Clock::duration idle_limit(const Job& job) const;
  static Clock::duration seconds(double s);

  Rendezvous& rv_;
  const Topology& topo_;
  std::unique_ptr<Link> link_;
  const NetSettings settings_;

  std::mutex mu_;
  std::condition_variable cv_;
  Job job_;                      // guarded by mu_
  bool stop_ = false;            // guarded by mu_
  bool kicked_ = false;          // guarded by mu_
  std::atomic<uint64_t> posted_{0};  // jobs posted (seq + 1)
  std::atomic<uint64_t> staged_{0};  // collectives staged (seq + 1)
  std::atomic<uint8_t*> staging_{nullptr};
  std::atomic<uint64_t> done_{0};

  // The network thread's own. Headers live as long as the Net (or, when a
  // send of one may still be posted, to the process's exit).
  const Job* current_ = nullptr;
  struct Headers {
    Envelope mine;
    std::vector<Envelope> in;    // by node, as received
    std::vector<Header> theirs;  // by node, mine included
  };
  std::shared_ptr<Headers> headers_;
  std::vector<Header> last_;  // the last header each node sent
  bool notified_ = false;     // this daemon's failure was sent to the others
  bool notice_pending_ = false;  // a notice received, not yet applied
  Notice notice_;                // it
  bool remote_ = false;       // the failure came from another daemon
  std::thread thread_;
};

}  // namespace zerod::comm::mpi

#endif  // ZEROD_COMM_MPI_NET_H
