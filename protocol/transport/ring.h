// A rank's call ring: one request slot and one reply slot in a sealed memfd
// that the client makes at connect and the daemon maps, so that a call and
// its answer cross between the processes through shared memory instead of
// the socket. The client publishes a request by bumping a 32-bit sequence
// word, the daemon its reply by setting its own word to the number of the
// request it answers; the daemon waits for the client's word to move, the
// client for the daemon's to reach its last request's number. A wait spins
// for a bounded time (most calls are answered in microseconds), then sleeps
// in FUTEX_WAIT on the word, which the other side wakes only when the
// sleeper said it sleeps.
//
// The ring has depth one: a rank has one call in flight (every zd_* call
// returns its status), so a deeper ring would never fill.
//
// The socket stays: set-up, fd passing and liveness. A sleeper waits in
// slices of kSliceMs and, between slices, asks `alive()` (the socket shows no
// hang-up), so a dead peer is seen within a slice even though no one is left
// to wake the futex.
//
// Layout (offsets in bytes; each word on a cache line of its own):
//   0     RingHeader, written once by the client before it sends the fd
//   64    request sequence (client -> daemon), a futex word
//   128   daemon-sleeps flag
//   192   reply sequence (daemon -> client), a futex word
//   256   client-sleeps flag
//   4096  request slot, request_bytes long
//   4096 + request_bytes   reply slot, up to the end
// The daemon trusts none of it: it reads the header once, checks it against
// the size fstat proved, and copies a request out before looking at it.
#pragma once

#include "transport/shared_memory.h"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

namespace zerod::transport {

inline constexpr uint32_t kRingMagic = 0x3152445Au;  // "ZDR1" little-endian
inline constexpr uint32_t kRingVersion = 1;
inline constexpr uint64_t kRingHeaderBytes = 4096;
inline constexpr uint64_t kRingMinBytes = 16 * 1024;
inline constexpr uint64_t kRingMaxBytes = uint64_t{64} << 20;

struct RingHeader {
  uint32_t magic;
  uint32_t version;
  uint64_t size;           // bytes of the whole memfd
  uint64_t request_bytes;  // the request slot's size; the reply slot takes the rest
};

// How a side waits for the other.
struct RingWait {
  // Busy-polls this long (with a pause per poll and a sched_yield every 4
  // polls, so a spinner hands its core to a runnable peer) before it sleeps.
  std::chrono::microseconds spin{50};
  // After spinning: sleep in futex slices of this length, calling alive()
  // between slices. 0 = one sleep until woken (no liveness check).
  int slice_ms = 10;
  // Give up with RingWaitEnd::timeout at this time (max() = never).
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  // false = the peer is gone: stop waiting with RingWaitEnd::gone.
  std::function<bool()> alive;
  // Set by another thread to stop a wait (checked at every wake and spin).
  const std::atomic<bool>* abort = nullptr;
};

enum class RingWaitEnd { ready, timeout, gone, aborted };

// The spin a side uses unless ZEROD_RING_SPIN_US (0..100000) says otherwise.
std::chrono::microseconds ring_spin_from_env();

class Ring {
 public:
  Ring() = default;
  Ring(Ring&&) noexcept = default;
  Ring& operator=(Ring&&) noexcept = default;

  // Client: a sealed memfd of `size` bytes laid out as above; fd gets it,
  // to send to the daemon.
  static Ring create(uint64_t size, uint64_t request_bytes, UniqueFd* fd);
  // Daemon: checks the fd as any shared memfd (check_sealed_memfd against
  // kRingMaxBytes), maps it, then checks the header against `size`. Throws
  // ZD_ERR_INVALID_ARGUMENT naming what was wrong.
  static Ring attach(int fd, uint64_t size);

  explicit operator bool() const noexcept { return static_cast<bool>(map_); }
  std::span<std::byte> request_slot() const noexcept { return {map_.data() + kRingHeaderBytes, request_bytes_}; }
  std::span<std::byte> reply_slot() const noexcept {
    return {map_.data() + kRingHeaderBytes + request_bytes_, map_.size() - kRingHeaderBytes - request_bytes_};
  }

  // --- client ---
  // Publishes the request written into request_slot() and wakes the daemon
  // if it sleeps.
  void post_request() noexcept;
  // Waits until the daemon published the reply to the last request (the
  // reply word says which request a reply answers: a late reply to an
  // earlier request, whose wait gave up, does not end this one).
  RingWaitEnd wait_reply(const RingWait& w) noexcept;

  // --- daemon ---
  // Waits until the client published a request it has not taken yet.
  RingWaitEnd wait_request(const RingWait& w) noexcept;
  // Publishes the reply written into reply_slot() and wakes the client if it sleeps.
  void post_reply() noexcept;
  // Wakes a daemon thread sleeping in wait_request (after setting its abort flag).
  void wake_daemon() noexcept;

 private:
  std::atomic<uint32_t>& word(uint64_t offset) const noexcept {
    return *reinterpret_cast<std::atomic<uint32_t>*>(map_.data() + offset);
  }
  SharedMapping map_;
  uint64_t request_bytes_ = 0;
  uint32_t sent_ = 0;  // client: requests posted; daemon: requests taken
};

}  // namespace zerod::transport
