// The host half of the signals that order a trainer's GPU stream against
// its daemon's (cuda_shared.h, SharedSignals): a page both processes map,
// holding how many times each signal has been recorded. The GPU half is a
// 32-bit word per signal that the recording stream writes the record's
// number into and the waiting stream waits on. Plain C++, so that CI tests
// it without a GPU (device_test).
#pragma once

#include <atomic>
#include <cstdint>

namespace zerod {

// Which signal: zerod's stream records kZerodDone where a local trainer's
// stream would wait for it (after a begin call's copies); the trainer's
// stream records kTrainerDone before each call (device.h, StreamLink).
enum SignalId : int { kZerodDone = 0, kTrainerDone = 1, kSignalCount = 2 };

// The shared page's layout. Each count has one writer, the process that
// records the signal; the other only reads it.
struct SignalCounts {
  std::atomic<uint64_t> issued[kSignalCount];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "the counts are shared between processes");

// The bytes of the page (a memfd of exactly this size, sealed against
// resizing).
constexpr uint64_t kSignalPageBytes = 4096;
static_assert(sizeof(SignalCounts) <= kSignalPageBytes);

// The GPU's word holds a record's number modulo 2^32, and a wait is for the
// cyclic comparison CUDA makes (cuStreamWaitValue32's default): (int32)(word
// - number) >= 0. Whether a word that reads `word` is still behind record
// `number`, by that comparison: true until the record (or a release) has
// written it, whatever 2^32 wraps have passed.
inline bool signal_behind(uint32_t word, uint64_t number) {
  return static_cast<int32_t>(word - static_cast<uint32_t>(number)) < 0;
}

}  // namespace zerod
