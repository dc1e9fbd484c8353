#include "transport/ring.h"

#include "error.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace zerod::transport {

namespace {

constexpr uint64_t kRequestSeq = 64;
constexpr uint64_t kDaemonSleeps = 128;
constexpr uint64_t kReplySeq = 192;
constexpr uint64_t kClientSleeps = 256;

static_assert(sizeof(std::atomic<uint32_t>) == 4 && std::atomic<uint32_t>::is_always_lock_free,
              "the ring's futex words are plain 32-bit integers shared between processes");

// Shared (not FUTEX_PRIVATE): the word lies in memory two processes map.
void futex_wait(std::atomic<uint32_t>& w, uint32_t old, int timeout_ms) noexcept {
  timespec ts{};
  timespec* t = nullptr;
  if (timeout_ms > 0) {
    ts.tv_sec = timeout_ms / 1000;
    ts.tv_nsec = static_cast<long>(timeout_ms % 1000) * 1000000L;
    t = &ts;
  }
  // EAGAIN (the word moved), EINTR and ETIMEDOUT all mean: look again.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&w), FUTEX_WAIT, old, t, nullptr, 0);
}

void futex_wake(std::atomic<uint32_t>& w) noexcept {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&w), FUTEX_WAKE, 1, nullptr, nullptr, 0);
}

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// A yield every 4 polls: measured on the 2-core VM with 2 ranks (4 threads
// that each alternate between working and waiting), yielding every poll,
// every 4, 16 and 64 gave 8.6 / 8.9 / 10.2 / 14.9 us per stage-0 begin+end
// and 36-40 / 23-25 / 24-28 / 49 us at stage 3: a waiter must give its
// core to the partner it waits for promptly, but not so often that the
// yields themselves dominate.
constexpr unsigned kYieldMask = 3;

bool aborted(const RingWait& w) noexcept { return w.abort && w.abort->load(std::memory_order_acquire); }

// Waits until `done(word)`. The sleeper raises `sleeps` before its last
// look and the poster reads it after its store (both seq_cst), so either
// the sleeper sees the new value or the poster sees the flag and wakes it;
// FUTEX_WAIT itself rechecks the value it last saw in the kernel.
template <typename Done>
RingWaitEnd wait_until(std::atomic<uint32_t>& word, std::atomic<uint32_t>& sleeps, Done done,
                       const RingWait& w) noexcept {
  using Clock = std::chrono::steady_clock;
  uint32_t seen = word.load(std::memory_order_acquire);
  const auto ready = [&] { return done(seen = word.load(std::memory_order_acquire)); };
  if (ready()) return RingWaitEnd::ready;
  const Clock::time_point spin_end = Clock::now() + w.spin;
  for (unsigned polls = 1;; ++polls) {
    if (ready()) return RingWaitEnd::ready;
    if ((polls & kYieldMask) == 0) {
      // A pause per poll keeps the spin gentle on a sibling hyperthread; a
      // yield every few polls lets a runnable peer (the very thread we wait
      // for, when ranks outnumber cores) have this core.
      if (aborted(w)) return RingWaitEnd::aborted;
      if (Clock::now() >= spin_end) break;
      sched_yield();
    } else {
      cpu_relax();
    }
  }
  for (;;) {
    sleeps.store(1, std::memory_order_seq_cst);
    if (ready()) {
      sleeps.store(0, std::memory_order_relaxed);
      return RingWaitEnd::ready;
    }
    int slice = w.slice_ms;
    if (w.deadline != Clock::time_point::max()) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(w.deadline - Clock::now()).count();
      if (left <= 0) {
        sleeps.store(0, std::memory_order_relaxed);
        return ready() ? RingWaitEnd::ready : RingWaitEnd::timeout;
      }
      if (slice <= 0 || left < slice) slice = static_cast<int>(left);
    }
    // Sleeps while the word still holds what ready() last saw: a move to
    // another value that is not the one waited for wakes it to look again.
    if (!aborted(w)) futex_wait(word, seen, slice);
    sleeps.store(0, std::memory_order_relaxed);
    if (ready()) return RingWaitEnd::ready;
    if (aborted(w)) return RingWaitEnd::aborted;
    if (w.alive && !w.alive()) return ready() ? RingWaitEnd::ready : RingWaitEnd::gone;
  }
}

}  // namespace

