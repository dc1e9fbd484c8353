#include "memory/host_scratch.h"

#include "error.h"
#include "memory/align.h"

#include <sys/mman.h>

#include <utility>

namespace zerod {

namespace {

// Anonymous pages, which munmap gives back to the system at once: the
// heap's free lists would keep a step's copies resident after it.
std::byte* map_bytes(uint64_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) fail(ZD_ERR_OUT_OF_MEMORY, "cannot map " + format_bytes(bytes) + " of host memory");
  return static_cast<std::byte*>(p);
}

void unmap_bytes(std::byte* p, uint64_t bytes) noexcept {
  if (p) munmap(p, bytes);
}

}  // namespace

HostScratch::Lease& HostScratch::Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    give_back();
    from_ = std::exchange(o.from_, nullptr);
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    own_ = std::exchange(o.own_, false);
  }
  return *this;
}

void HostScratch::Lease::give_back() noexcept {
  if (from_) from_->give_back(*this);
  from_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
  own_ = false;
}

void HostScratch::reserve(uint64_t bytes) {
  bytes = align_up(bytes, kAlign);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!taken_.empty()) fail(ZD_ERR_INTERNAL, "the host scratch was reserved again while copies held runs of it");
    if (bytes == size_ && !release_pending_) return;
  }
  release();
  if (bytes == 0) return;
  ledger_.charge(ZD_TIER_HOST, ZD_MEM_BUFFERS, bytes,
                 "the host copies of bytes in the device pool (a compressed step's exchange, error feedback and "
                 "optimizer operands)");
  std::byte* p = nullptr;
  try {
    p = map_bytes(bytes);
  } catch (...) {
    ledger_.release(ZD_TIER_HOST, ZD_MEM_BUFFERS, bytes);
    throw;
  }
  std::lock_guard<std::mutex> lock(mu_);
  buf_ = p;
  size_ = bytes;
}

void HostScratch::release() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!taken_.empty()) {
    release_pending_ = true;
    return;
  }
  unmap_buffer();
}

void HostScratch::unmap_buffer() noexcept {
  release_pending_ = false;
  if (!buf_) return;
  unmap_bytes(buf_, size_);
  ledger_.release(ZD_TIER_HOST, ZD_MEM_BUFFERS, size_);
  buf_ = nullptr;
  size_ = 0;
}

uint64_t HostScratch::reserved() const {
  std::lock_guard<std::mutex> lock(mu_);
  return size_;
}

std::byte* HostScratch::fit(uint64_t bytes) {
  if (!buf_ || release_pending_) return nullptr;
  uint64_t at = 0;
  for (const auto& [off, len] : taken_) {
    if (off - at >= bytes) break;
    at = off + len;
  }
  if (at > size_ || size_ - at < bytes) return nullptr;
  taken_.emplace(at, bytes);
  return buf_ + at;
}

HostScratch::Lease HostScratch::take(uint64_t bytes, const std::string& what) {
  Lease l;
  if (bytes == 0) return l;
  l.bytes_ = align_up(bytes, kAlign);
  {
    std::lock_guard<std::mutex> lock(mu_);
    l.data_ = fit(l.bytes_);
  }
  if (!l.data_) {
    // Beyond what the plan reserved: charged while it lives, so a host
    // budget that cannot hold it refuses here.
    ledger_.charge(ZD_TIER_HOST, ZD_MEM_BUFFERS, l.bytes_, what + " (a host copy beyond the reserved host scratch)");
    try {
      l.data_ = map_bytes(l.bytes_);
    } catch (...) {
      ledger_.release(ZD_TIER_HOST, ZD_MEM_BUFFERS, l.bytes_);
      throw;
    }
    l.own_ = true;
  }
  l.from_ = this;
  return l;
}

void HostScratch::give_back(const Lease& l) noexcept {
  if (l.own_) {
    unmap_bytes(l.data_, l.bytes_);
    ledger_.release(ZD_TIER_HOST, ZD_MEM_BUFFERS, l.bytes_);
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  taken_.erase(static_cast<uint64_t>(l.data_ - buf_));
  if (taken_.empty() && release_pending_) unmap_buffer();
}

}  // namespace zerod
