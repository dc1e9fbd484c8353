// A rank's buffer of one kind — the fp32 masters of a parameter group, an
// optimizer state slot, the rank's stage-3 parameter shards, the gradient
// accumulators — as consecutive segments, each in one tier: the device pool
// (reached through the rank's Device), host memory (the CPU points at it),
// or NVMe (a reserved extent of the rank's store, reached through I/O).
// Where each segment lives is the placement policy's decision; the buffer
// holds the bytes and charges the rank's ledger for them, and each segment
// carries the memory object that works on its bytes (memory.h).
#pragma once

#include "memory/arena.h"
#include "device/device.h"
#include "memory/ledger.h"
#include "memory/memory.h"
#include "observe/probe.h"
#include "runtime/plugin_host.h"

#include <zerod/zerod.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace zerod {

// The tiers of one rank. host and nvme may be null when the job does not
// use them.
struct TierSet {
  Device* device = nullptr;
  TierInstance* host = nullptr;
  TierInstance* nvme = nullptr;
  MemoryLedger* ledger = nullptr;
  const observe::RankProbe* probe = nullptr;  // NVMe transfers are counted and traced here
  // The memory of each tier (by zd_tier), which segments placed there carry.
  std::array<Memory*, ZD_TIER_COUNT> memories{};
};

// A run of elements that lives in one tier.
struct TierRun {
  uint64_t count;
  zd_tier tier;
};

class TieredBuffer {
 public:
  using Segment = BufferSegment;

  TieredBuffer() = default;
  TieredBuffer(TieredBuffer&&) noexcept = default;
  TieredBuffer& operator=(TieredBuffer&&) noexcept = default;

  // Allocates the runs in order, zero-filled. On failure releases what it
  // took and throws naming `what` and the tier. An NVMe run's reservation
  // is named `nvme_what` when given (the nvme tier names the rank itself,
  // so a `what` that does would name it twice), else `what`.
  void allocate(const TierSet& tiers, size_t elem_size, const std::vector<TierRun>& runs,
                zd_mem_kind kind, const std::string& what, const std::string& nvme_what = {});
  void release(const TierSet& tiers);

  bool empty() const { return segments_.empty(); }
  uint64_t count() const { return count_; }
  const std::vector<Segment>& segments() const { return segments_; }
  const Segment& segment_at(uint64_t element) const;

  // The address of an element in a memory segment (device or host); nullptr
  // on NVMe. A device-tier address is the device's: the host may use it
  // only where the device is host-addressable.
  std::byte* addr(uint64_t element) const;
  // Whether [begin, begin + n) lies in memory segments only (not on NVMe).
  // Each segment is an allocation of its own: addr(begin) reaches the whole
  // range only where it is also in_one_segment.
  bool addressable(uint64_t begin, uint64_t n) const;
  // Whether [begin, begin + n) lies in one memory segment, so that the n
  // elements from addr(begin) are its own. A tier boundary falls on a
  // granule of elements, not between tensors (Placement::tier_runs), so a
  // tensor's range may end in the segment after the one it starts in.
  bool in_one_segment(uint64_t begin, uint64_t n) const;

  // Copies elements out of and into the buffer, whatever their tiers: each
  // segment's memory copies its part (the device for the device tier;
  // synchronous I/O for NVMe, through an aligned bounce buffer).
  void read(const TierSet& tiers, uint64_t begin, uint64_t n, void* dst) const;
  void write(const TierSet& tiers, uint64_t begin, uint64_t n, const void* src);
  // Every element zero, each segment by its memory (the device's fill in
  // the pool, the host's in host memory; NVMe refuses).
  void zero();

 private:
  void transfer(const TierSet& tiers, uint64_t begin, uint64_t n, void* data, bool write) const;

  std::vector<Segment> segments_;
  uint64_t count_ = 0;
  size_t elem_size_ = 4;
  zd_mem_kind kind_ = ZD_MEM_BUFFERS;
};

// Memory aligned for O_DIRECT transfers, from the heap (host staging).
struct AlignedBuffer {
  AlignedBuffer() = default;
  AlignedBuffer(uint64_t bytes, uint64_t align);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& o) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept;
  std::byte* data() const { return ptr_; }
  uint64_t size() const { return bytes_; }

 private:
  std::byte* ptr_ = nullptr;
  uint64_t bytes_ = 0;
};

}  // namespace zerod
