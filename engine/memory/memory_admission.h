// A gate each rank's planned model state passes at finalize, after the
// job's own budgets and before anything is allocated. A daemon serving
// several jobs charges every rank of every job against the node's memory as
// a whole there (daemon/server/node_memory.h); the engine alone checks only
// the job's own budgets (Placement::check_budgets).
#pragma once

#include <zerod/zerod.h>

#include <array>
#include <cstdint>

namespace zerod {

class MemoryAdmission {
 public:
  virtual ~MemoryAdmission() = default;
  // need: the rank's planned bytes per tier, every kind added up (the table
  // `zerod plan` prints). Throws Error (ZD_ERR_BUDGET) to refuse.
  virtual void admit(int rank, const std::array<uint64_t, ZD_TIER_COUNT>& need) = 0;
  // Gives back what admit() charged for the rank; nothing if it charged nothing.
  virtual void release(int rank) noexcept = 0;
};

}  // namespace zerod
