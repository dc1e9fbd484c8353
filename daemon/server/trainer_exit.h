// A rank's trainer that went away while zerod's stream may wait for it.
//
// On a GPU, a trainer records `trainer_done` on its stream before each call
// and the daemon's stream waits for that record (device.h StreamLink). A
// trainer killed with work still queued behind its record never runs it,
// and the daemon's stream, which waits for it, would stop there for good:
// every later copy, reduction, snapshot and the device's own teardown with
// it. So when a rank's connection ends, the daemon waits for the trainer's
// process to be gone (its work on the GPU stops with it) and then releases
// what its stream still waits for (Device::release_trainer).
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>

namespace zerod::server {

// Whether process `pid` has exited (a zombie counts: its GPU context is
// gone with its files) within `timeout_ms`. Uses a pidfd where the kernel
// has them, else looks every few milliseconds. False for pid 0 (a peer in
// another pid namespace, whose pid is not known here) and on timeout.
bool wait_for_exit(pid_t pid, int timeout_ms);

// The release itself, for one device: nothing when `pending()` says the
// trainer's latest record has run. Else waits up to `timeout_ms` for the
// process to exit (or the record to run: a trainer that only closed its
// connection goes on computing and gets there), then calls `release()` if
// the record is still pending and the process is gone. Returns what it
// did, for the log: "" (nothing was pending), or a sentence.
std::string release_trainer_waits(pid_t pid, int timeout_ms, const std::function<bool()>& pending,
                                  const std::function<void()>& release);

}  // namespace zerod::server
