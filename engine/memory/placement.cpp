#include "memory/placement.h"

#include "memory/align.h"
#include "memory/arena.h"
#include "runtime/dtype.h"
#include "error.h"
#include "log.h"
#include "compression/momentum_compression.h"
#include "memory/host_scratch.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace zerod {

void Placement::decide(bool host_addressable) {
  host_addressable_ = host_addressable;
  const OffloadConfig& off = ctx_.config.offload;
  const Registry& reg = ctx_.registry;
  const bool p3 = ctx_.params_partitioned();
  entries_.assign(reg.params().size(), Entry{});
  std::vector<std::string> problems;
  for (size_t i = 0; i < reg.params().size(); ++i) {
    const ParamRecord& p = reg.params()[i];
    Entry& e = entries_[i];
    const auto numel = static_cast<uint64_t>(p.numel);
    auto ask = [&](const char* kind, uint64_t bytes, zd_tier fallback, bool* chosen) {
      zd_tier t = fallback;
      if (policy_) {
        TensorInfo ti{p.name, kind, reg.module(p.module).name, numel, bytes};
        if (auto choice = policy_->placement(ti)) {
          t = *choice;
          if (chosen) *chosen = true;
        }
      }
      return t;
    };
    e.params = ask("params", numel * dtype_size(p.dtype), p3 ? off.params : ZD_TIER_DEVICE, nullptr);
    e.master = ask("master", numel * 4, off.optimizer, &e.master_explicit);
    e.optimizer = ask("optimizer", numel * ctx_.state_size() * ctx_.optimizer().state_slots(), off.optimizer,
                      &e.optimizer_explicit);
    if (!p3 && e.params != ZD_TIER_DEVICE)
      problems.push_back("parameter '" + p.name + "': its working copy can leave the device tier only at "
                         "ZeRO stage 3 (trainers compute with it in place); it was placed on " +
                         tier_name(e.params));
    for (auto [kind, t] : {std::pair<const char*, zd_tier>{"shard", e.params}, {"master", e.master},
                           {"optimizer state", e.optimizer}}) {
      if (t == ZD_TIER_NVME && off.nvme_paths.empty())
        problems.push_back("parameter '" + p.name + "': its " + kind +
                           " is placed on nvme, but offload.nvme_path names no directory");
    }
  }
  if (!problems.empty()) {
    std::string msg = "the placement of the model state cannot be done (" + ctx_.config.source + "):";
    for (const auto& m : problems) msg += "\n  " + m;
    fail(ZD_ERR_CONFIG, msg);
  }
  warn_of_a_ratio_with_nothing_to_split();
  ratio_by_tensor_ = !host_addressable && off.ratio < 1.0;
  if (ratio_by_tensor_) apply_ratio_by_tensor();
}

// Where the host cannot address the device, a group's optimizer work is
// wholly on the device or wholly off it (its gradients have one tier), so
// the ratio cannot cut inside a tensor as it does on the cpu device: it
// moves whole tensors, the last ones registered, until at least that share
// of the elements it applies to is off the device (at least: the device
// then holds no more than the ratio leaves it). The last ones, where the cpu
// device moves the first elements: their gradients are the first a backward
// produces, so they leave the device while the backward goes on, and the
// overlapped update, which runs in forward order, reaches their state last,
// behind the most of the next forward; the first layers' state stays on
// the device and is updated there at once. The tensors kept on the device
// form groups of their own (state_class). A tensor whose stage-3 shard is
// off the device keeps its optimizer off it too (an update on the device
// writes the shard in place): it counts as moved.
void Placement::apply_ratio_by_tensor() {
  const double ratio = ctx_.config.offload.ratio;
  auto applies = [](const Entry& e) {
    return !e.master_explicit && !e.optimizer_explicit && e.master != ZD_TIER_DEVICE;
  };
  const Registry& reg = ctx_.registry;
  uint64_t total = 0, moved = 0;
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (!applies(entries_[i])) continue;
    total += static_cast<uint64_t>(reg.params()[i].numel);
    if (entries_[i].params != ZD_TIER_DEVICE) moved += static_cast<uint64_t>(reg.params()[i].numel);
  }
  const auto target = static_cast<uint64_t>(std::ceil(ratio * static_cast<double>(total)));
  bool kept = false;
  for (size_t i = entries_.size(); i-- > 0;) {
    Entry& e = entries_[i];
    if (!applies(e) || e.params != ZD_TIER_DEVICE) continue;
    if (moved < target) {
      moved += static_cast<uint64_t>(reg.params()[i].numel);
    } else {
      e.master = ZD_TIER_DEVICE;
      e.optimizer = ZD_TIER_DEVICE;
      kept = true;
    }
  }
  if (!kept && total > 0 && ctx_.params_partitioned() && ctx_.config.offload.params != ZD_TIER_DEVICE) {
    char r[32];
    std::snprintf(r, sizeof r, "%g", ratio);
    log_warn("offload.ratio = " + std::string(r) + " keeps nothing on the device (" + ctx_.config.source +
             "): on a device the host cannot address, a tensor's optimizer stays with its stage-3 shard, and "
             "offload.params = \"" + tier_name(ctx_.config.offload.params) + "\" moves every shard off it");
  }
}

