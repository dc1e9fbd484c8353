// A rank's trainer gone while its session's thread is inside a call: the
// rank marked lost on its models, and on a GPU what zerod's streams wait for
// from it released, from another thread.
//
// Every rank: the session's thread reads the next request only once its
// call returns, and a call may wait in a collective (a finalize, a step)
// for a rank that never comes, up to comm.timeout (0: for good). A trainer
// that dies there, or that gives up on the call (its ZD_ERR_TIMEOUT says to
// disconnect and connect again) and disconnects, would hold its rank until
// then: its new connection refused ("rank 0 is already connected"), `zerod
// status` showing the dead pid in the call. So the watch marks the rank
// lost on each model it watches (ModelHost::rank_gone) when the connection
// hangs up during a call (begin_call .. end_call), or at the next call's
// start when it hung up between calls: that aborts the collective, the call
// returns, and the session ends as for any hangup. A hangup is the peer's
// close (POLLRDHUP/POLLHUP), not a quiet socket: a client that waits on its
// call ring keeps the socket quiet for as long as it likes. Between calls
// the session's own reader (the socket, or the ring's liveness check) sees
// the hangup and ends the session itself.
//
// On a GPU, besides, zerod's stream for a rank waits for the trainer's record of
// kTrainerDone (Device::wait_for_trainer), and a call such as zd_step then
// blocks the session's thread on the CPU until that stream gets there (the
// drain's transfer_wait, the gradient norm's cudaStreamSynchronize). A
// trainer SIGKILLed with that record still queued behind its own GPU work
// never runs it. Session::end releases such a wait (release_gpu_waits), but
// on the session's thread, after its read loop has seen the hangup, and
// that thread is the one stuck in the call: it would never return, the rank
// would never be freed, and Server::stop would wait for it in join for
// good. This watch sees the hangup on a thread of its own
// (transport::HangupWatch, as libzerod watches its daemon) and, once the
// trainer's process has exited (transport::release_when_gone), releases
// the waits of the devices it watches. The release is the CPU's store into
// the signals' page (Device::release_trainer): no GPU call, so it cannot be
// held behind the wait it ends. The call then goes on and returns, and the
// session ends as for any hangup.
//
// Made at a rank's first model (Session, zd_model_create), one thread per
// rank session; an observer has none.
#pragma once

#include "device/device.h"
#include "transport/hangup_watch.h"

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace zerod::server {

class TrainerGoneWatch {
 public:
  // Watches `socket_fd` (the session's connection, not owned: open until
  // stop() returns) for the hangup of the trainer `pid` (<= 0: not visible
  // here, taken for dead `slow_ms` after the hangup). `who` starts each
  // log line; `slow_ms`: after that long the log says the watch still waits
  // for a live process. `closed_here`: whether the daemon itself shut the
  // socket (Session::stop), which is no hangup of the trainer's.
  TrainerGoneWatch(int socket_fd, pid_t pid, std::string who, int slow_ms,
                   std::function<bool()> closed_here = nullptr);
  ~TrainerGoneWatch();  // stop()
  TrainerGoneWatch(const TrainerGoneWatch&) = delete;
  TrainerGoneWatch& operator=(const TrainerGoneWatch&) = delete;

  // A model the rank is attached to, from the session's thread: lose(call)
  // marks the rank lost on it, the connection having hung up during `call`
  // (begin_call's name). Called at most once, never after unwatch(id) or
  // stop() returns, and on the watch's thread or inside begin_call.
  void watch_model(int id, std::function<void(const std::string& call)> lose);
  // One model's device for this rank, from the session's thread. The device
  // must outlive its watch: until unwatch(id) or stop() returns. A device
  // added after the hangup is left to Session::end: its trainer never had
  // its signals' page to record on (the page goes out in this model's
  // create reply).
  void watch(int id, const Device& d);
  // Once it returns the watch no longer touches that model or device: a
  // wait for the device in progress ends at its next look (50 ms), and is
  // not released then.
  void unwatch(int id);
  // The session's thread runs a call until end_call(): `call` names it
  // ("zd_model_finalize"), a string that outlives the call (a literal, or
  // calls::name's). A hangup already seen marks the rank lost here, at once.
  void begin_call(const char* call);
  void end_call();
  // Ends a wait in progress (within one look of release_when_gone's, 50 ms)
  // and the watch's thread: once it returns, nothing is released here.
  // Session::end calls it before its own pass over the devices, so a device
  // is never released from two threads at once, and one released here is
  // no longer pending there.
  void stop();
  // Releases done so far (a test reads it).
  int released() const { return released_.load(); }

 private:
  void on_hangup();
  // Under calls_mu_: each watched model's lose(call), once for the watch.
  void lose_models_locked(const std::string& call);

  const pid_t pid_;
  const std::string who_;
  const int slow_ms_;
  const std::function<bool()> closed_here_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> dropping_{-1};  // the id unwatch() is removing
  std::atomic<int> released_{0};
  // The models and the call in progress; held while the rank is marked
  // lost on them, never while a device's wait is released (mu_), so that a
  // call's start or end never waits for a live trainer to exit.
  std::mutex calls_mu_;
  std::map<int, std::function<void(const std::string&)>> models_;
  const char* call_ = nullptr;  // the call in progress; null between calls
  bool hung_up_ = false;   // the trainer's hangup seen (not the daemon's own close)
  bool lost_ = false;      // the models were told: once
  std::mutex mu_;  // devices_; held while the watch releases them
  std::map<int, const Device*> devices_;
  std::unique_ptr<transport::HangupWatch> hangup_;  // last: its thread uses the members above
};

}  // namespace zerod::server
