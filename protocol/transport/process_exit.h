// The other end of a connection that went away while a GPU stream may wait
// for it.
//
// On a GPU, each side of a daemon's rank records a signal on its stream
// that the other side's stream waits for (engine/device/device.h
// StreamLink, device/cuda_shared.h SharedSignals): the trainer kTrainerDone
// before each call, the daemon kZerodDone after a begin call's copies. A process killed with work still
// queued before its record never runs that record, and the other stream,
// waiting for it, would stop there for good: every later copy, reduction,
// snapshot and teardown on the daemon's side; the trainer's `loss.item()` on
// the other. What releases it is storing the signal's latest number from the
// CPU (SharedSignals::release), done only once the dead side can no longer
// run work on the GPU: once its process has exited.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>

namespace zerod::transport {

// A process to wait for: a pidfd opened once, where the kernel has them (so
// a pid reused after the process was reaped is not mistaken for it), else
// looks at /proc.
class ProcessExit {
 public:
  explicit ProcessExit(pid_t pid);
  ~ProcessExit();
  ProcessExit(const ProcessExit&) = delete;
  ProcessExit& operator=(const ProcessExit&) = delete;

  // Whether the process has exited (a zombie counts: its files, the GPU's
  // among them, are closed) within `timeout_ms`. Never true for pid <= 0
  // (a peer in another pid namespace, whose pid is not known here): that
  // waits `timeout_ms` and says false.
  bool wait(int timeout_ms);

 private:
  pid_t pid_;
  int fd_ = -1;
  bool gone_ = false;
};

// The release, for one event. Nothing when `pending()` says the dead side's
// latest record has run. Else waits for its process to exit, or for the
// record to run (a process that only closed its connection goes on and gets
// there), and calls `release()` once the process is gone with the record
// still pending. How long: `timeout_ms` (< 0: until one of the two
// happens). `slow` is told once, after `slow_ms`, that it is still waiting.
// A pid <= 0 (not visible here) is taken for dead after `slow_ms`, since a
// stream that waits forever stops the rank for good. Returns what it did,
// for the log: "" (nothing was pending, or the record ran), or a sentence.
std::string release_when_gone(pid_t pid, int timeout_ms, int slow_ms, const std::function<bool()>& pending,
                              const std::function<void()>& release,
                              const std::function<void(const std::string&)>& slow = {});

}  // namespace zerod::transport
