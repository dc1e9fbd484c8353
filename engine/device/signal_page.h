// The page that orders a trainer's GPU stream against its daemon's
// (cuda_shared.h, SharedSignals): one page of host memory both processes
// map and register with their GPU. For each signal it holds how many times
// the signal has been recorded, and a 32-bit word that the recording stream
// writes each record's number into and that the waiting stream waits on.
// Plain C++ (the GPU half is cuda_shared.cpp), so that CI tests the host
// half without a GPU (device_test).
//
// Why host memory: a surviving process must be able to end a wait on a
// record its dead peer never ran, whatever its own streams are doing. A
// word in host memory is released with a plain store from the CPU; a word
// in GPU memory had to be written by a stream of the survivor's, which
// could sit in one of the GPU's hardware queues behind the very wait it was
// to end (CUDA_DEVICE_MAX_CONNECTIONS), and whether the word was still
// behind could only be read through another stream, which could be stuck
// the same way.
#pragma once

#include "cuda_failure.h"

#include <atomic>
#include <cstdint>

namespace zerod {

// Which signal: zerod's stream records kZerodDone where a local trainer's
// stream would wait for it (after a begin call's copies); the trainer's
// stream records kTrainerDone before each call (device.h, StreamLink).
enum SignalId : int { kZerodDone = 0, kTrainerDone = 1, kSignalCount = 2 };

// The page's layout. Each count and each word has one writer, the process
// that records the signal (its CPU the count, its GPU stream the word); the
// other process only reads them, and writes a word only to release a wait
// once the recording process has exited. The recording process's CPU writes
// its word only once its GPU context has failed, when its stream never will.
struct SignalPage {
  std::atomic<uint64_t> issued[kSignalCount];
  // A cache line of their own: the GPU writes them over the bus.
  alignas(64) std::atomic<uint32_t> word[kSignalCount];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "the page is shared between processes");
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "the GPU writes the words as plain 32-bit values");

// The bytes of the page (a memfd of exactly this size, sealed against
// resizing).
constexpr uint64_t kSignalPageBytes = 4096;
static_assert(sizeof(SignalPage) <= kSignalPageBytes);

// A word holds a record's number modulo 2^32, and a wait is for the cyclic
// comparison CUDA makes (cuStreamWaitValue32's default): (int32)(word -
// number) >= 0. Whether a word that reads `word` is still behind record
// `number`, by that comparison: true until the record (or a release) has
// written it, whatever 2^32 wraps have passed.
inline bool signal_behind(uint32_t word, uint64_t number) {
  return static_cast<int32_t>(word - static_cast<uint32_t>(number)) < 0;
}

// Whether the latest record of `s` has not written its number yet.
inline bool signal_pending(const SignalPage& p, SignalId s) {
  const uint64_t n = p.issued[s].load(std::memory_order_acquire);
  return n != 0 && signal_behind(p.word[s].load(std::memory_order_acquire), n);
}

// Writes the latest number of `s` into its word, which ends every wait for
// it. Only once the recording process can no longer run work on its GPU
// (it has exited, or its GPU context has failed): its queued records never
// run then, and nothing else would write the word. A word already at or
// past the number is left, so a second release, from either process, does
// nothing. The count is read seq_cst: a release for a failed context pairs
// with a record's publish (signal_publish), each side storing before it
// reads, and only seq_cst on both sides rules out each missing the other's
// store.
inline void signal_release(SignalPage& p, SignalId s) {
  const uint64_t n = p.issued[s].load(std::memory_order_seq_cst);
  uint32_t w = p.word[s].load(std::memory_order_acquire);
  while (signal_behind(w, n) &&
         !p.word[s].compare_exchange_weak(w, static_cast<uint32_t>(n), std::memory_order_release,
                                          std::memory_order_acquire)) {
  }
}

// The recording process's own release, alive, of `s` once a CUDA call of
// its returned `cuda_error` (cuda_failure.h): where that error says its GPU
// context has failed (a kernel of its faulted: a device-side assert, an
// illegal address), none of its queued records will ever run, and the
// other process's stream, waiting for one, would hold for good (the other
// side's hangup watch releases only once this process has exited). Returns
// whether it released; any other error leaves the signal as it is.
//
// `context_failed` is this process's word that its context on the page's
// GPU has failed, which it sets first, for good (a failed context never
// recovers): a record another thread of the process has queued but not yet
// published is then released by that thread (signal_publish), since this
// release, reading the count before the publish, stops at the number
// before it.
inline bool signal_release_if_context_failed(SignalPage& p, SignalId s, int cuda_error,
                                             std::atomic<bool>& context_failed) {
  if (!cuda_context_failed_before(cuda_error)) return false;
  context_failed.store(true, std::memory_order_seq_cst);
  signal_release(p, s);
  return true;
}

// The recording process publishes record `n` of `s`, its write of the word
// queued on its stream, and then looks again at `context_failed` (set by
// signal_release_if_context_failed, on any thread): a context that failed
// between the queuing and the publish never runs the record, and the
// release made meanwhile stopped at n - 1, so the publishing thread
// releases n itself; else the other side would wait for it for good. The
// store and the load are seq_cst, as are the release's: of the two
// threads, at least one sees the other's store.
inline void signal_publish(SignalPage& p, SignalId s, uint64_t n, const std::atomic<bool>& context_failed) {
  p.issued[s].store(n, std::memory_order_seq_cst);
  if (context_failed.load(std::memory_order_seq_cst)) signal_release(p, s);
}

}  // namespace zerod
