#include "memory/host_staging.h"

#include "model/rank_resources.h"

namespace zerod {

std::byte* HostStaging::acquire() {
  if (buf_.data()) return buf_.data();
  res_.ledger.charge(ZD_TIER_HOST, ZD_MEM_BUFFERS, bytes_, what_);
  charged_ = true;
  try {
    buf_ = AlignedBuffer(bytes_, 4096);
    res_.device->register_host(buf_.data(), buf_.size());  // a warning, not a failure, where it cannot
  } catch (...) {
    buf_ = AlignedBuffer();
    res_.ledger.release(ZD_TIER_HOST, ZD_MEM_BUFFERS, bytes_);
    charged_ = false;
    throw;
  }
  return buf_.data();
}

void HostStaging::reserve() {
  std::lock_guard<std::mutex> lock(mu_);
  acquire();
}

void HostStaging::release() {
  std::lock_guard<std::mutex> lock(mu_);
  if (buf_.data() && res_.device) res_.device->unregister_host(buf_.data());
  buf_ = AlignedBuffer();
  if (charged_) res_.ledger.release(ZD_TIER_HOST, ZD_MEM_BUFFERS, bytes_);
  charged_ = false;
}

}  // namespace zerod
