// What `zerod plan` works out, apart from reading its arguments and writing
// its report: the device the plan is for, the model laid out on it by the
// engine's own code (the job's placement() included, nothing allocated),
// every rank's needs with identical ranks together, and whether finalize
// would take them. Nothing of what the job writes or serves is opened
// (snapshots, trace, metrics), and the local comm plugin stands in for the
// job's: a plan runs no collectives.
//
// Planning for a GPU without one. The layout depends on three things of the
// device, none of which needs the device itself: whether the host can
// address its memory (if not, gradients of a window accumulate on the
// device, and page-locked staging buffers are reserved in host memory:
// Placement::decide_window, host_staging), how it rounds its blocks
// (Device::block_align), and its budget. Where this machine sees no GPU (or
// --device-memory describes another one), a cuda plan runs on the emulated
// device, which is exactly a device the host cannot address with a GPU's
// rounding, answering as the cuda device would where that decides a
// refusal (its name, whether the optimizer has CUDA kernels). Its figures
// are the emulated device's ledger after finalize, cell by cell
// (cli.JobPlan.* in tests/daemon/job_plan_test.cpp). The budget a GPU
// chooses itself (kDefaultBudgetShare of its free memory, when the job sets
// none) is the one thing a plan cannot know without the GPU: the user says
// it with --device-memory, or the plan says it assumed none.
#pragma once

#include "job_script.h"
#include "memory/placement.h"

#include <cstdint>
#include <string>
#include <vector>

namespace zerod::cli {

// One row of a model description.
struct PlannedTensor {
  std::string name, module;
  std::vector<int64_t> shape;
};

// The device to plan for.
struct PlanTarget {
  // "cpu", "cuda", "auto" or "emulated", as the job's `device`; "" = the
  // job's own.
  std::string device;
  // The free memory of each rank's GPU (one GPU per rank) when the job
  // starts; 0 = not given. Only for cuda, which it then plans without
  // opening a GPU even where there is one.
  uint64_t device_memory = 0;
};

// Ranks whose needs and budgets are the same, in rank order.
struct RankGroup {
  std::vector<int> ranks;
  TierPlan plan;
};

struct JobPlan {
  uint64_t numel = 0;         // parameters in all
  std::string device;                     // the device the plan assumed
  std::vector<std::string> device_notes;  // why that one, how it was planned, its budget
  std::vector<RankGroup> groups;  // every rank in one of them, by first rank
  // Each cell's most over every rank, against each tier's smallest budget:
  // what finalize holds to the budgets on every rank (check_budgets).
  TierPlan worst;
  bool worst_is_a_rank = true;  // worst is one of the groups' plans
  bool fits = false;
};

// Lays out `tensors` (registered in order, in the job's precision) for a
// job of `world` ranks on the target device and plans every rank. Throws
// zerod::Error (ZD_ERR_CONFIG) for what finalize would refuse before it
// counts, and for a target the job or this machine cannot plan.
JobPlan plan_job(scripting::JobScript& script, int world, const std::vector<PlannedTensor>& tensors,
                 const PlanTarget& target);

// "rank 3", "ranks 0-2", "ranks 0, 2-3, 5".
std::string rank_list(const std::vector<int>& ranks);

}  // namespace zerod::cli
