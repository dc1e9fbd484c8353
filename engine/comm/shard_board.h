// Stage 3 with every rank of the job in this process and the in-process
// ("local") comm plugin: a rank gathers a module by copying its peers'
// parameter shards itself (a one-sided gather), with no collective. The
// bytes are the ones the local plugin's all-gather would copy; what the
// collective's rendezvous guaranteed — that a peer's shard is the version
// the peer had at the same point of its program, and that nobody writes it
// meanwhile — the board guarantees with two counters per rank:
//
//   done[r]     write phases rank r has completed;
//   entered[r]  write phases rank r has begun;
// and, as the collective's arrival did, every rank's gather k is compared
// with the others' (its module), so that ranks in different modules are
// told: a prefetch waits for the others to arrive before it copies; a begin
// call copies at once and its rank compares at its next call
// (Residency::settle_gathers), waiting for them then.
//
// A write phase is anything that writes a rank's working shards: a step's
// update, zd_param_write, a checkpoint load or snapshot resume, the rebuild
// after a restart. Every rank runs the same phases in the same order (the
// step and the loads are collectives; zd_param_write is made by every rank),
// so a rank that completed w phases reads the version w of every shard:
//
//  - a reader whose rank completed w phases waits until every peer has
//    completed w (a peer still applying its step holds it; nothing else
//    does);
//  - a writer entering phase w+1 first finishes its own reads (its stream
//    is drained), says so (entered), and waits until every rank has entered
//    w+1: from then on nobody reads version w any more. At a step every
//    rank has already passed the step's gradient collectives there, so the
//    wait ends at once.
//
// Every wait spins briefly (yielding), then sleeps in slices of at most a
// millisecond; it ends with an Error when the board is aborted (a rank
// lost, the job broken), when a rank it waits for has left the job, or
// after the job's comm timeout, as a collective would.
//
// Thread-safety: publish() from each rank's thread before the finalize
// barrier, shard() and one_sided() after it; epoch(), begin_write(),
// end_write() from the rank's own thread; await_readable() from the rank's
// thread or its stream; abort(), rank_left() and reset() from any thread
// (reset() only while no rank is inside the model).
#pragma once

#include "error.h"

#include <zerod/zerod.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace zerod {

class ShardBoard {
 public:
  // timeout_s: the job's comm timeout (0: none).
  ShardBoard(int world, double timeout_s);
  ShardBoard(const ShardBoard&) = delete;
  ShardBoard& operator=(const ShardBoard&) = delete;

  // At finalize, before the barrier every rank passes: where each parameter's
  // shard of `rank` is (null where it is not in memory, or not gathered).
  void publish(int rank, std::vector<const std::byte*> shards);
  // After that barrier.
  const std::byte* shard(int rank, zd_param_id p) const {
    return shards_[static_cast<size_t>(rank)][static_cast<size_t>(p)];
  }
  // Every rank's shard of p is in memory: p can be gathered one-sided (the
  // same answer on every rank).
  bool one_sided(zd_param_id p) const;

  // Write phases `rank` has completed: the version of the shards its
  // gathers read now.
  uint64_t epoch(int rank) const { return slots_[static_cast<size_t>(rank)].done.load(std::memory_order_relaxed); }
  // The rendezvous of a one-sided gather, without its collective: rank
  // arrives at its next gather (of module `tag`), in program order, and
  // gets its number k; await_arrival() waits until every rank has arrived
  // at gather k (as the all-gather did, so that ranks that went different
  // ways are told); disagreeing() is then -1 when all gather the same
  // module, else a rank that gathers another (its module in *other_tag).
  uint64_t arrive(int rank, uint64_t tag);
  bool all_arrived(uint64_t k) const {
    for (int q = 0; q < world_; ++q)
      if (slots_[static_cast<size_t>(q)].arrived.load(std::memory_order_acquire) <= k) return false;
    return !failed_.load(std::memory_order_relaxed);
  }
  void await_arrival(int rank, uint64_t k, const std::string& what);
  int disagreeing(int rank, uint64_t k, uint64_t tag, uint64_t* other_tag) const;

  // Every rank has completed `epoch` write phases (nearly always: a rank
  // holds its shards only while it writes them).
  bool readable(uint64_t epoch) const {
    for (int q = 0; q < world_; ++q)
      if (slots_[static_cast<size_t>(q)].done.load(std::memory_order_acquire) < epoch) return false;
    return !failed_.load(std::memory_order_relaxed);
  }
  // Waits until every other rank has completed `epoch` write phases. `what`
  // names the gather in a failure.
  void await_readable(int rank, uint64_t epoch, const std::string& what);
  // Enters the rank's next write phase once its own reads are done (the
  // caller drained its stream) and waits until every rank has entered it.
  // `what` names the phase ("zd_step's update").
  void begin_write(int rank, const char* what);
  void end_write(int rank);

  // Every wait, now and later, fails with status and message.
  void abort(zd_status status, const std::string& message);
  // The rank will make no more calls: writers no longer wait for it, a
  // reader still reads the shards it left (their version is final), and a
  // reader that needs a later version fails (ZD_ERR_PEER_LOST, reason).
  void rank_left(int rank, const std::string& reason);
  // A restart: every counter back to zero, no failure, nobody gone.
  void reset();

 private:
  static constexpr uint64_t kTags = 64;  // the gathers whose modules a rank keeps for the others to compare
  struct alignas(64) Slot {
    std::atomic<uint64_t> entered{0};
    std::atomic<uint64_t> done{0};
    std::atomic<bool> gone{false};
    std::atomic<uint64_t> arrived{0};  // gathers this rank has arrived at
    std::atomic<uint64_t> tags[kTags]; // the module of gather k at k % kTags
  };
  // Waits until ready(q) holds for every rank q but `rank`. For the
  // failure's message: `blocker`, what rank q has not done; `doing`, what
  // this rank was doing.
  template <typename Ready>
  void await(int rank, Ready ready, bool fail_on_gone, const std::string& blocker, const std::string& doing);
  void wake();
  [[noreturn]] void throw_failure();

  const int world_;
  const double timeout_s_;
  std::unique_ptr<Slot[]> slots_;
  std::vector<std::vector<const std::byte*>> shards_;  // [rank][param]

  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<int> sleepers_{0};
  std::atomic<bool> failed_{false};
  zd_status fail_status_ = ZD_OK;  // guarded by mu_
  std::string fail_message_;       // guarded by mu_
  std::vector<std::string> gone_reason_;  // guarded by mu_
};

}  // namespace zerod
