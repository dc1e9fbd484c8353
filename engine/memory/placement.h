// Where a model's state lives: the tier of each parameter's stage-3 shard,
// master copy and optimizer state (the job's placement policy, else the
// offload table's defaults and ratio), the tier runs of every rank's
// buffers, where gradients accumulate, and what each tier must hold — the
// figure finalize checks against the budgets before anything is allocated
// and `zerod plan` prints.
#pragma once

#include "model/job_config.h"
#include "memory/arena.h"
#include "memory/host_staging.h"
#include "memory/ledger.h"
#include "memory/saturating.h"
#include "model/model_context.h"
#include "memory/tiered_buffer.h"

#include <zerod/zerod.h>

#include <array>
#include <atomic>
#include <string>
#include <vector>

namespace zerod {

// What a rank's buffer holds, for its tier runs.
enum class Holds { Params, Master, Optimizer };

// Bytes per tier and kind that one rank needs: [tier][kind]. A tier's
// total adds its kinds with saturating_add: a plan's cells can each fit in
// 64 bits where their sum does not.
using NeedTable = std::vector<std::array<uint64_t, ZD_MEM_KIND_COUNT>>;

struct TierPlan {
  NeedTable need;
  std::array<uint64_t, ZD_TIER_COUNT> budget{};
};

class Placement {
 public:
  // policy may be null; it is not owned.
  Placement(const ModelContext& ctx, JobPolicy* policy) : ctx_(ctx), policy_(policy) {}

  // Asks the policy once per parameter and kind (the parameters are
  // registered; the registry is laid out after, by state_class()). Called
  // once, so every rank places alike. Throws ZD_ERR_CONFIG listing every
  // tensor that cannot go where it was placed; warns where offload.ratio < 1
  // splits nothing (it applies to offload.optimizer's masters and state,
  // never to the stage-3 parameter shards). host_addressable: whether the
  // ranks' device is memory the host writes (the cpu device); where it is
  // not, the ratio moves whole tensors (apply_ratio_by_tensor).
  void decide(bool host_addressable = true);
  // The layout's group class of a parameter (LayoutPolicy::group_class):
  // on a device the host cannot address, a group's gradients have one tier
  // and its optimizer work is wholly on the device or wholly off it, so the
  // parameters whose masters stay on the device (by the ratio or the job's
  // placement()) form groups of their own: 1 for those, 0 for the rest;
  // always 0 on a host-addressable device (one group per working dtype).
  int state_class(size_t param) const {
    return !host_addressable_ && entries_[param].master == ZD_TIER_DEVICE ? 1 : 0;
  }

  // The tier runs of one of a rank's buffers of a group, in element order.
  std::vector<TierRun> tier_runs(size_t group, int rank, Holds what) const;
  // Where the rank's gradient accumulators of a group live: in the device
  // tier while the group's optimizer runs there; otherwise they leave the
  // device as they are produced and accumulate in host memory, next to the
  // optimizer (NVMe-resident state reads its gradients from there too).
  zd_tier grad_tier(size_t group, int rank) const;
  // Whether any of the rank's state uses the tier.
  bool uses(int rank, zd_tier tier) const;
  // offload.accumulate, decided once (after decide(), with the device's
  // budget and a rank of this process): whether stages 2-3 accumulate the micro-batches before a
  // window's last in a device buffer of the owned gradients, for groups
  // whose accumulators are off the device. auto: when the window has
  // several micro-batches, gradients leaving the device travel
  // (Transfers::bytes_travel: the device is not host memory anyway), and the
  // buffers of every group take at most a quarter of the device budget
  // (the rest is the live window's and the trainer's activations').
  // It also records bytes_travel for host_staging().
  void decide_window(uint64_t device_budget, bool bytes_travel, int rank);
  bool window_on_device(size_t group, int rank) const { return window_ && grad_tier(group, rank) != ZD_TIER_DEVICE; }
  // The ranks' device rounds its blocks up to this (Device::block_align),
  // and need_table counts the device row so; set once, before the plan is
  // asked for.
  void set_device_block_align(uint64_t align) { device_align_ = align; }

