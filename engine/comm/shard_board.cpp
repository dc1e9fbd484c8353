#include "shard_board.h"

#include <sched.h>

#include <chrono>
#include <cstdio>

namespace zerod {

namespace {

using Clock = std::chrono::steady_clock;

// As the call ring and the comm stream: a wait that ends within tens of
// microseconds costs no sleep; a yield every 4 polls lets the thread being
// waited for have this core when threads outnumber cores.
constexpr std::chrono::microseconds kSpin{50};
// A sleeper looks again at least this often: a wake-up that raced with its
// sleep, an abort, or its deadline are noticed within a slice.
constexpr std::chrono::milliseconds kSlice{1};

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

ShardBoard::ShardBoard(int world, double timeout_s)
    : world_(world),
      timeout_s_(timeout_s),
      slots_(new Slot[static_cast<size_t>(world)]),
      shards_(static_cast<size_t>(world)),
      gone_reason_(static_cast<size_t>(world)) {}

void ShardBoard::publish(int rank, std::vector<const std::byte*> shards) {
  shards_[static_cast<size_t>(rank)] = std::move(shards);
}

bool ShardBoard::one_sided(zd_param_id p) const {
  for (const auto& r : shards_)
    if (static_cast<size_t>(p) >= r.size() || r[static_cast<size_t>(p)] == nullptr) return false;
  return true;
}

void ShardBoard::throw_failure() {
  std::lock_guard<std::mutex> lock(mu_);
  throw Error(fail_status_ != ZD_OK ? fail_status_ : ZD_ERR_INTERNAL, fail_message_);
}

template <typename Ready>
void ShardBoard::await(int rank, Ready ready, bool fail_on_gone, const std::string& blocker, const std::string& doing) {
  // 0: some rank is not ready (*late), 1: all are, 2: *late is gone.
  int late = -1;
  const auto check = [&]() -> int {
    for (int q = 0; q < world_; ++q) {
      if (q == rank) continue;
      if (ready(q)) continue;
      // A rank that left makes no more calls: nobody need wait for it to
      // enter a write phase, and nobody can wait for it to finish one.
      if (slots_[static_cast<size_t>(q)].gone.load(std::memory_order_acquire)) {
        if (!fail_on_gone) continue;
        late = q;
        return 2;
      }
      late = q;
      return 0;
    }
    return 1;
  };
  const Clock::time_point entered = Clock::now();
  const Clock::time_point spin_end = entered + kSpin;
  int st = 0;
  for (unsigned polls = 1;; ++polls) {
    if ((st = check()) != 0 || failed_.load(std::memory_order_acquire)) break;
    if ((polls & 3) == 0) {
      if (Clock::now() >= spin_end) break;
      sched_yield();
    } else {
      cpu_relax();
    }
  }
  if (st == 0 && !failed_.load(std::memory_order_acquire)) {
    const bool limited = timeout_s_ > 0;
    const Clock::time_point deadline =
        limited ? entered + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_))
                : Clock::time_point::max();
    std::unique_lock<std::mutex> lock(mu_);
    sleepers_.fetch_add(1);
    for (;;) {
      if ((st = check()) != 0 || failed_.load(std::memory_order_acquire)) break;
      const Clock::time_point now = Clock::now();
      if (now >= deadline) break;
      cv_.wait_until(lock, std::min(deadline, now + kSlice));
    }
    sleepers_.fetch_sub(1);
  }
  if (st == 1) return;
  if (failed_.load(std::memory_order_acquire)) throw_failure();
  if (st == 2) {
    std::lock_guard<std::mutex> lock(mu_);
    throw Error(ZD_ERR_PEER_LOST, gone_reason_[static_cast<size_t>(late)] + "; rank " + std::to_string(rank) + " was " + doing);
  }
  char waited[32];
  std::snprintf(waited, sizeof waited, "%.1f", std::chrono::duration<double>(Clock::now() - entered).count());
  throw Error(ZD_ERR_TIMEOUT, "rank " + std::to_string(rank) + " waited " + waited + " s (the job's comm timeout) for rank " +
                                  std::to_string(late) + " " + blocker + ", " + doing);
}

