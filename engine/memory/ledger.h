// Byte accounting for one rank: every allocation of model state is charged
// here by tier and kind, so memory figures are measured rather than assumed.
// A tier may have a budget; charging past it fails before anything is
// allocated, naming what wanted the bytes.
#pragma once

#include <zerod/kit/text.h>
#include <zerod/zerod.h>

#include <array>
#include <cstdint>
#include <limits>
#include <mutex>
#include <string>

namespace zerod {

const char* tier_name(zd_tier tier);       // "device", "host", "nvme"
const char* mem_kind_name(zd_mem_kind k);  // "params", "grads", ...

class MemoryLedger {
 public:
  static constexpr uint64_t kNoBudget = std::numeric_limits<uint64_t>::max();

  void set_budget(zd_tier tier, uint64_t bytes);
  uint64_t budget(zd_tier tier) const;

  // Charges bytes, or throws ZD_ERR_BUDGET naming `what` if the tier's budget
  // would be exceeded. Nothing is charged on failure.
  void charge(zd_tier tier, zd_mem_kind kind, uint64_t bytes, const std::string& what);
  void release(zd_tier tier, zd_mem_kind kind, uint64_t bytes);

  uint64_t current(zd_tier tier, zd_mem_kind kind) const;  // kind may be ZD_MEM_ALL
  uint64_t peak(zd_tier tier, zd_mem_kind kind) const;     // kind may be ZD_MEM_ALL

  // The most each tier held since the previous call (since the ledger was
  // made, the first time); the count then starts again from what each holds
  // now. The trace's memory counter takes it at every sample, so a buffer
  // allocated and freed between two samples still shows.
  std::array<uint64_t, ZD_TIER_COUNT> take_peaks_since_last();

 private:
  mutable std::mutex mu_;
  std::array<std::array<uint64_t, ZD_MEM_KIND_COUNT>, ZD_TIER_COUNT> current_{};
  std::array<std::array<uint64_t, ZD_MEM_KIND_COUNT>, ZD_TIER_COUNT> peak_{};
  std::array<uint64_t, ZD_TIER_COUNT> tier_current_{};
  std::array<uint64_t, ZD_TIER_COUNT> tier_peak_{};
  std::array<uint64_t, ZD_TIER_COUNT> tier_peak_since_last_{};
  std::array<uint64_t, ZD_TIER_COUNT> budget_{kNoBudget, kNoBudget, kNoBudget};
};

// format_bytes ("1.50 GiB", "512 B", for messages and tables) is the kit's,
// zerod/kit/text.h, included above.

}  // namespace zerod
