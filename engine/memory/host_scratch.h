// Host memory for the copies a rank's host code makes of bytes in a pool
// the host cannot address: the host windows of its loops (HostWindow,
// transfers.h) and the comm bounce (Transfers::bounce). One buffer per
// rank, reserved at finalize at the size the plan counts
// (Placement::host_windows, the host row's buffers), charged to the host
// tier as ZD_MEM_BUFFERS and reused by every step; each copy takes a run of
// it while it lives (first fit, 64-byte aligned).
//
// Why: a compressed step on a GPU copies the exchange buffer, the error
// feedback and every operand of its planned passes to the host, several
// times the model's bytes a step. Allocated afresh per copy, no memory
// figure and no budget saw them, and the allocator kept them resident after
// the step, and after the model went. A copy the buffer cannot hold (a
// bounce, which the plan does not size; a layout of the exchange the plan
// did not read) gets memory of its own, charged while it lives, so the host
// budget refuses it then, naming what wanted it. Both are mapped anonymous
// memory, which goes back to the system when released.
#pragma once

#include "memory/ledger.h"

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace zerod {

class HostScratch {
 public:
  // Runs start at multiples of this, as the pool's blocks do, so the host's
  // vector loops take the same paths over a copy as over the bytes.
  static constexpr uint64_t kAlign = 64;

  explicit HostScratch(MemoryLedger& ledger) : ledger_(ledger) {}
  ~HostScratch() { release(); }
  HostScratch(const HostScratch&) = delete;
  HostScratch& operator=(const HostScratch&) = delete;

  // Host bytes while it lives: a run of the reserved buffer, or memory of
  // its own (charged).
  class Lease {
   public:
    Lease() = default;
    ~Lease() { give_back(); }
    Lease(Lease&& o) noexcept { *this = std::move(o); }
    Lease& operator=(Lease&& o) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    std::byte* data() const { return data_; }

   private:
    friend class HostScratch;
    void give_back() noexcept;
    HostScratch* from_ = nullptr;
    std::byte* data_ = nullptr;
    uint64_t bytes_ = 0;  // rounded to kAlign
    bool own_ = false;    // memory of its own, not a run of the buffer
  };

  // The buffer, `bytes` of it (0: none), charged now: ZD_ERR_BUDGET where
  // the host tier's budget refuses it, and then nothing is held. The one
  // reserved before goes first; no lease may be live.
  void reserve(uint64_t bytes);
  // The buffer goes (uncharged, unmapped); where leases are still live it
  // goes when the last of them does.
  void release();
  uint64_t reserved() const;
  // `bytes` of host memory for `what` (named where the budget refuses it).
  Lease take(uint64_t bytes, const std::string& what);

 private:
  // The first gap of the buffer that holds `bytes`, or nullptr (mu_ held).
  std::byte* fit(uint64_t bytes);
  void give_back(const Lease& l) noexcept;
  void unmap_buffer() noexcept;  // mu_ held

  MemoryLedger& ledger_;
  mutable std::mutex mu_;
  std::byte* buf_ = nullptr;
  uint64_t size_ = 0;
  std::map<uint64_t, uint64_t> taken_;  // offset -> bytes of each live run
  bool release_pending_ = false;         // release() came while runs were live
};

}  // namespace zerod
