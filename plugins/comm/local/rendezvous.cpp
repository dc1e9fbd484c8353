#include "rendezvous.h"

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

Rendezvous::Rendezvous(int world, int first, int ranks, double spin_us)
    : world_(world),
      first_(first),
      ranks_n_(ranks),
      spin_(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::micro>(spin_us))),
      ranks_(new Rank[static_cast<size_t>(ranks)]),
      calls_(static_cast<size_t>(ranks)),
      seen_(static_cast<size_t>(ranks)) {}

// Spins until ready() or `until`, with a pause per poll and a yield every
// 32 polls: when ranks outnumber cores, the rank being waited for may need
// this core.
template <typename Pred>
bool Rendezvous::spin(Pred ready, Clock::time_point until) const noexcept {
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

void Rendezvous::wake(std::unique_lock<std::mutex>& lk) noexcept {
  const bool any = sleepers_ > 0;
  lk.unlock();
  if (any) cv_.notify_all();
}

void Rendezvous::failed_now() noexcept {
  cv_.notify_all();
  if (hook_ != nullptr) hook_(hook_context_);
}

void Rendezvous::notify() noexcept {
  // Taking the lock orders the caller's store before a sleeper's check.
  std::unique_lock<std::mutex> lk(mu_);
  wake(lk);
}

void Rendezvous::fail_locked(zd_status status, bool quote) noexcept {
  fail_status_ = status;
  fail_quote_ = quote;
  failed_.store(true, std::memory_order_release);
}

zd_status Rendezvous::refuse_locked(Rank& me, int rank, uint64_t k, const char* what) noexcept {
  if (fail_quote_) {
    Text t(me.error, sizeof me.error);
    say_gone(t, k, rank, what, fail_msg_);
  } else {
    copy_text(me.error, sizeof me.error, fail_msg_);
  }
  return fail_status_;
}

void Rendezvous::fail_unattributed(const char* fmt, ...) noexcept {
  std::unique_lock<std::mutex> lk(mu_);
  if (failed_.load(std::memory_order_relaxed)) return;
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(fail_msg_, sizeof fail_msg_, fmt, ap);
  va_end(ap);
  fail_locked(ZD_ERR_INVALID_STATE, true);
  lk.unlock();
  failed_now();
}

void Rendezvous::fail(zd_status status, const char* message) noexcept {
  std::unique_lock<std::mutex> lk(mu_);
  if (failed_.load(std::memory_order_relaxed)) return;
  copy_text(fail_msg_, sizeof fail_msg_, message != nullptr && message[0] != '\0' ? message : "failed");
  fail_locked(status != ZD_OK ? status : ZD_ERR_INTERNAL, true);
  lk.unlock();
  failed_now();
}

void Rendezvous::abort(zd_status status, const char* reason) noexcept {
  std::unique_lock<std::mutex> lk(mu_);
  // The first failure is the cause; later aborts (the other ranks going
  // down because of it) must not replace it in what every rank reports.
  if (failed_.load(std::memory_order_relaxed)) return;
  copy_text(fail_msg_, sizeof fail_msg_, reason != nullptr && reason[0] != '\0' ? reason : "aborted");
  // A failed call must not report success.
  fail_locked(status != ZD_OK ? status : ZD_ERR_INVALID_STATE, false);
  lk.unlock();
  failed_now();
}

zd_status Rendezvous::failure(char* out, size_t size) noexcept {
  std::lock_guard<std::mutex> lk(mu_);
  if (out != nullptr) copy_text(out, size, failed_.load(std::memory_order_relaxed) ? fail_msg_ : "");
  return failed_.load(std::memory_order_relaxed) ? fail_status_ : ZD_OK;
}

zd_status Rendezvous::take_failure(int index) noexcept {
  std::lock_guard<std::mutex> lk(mu_);
  copy_text(ranks_[index].error, sizeof ranks_[index].error, fail_msg_);
  return fail_status_ != ZD_OK ? fail_status_ : ZD_ERR_INTERNAL;
}

zd_status Rendezvous::run(const zd_comm_call* raw, Call c, Body& body) noexcept {
  // A caller built against a later header may pass a longer struct; this
  // version reads the fields it knows.
  if (raw == nullptr || raw->struct_size < sizeof(zd_comm_call)) {
    fail_unattributed("a collective was called with a %s zd_comm_call", raw == nullptr ? "NULL" : "short");
    return ZD_ERR_INVALID_ARGUMENT;
  }
  zd_comm_call call;
  std::memcpy(&call, raw, sizeof call);
  if (call.rank < first_ || call.rank >= first_ + ranks_n_) {
    fail_unattributed("a collective (\"%.*s\") was called with rank %d, outside %d..%d%s", static_cast<int>(kWhatMax),
                      call.what != nullptr ? call.what : "", call.rank, first_, first_ + ranks_n_ - 1,
                      ranks_n_ < world_ ? " (the ranks this daemon serves)" : "");
    return ZD_ERR_INVALID_ARGUMENT;
  }
  c.tag = call.tag;
  const int index = call.rank - first_;
  Rank& me = ranks_[index];
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
    failed_now();
    return ZD_ERR_INVALID_STATE;
  }
  const zd_status st = collective(me, index, call, c, body);
  me.in_call.store(false, std::memory_order_release);
  return st;
}