uint64_t ShardBoard::arrive(int rank, uint64_t tag) {
  Slot& me = slots_[static_cast<size_t>(rank)];
  const uint64_t k = me.arrived.load(std::memory_order_relaxed);
  me.tags[k % kTags].store(tag, std::memory_order_relaxed);
  me.arrived.store(k + 1, std::memory_order_seq_cst);
  wake();
  return k;
}

void ShardBoard::await_arrival(int rank, uint64_t k, const std::string& what) {
  if (all_arrived(k)) return;
  await(
      rank, [&](int q) { return slots_[static_cast<size_t>(q)].arrived.load(std::memory_order_acquire) > k; }, true,
      "to arrive at its gather #" + std::to_string(k + 1), what);
  if (failed_.load(std::memory_order_acquire)) throw_failure();
}

int ShardBoard::disagreeing(int rank, uint64_t k, uint64_t tag, uint64_t* other_tag) const {
  for (int q = 0; q < world_; ++q) {
    if (q == rank) continue;
    const Slot& s = slots_[static_cast<size_t>(q)];
    const uint64_t t = s.tags[k % kTags].load(std::memory_order_relaxed);
    // A rank that ran more than kTags gathers ahead (prefetches issued
    // without waiting) wrote over it: not compared.
    if (s.arrived.load(std::memory_order_acquire) > k + kTags) continue;
    if (t != tag) {
      *other_tag = t;
      return q;
    }
  }
  return -1;
}

void ShardBoard::await_readable(int rank, uint64_t epoch, const std::string& what) {
  if (readable(epoch)) return;
  await(
      rank, [&](int q) { return slots_[static_cast<size_t>(q)].done.load(std::memory_order_acquire) >= epoch; },
      true, "to finish writing its parameter shards (update " + std::to_string(epoch) + ")", what);
  if (failed_.load(std::memory_order_acquire)) throw_failure();
}

void ShardBoard::begin_write(int rank, const char* what) {
  Slot& me = slots_[static_cast<size_t>(rank)];
  const uint64_t phase = me.done.load(std::memory_order_relaxed) + 1;
  me.entered.store(phase, std::memory_order_seq_cst);
  wake();
  await(
      rank, [&](int q) { return slots_[static_cast<size_t>(q)].entered.load(std::memory_order_acquire) >= phase; },
      false, std::string("to reach ") + what + " (every rank writes its parameter shards at the same point)",
      std::string("entering ") + what);
}

void ShardBoard::end_write(int rank) {
  Slot& me = slots_[static_cast<size_t>(rank)];
  me.done.store(me.entered.load(std::memory_order_relaxed), std::memory_order_seq_cst);
  wake();
}

void ShardBoard::wake() {
  if (sleepers_.load(std::memory_order_seq_cst) == 0) return;
  // Taking the lock orders the store before a sleeper's next check.
  { std::lock_guard<std::mutex> lock(mu_); }
  cv_.notify_all();
}

void ShardBoard::abort(zd_status status, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_.load(std::memory_order_relaxed)) return;  // the first failure is the cause
    fail_status_ = status;
    fail_message_ = message;
    failed_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

void ShardBoard::rank_left(int rank, const std::string& reason) {
  if (rank < 0 || rank >= world_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    gone_reason_[static_cast<size_t>(rank)] = reason;
    slots_[static_cast<size_t>(rank)].gone.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

void ShardBoard::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  for (int q = 0; q < world_; ++q) {
    Slot& s = slots_[static_cast<size_t>(q)];
    s.entered.store(0);
    s.done.store(0);
    s.gone.store(false);
    s.arrived.store(0);
    gone_reason_[static_cast<size_t>(q)].clear();
  }
  fail_status_ = ZD_OK;
  fail_message_.clear();
  failed_.store(false);
}

}  // namespace zerod
