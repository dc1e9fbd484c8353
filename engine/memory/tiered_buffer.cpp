#include "memory/tiered_buffer.h"

#include "memory/align.h"

#include "error.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace zerod {

AlignedBuffer::AlignedBuffer(uint64_t bytes, uint64_t align) : bytes_(bytes) {
  const uint64_t rounded = (bytes + align - 1) / align * align;
  ptr_ = static_cast<std::byte*>(std::aligned_alloc(align, rounded ? rounded : align));
  if (!ptr_) fail(ZD_ERR_OUT_OF_MEMORY, "cannot allocate " + format_bytes(rounded) + " of staging memory");
  bytes_ = rounded;
}

AlignedBuffer::~AlignedBuffer() { std::free(ptr_); }

AlignedBuffer::AlignedBuffer(AlignedBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
  o.ptr_ = nullptr;
  o.bytes_ = 0;
}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& o) noexcept {
  if (this != &o) {
    std::free(ptr_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}


void TieredBuffer::allocate(const TierSet& tiers, size_t elem_size, const std::vector<TierRun>& runs,
                            zd_mem_kind kind, const std::string& what, const std::string& nvme_what) {
  elem_size_ = elem_size;
  kind_ = kind;
  try {
    for (const TierRun& run : runs) {
      if (run.count == 0) continue;
      Segment s;
      s.begin = count_;
      s.count = run.count;
      s.tier = run.tier;
      s.memory = tiers.memories[static_cast<size_t>(run.tier)];
      if (!s.memory) fail(ZD_ERR_INTERNAL, what + ": no memory object for its tier");
      const uint64_t bytes = run.count * elem_size;
      switch (run.tier) {
        case ZD_TIER_DEVICE:
          s.block = tiers.device->allocate(bytes, kind, what);
          s.ptr = s.block.ptr;
          s.bytes = s.block.bytes;
          break;
        case ZD_TIER_HOST: {
          if (!tiers.host) fail(ZD_ERR_INTERNAL, what + " placed on the host tier, which is not set up");
          s.bytes = align_up(bytes, 64);
          tiers.ledger->charge(ZD_TIER_HOST, kind, s.bytes, what);
          try {
            s.ptr = static_cast<std::byte*>(tiers.host->allocate(s.bytes, what));
          } catch (...) {
            tiers.ledger->release(ZD_TIER_HOST, kind, s.bytes);
            throw;
          }
          // The host tier plugin page-locks its memory itself (its `pin`).
          break;
        }
        default: {
          if (!tiers.nvme) fail(ZD_ERR_INTERNAL, what + " placed on the nvme tier, which is not set up");
          s.bytes = align_up(bytes, tiers.nvme->alignment());
          tiers.ledger->charge(ZD_TIER_NVME, kind, s.bytes, what);
          try {
            s.offset = tiers.nvme->reserve(s.bytes, nvme_what.empty() ? what : nvme_what);
          } catch (...) {
            tiers.ledger->release(ZD_TIER_NVME, kind, s.bytes);
            throw;
          }
          break;
        }
      }
      segments_.push_back(s);
      count_ += run.count;
    }
  } catch (...) {
    release(tiers);
    throw;
  }
}

void TieredBuffer::release(const TierSet& tiers) {
  for (Segment& s : segments_) {
    switch (s.tier) {
      case ZD_TIER_DEVICE: tiers.device->release(s.block, kind_); break;
      case ZD_TIER_HOST:
        tiers.host->release(s.ptr, s.bytes);
        tiers.ledger->release(ZD_TIER_HOST, kind_, s.bytes);
        break;
      default:
        // The budget is given back; the extents stay in the store, which
        // only grows (a tier reserves and never releases), until the store
        // is closed: with the model, or when a finalize fails
        // (Model::finalize), so that a retry starts from an empty store.
        tiers.ledger->release(ZD_TIER_NVME, kind_, s.bytes);
        break;
    }
  }
  segments_.clear();
  count_ = 0;
}

const TieredBuffer::Segment& TieredBuffer::segment_at(uint64_t element) const {
  auto it = std::upper_bound(segments_.begin(), segments_.end(), element,
                             [](uint64_t e, const Segment& s) { return e < s.begin; });
  if (it == segments_.begin() || element >= count_)
    fail(ZD_ERR_INTERNAL, "element " + std::to_string(element) + " is outside a buffer of " +
                              std::to_string(count_));
  return *(it - 1);
}

std::byte* TieredBuffer::addr(uint64_t element) const {
  const Segment& s = segment_at(element);
  return s.ptr ? s.ptr + (element - s.begin) * elem_size_ : nullptr;
}

bool TieredBuffer::addressable(uint64_t begin, uint64_t n) const {
  if (n == 0) return true;
  for (uint64_t e = begin; e < begin + n;) {
    const Segment& s = segment_at(e);
    if (!s.ptr) return false;
    e = s.begin + s.count;
  }
  return true;
}

bool TieredBuffer::in_one_segment(uint64_t begin, uint64_t n) const {
  if (n == 0) return true;
  const Segment& s = segment_at(begin);
  return s.ptr != nullptr && begin + n <= s.begin + s.count;
}

void TieredBuffer::transfer(const TierSet&, uint64_t begin, uint64_t n, void* data, bool write) const {
  auto* out = static_cast<std::byte*>(data);
  for (uint64_t e = begin; e < begin + n;) {
    const Segment& s = segment_at(e);
    const uint64_t take = std::min(begin + n, s.begin + s.count) - e;
    const uint64_t at = (e - s.begin) * elem_size_;
    const uint64_t len = take * elem_size_;
    std::byte* mine = out + (e - begin) * elem_size_;
    if (write)
      s.memory->write(s, at, mine, len);
    else
      s.memory->read(s, at, mine, len);
    e += take;
  }
}

void TieredBuffer::read(const TierSet& tiers, uint64_t begin, uint64_t n, void* dst) const {
  transfer(tiers, begin, n, dst, false);
}

void TieredBuffer::write(const TierSet& tiers, uint64_t begin, uint64_t n, const void* src) {
  transfer(tiers, begin, n, const_cast<void*>(src), true);
}

void TieredBuffer::zero() {
  for (const Segment& s : segments_) s.memory->zero(s.ptr, s.count * elem_size_);
}

}  // namespace zerod
