#include "communicator.h"

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <thread>

namespace zerod::comm {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

Communicator::Communicator(int world, double spin_us)
    : world_(world),
      spin_(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::micro>(spin_us))),
      ranks_(new Rank[static_cast<size_t>(world)]),
      calls_(static_cast<size_t>(world)),
      seen_(static_cast<size_t>(world)) {
  for (int r = 0; r < world; ++r) {
    ranks_[r].srcs.reset(new const void*[static_cast<size_t>(world)]);
    ranks_[r].dsts.reset(new void*[static_cast<size_t>(world)]);
  }
}

// Spins until ready() or `until`, with a pause per poll and a yield every
// 32 polls: when ranks outnumber cores, the rank being waited for may need
// this core.
template <typename Pred>
bool Communicator::spin(Pred ready, Clock::time_point until) const noexcept {
  if (spin_ <= Clock::duration::zero()) return ready();
  for (unsigned i = 0;; ++i) {
    if (ready()) return true;
    cpu_relax();
    if ((i & 31u) == 31u) {
      if (Clock::now() >= until) return ready();
      std::this_thread::yield();
    }
  }
}

void Communicator::wake(std::unique_lock<std::mutex>& lk) noexcept {
  const bool any = sleepers_ > 0;
  lk.unlock();
  if (any) cv_.notify_all();
}

void Communicator::fail_locked(zd_status status, bool quote) noexcept {
  fail_status_ = status;
  fail_quote_ = quote;
  failed_.store(true, std::memory_order_release);
}

zd_status Communicator::refuse_locked(Rank& me, int rank, uint64_t k, const char* what) noexcept {
  if (fail_quote_) {
    Text t(me.error, sizeof me.error);
    say_gone(t, k, rank, what, fail_msg_);
  } else {
    copy_text(me.error, sizeof me.error, fail_msg_);
  }
  return fail_status_;
}

void Communicator::fail_unattributed(const char* fmt, ...) noexcept {
  std::unique_lock<std::mutex> lk(mu_);
  if (failed_.load(std::memory_order_relaxed)) return;
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(fail_msg_, sizeof fail_msg_, fmt, ap);
  va_end(ap);
  fail_locked(ZD_ERR_INVALID_STATE, true);
  lk.unlock();
  cv_.notify_all();
}

zd_status Communicator::run(const zd_comm_call* raw, Call c) noexcept {
  // A caller built against a later header may pass a longer struct; this
  // version reads the fields it knows.
  if (raw == nullptr || raw->struct_size < sizeof(zd_comm_call)) {
    fail_unattributed("a collective was called with a %s zd_comm_call", raw == nullptr ? "NULL" : "short");
    return ZD_ERR_INVALID_ARGUMENT;
  }
  zd_comm_call call;
  std::memcpy(&call, raw, sizeof call);
  if (call.rank < 0 || call.rank >= world_) {
    fail_unattributed("a collective (\"%.*s\") was called with rank %d, outside 0..%d", static_cast<int>(kWhatMax),
                      call.what != nullptr ? call.what : "", call.rank, world_ - 1);
    return ZD_ERR_INVALID_ARGUMENT;
  }
  c.tag = call.tag;
  Rank& me = ranks_[call.rank];
  if (me.in_call.exchange(true, std::memory_order_acq_rel)) {
    // Two threads for one rank: the sequence numbers would no longer say
    // which call belongs to which collective.
    std::unique_lock<std::mutex> lk(mu_);
    if (!failed_.load(std::memory_order_relaxed)) {
      Text t(fail_msg_, sizeof fail_msg_);
      t.add("rank %d called ", call.rank);
      t.quoted(call.what, kWhatMax);
      t.add(" while another call of rank %d had not returned: one call per rank at a time", call.rank);
      fail_locked(ZD_ERR_INVALID_STATE, true);
    }
    copy_text(me.error, sizeof me.error, fail_msg_);
    lk.unlock();
    cv_.notify_all();
    return ZD_ERR_INVALID_STATE;
  }
  const zd_status st = collective(me, call.rank, call, c);
  me.in_call.store(false, std::memory_order_release);
  return st;
}

