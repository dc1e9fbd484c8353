// A record this process published for another process's stream to wait on
// (the daemon's kZerodDone, cuda_shared.h SharedSignals) that sits behind a
// kernel that failed this process's GPU context never runs, and nothing but
// this process's own release ends the other side's wait: the other side's
// hangup watch releases only once this process has exited, and a daemon
// lives on. That release is made by this process's CUDA calls, when one
// returns an error that says the context failed
// (SharedSignals::release_if_context_failed). A daemon whose kernel fails
// after its last call, its trainer then waiting on the GPU for that record
// before any other zerod call (a loss.item(), zd_model_destroy's wait for
// its stream), would leave the trainer waiting for good, with nothing in
// either log.
//
// So while such a record is pending, a thread of its own asks the GPU every
// `period` whether the context has failed (a call that never blocks:
// cudaStreamQuery on the recording stream) and, the first time it has,
// hands the error to `failed`, which releases and logs. A failed context
// never recovers, and the records published after the release release
// themselves (signal_publish): the thread's work is then done.
//
// Costs nothing while no record is pending: the thread sleeps until
// recorded(), looks a period later (a record usually runs before then),
// and once the CPU sees the record run (its word written) sleeps again,
// having made no GPU call. Plain C++ with the GPU behind the hooks, so that
// CI tests it without one (device_test, StreamSignals.*).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

namespace zerod {

class ContextFailureWatch {
 public:
  struct Hooks {
    // Whether the latest record is still pending: the CPU's read of the
    // page (SharedSignals::pending), no GPU call.
    std::function<bool()> pending;
    // A CUDA call that never blocks and returns the context's error once it
    // has failed (cudaStreamQuery): its code (cuda_failure.h's numbering).
    std::function<int()> query;
    // The context has failed with `code` (cuda_context_failed_before):
    // called once, on the watch's thread.
    std::function<void(int code)> failed;
  };

  // How often a pending record's context is asked: a trainer waits at most
  // about this long past the failure, and a step's records, which mostly
  // run within it, cost no GPU call.
  static constexpr std::chrono::milliseconds kPeriod{50};

  explicit ContextFailureWatch(Hooks hooks, std::chrono::milliseconds period = kPeriod);
  ~ContextFailureWatch();  // stop()
  ContextFailureWatch(const ContextFailureWatch&) = delete;
  ContextFailureWatch& operator=(const ContextFailureWatch&) = delete;

  // After each publish of a record (never before it: a look between the
  // two would see the previous record run, and sleep).
  void recorded();
  // Ends the thread, waiting for a hook in progress: once it returns no
  // hook runs any more. Before anything the hooks use goes. From one
  // thread, not the watch's.
  void stop();

  // What a test reads: the queries made so far, and whether `failed` ran.
  int queries() const;
  bool fired() const;

 private:
  enum class Look { kRan, kPending, kFailed };

  void run();
  // One look at the latest record, outside mu_: the hooks may take their
  // own locks, and stop() waits for this without holding mu_.
  Look look();

  const Hooks hooks_;
  const std::chrono::milliseconds period_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;
  bool armed_ = false;     // a record published since the thread last saw the latest one run
  uint64_t records_ = 0;   // recorded() calls: a record published during a look keeps the watch armed
  int queries_ = 0;
  bool fired_ = false;
  std::thread thread_;  // last: it uses the members above
};

}  // namespace zerod
