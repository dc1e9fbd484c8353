// A gate a model's planned state passes at finalize, after the job's own
// budgets and before anything is allocated. A daemon serving several jobs
// charges each model against the node's memory as a whole there
// (daemon/server/node_memory.h): all of the model's ranks on the node or
// none, so that two jobs started at once cannot each get part of their
// ranks in and then hold that memory, failing both, while the node had room
// for one. The engine alone checks only the job's own budgets
// (Placement::check_budgets).
#pragma once

#include <zerod/zerod.h>

#include <array>
#include <cstdint>
#include <map>

namespace zerod {

// A rank's planned bytes per tier, every kind added up (the table `zerod
// plan` prints).
using TierBytes = std::array<uint64_t, ZD_TIER_COUNT>;

class MemoryAdmission {
 public:
  virtual ~MemoryAdmission() = default;
  // Every local rank calls it at finalize. local_needs: what each of the
  // model's ranks in this process needs, by rank (the same on every call).
  // The first rank to arrive charges all of them at once; the others share
  // its answer. Throws Error (ZD_ERR_BUDGET) to refuse.
  virtual void admit(int rank, const std::map<int, TierBytes>& local_needs) = 0;
  // The rank no longer holds its state (its finalize failed, or the model
  // goes): the model's charge is given back once no rank holds it. Nothing
  // if the rank holds nothing.
  virtual void release(int rank) noexcept = 0;
};

}  // namespace zerod
