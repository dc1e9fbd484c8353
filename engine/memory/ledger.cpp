#include "memory/ledger.h"

#include "error.h"

#include <algorithm>

namespace zerod {

const char* tier_name(zd_tier tier) {
  switch (tier) {
    case ZD_TIER_DEVICE: return "device";
    case ZD_TIER_HOST: return "host";
    case ZD_TIER_NVME: return "nvme";
    default: return "invalid";
  }
}

const char* mem_kind_name(zd_mem_kind k) {
  switch (k) {
    case ZD_MEM_ALL: return "all";
    case ZD_MEM_PARAMS: return "params";
    case ZD_MEM_GRADS: return "grads";
    case ZD_MEM_MASTER: return "master";
    case ZD_MEM_OPTIMIZER: return "optimizer";
    case ZD_MEM_BUFFERS: return "buffers";
    default: return "invalid";
  }
}

void MemoryLedger::set_budget(zd_tier tier, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  budget_.at(static_cast<size_t>(tier)) = bytes;
}

uint64_t MemoryLedger::budget(zd_tier tier) const {
  std::lock_guard<std::mutex> lock(mu_);
  return budget_.at(static_cast<size_t>(tier));
}

void MemoryLedger::charge(zd_tier tier, zd_mem_kind kind, uint64_t bytes, const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto t = static_cast<size_t>(tier);
  const auto k = static_cast<size_t>(kind);
  const uint64_t held = tier_current_.at(t);
  if (budget_[t] != kNoBudget && bytes > budget_[t] - std::min(held, budget_[t])) {
    fail(ZD_ERR_BUDGET, std::string(what) + " needs " + format_bytes(bytes) + " in the " +
                            tier_name(tier) + " tier, which holds " + format_bytes(held) +
                            " of its " + format_bytes(budget_[t]) + " budget");
  }
  current_[t].at(k) += bytes;
  peak_[t][k] = std::max(peak_[t][k], current_[t][k]);
  tier_current_[t] += bytes;
  tier_peak_[t] = std::max(tier_peak_[t], tier_current_[t]);
  tier_peak_since_last_[t] = std::max(tier_peak_since_last_[t], tier_current_[t]);
}

void MemoryLedger::release(zd_tier tier, zd_mem_kind kind, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto t = static_cast<size_t>(tier);
  const auto k = static_cast<size_t>(kind);
  current_[t].at(k) -= std::min(bytes, current_[t][k]);
  tier_current_[t] -= std::min(bytes, tier_current_[t]);
}

uint64_t MemoryLedger::current(zd_tier tier, zd_mem_kind kind) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto t = static_cast<size_t>(tier);
  return kind == ZD_MEM_ALL ? tier_current_.at(t) : current_.at(t).at(static_cast<size_t>(kind));
}

uint64_t MemoryLedger::peak(zd_tier tier, zd_mem_kind kind) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto t = static_cast<size_t>(tier);
  return kind == ZD_MEM_ALL ? tier_peak_.at(t) : peak_.at(t).at(static_cast<size_t>(kind));
}

std::array<uint64_t, ZD_TIER_COUNT> MemoryLedger::take_peaks_since_last() {
  std::lock_guard<std::mutex> lock(mu_);
  const std::array<uint64_t, ZD_TIER_COUNT> peaks = tier_peak_since_last_;
  tier_peak_since_last_ = tier_current_;
  return peaks;
}

}  // namespace zerod