void Rendezvous::started_locked(Started* s) const noexcept {
  s->deadline = Clock::time_point::max();
  s->timeout_ms = 0;
  for (int j = 0; j < ranks_n_; ++j) {
    const Rank& r = ranks_[j];
    if (r.timeout_ms == 0) continue;
    if (r.deadline < s->deadline) {
      s->deadline = r.deadline;
      s->since = r.entered;
    }
    if (s->timeout_ms == 0 || r.timeout_ms < s->timeout_ms) s->timeout_ms = r.timeout_ms;
  }
}

zd_status Rendezvous::collective(Rank& me, int i, const zd_comm_call& call, const Call& c, Body& body) noexcept {
  const Clock::time_point entered = Clock::now();
  const int r = first_ + i;
  char why_buf[256];
  Text why(why_buf, sizeof why_buf);
  const bool valid = check_call(c, world_, r, why);

  std::unique_lock<std::mutex> lk(mu_);
  const uint64_t k = me.next++;
  if (failed_.load(std::memory_order_relaxed)) return refuse_locked(me, r, k, call.what);
  calls_[i] = c;
  seen_[i].seq = k;
  copy_text(seen_[i].what, kWhatMax, call.what);
  me.timeout_ms = call.timeout_ms;
  me.entered = entered;
  me.deadline = entered + std::chrono::milliseconds(call.timeout_ms);

  if (!valid || (arrived_ > 0 && !same_collective(calls_[first_in_], c))) {
    Text t(fail_msg_, sizeof fail_msg_);
    if (!valid) {
      say_invalid(t, k, r, seen_[i].what, why.str());
    } else {
      say_disagreement(t, k, first_ + first_in_, calls_[first_in_], seen_[first_in_].what, r, c, seen_[i].what);
    }
    fail_locked(ZD_ERR_INVALID_STATE, true);
    copy_text(me.error, sizeof me.error, fail_msg_);
    lk.unlock();
    failed_now();
    return valid ? ZD_ERR_INVALID_STATE : ZD_ERR_INVALID_ARGUMENT;
  }
  Started s;
  s.index = i;
  s.seq = k;
  s.calls = calls_.data();
  s.seen = seen_.data();
  if (arrived_ == 0) first_in_ = i;
  if (++arrived_ == ranks_n_) {
    arrived_ = 0;
    s.last = true;
    started_locked(&s);
    started_.store(k + 1, std::memory_order_release);
    wake(lk);
  } else {
    lk.unlock();
    const zd_status st = await_start(me, i, k, call.timeout_ms, entered);
    if (st != ZD_OK) return st;
  }
  // Started: calls_ holds every rank's call until it leaves started().
  return body.started(s);
}

zd_status Rendezvous::await_start(Rank& me, int i, uint64_t k, uint32_t timeout_ms, Clock::time_point entered) noexcept {
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
    say_timeout(t, k, i, first_, static_cast<uint64_t>(waited), calls_.data(), seen_.data(), ranks_n_);
    fail_locked(ZD_ERR_TIMEOUT, true);
    copy_text(me.error, sizeof me.error, fail_msg_);
    st = ZD_ERR_TIMEOUT;
    timed_out = true;
    break;
  }
  --sleepers_;
  lk.unlock();
  if (timed_out) failed_now();
  return st;
}

void Rendezvous::meet(int index) noexcept {
  const uint64_t m = ranks_[index].meets++;
  std::unique_lock<std::mutex> lk(mu_);
  if (++met_ == ranks_n_) {
    met_ = 0;
    meetings_.store(m + 1, std::memory_order_release);
    wake(lk);
    return;
  }
  lk.unlock();
  const auto done = [&] { return meetings_.load(std::memory_order_acquire) > m; };
  if (spin(done, Clock::now() + spin_)) return;
  lk.lock();
  ++sleepers_;
  cv_.wait(lk, [&] { return meetings_.load(std::memory_order_relaxed) > m; });
  --sleepers_;
}

bool Rendezvous::await(const std::atomic<uint64_t>& counter, uint64_t k) noexcept {
  const auto ready = [&] { return counter.load(std::memory_order_acquire) > k || failed_.load(std::memory_order_acquire); };
  if (!spin(ready, Clock::now() + spin_)) {
    std::unique_lock<std::mutex> lk(mu_);
    ++sleepers_;
    cv_.wait(lk, ready);
    --sleepers_;
  }
  return counter.load(std::memory_order_acquire) > k;
}

const char* Rendezvous::last_error(int rank) const noexcept {
  if (rank < first_ || rank >= first_ + ranks_n_) return "";
  return ranks_[rank - first_].error;
}

void Rendezvous::count(int index, uint64_t bytes, uint64_t collectives) noexcept {
  ranks_[index].bytes.fetch_add(bytes, std::memory_order_relaxed);
  ranks_[index].collectives.fetch_add(collectives, std::memory_order_relaxed);
}

uint64_t Rendezvous::bytes_sent(int rank) const noexcept {
  if (rank < first_ || rank >= first_ + ranks_n_) return 0;
  return ranks_[rank - first_].bytes.load(std::memory_order_relaxed);
}

uint64_t Rendezvous::collectives(int rank) const noexcept {
  if (rank < first_ || rank >= first_ + ranks_n_) return 0;
  return ranks_[rank - first_].collectives.load(std::memory_order_relaxed);
}

}  // namespace zerod::comm