// offload.ratio is the share of what offload.optimizer moves, the masters
// and the optimizer state where placement() left them to it (DeepSpeed's
// offload_optimizer.ratio, ZeRO-Offload++'s partial offload); the stage-3
// parameter shards go where offload.params says, whole. A ratio with none
// of the former off the device does nothing, which a job that set it
// expecting its parameter shards split would not see without this line.
void Placement::warn_of_a_ratio_with_nothing_to_split() const {
  const OffloadConfig& off = ctx_.config.offload;
  if (off.ratio >= 1.0) return;
  for (const Entry& e : entries_)
    if ((!e.master_explicit && e.master != ZD_TIER_DEVICE) || (!e.optimizer_explicit && e.optimizer != ZD_TIER_DEVICE))
      return;
  char ratio[32];
  std::snprintf(ratio, sizeof ratio, "%g", off.ratio);
  std::string why = off.optimizer == ZD_TIER_DEVICE
                        ? "offload.optimizer is \"device\""
                        : "the job's placement() placed every master and optimizer state itself";
  if (ctx_.params_partitioned() && off.params != ZD_TIER_DEVICE)
    why += std::string("; offload.params = \"") + tier_name(off.params) +
           "\" moves every parameter shard whole, whatever the ratio";
  log_warn("offload.ratio = " + std::string(ratio) + " moves nothing (" + ctx_.config.source +
           "): it is the share of the fp32 master copies and optimizer state that offload.optimizer moves off the "
           "device, and " + why);
}

void Placement::check_device(const Device& device, const Memory& pool, int rank) const {
  // A piece whose operands are in the pool and in host memory is updated by
  // the host's loops (OptimizerRunner::pieces), and the pool's own update
  // writes a working shard in host memory: both need the host to write the
  // pool in place.
  if (pool.host_writes()) return;
  const std::string where = " (" + ctx_.config.source + ")";
  const std::string dev = std::string("the ") + device.name() + " device";
  bool state_on_device = false;
  const Registry& reg = ctx_.registry;
  for (size_t i = 0; i < reg.params().size(); ++i) {
    const Entry& e = entries_[i];
    const ParamRecord& p = reg.params()[i];
    const bool master_dev = e.master == ZD_TIER_DEVICE;
    if (ctx_.optimizer().state_slots() && master_dev != (e.optimizer == ZD_TIER_DEVICE))
      fail(ZD_ERR_CONFIG, "parameter '" + p.name + "': its master copy is on " + tier_name(e.master) +
                              " and its optimizer state on " + tier_name(e.optimizer) + "; on " + dev +
                              " both must be on the device or both off it" + where);
    if (master_dev && e.params != ZD_TIER_DEVICE)
      fail(ZD_ERR_CONFIG, "parameter '" + p.name + "': its optimizer runs on the device but its stage-3 shard is on " +
                              tier_name(e.params) + "; on " + dev +
                              " offload the optimizer too (offload.optimizer) or keep the shard on the device" +
                              where);
    state_on_device = state_on_device || master_dev;
  }
  if (state_on_device && !device.runs(ctx_.optimizer()))
    fail(ZD_ERR_CONFIG, "optimizer '" + ctx_.optimizer().plugin().name() + "' has no kernels for " + dev +
                            ", and its state is in the device tier; place the optimizer state on the host " +
                            "(offload = { optimizer = \"host\" }" +
                            (ratio_by_tensor_ ? ", and offload.ratio = 1: a ratio below 1 keeps some of it on the device"
                                              : "") +
                            ")" + where);
  // Each group's optimizer work wholly on the device or wholly off it: the
  // layout keeps the two apart (state_class); a group that mixed them would
  // update state in the pool from gradients in host memory.
  for (size_t gi = 0; gi < reg.groups().size(); ++gi) {
    bool on = false, off = false;
    for (const TierRun& r : tier_runs(gi, rank, Holds::Master)) (r.tier == ZD_TIER_DEVICE ? on : off) = true;
    if (on && off)
      fail(ZD_ERR_INTERNAL, "the group of '" + reg.param(reg.groups()[gi].params.front()).name +
                                "' holds masters both on and off " + dev + where);
  }
}