std::chrono::microseconds ring_spin_from_env() {
  const char* v = std::getenv("ZEROD_RING_SPIN_US");
  if (!v || !*v) return std::chrono::microseconds(50);
  char* end = nullptr;
  const long us = std::strtol(v, &end, 10);
  if (*end != 0 || us < 0 || us > 100000)
    fail(ZD_ERR_INVALID_ARGUMENT, std::string("ZEROD_RING_SPIN_US='") + v + "': expected microseconds, 0..100000");
  return std::chrono::microseconds(us);
}

Ring Ring::create(uint64_t size, uint64_t request_bytes, UniqueFd* fd) {
  if (size < kRingMinBytes || size > kRingMaxBytes || request_bytes < 256 ||
      request_bytes > size - kRingHeaderBytes - 256)
    fail(ZD_ERR_INVALID_ARGUMENT, "a call ring of " + std::to_string(size) + " bytes with a request slot of " +
                                      std::to_string(request_bytes) + " cannot be laid out");
  UniqueFd f = create_sealed_memfd("zerod-ring", size);
  Ring r;
  r.map_ = SharedMapping(f.get(), size, kRingMaxBytes, "the call ring memfd");
  RingHeader h{kRingMagic, kRingVersion, size, request_bytes};
  std::memcpy(r.map_.data(), &h, sizeof h);
  r.request_bytes_ = request_bytes;
  *fd = std::move(f);
  return r;
}

Ring Ring::attach(int fd, uint64_t size) {
  const std::string what = "the client's call ring memfd";
  if (size < kRingMinBytes)
    fail(ZD_ERR_INVALID_ARGUMENT, what + ": " + std::to_string(size) + " bytes were claimed, fewer than the least, " +
                                      std::to_string(kRingMinBytes));
  Ring r;
  r.map_ = SharedMapping(fd, size, kRingMaxBytes, what);  // sealed, long enough: checked before mmap
  RingHeader h;
  std::memcpy(&h, r.map_.data(), sizeof h);  // read once: the client may change it later
  if (h.magic != kRingMagic || h.version != kRingVersion)
    fail(ZD_ERR_INVALID_ARGUMENT, what + " does not begin with a version-1 ring header");
  if (h.size != size)
    fail(ZD_ERR_INVALID_ARGUMENT, what + ": its header says " + std::to_string(h.size) + " bytes, the request " +
                                      std::to_string(size));
  if (h.request_bytes < 256 || h.request_bytes > size - kRingHeaderBytes - 256)
    fail(ZD_ERR_INVALID_ARGUMENT, what + ": a request slot of " + std::to_string(h.request_bytes) +
                                      " bytes does not fit a ring of " + std::to_string(size));
  r.request_bytes_ = h.request_bytes;
  r.sent_ = r.word(kRequestSeq).load(std::memory_order_acquire);
  return r;
}

void Ring::post_request() noexcept {
  word(kRequestSeq).store(++sent_, std::memory_order_seq_cst);
  if (word(kDaemonSleeps).load(std::memory_order_seq_cst)) futex_wake(word(kRequestSeq));
}

RingWaitEnd Ring::wait_reply(const RingWait& w) noexcept {
  // The daemon's reply word is the number of the request it answered, so
  // the wait is for that number to be the last request's, not for the word
  // to move: after a wait that gave up, the word moves when the daemon
  // answers that older request, or has not moved yet when the next request
  // goes out, and either would end a wait "while the word is sent_ - 1" at
  // once with the wrong reply in the slot.
  const uint32_t want = sent_;
  return wait_until(word(kReplySeq), word(kClientSleeps), [want](uint32_t v) { return v == want; }, w);
}

RingWaitEnd Ring::wait_request(const RingWait& w) noexcept {
  const uint32_t taken = sent_;
  const RingWaitEnd end =
      wait_until(word(kRequestSeq), word(kDaemonSleeps), [taken](uint32_t v) { return v != taken; }, w);
  // Any move counts as one request: a client that jumps its counter only
  // confuses itself.
  if (end == RingWaitEnd::ready) sent_ = word(kRequestSeq).load(std::memory_order_acquire);
  return end;
}

void Ring::post_reply() noexcept {
  word(kReplySeq).store(sent_, std::memory_order_seq_cst);
  if (word(kClientSleeps).load(std::memory_order_seq_cst)) futex_wake(word(kReplySeq));
}

void Ring::wake_daemon() noexcept {
  if (map_) futex_wake(word(kRequestSeq));
}

}  // namespace zerod::transport
