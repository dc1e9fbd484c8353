// A GPU rank's trainer gone while its session's thread is inside a call:
// what zerod's streams wait for from it, released from another thread.
//
// On a GPU, zerod's stream for a rank waits for the trainer's record of
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
#pragma once

#include "device/device.h"
#include "transport/hangup_watch.h"

#include <sys/types.h>

#include <atomic>
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
  // for a live process.
  TrainerGoneWatch(int socket_fd, pid_t pid, std::string who, int slow_ms);
  ~TrainerGoneWatch();  // stop()
  TrainerGoneWatch(const TrainerGoneWatch&) = delete;
  TrainerGoneWatch& operator=(const TrainerGoneWatch&) = delete;

  // One model's device for this rank, from the session's thread. The device
  // must outlive its watch: until unwatch(id) or stop() returns. A device
  // added after the hangup is left to Session::end: its trainer never had
  // its signals' page to record on (the page goes out in this model's
  // create reply).
  void watch(int id, const Device& d);
  // Once it returns the watch no longer touches that device: a wait for it
  // in progress ends at its next look (50 ms), and is not released then.
  void unwatch(int id);
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

  const pid_t pid_;
  const std::string who_;
  const int slow_ms_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> dropping_{-1};  // the id unwatch() is removing
  std::atomic<int> released_{0};
  std::mutex mu_;  // devices_; held while the watch releases them
  std::map<int, const Device*> devices_;
  std::unique_ptr<transport::HangupWatch> hangup_;  // last: its thread uses the members above
};

}  // namespace zerod::server