void Placement::raise_nvme_alignment(uint64_t align) {
  uint64_t seen = nvme_align_.load();
  while (align > seen && !nvme_align_.compare_exchange_weak(seen, align)) {
  }
}

std::vector<TierRun> Placement::tier_runs(size_t group, int rank, Holds what) const {
  const ParamGroup& g = ctx_.registry.groups()[group];
  const bool by_param = ctx_.registry.partitioning() == Partitioning::Param;
  if (what == Holds::Params && !by_param) return {{g.full_numel, ZD_TIER_DEVICE}};
  const uint64_t dom_lo = by_param ? 0 : ctx_.owned_begin(g, rank);
  const uint64_t dom_n = ctx_.owned_count(g);
  // Each parameter covers its elements and the alignment gap after them.
  auto start_of = [&](size_t k) {
    const ParamRecord& p = ctx_.registry.param(g.params[k]);
    return by_param ? p.flat_offset : p.full_offset;
  };
  // The parameters are in element order: start at the last one that begins
  // at or before the rank's range, stop at the first that begins past it.
  // Each rank then reads only its own part of the group, not all of it
  // (`zerod plan` and finalize's budget check lay out every rank: a group
  // of 10^6 tensors on 4096 ranks took half an hour).
  size_t first = 0;
  for (size_t lo = 0, hi = g.params.size(); lo < hi;) {
    const size_t mid = lo + (hi - lo) / 2;
    if (start_of(mid) <= dom_lo) {
      first = mid;
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  std::vector<TierRun> raw;
  std::vector<bool> defaulted;  // the run's tier is the offload default
  for (size_t k = first; k < g.params.size(); ++k) {
    const uint64_t lo = start_of(k);
    if (lo >= dom_lo + dom_n) break;
    const uint64_t hi = k + 1 < g.params.size() ? start_of(k + 1) : (by_param ? g.flat_numel : g.full_numel);
    const uint64_t a = std::max(lo, dom_lo), b = std::min(hi, dom_lo + dom_n);
    if (a >= b) continue;
    const Entry& e = entries_[static_cast<size_t>(g.params[k])];
    zd_tier t = ZD_TIER_DEVICE;
    bool dflt = false;
    switch (what) {
      case Holds::Params: t = e.params; break;
      case Holds::Master: t = e.master; dflt = !e.master_explicit; break;
      case Holds::Optimizer: t = e.optimizer; dflt = !e.optimizer_explicit; break;
    }
    raw.push_back({b - a, t});
    defaulted.push_back(dflt && t != ZD_TIER_DEVICE);
  }
  // The offload ratio: only that share of the defaulted elements leaves the
  // device, the first ones in order.
  const double ratio = ctx_.config.offload.ratio;
  if (what != Holds::Params && ratio < 1.0 && !ratio_by_tensor_) {
    uint64_t total = 0;
    for (size_t i = 0; i < raw.size(); ++i)
      if (defaulted[i]) total += raw[i].count;
    uint64_t left = static_cast<uint64_t>(std::ceil(ratio * static_cast<double>(total)));
    std::vector<TierRun> cut;
    for (size_t i = 0; i < raw.size(); ++i) {
      if (!defaulted[i]) {
        cut.push_back(raw[i]);
        continue;
      }
      const uint64_t off = std::min(left, raw[i].count);
      left -= off;
      if (off) cut.push_back({off, raw[i].tier});
      if (raw[i].count > off) cut.push_back({raw[i].count - off, ZD_TIER_DEVICE});
    }
    raw.swap(cut);
  }
  // Boundaries between tiers move down to a granule; equal neighbours merge.
  const uint64_t gran = tier_granule();
  std::vector<std::pair<uint64_t, zd_tier>> starts;  // (first element, tier)
  uint64_t at = 0;
  for (const TierRun& r : raw) {
    const uint64_t s = at == 0 ? 0 : at / gran * gran;
    if (!starts.empty() && starts.back().first == s) starts.back().second = r.tier;
    else if (starts.empty() || starts.back().second != r.tier) starts.emplace_back(s, r.tier);
    at += r.count;
  }
  std::vector<TierRun> runs;
  for (size_t i = 0; i < starts.size(); ++i) {
    const uint64_t end = i + 1 < starts.size() ? starts[i + 1].first : dom_n;
    if (end <= starts[i].first) continue;
    if (!runs.empty() && runs.back().tier == starts[i].second)
      runs.back().count += end - starts[i].first;
    else
      runs.push_back({end - starts[i].first, starts[i].second});
  }
  if (runs.empty()) runs.push_back({dom_n, ZD_TIER_DEVICE});
  return runs;
}

zd_tier Placement::grad_tier(size_t group, int rank) const {
  for (Holds h : {Holds::Master, Holds::Optimizer}) {
    if (h == Holds::Optimizer && ctx_.optimizer().state_slots() == 0) continue;
    for (const TierRun& r : tier_runs(group, rank, h))
      if (r.tier != ZD_TIER_DEVICE) return ZD_TIER_HOST;
  }
  return ZD_TIER_DEVICE;
}

void Placement::decide_window(uint64_t device_budget, bool bytes_travel, int rank) {
  using A = OffloadConfig::Accumulate;
  const A choice = ctx_.config.offload.accumulate;
  bytes_travel_ = bytes_travel;
  window_ = false;
  if (!ctx_.partitioned(ZD_PARTITION_GRADS) || choice == A::Host) return;
  if (choice == A::Device) {
    window_ = true;
    return;
  }
  if (ctx_.config.gradient_accumulation_steps < 2 || !bytes_travel) return;
  uint64_t bytes = 0;
  for (size_t gi = 0; gi < ctx_.registry.groups().size(); ++gi)
    if (grad_tier(gi, rank) != ZD_TIER_DEVICE)
      bytes += ctx_.owned_count(ctx_.registry.groups()[gi]) * dtype_size(ctx_.grad_dtype(ctx_.registry.groups()[gi]));
  window_ = bytes > 0 && (device_budget == MemoryLedger::kNoBudget || bytes <= device_budget / 4);
}

bool Placement::uses(int rank, zd_tier tier) const {
  for (size_t gi = 0; gi < ctx_.registry.groups().size(); ++gi) {
    if (grad_tier(gi, rank) == tier) return true;
    for (Holds h : {Holds::Params, Holds::Master, Holds::Optimizer})
      for (const TierRun& r : tier_runs(gi, rank, h))
        if (r.tier == tier) return true;
  }
  return false;
}

NeedTable Placement::need_table(int rank) const {
  NeedTable need(ZD_TIER_COUNT);
  const uint32_t slots = ctx_.optimizer().state_slots();
  const uint64_t nvme_align = nvme_alignment();
  auto bytes_in = [&](zd_tier t, uint64_t b) {
    switch (t) {
      case ZD_TIER_DEVICE: return align_up(b, device_align_);
      case ZD_TIER_HOST: return align_up(b, 64);
      default: return align_up(b, nvme_align);
    }
  };
  auto add_runs = [&](const std::vector<TierRun>& runs, size_t esz, zd_mem_kind kind, uint32_t copies) {
    for (const TierRun& r : runs)
      need[static_cast<size_t>(r.tier)][kind] += bytes_in(r.tier, r.count * esz) * copies;
  };
  const Registry& reg = ctx_.registry;
  const bool p3 = ctx_.params_partitioned();
  std::array<uint64_t, ZD_TIER_COUNT> scratch{};  // per tier, the largest of its groups' (CompressionBytes::scratch)
  for (size_t gi = 0; gi < reg.groups().size(); ++gi) {
    const ParamGroup& g = reg.groups()[gi];
    const uint64_t grad_len = p3 ? g.flat_numel : ctx_.partitioned(ZD_PARTITION_GRADS) ? g.stride : g.full_numel;
    const zd_tier gt = grad_tier(gi, rank);
    need[static_cast<size_t>(gt)][ZD_MEM_GRADS] += bytes_in(gt, grad_len * dtype_size(ctx_.grad_dtype(g)));
    if (window_on_device(gi, rank))
      need[ZD_TIER_DEVICE][ZD_MEM_GRADS] += bytes_in(ZD_TIER_DEVICE, grad_len * dtype_size(ctx_.grad_dtype(g)));
    add_runs(tier_runs(gi, rank, Holds::Params), dtype_size(g.dtype), ZD_MEM_PARAMS, 1);
    add_runs(tier_runs(gi, rank, Holds::Master), 4, ZD_MEM_MASTER, 1);
    if (slots) add_runs(tier_runs(gi, rank, Holds::Optimizer), ctx_.state_size(), ZD_MEM_OPTIMIZER, slots);
    const CompressionBytes cb = compression_bytes(ctx_, gi, rank);
    if (cb.grads) need[static_cast<size_t>(gt)][ZD_MEM_GRADS] += bytes_in(gt, cb.grads);
    if (cb.buffers) need[static_cast<size_t>(gt)][ZD_MEM_BUFFERS] += bytes_in(gt, cb.buffers);
    scratch[static_cast<size_t>(gt)] = std::max(scratch[static_cast<size_t>(gt)], cb.scratch);
    if (cb.params) need[static_cast<size_t>(gt)][ZD_MEM_PARAMS] += bytes_in(gt, cb.params);
    for (uint64_t b : cb.optimizer) need[static_cast<size_t>(gt)][ZD_MEM_OPTIMIZER] += bytes_in(gt, b);
    // Stage 1 on several ranks: the owned range the step reduce-scatters
    // the whole gradients into (GradReducer::reset).
    if (ctx_.world_size > 1 && ctx_.partitioned(ZD_PARTITION_OPTIMIZER) && !ctx_.partitioned(ZD_PARTITION_GRADS))
      need[static_cast<size_t>(gt)][ZD_MEM_BUFFERS] += bytes_in(gt, g.stride * dtype_size(ctx_.grad_dtype(g)));
  }
  for (size_t t = 0; t < scratch.size(); ++t)
    if (scratch[t]) need[t][ZD_MEM_BUFFERS] += bytes_in(static_cast<zd_tier>(t), scratch[t]);
  if (p3)
    for (const ParamRecord& p : reg.params())
      if (p.persistent)
        need[ZD_TIER_DEVICE][ZD_MEM_PARAMS] +=
            bytes_in(ZD_TIER_DEVICE, p.stride * static_cast<uint64_t>(ctx_.world_size) * dtype_size(p.dtype));
  for (uint64_t b : staging_layout(rank))
    need[ZD_TIER_HOST][ZD_MEM_BUFFERS] += b * static_cast<uint64_t>(ctx_.config.offload.buffer_count);
  const HostStagingNeed hs = host_staging(rank);
  need[ZD_TIER_HOST][ZD_MEM_BUFFERS] += hs.gradients + hs.working + host_windows(rank);
  return need;
}

uint64_t Placement::host_windows(int rank) const {
  if (host_addressable_) return 0;
  const uint32_t slots = ctx_.optimizer().state_slots();
  const uint64_t tile = ctx_.config.offload.nvme_tile_elems;
  uint64_t most = 0;
  for (size_t gi = 0; gi < ctx_.registry.groups().size(); ++gi) {
    auto in = [&](Holds h, zd_tier t) {
      for (const TierRun& r : tier_runs(gi, rank, h))
        if (r.tier == t) return true;
      return false;
    };
    PoolResident pool;
    pool.buffers = grad_tier(gi, rank) == ZD_TIER_DEVICE;
    pool.master = in(Holds::Master, ZD_TIER_DEVICE);
    pool.state = slots != 0 && in(Holds::Optimizer, ZD_TIER_DEVICE);
    pool.working = in(Holds::Params, ZD_TIER_DEVICE);
    most = std::max(most, compression_window_bytes(ctx_, gi, rank, pool));
    // A working copy on the device updated from NVMe tiles goes up a tile at
    // a time, through the host scratch where the upload ring cannot hold it.
    const uint64_t work_tile = tile * dtype_size(ctx_.registry.groups()[gi].dtype);
    const bool staged = in(Holds::Master, ZD_TIER_NVME) || (slots != 0 && in(Holds::Optimizer, ZD_TIER_NVME));
    if (pool.working && staged && work_tile > kWorkingStagingBytes)
      most = std::max(most, align_up(work_tile, HostScratch::kAlign));
  }
  return most;
}

Placement::HostStagingNeed Placement::host_staging(int rank) const {
  HostStagingNeed need;
  if (!bytes_travel_) return need;
  for (size_t gi = 0; gi < ctx_.registry.groups().size(); ++gi) {
    if (grad_tier(gi, rank) == ZD_TIER_DEVICE) continue;
    // Gradients accumulate in host memory: they leave the device through
    // the gradients' staging buffer (Transfers::add_to_host).
    need.gradients = kGradientStagingBytes;
    // The host updates state whose working copies are on the device: the
    // new copies go up through the upload ring.
    for (const TierRun& r : tier_runs(gi, rank, Holds::Params))
      if (r.tier == ZD_TIER_DEVICE) need.working = kWorkingStagingBytes;
  }
  return need;
}

std::vector<uint64_t> Placement::staging_layout(int rank) const {
  const uint32_t slots = ctx_.optimizer().state_slots();
  bool master = false, state = false, working = false;
  size_t working_esz = 0;
  for (size_t gi = 0; gi < ctx_.registry.groups().size(); ++gi) {
    auto on_nvme = [&](Holds h) {
      for (const TierRun& r : tier_runs(gi, rank, h))
        if (r.tier == ZD_TIER_NVME) return true;
      return false;
    };
    master = master || on_nvme(Holds::Master);
    state = state || (slots && on_nvme(Holds::Optimizer));
    if (on_nvme(Holds::Params)) {
      working = true;
      working_esz = std::max(working_esz, dtype_size(ctx_.registry.groups()[gi].dtype));
    }
  }
  if (!master && !state && !working) return {};
  const uint64_t tile = ctx_.config.offload.nvme_tile_elems, align = nvme_alignment();
  std::vector<uint64_t> layout;
  layout.push_back(master ? align_up(tile * 4, align) : 0);
  for (uint32_t s = 0; s < slots; ++s) layout.push_back(state ? align_up(tile * ctx_.state_size(), align) : 0);
  layout.push_back(working ? align_up(tile * working_esz, align) : 0);
  return layout;
}

std::string Placement::table(const TierPlan& plan, bool* fits) {
  bool over = false;
  std::ostringstream table;
  table << "  tier     params      grads       master      optimizer   buffers     total       budget\n";
  for (int t = 0; t < ZD_TIER_COUNT; ++t) {
    const auto& n = plan.need[static_cast<size_t>(t)];
    uint64_t total = 0;
    for (uint64_t b : n) total = saturating_add(total, b);
    const uint64_t budget = plan.budget[static_cast<size_t>(t)];
    if (total == 0 && budget == MemoryLedger::kNoBudget) continue;
    const bool tier_over = budget != MemoryLedger::kNoBudget && total > budget;
    over = over || tier_over;
    char line[256];
    auto f = [](uint64_t b) { return format_bytes(b); };
    std::snprintf(line, sizeof line, "  %-8s %-11s %-11s %-11s %-11s %-11s %-11s %-11s%s\n", tier_name(t),
                  f(n[ZD_MEM_PARAMS]).c_str(), f(n[ZD_MEM_GRADS]).c_str(), f(n[ZD_MEM_MASTER]).c_str(),
                  f(n[ZD_MEM_OPTIMIZER]).c_str(), f(n[ZD_MEM_BUFFERS]).c_str(),
                  total == kSaturatedBytes ? "over 2^64 B" : f(total).c_str(),
                  budget == MemoryLedger::kNoBudget ? "none" : f(budget).c_str(),
                  tier_over ? "  <- over budget" : "");
    table << line;
  }
  if (fits) *fits = !over;
  return table.str();
}

NeedTable worst_cells(const std::vector<NeedTable>& tables) {
  NeedTable worst(ZD_TIER_COUNT);
  for (const NeedTable& n : tables)
    for (size_t t = 0; t < n.size(); ++t)
      for (size_t k = 0; k < n[t].size(); ++k) worst[t][k] = std::max(worst[t][k], n[t][k]);
  return worst;
}

void Placement::check_budgets(const std::array<uint64_t, ZD_TIER_COUNT>& budgets) const {
  std::vector<NeedTable> ranks;
  for (int r = 0; r < ctx_.world_size; ++r) ranks.push_back(need_table(r));
  TierPlan worst;
  worst.need = worst_cells(ranks);
  worst.budget = budgets;
  bool fits = true;
  const std::string text = table(worst, &fits);
  if (!fits)
    fail(ZD_ERR_BUDGET, "the model state does not fit its memory budgets (per rank):\n" + text +
                            "raise the budget in " + ctx_.config.source + " or move state to another tier");
}

}  // namespace zerod
