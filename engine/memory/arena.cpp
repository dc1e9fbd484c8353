#include "memory/arena.h"

#include "error.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace zerod {

namespace {
constexpr uint64_t kPage = 4096;
}

SharedArena::SharedArena(int32_t id, uint64_t bytes, const std::string& name)
    : id_(id), size_((bytes + kPage - 1) / kPage * kPage) {
  fd_ = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ZD_CHECK_SYS(fd_, "memfd_create for the device pool arena '" + name + "'");
  if (ftruncate(fd_, static_cast<off_t>(size_)) == -1) {
    const int err = errno;
    close(fd_);
    fail(ZD_ERR_OUT_OF_MEMORY, "sizing the device pool arena '" + name + "' to " +
                                   format_bytes(size_) + ": " + errno_text(err));
  }
  // Sealed so a peer that maps it can trust its size.
  fcntl(fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  void* p = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    close(fd_);
    fail(ZD_ERR_OUT_OF_MEMORY, "mapping the device pool arena '" + name + "' (" +
                                   format_bytes(size_) + "): " + errno_text(err));
  }
  base_ = static_cast<std::byte*>(p);
  // The optimizer streams its state through here once per step; with 4 KiB
  // pages every 4 KiB of each stream misses the TLB. Shared memory takes
  // the advice where the kernel's shmem_enabled is advise or within_size
  // (Debian's default is never: then this changes nothing). The host tier
  // asks the same for its anonymous memory (its huge_pages). Advice only:
  // a kernel without THP refuses it and the arena works in 4 KiB pages.
  madvise(p, size_, MADV_HUGEPAGE);
}

SharedArena::~SharedArena() {
  if (base_) munmap(base_, size_);
  if (fd_ >= 0) close(fd_);
}

RangeHeap::RangeHeap(uint64_t size) : size_(size) { free_.emplace(0, size); }

bool RangeHeap::allocate(uint64_t bytes, uint64_t align, uint64_t* offset) {
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    const uint64_t start = (it->first + align - 1) / align * align;
    const uint64_t end = it->first + it->second;
    if (start + bytes > end) continue;
    const uint64_t head = start - it->first;
    const uint64_t tail = end - (start + bytes);
    const uint64_t head_off = it->first;
    free_.erase(it);
    if (head) free_.emplace(head_off, head);
    if (tail) free_.emplace(start + bytes, tail);
    *offset = start;
    return true;
  }
  return false;
}

void RangeHeap::release(uint64_t offset, uint64_t bytes) {
  auto next = free_.lower_bound(offset);
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      bytes += prev->second;
      free_.erase(prev);
    }
  }
  if (next != free_.end() && offset + bytes == next->first) {
    bytes += next->second;
    free_.erase(next);
  }
  free_.emplace(offset, bytes);
}

bool RangeHeap::empty() const { return free_.size() == 1 && free_.begin()->second == size_; }

uint64_t PageUse::mark(uint64_t first, uint64_t end) {
  uint64_t fresh = 0;
  for (uint64_t p = first; p < end; ++p) {
    const uint64_t bit = uint64_t{1} << (p % 64);
    fresh += (resident_[p / 64] & bit) ? 0 : 1;
    resident_[p / 64] |= bit;
    this_step_[p / 64] |= bit;
  }
  return fresh;
}

uint64_t PageUse::give_back_unused(uint64_t first, uint64_t end,
                                   const std::function<bool(uint64_t, uint64_t)>& give_back) {
  uint64_t given = 0;
  uint64_t p = first;
  while (p < end) {
    if (p % 64 == 0 && !unused_word(p / 64)) {  // 64 pages at once: most of a free range
      p += 64;
      continue;
    }
    if (!unused(p)) {
      ++p;
      continue;
    }
    const uint64_t run = p;
    while (p < end && unused(p)) ++p;
    if (!give_back(run, p)) continue;
    for (uint64_t q = run; q < p; ++q) resident_[q / 64] &= ~(uint64_t{1} << (q % 64));
    given += p - run;
  }
  return given;
}

DevicePool::DevicePool(MemoryLedger& ledger, uint64_t chunk_bytes, std::string name)
    : ledger_(ledger), chunk_bytes_(chunk_bytes), name_(std::move(name)) {}

DevicePool::~DevicePool() = default;

Block DevicePool::allocate(uint64_t bytes, zd_mem_kind kind, const std::string& what, bool zero_fill) {
  const uint64_t size = round_up(bytes == 0 ? 1 : bytes);
  ledger_.charge(ZD_TIER_DEVICE, kind, size, what);
  try {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& c : chunks_) {
      uint64_t off = 0;
      if (c.heap.allocate(size, kAlign, &off)) {
        handed_out(c, off, size);
        std::byte* p = c.arena->base() + off;
        if (zero_fill) std::memset(p, 0, size);
        return Block{p, size, c.arena->id(), off};
      }
    }
    // A new arena: a whole chunk, or exactly the request when it is larger.
    const auto id = static_cast<int32_t>(chunks_.size());
    const uint64_t arena_bytes = size > chunk_bytes_ ? size : chunk_bytes_;
    auto arena = std::make_unique<SharedArena>(id, arena_bytes,
                                               name_ + "-" + std::to_string(id));
    const uint64_t pages = arena->size() / kPage;
    chunks_.push_back(Chunk{std::move(arena), RangeHeap(arena_bytes), PageUse(pages)});
    Chunk& chunk = chunks_.back();
    uint64_t off = 0;
    chunk.heap.allocate(size, kAlign, &off);
    handed_out(chunk, off, size);
    // Fresh memfd pages read as zero: no memset needed.
    return Block{chunk.arena->base() + off, size, id, off};
  } catch (...) {
    ledger_.release(ZD_TIER_DEVICE, kind, size);
    throw;
  }
}

void DevicePool::release(const Block& block, zd_mem_kind kind) {
  if (!block) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    chunks_.at(static_cast<size_t>(block.arena)).heap.release(block.offset, block.bytes);
  }
  ledger_.release(ZD_TIER_DEVICE, kind, block.bytes);
}

void DevicePool::handed_out(Chunk& chunk, uint64_t offset, uint64_t size) {
  resident_pages_ += chunk.pages.mark(offset / kPage, (offset + size + kPage - 1) / kPage);
}

void DevicePool::end_step() {
  std::lock_guard<std::mutex> lock(mu_);
  for (Chunk& c : chunks_) {
    for (const auto& [offset, length] : c.heap.free_ranges()) {
      // Whole pages only: a page a live block shares keeps its bytes.
      const uint64_t first = (offset + kPage - 1) / kPage;
      const uint64_t end = (offset + length) / kPage;
      if (first < end && can_punch_)
        resident_pages_ -= c.pages.give_back_unused(first, end, [&](uint64_t a, uint64_t b) { return punch(c, a, b); });
    }
    c.pages.new_step();
  }
}

bool DevicePool::punch(const Chunk& chunk, uint64_t first, uint64_t end) {
  if (!can_punch_) return false;
  // The memfd's pages go for every process that maps it (the daemon's
  // trainers too); a free range is no block's, so nobody reads them.
  if (fallocate(chunk.arena->fd(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(first * kPage),
                static_cast<off_t>((end - first) * kPage)) == 0)
    return true;
  can_punch_ = false;  // a kernel without hole punching in shmem: keep the pages
  return false;
}

uint64_t DevicePool::resident_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return resident_pages_ * kPage;
}

std::vector<const SharedArena*> DevicePool::arenas() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<const SharedArena*> out;
  for (const auto& c : chunks_) out.push_back(c.arena.get());
  return out;
}

}  // namespace zerod
