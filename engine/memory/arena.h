// Shared-memory arenas and the device pool of a CPU rank.
//
// A CPU rank's "device" memory is a bounded pool of memfd arenas. They are
// shared mappings so that, in daemon mode, the daemon can pass their fds to a
// trainer once (SCM_RIGHTS) and a tensor view becomes (arena, offset, length):
// no tensor bytes travel through the socket. The pool's bound is the ledger's
// device budget, so a model that would not fit a GPU of that size does not fit
// here either.
#pragma once

#include "memory/ledger.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace zerod {

// A piece of memory in some tier. arena/offset locate it inside a shared
// arena (arena -1 when it is not in one).
struct Block {
  std::byte* ptr = nullptr;
  uint64_t bytes = 0;
  int32_t arena = -1;
  uint64_t offset = 0;

  explicit operator bool() const { return ptr != nullptr; }
  template <typename T>
  T* as() const { return reinterpret_cast<T*>(ptr); }
};

// One memfd mapping, sealed at its size.
class SharedArena {
 public:
  SharedArena(int32_t id, uint64_t bytes, const std::string& name);
  ~SharedArena();
  SharedArena(const SharedArena&) = delete;
  SharedArena& operator=(const SharedArena&) = delete;

  int32_t id() const { return id_; }
  int fd() const { return fd_; }
  std::byte* base() const { return base_; }
  uint64_t size() const { return size_; }

 private:
  int32_t id_;
  int fd_ = -1;
  std::byte* base_ = nullptr;
  uint64_t size_ = 0;
};

// First-fit allocation of aligned ranges inside one arena, coalescing frees.
class RangeHeap {
 public:
  explicit RangeHeap(uint64_t size);
  bool allocate(uint64_t bytes, uint64_t align, uint64_t* offset);
  void release(uint64_t offset, uint64_t bytes);
  bool empty() const;  // nothing allocated
  const std::map<uint64_t, uint64_t>& free_ranges() const { return free_; }  // offset -> length

 private:
  uint64_t size_;
  std::map<uint64_t, uint64_t> free_;  // offset -> length
};

// Which pages of one arena blocks were handed out over: since the pool last
// gave them back (those it may hold resident), and during the current step.
// A bit a page in each.
class PageUse {
 public:
  explicit PageUse(uint64_t pages) : resident_((pages + 63) / 64, 0), this_step_(resident_.size(), 0) {}
  // Pages [first, end) were handed out; returns how many were not resident.
  uint64_t mark(uint64_t first, uint64_t end);
  // For each run of resident pages in [first, end) that no block used this
  // step: give_back(run_first, run_end); a run it gave back (true) is no
  // longer resident. Returns the pages given back.
  uint64_t give_back_unused(uint64_t first, uint64_t end, const std::function<bool(uint64_t, uint64_t)>& give_back);
  void new_step() { std::fill(this_step_.begin(), this_step_.end(), 0); }

 private:
  uint64_t unused_word(uint64_t w) const { return resident_[w] & ~this_step_[w]; }
  bool unused(uint64_t page) const { return (unused_word(page / 64) >> (page % 64)) & 1; }
  std::vector<uint64_t> resident_;
  std::vector<uint64_t> this_step_;
};

// A rank's "device" memory on the cpu device. Freed blocks' pages stay
// resident while steps reuse them: a step frees its short-lived blocks
// (gathered parameters, reduce buffers) and the next allocates them again.
// Giving pages back at every release faulted them in again each step (2
// ranks of four 4 MiB fp32 layers: the daemon's CPU time per step 26 -> 64
// ms at stage 2, 36 -> 120 ms at stage 3), and so did giving back what
// passed the peak (stage 3, optimizer on the host, 8 MiB layers: 77 -> 98
// ms), because a step's blocks spread over more pages than they hold at
// once. So at the end of each step (end_step) the pool gives back to the
// system only the free pages no block used during that step (punched out
// of their memfd): what first fit spread over in an earlier step, what
// finalize needed once. It then holds its live blocks' pages and the
// step's: 84 MiB at an 80 MiB ledger peak in that stage-3 job (88 MiB
// before), 104 at 96 MiB with the optimizer on the host (112 before).
class DevicePool {
 public:
  static constexpr uint64_t kAlign = 64;  // a cache line; AVX-512 vector width

  DevicePool(MemoryLedger& ledger, uint64_t chunk_bytes, std::string name);
  ~DevicePool();

  // Zero-filled (unless !zero_fill: the caller overwrites every byte),
  // kAlign-aligned. Throws ZD_ERR_BUDGET (naming `what`) past the device
  // budget, ZD_ERR_OUT_OF_MEMORY if the system refuses.
  Block allocate(uint64_t bytes, zd_mem_kind kind, const std::string& what, bool zero_fill = true);
  void release(const Block& block, zd_mem_kind kind);
  // The rank's step ended: the free pages no block used in it go back.
  void end_step();

  // Arenas in creation order (ids are indices). The daemon shares them.
  std::vector<const SharedArena*> arenas() const;

  // The arenas' pages blocks were handed out over and not given back since:
  // an upper bound of what the pool holds resident.
  uint64_t resident_bytes() const;

 private:
  struct Chunk {
    std::unique_ptr<SharedArena> arena;
    RangeHeap heap;
    PageUse pages;
  };
  static uint64_t round_up(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }
  // Under mu_: a block of `size` bytes at `offset` of the chunk was handed out.
  void handed_out(Chunk& chunk, uint64_t offset, uint64_t size);
  // Under mu_: punches pages [first, end) out of the chunk's memfd.
  bool punch(const Chunk& chunk, uint64_t first, uint64_t end);

  MemoryLedger& ledger_;
  uint64_t chunk_bytes_;
  std::string name_;
  mutable std::mutex mu_;
  std::vector<Chunk> chunks_;
  uint64_t resident_pages_ = 0;  // the chunks' resident pages together
  bool can_punch_ = true;        // false once the system refused a punch
};

}  // namespace zerod