  NeedTable need_table(int rank) const;
  // Bytes of one NVMe staging buffer per optimizer operand (master, each
  // state slot, the working shard; 0 = never on NVMe for this rank): the
  // pipeline holds offload.buffer_count sets of them from finalize on.
  std::vector<uint64_t> staging_layout(int rank) const;
  // The page-locked host buffers through which bytes cross to and from a
  // device the host cannot address (Transfers, host_staging.h): the
  // gradients' staging buffer where gradients accumulate in host memory,
  // the working copies' upload ring where the host updates state whose
  // working copies are on the device; 0 where not needed, or where the
  // host addresses the device's pool. Reserved at finalize
  // (Transfers::reserve_staging), counted in the host row's buffers.
  struct HostStagingNeed {
    uint64_t gradients = 0, working = 0;
  };
  HostStagingNeed host_staging(int rank) const;
  // The host scratch (host_scratch.h) through which the host's loops reach
  // bytes in a pool the host cannot address: the most a compressed step's
  // host windows hold at once (compression_window_bytes, its largest
  // group's), or an NVMe tile of a working copy that is bigger than the
  // upload ring (OptimizerRunner::update_staged), whichever is more; 0 where
  // the host addresses the pool. Reserved at finalize
  // (Transfers::reserve_staging), counted in the host row's buffers.
  uint64_t host_windows(int rank) const;
  // The table finalize refuses with and `zerod plan` prints; *fits tells
  // whether every tier is within its budget (fits may be null).
  static std::string table(const TierPlan& plan, bool* fits);
  // The worst rank's needs against the budgets (worst_cells over every
  // rank); throws ZD_ERR_BUDGET with the table when a tier does not fit.
  void check_budgets(const std::array<uint64_t, ZD_TIER_COUNT>& budgets) const;

  // Refuses (ZD_ERR_CONFIG, naming the tensor and what to do) a placement
  // the rank's device cannot run: where the host's loops cannot write the
  // device's pool (`pool`, the rank's PoolMemory), every piece of the
  // optimizer's work must be wholly on the device or wholly off it.
  void check_device(const Device& device, const Memory& pool, int rank) const;

  // NVMe transfers are aligned to the largest alignment of the ranks' nvme
  // tier instances (the same paths on every rank, so the same figure): each
  // rank raises it when it opens its own, without touching another rank.
  void raise_nvme_alignment(uint64_t align);
  uint64_t nvme_alignment() const { return tier_granule() * 2; }

 private:
  struct Entry {
    zd_tier params = ZD_TIER_DEVICE, master = ZD_TIER_DEVICE, optimizer = ZD_TIER_DEVICE;
    // Whether the policy chose the master/optimizer tiers itself (the
    // offload ratio applies only to the default ones).
    bool master_explicit = false, optimizer_explicit = false;
  };
  // decide()'s warning where offload.ratio < 1 has nothing to split.
  void warn_of_a_ratio_with_nothing_to_split() const;
  // offload.ratio on a device the host cannot address, in decide().
  void apply_ratio_by_tensor();
  // Tier boundaries fall on multiples of this many elements, so every NVMe
  // transfer starts at an aligned offset whatever the element size.
  uint64_t tier_granule() const { return nvme_align_.load() / 2; }  // the smallest element is 2 bytes

  const ModelContext& ctx_;
  JobPolicy* policy_;
  std::vector<Entry> entries_;  // per parameter
  std::atomic<uint64_t> nvme_align_{4096};
  bool window_ = false;
  bool bytes_travel_ = false;  // as decide_window was told
  bool host_addressable_ = true;  // as decide was told
  bool ratio_by_tensor_ = false;  // the ratio moved whole tensors (tier_runs cuts nothing)
  uint64_t device_align_ = DevicePool::kAlign;
};

// The most any of the ranks' tables needs in each cell: what finalize holds
// to the budgets (Placement::check_budgets) and `zerod plan` judges by.
// Ranks differ by padding, and by which tensors their shards hold where a
// placement policy or the ratio put some of them elsewhere.
NeedTable worst_cells(const std::vector<NeedTable>& tables);

}  // namespace zerod