zd_status Communicator::collective(Rank& me, int r, const zd_comm_call& call, const Call& c) noexcept {
  const Clock::time_point entered = Clock::now();
  char why_buf[256];
  Text why(why_buf, sizeof why_buf);
  const bool valid = check_call(c, world_, why);

  std::unique_lock<std::mutex> lk(mu_);
  const uint64_t k = me.next++;
  if (failed_.load(std::memory_order_relaxed)) return refuse_locked(me, r, k, call.what);
  calls_[r] = c;
  seen_[r].seq = k;
  copy_text(seen_[r].what, kWhatMax, call.what);

  if (!valid || (arrived_ > 0 && !same_collective(calls_[first_], c))) {
    Text t(fail_msg_, sizeof fail_msg_);
    if (!valid) say_invalid(t, k, r, seen_[r].what, why.str());
    else say_disagreement(t, k, first_, calls_[first_], seen_[first_].what, r, c, seen_[r].what);
    fail_locked(ZD_ERR_INVALID_STATE, true);
    copy_text(me.error, sizeof me.error, fail_msg_);
    lk.unlock();
    cv_.notify_all();
    return valid ? ZD_ERR_INVALID_STATE : ZD_ERR_INVALID_ARGUMENT;
  }
  if (arrived_ == 0) first_ = r;
  if (++arrived_ == world_) {
    arrived_ = 0;
    started_.store(k + 1, std::memory_order_release);
    wake(lk);
  } else {
    lk.unlock();
    const zd_status st = await_start(me, r, k, call.timeout_ms, entered);
    if (st != ZD_OK) return st;
  }

  // Started: calls_ holds every rank's call until all pass finish().
  do_share(calls_.data(), world_, r, Scratch{me.srcs.get(), me.dsts.get()});
  if (shares_buffers(c, world_)) finish(k);
  me.bytes.fetch_add(ring_bytes(c, world_, r), std::memory_order_relaxed);
  return ZD_OK;
}

zd_status Communicator::await_start(Rank& me, int r, uint64_t k, uint32_t timeout_ms,
                                    Clock::time_point entered) noexcept {
  const bool limited = timeout_ms > 0;
  const Clock::time_point deadline = entered + std::chrono::milliseconds(timeout_ms);
  Clock::time_point spin_end = Clock::now() + spin_;
  if (limited && deadline < spin_end) spin_end = deadline;
  const auto ready = [&] {
    return started_.load(std::memory_order_acquire) > k || failed_.load(std::memory_order_acquire);
  };
  // Started wins over failed: once every rank has arrived, the others are
  // already working on this rank's buffers.
  if (spin(ready, spin_end) && started_.load(std::memory_order_acquire) > k) return ZD_OK;

  std::unique_lock<std::mutex> lk(mu_);
  ++sleepers_;
  zd_status st = ZD_OK;
  bool timed_out = false;
  for (;;) {
    if (started_.load(std::memory_order_relaxed) > k) break;
    if (failed_.load(std::memory_order_relaxed)) {
      st = fail_status_;
      copy_text(me.error, sizeof me.error, fail_msg_);
      break;
    }
    if (!limited) {
      cv_.wait(lk);
      continue;
    }
    const Clock::time_point now = Clock::now();
    if (now < deadline) {
      cv_.wait_until(lk, deadline);
      continue;
    }
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - entered).count();
    Text t(fail_msg_, sizeof fail_msg_);
    say_timeout(t, k, r, static_cast<uint64_t>(waited), calls_.data(), seen_.data(), world_);
    fail_locked(ZD_ERR_TIMEOUT, true);
    copy_text(me.error, sizeof me.error, fail_msg_);
    st = ZD_ERR_TIMEOUT;
    timed_out = true;
    break;
  }
  --sleepers_;
  lk.unlock();
  if (timed_out) cv_.notify_all();
  return st;
}

void Communicator::finish(uint64_t k) noexcept {
  std::unique_lock<std::mutex> lk(mu_);
  if (++done_ == world_) {
    done_ = 0;
    completed_.store(k + 1, std::memory_order_release);
    wake(lk);
    return;
  }
  lk.unlock();
  const auto done = [&] { return completed_.load(std::memory_order_acquire) > k; };
  if (spin(done, Clock::now() + spin_)) return;
  lk.lock();
  ++sleepers_;
  cv_.wait(lk, [&] { return completed_.load(std::memory_order_relaxed) > k; });
  --sleepers_;
}

void Communicator::abort(zd_status status, const char* reason) noexcept {
  std::unique_lock<std::mutex> lk(mu_);
  copy_text(fail_msg_, sizeof fail_msg_, reason != nullptr && reason[0] != '\0' ? reason : "aborted");
  // A failed call must not report success.
  fail_locked(status != ZD_OK ? status : ZD_ERR_INVALID_STATE, false);
  lk.unlock();
  cv_.notify_all();
}

const char* Communicator::last_error(int rank) const noexcept {
  if (rank < 0 || rank >= world_) return "";
  return ranks_[rank].error;
}

uint64_t Communicator::bytes_sent(int rank) const noexcept {
  if (rank < 0 || rank >= world_) return 0;
  return ranks_[rank].bytes.load(std::memory_order_relaxed);
}

}  // namespace zerod::comm
