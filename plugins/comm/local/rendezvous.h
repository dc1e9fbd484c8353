// The rendezvous of the rank threads one process serves: they meet at each
// collective, and the plugin's Body does the collective's work once all have
// arrived. Shared by the local plugin (the work is all of it) and the mpi
// plugin (the work includes the other daemons).
//
// One collective at a time. Every rank calls collectives in the same order,
// so a rank's k-th call belongs to collective k (numbered from #1 in
// messages).
//
//  1. Arrival. A rank records its call under the lock and compares it with
//     the first rank's call there (op, tag, count, dtype, reduce op, root).
//     The last rank to arrive starts the collective (started_ = k + 1).
//     Ranks wait for that by spinning spin_us on an atomic, then sleeping on
//     the condition variable; only this wait has a timeout and can be
//     aborted.
//  2. Body. Once started, every rank runs Body::started() on its own thread.
//     meet() lets the Body hold every served rank until all have finished a
//     step (memory work on each other's buffers): that wait has NO timeout
//     and ignores abort, since all ranks are present and doing bounded
//     memory work, and leaving early would let a caller free a buffer
//     another thread is writing.
//
// Outcome. A collective that never starts fails on every rank that called
// it:
//  - a call that disagrees with the first arrival, or is invalid, fails it
//    at once (ZD_ERR_INVALID_STATE for the others; the invalid caller gets
//    ZD_ERR_INVALID_ARGUMENT);
//  - a waiting rank whose timeout_ms passes fails it with ZD_ERR_TIMEOUT;
//  - abort(), or fail() from outside the calls, fails it with that status.
// Every rank waiting in it wakes with that status and message, and the
// rendezvous is then broken: every later call on any rank (including a late
// rank arriving at the failed collective) fails at once with the same
// status; its message names the call and quotes the failure. An abort's
// reason is given verbatim; the first failure stays (a later abort or fail
// is ignored), since it is the cause and the later ones are the other ranks
// going down because of it. There is no recovery: the engine treats a failed collective as fatal for the job. A
// started collective's outcome is the Body's.
//
// Thread-safety: run() for different ranks from different threads; one
// call per rank at a time (a second concurrent call for a rank breaks the
// rendezvous). abort(), fail(), failed() and the figures from any thread.
// last_error(rank) is written only by that rank's calls: read it from that
// rank's thread, or while that rank is not in a call.
#ifndef ZEROD_COMM_LOCAL_RENDEZVOUS_H
#define ZEROD_COMM_LOCAL_RENDEZVOUS_H

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

namespace zerod::comm {

class Rendezvous {
 public:
  using Clock = std::chrono::steady_clock;

  // What a rank's thread gets once every served rank has arrived.
  struct Started {
    int index = 0;              // this rank among the served ones (rank - first())
    uint64_t seq = 0;           // the collective, counted from 0
    bool last = false;          // this rank's arrival started it
    const Call* calls = nullptr;  // every served rank's call, by index (see Body)
    const Seen* seen = nullptr;   // and its `what`
    // For the rank whose arrival started it (last) only: the earliest
    // deadline among the ranks' calls (time_point::max() when none has a
    // timeout), when the rank whose deadline that is entered its call (for
    // "waited N ms": the smallest timeout may be another rank's), and the
    // smallest nonzero timeout_ms (0: none).
    Clock::time_point deadline{};
    Clock::time_point since{};
    uint32_t timeout_ms = 0;
  };

  // The plugin's side of a started collective. calls[j] and seen[j] stay as
  // they are until rank j's started() returns: a Body that reads or writes
  // other ranks' buffers meet()s before it returns. started() returns the
  // rank's status; a failure must have broken the rendezvous (fail()) and
  // set the rank's message (take_failure()).
  class Body {
   public:
    virtual zd_status started(const Started& s) noexcept = 0;

   protected:
    ~Body() = default;
  };

  // Serves ranks [first, first + ranks) of a job of `world`. Throws
  // std::bad_alloc.
  Rendezvous(int world, int first, int ranks, double spin_us);
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  int world() const { return world_; }
  int first() const { return first_; }
  int ranks() const { return ranks_n_; }

  // One rank's side of a collective. c carries everything but the tag,
  // which comes from call. Never throws, never allocates.
  zd_status run(const zd_comm_call* call, Call c, Body& body) noexcept;

  // Inside started(): returns once every served rank has called meet() the
  // same number of times. No timeout, no abort.
  void meet(int index) noexcept;

