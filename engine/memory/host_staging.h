// A page-locked host buffer through which data crosses between host memory
// and a device the host cannot address, a chunk at a time.
//
// Why: a copy from or to pageable memory runs at a fraction of the link's
// speed (the driver bounces it through a pinned buffer of its own), and a
// fresh std::vector per copy also pays a page fault per 4 KiB on every use.
// On an H100 the gradients of a 100M-parameter GPT left the device through
// such vectors at 0.5 GB/s, most of a 470 ms offloaded step. This buffer is
// made once, page-locked through the device, charged to the host tier, and
// reused; one user at a time (Lease holds its lock). Where the plan counts
// it (Placement::host_staging) it is made at finalize (reserve()), so the
// host budget refuses it there, with the table, never on the thread that
// moves gradients mid-step; a lease makes it where nothing reserved it.
#pragma once

#include "memory/tiered_buffer.h"

#include <cstdint>
#include <mutex>
#include <string>

namespace zerod {

struct RankResources;

// The sizes of a rank's two staging buffers (Transfers).
inline constexpr uint64_t kGradientStagingBytes = uint64_t{32} << 20;  // gradients leaving the device
inline constexpr uint64_t kWorkingStagingBytes = uint64_t{16} << 20;   // the working copies' upload ring

class HostStaging {
 public:
  HostStaging(RankResources& res, uint64_t bytes, std::string what)
      : res_(res), bytes_(bytes), what_(std::move(what)) {}
  ~HostStaging() { release(); }
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;

  // The buffer, held for one user until the lease goes.
  class Lease {
   public:
    explicit Lease(HostStaging& s) : lock_(s.mu_), data_(s.acquire()), bytes_(s.bytes_) {}
    std::byte* data() const { return data_; }
    uint64_t size() const { return bytes_; }

   private:
    std::unique_lock<std::mutex> lock_;
    std::byte* data_;
    uint64_t bytes_;
  };

  // The buffer made now (charged; ZD_ERR_BUDGET where the host tier's
  // budget refuses it), not at the first lease.
  void reserve();
  // The buffer goes (unregistered, uncharged); the next lease makes it again.
  void release();

 private:
  std::byte* acquire();  // with mu_ held

  RankResources& res_;
  const uint64_t bytes_;
  const std::string what_;
  std::mutex mu_;
  AlignedBuffer buf_;
  bool charged_ = false;
};

}  // namespace zerod
