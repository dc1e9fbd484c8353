// Ctrl-C for `zerod run`: the stop signals zerod receives go on to its ranks.
//
// Each rank leads its own process group, so a Ctrl-C at the terminal reaches
// zerod alone and zerod decides: the first SIGINT, SIGTERM or SIGHUP is sent
// on to every rank as it is (Launcher::terminate), any later one as SIGKILL.
//
// The handler only writes the signal's number to a pipe (async-signal-safe);
// a thread of the forwarder's reads it and does the rest. No signal mask is
// changed, so it may be installed at any time, with any number of threads
// running. A signal ignored when the forwarder is made (SIGHUP under nohup,
// SIGINT for a job a non-interactive shell put in the background) stays
// ignored.
#pragma once

#include "launcher/launcher.h"

#include <functional>
#include <memory>

namespace zerod::launch {

class SignalForwarder {
 public:
  // Called on the forwarder's thread after each forward: the signal zerod
  // received and the one the ranks were sent (the same, or SIGKILL). What it
  // throws is logged.
  using Notify = std::function<void(int received, int sent)>;

  // Installs the handlers. The handlers are process-wide, so one forwarder
  // at a time: a second fails with ZD_ERR_INVALID_STATE. `launcher` must
  // outlive the forwarder.
  explicit SignalForwarder(Launcher& launcher, Notify notify = {});
  // Puts the previous handlers back and stops the thread.
  ~SignalForwarder();
  SignalForwarder(const SignalForwarder&) = delete;
  SignalForwarder& operator=(const SignalForwarder&) = delete;

  // How many signals have been received so far.
  int received() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace zerod::launch