  // Inside started(): waits (spinning spin_us, then sleeping) until
  // counter > k, or the rendezvous fails. True when counter > k (which wins
  // over a failure). No timeout of its own: whoever moves the counter or
  // fails the rendezvous bounds it. The mover calls notify() after a store.
  bool await(const std::atomic<uint64_t>& counter, uint64_t k) noexcept;
  void notify() noexcept;

  // Breaks the rendezvous from outside the arrival (a Body, another thread):
  // later calls name themselves and quote the message. A no-op when already
  // broken.
  void fail(zd_status status, const char* message) noexcept;
  // Makes every collective not yet started, and every later one, fail with
  // status and reason (verbatim). A no-op when already broken: the first
  // failure is kept as the cause.
  void abort(zd_status status, const char* reason) noexcept;
  bool failed() const noexcept { return failed_.load(std::memory_order_acquire); }
  // The failure's status (ZD_OK when not failed) and its message.
  zd_status failure(char* out, size_t size) noexcept;
  // Sets rank `index`'s last_error to the failure; returns its status.
  zd_status take_failure(int index) noexcept;

  // Called (without the rendezvous's lock held) after every failure, from
  // the thread that failed it: so that whoever must tell others (the mpi
  // plugin's network thread) hears of it at once. Set before any call.
  void on_failure(void (*hook)(void*), void* context) noexcept {
    hook_ = hook;
    hook_context_ = context;
  }

  // "" for a rank that has not failed, or a rank this rendezvous does not
  // serve.
  const char* last_error(int rank) const noexcept;

  // Figures: a completed collective of rank `index` that sent `bytes` (as
  // ring_bytes counts them); `collectives` is how many calls it completes.
  void count(int index, uint64_t bytes, uint64_t collectives) noexcept;
  uint64_t bytes_sent(int rank) const noexcept;
  uint64_t collectives(int rank) const noexcept;

 private:
  // What only rank r's thread touches, apart from `error` (read by
  // last_error) and the figures; a cache line of its own.
  struct alignas(64) Rank {
    std::atomic<bool> in_call{false};
    std::atomic<uint64_t> bytes{0};
    std::atomic<uint64_t> collectives{0};
    uint64_t next = 0;   // the index of this rank's next collective; guarded by mu_
    uint64_t meets = 0;  // meet() calls so far; only this rank's thread
    Clock::time_point deadline{};  // of the call in the open collective; guarded by mu_
    Clock::time_point entered{};   // likewise: when that call began
    uint32_t timeout_ms = 0;       // likewise
    char error[kMessageMax] = "";  // written under mu_
  };

  zd_status collective(Rank& me, int index, const zd_comm_call& call, const Call& c, Body& body) noexcept;
  zd_status await_start(Rank& me, int index, uint64_t k, uint32_t timeout_ms, Clock::time_point entered) noexcept;
  void started_locked(Started* s) const noexcept;

  void fail_locked(zd_status status, bool quote) noexcept;
  zd_status refuse_locked(Rank& me, int rank, uint64_t k, const char* what) noexcept;
  void fail_unattributed(const char* fmt, ...) noexcept __attribute__((format(printf, 2, 3)));
  void wake(std::unique_lock<std::mutex>& lk) noexcept;
  // Wakes every waiter and calls the failure hook; after the lock is released.
  void failed_now() noexcept;

  template <typename Pred>
  bool spin(Pred ready, Clock::time_point until) const noexcept;

  const int world_;
  const int first_;
  const int ranks_n_;
  const Clock::duration spin_;
  void (*hook_)(void*) = nullptr;
  void* hook_context_ = nullptr;

  std::unique_ptr<Rank[]> ranks_;

  std::mutex mu_;
  std::condition_variable cv_;
  // Guarded by mu_; see Body for when others read them.
  std::vector<Call> calls_;
  std::vector<Seen> seen_;
  int arrived_ = 0;  // ranks in the open collective
  int first_in_ = 0; // the index of the first of them
  int met_ = 0;      // ranks in the open meeting
  int sleepers_ = 0;
  zd_status fail_status_ = ZD_OK;
  bool fail_quote_ = false;
  char fail_msg_[kMessageMax] = "";

  // Written under mu_, read by spinning ranks without it.
  std::atomic<uint64_t> started_{0};   // collectives all ranks have arrived at
  std::atomic<uint64_t> meetings_{0};  // meetings all ranks have finished
  std::atomic<bool> failed_{false};
};

}  // namespace zerod::comm

#endif  // ZEROD_COMM_LOCAL_RENDEZVOUS_H
