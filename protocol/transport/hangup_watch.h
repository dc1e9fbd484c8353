// Runs callbacks once, on a thread of its own, when the peer of a socket
// hangs up (exits, or closes its end), whether or not anybody is reading
// the socket then.
//
// libzerod uses it on a GPU: a trainer's stream waits for the daemon's
// record of its kZerodDone signal after each begin call. A daemon killed with that
// record still queued behind its work never runs it, and the trainer's
// stream would stop there for good, with the trainer's host thread stuck in
// whatever next waits for its stream (`loss.item()`) and never reaching a
// zerod call that would tell it the daemon is gone. On the hangup, once
// the daemon's process has exited, the signal is released (its latest
// number stored from the CPU: SharedSignals::release,
// process_exit.h), which ends that wait, so the trainer's next zerod call fails with ZD_ERR_PEER_LOST
// instead. The daemon watches a GPU rank's trainer the same way
// (daemon/server/trainer_gone_watch.h): its session's thread may be stuck
// in a call behind the trainer's unrun record of kTrainerDone.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <mutex>
#include <thread>

namespace zerod::transport {

class HangupWatch {
 public:
  // Watches `socket_fd` (not owned: it must stay open until this is
  // destroyed). Starts its thread at once.
  explicit HangupWatch(int socket_fd);
  // Stops the thread; callbacks not yet run never run. In a child forked
  // after the thread started (a DataLoader worker that ends its
  // interpreter), which has no such thread, it only lets go of it.
  ~HangupWatch();
  HangupWatch(const HangupWatch&) = delete;
  HangupWatch& operator=(const HangupWatch&) = delete;

  // A callback for the hangup; its id for remove(). Added after the hangup,
  // it runs at once, on the caller's thread. It must not call this watch.
  int add(std::function<void()> on_hangup);
  // Once it returns, that callback is not running and never will.
  void remove(int id);
  bool hung_up() const;

 private:
  void run();

  int socket_fd_;
  pid_t owner_;       // the process whose thread watches
  int wake_fd_ = -1;  // an eventfd: the destructor's word to the thread
  mutable std::mutex mu_;
  std::map<int, std::function<void()>> callbacks_;
  int next_id_ = 0;
  bool hung_up_ = false;
  std::thread thread_;
};

}  // namespace zerod::transport
