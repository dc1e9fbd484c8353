// The rendezvous of the local comm plugin: world_size rank threads of one
// process meet at each collective and do its memory work themselves.
//
// One collective at a time. Every rank calls collectives in the same order,
// so a rank's k-th call belongs to collective k (numbered from #1 in
// messages). A collective goes through two meetings:
//
//  1. Arrival. A rank records its call under the lock and compares it with
//     the first rank's call there (op, tag, count, dtype, reduce op, root).
//     The last rank to arrive starts the collective (started_ = k + 1).
//     Ranks wait for that by spinning spin_us on an atomic, then sleeping on
//     the condition variable; only this wait has a timeout and can be
//     aborted.
//  2. Work, then completion. Once started, every rank does its 1/N of the
//     work (work.h) on all ranks' buffers, then meets the others again
//     (done_, completed_ = k + 1) before returning, so no rank returns, and
//     lets its buffers go, while another may still read or write them.
//     This second wait has NO timeout and ignores abort: all ranks are
//     present and doing bounded memory work, and leaving early would let a
//     caller free a buffer another thread is writing. Collectives that
//     touch no other rank's memory (barrier, count 0, one rank) skip it.
//
// Outcome. A collective that started succeeds on every rank. One that never
// starts fails on every rank that called it:
//  - a call that disagrees with the first arrival, or is invalid, fails it
//    at once (ZD_ERR_INVALID_STATE for the others; the invalid caller gets
//    ZD_ERR_INVALID_ARGUMENT);
//  - a waiting rank whose timeout_ms passes fails it with ZD_ERR_TIMEOUT;
//  - abort() fails it with the abort's status.
// Every rank waiting in it wakes with that status and message, and the
// communicator is then broken: every later call on any rank (including a
// late rank arriving at the failed collective) fails at once with the same
// status; its message names the call and quotes the failure. An abort's
// reason is given verbatim and replaces an earlier failure. There is no
// recovery: the engine treats a failed collective as fatal for the job.
//
// So the only ways a call blocks forever are a rank that never calls its
// collective with timeout_ms = 0 and no abort; and the only thing that can
// hold a started collective is a rank thread that is descheduled.
//
// Thread-safety: run() for different ranks from different threads; one
// call per rank at a time (a second concurrent call for a rank breaks the
// communicator). abort(), bytes_sent() from any thread. last_error(rank)
// is written only by that rank's calls: read it from that rank's thread, or
// while that rank is not in a call.
#ifndef ZEROD_COMM_LOCAL_COMMUNICATOR_H
#define ZEROD_COMM_LOCAL_COMMUNICATOR_H

#include <zerod/zerod_plugin.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "call.h"
#include "messages.h"
#include "work.h"

namespace zerod::comm {

class Communicator {
 public:
  // Throws std::bad_alloc.
  Communicator(int world, double spin_us);
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int world() const { return world_; }

  // One rank's side of a collective. c carries everything but the tag,
  // which comes from call. Never throws, never allocates.
  zd_status run(const zd_comm_call* call, Call c) noexcept;

  void abort(zd_status status, const char* reason) noexcept;
  // "" for a rank that has not failed, or a rank outside the world.
  const char* last_error(int rank) const noexcept;
  uint64_t bytes_sent(int rank) const noexcept;

 private:
  using Clock = std::chrono::steady_clock;

  // What only rank r's thread touches, apart from `error` (read by
  // last_error) and `bytes` (read by bytes_sent); a cache line of its own.
  struct alignas(64) Rank {
    std::atomic<bool> in_call{false};
    std::atomic<uint64_t> bytes{0};
    uint64_t next = 0;  // the index of this rank's next collective; guarded by mu_
    std::unique_ptr<const void*[]> srcs;
    std::unique_ptr<void*[]> dsts;
    char error[kMessageMax] = "";  // written under mu_
  };

  zd_status collective(Rank& me, int rank, const zd_comm_call& call, const Call& c) noexcept;
  zd_status await_start(Rank& me, int rank, uint64_t k, uint32_t timeout_ms, Clock::time_point entered) noexcept;
  void finish(uint64_t k) noexcept;

  // Marks the communicator failed, with the message already written into
  // fail_msg_. `quote` makes later calls name themselves and quote it.
  void fail_locked(zd_status status, bool quote) noexcept;
  // A call on a failed communicator: its message into me.error.
  zd_status refuse_locked(Rank& me, int rank, uint64_t k, const char* what) noexcept;
  // A call that cannot be attributed to a rank (NULL call, rank out of range).
  void fail_unattributed(const char* fmt, ...) noexcept __attribute__((format(printf, 2, 3)));
  // Unlocks, then wakes sleepers if there are any.
  void wake(std::unique_lock<std::mutex>& lk) noexcept;

  template <typename Pred>
  bool spin(Pred ready, Clock::time_point until) const noexcept;

  const int world_;
  const Clock::duration spin_;

  std::unique_ptr<Rank[]> ranks_;

  std::mutex mu_;
  std::condition_variable cv_;
  // Guarded by mu_. calls_ is also read without the lock by the work phase,
  // which starts after the last write of this collective and ends before
  // any rank writes the next (the completion meeting).
  std::vector<Call> calls_;
  std::vector<Seen> seen_;
  int arrived_ = 0;  // ranks in the open collective
  int first_ = 0;    // the first of them
  int done_ = 0;     // ranks that finished their share of the started one
  int sleepers_ = 0;
  zd_status fail_status_ = ZD_OK;
  bool fail_quote_ = false;
  char fail_msg_[kMessageMax] = "";

  // Written under mu_, read by spinning ranks without it.
  std::atomic<uint64_t> started_{0};    // collectives all ranks have arrived at
  std::atomic<uint64_t> completed_{0};  // collectives all ranks have finished
  std::atomic<bool> failed_{false};
};

}  // namespace zerod::comm

#endif  // ZEROD_COMM_LOCAL_COMMUNICATOR_H
