// Model: laying out and placing the state — which tier each parameter's
// stage-3 shard, master and optimizer state live in (the job's placement
// policy, the offload table's defaults and ratio), the tier runs of every
// rank's buffers, what each tier must hold (checked against the budgets
// before anything is allocated, and printed by `zerod plan`), and the
// rank's tier instances.
#include "model_state.h"

#include "dtype.h"
#include "error.h"
#include "log.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace zerod {

void Model::check_registrations() {
  std::lock_guard<std::mutex> lock(reg_mu_);
  const size_t n = registry_.params().size();
  for (int r = first_local_; r < first_local_ + local_ranks(); ++r) {
    const auto got = static_cast<size_t>(ranks_[static_cast<size_t>(r - first_local_)]->registered);
    if (got != n)
      fail(ZD_ERR_INVALID_STATE, "rank " + std::to_string(r) + " registered " + std::to_string(got) +
                                     " parameters but another rank registered " +
                                     std::to_string(n) +
                                     "; every rank must register the same parameters");
  }
  if (n == 0) fail(ZD_ERR_INVALID_STATE, "zd_model_finalize with no parameters registered");
}

// Every node's ranks registered the same parameters: a fingerprint of the
// registry (names, modules, types, shapes, in order) and its size agree on
// every rank. Compared by one all-reduce of (v, -v) with MAX: equal
// everywhere exactly when max(v) == -max(-v).
void Model::check_registrations_across_nodes(RankState& rs, int rank) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  auto mix = [&h](const void* p, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const unsigned char*>(p)[i]) * 1099511628211ull;
  };
  double count;
  {
    std::lock_guard<std::mutex> lock(reg_mu_);
    for (const ParamRecord& p : registry_.params()) {
      mix(p.name.data(), p.name.size() + 1);
      const std::string& m = registry_.module(p.module).name;
      mix(m.data(), m.size() + 1);
      mix(&p.dtype, sizeof p.dtype);
      for (int64_t d : p.shape) mix(&d, sizeof d);
    }
    count = static_cast<double>(registry_.params().size());
  }
  // Doubles hold integers exactly up to 2^53: the hash in two 32-bit halves.
  const double hi = static_cast<double>(h >> 32), lo = static_cast<double>(h & 0xffffffffu);
  double v[6] = {count, hi, lo, -count, -hi, -lo};
  const std::string what = "finalize: comparing the parameters every node registered";
  wait(issue(rs, [&, rank] {
    plugins_.comm->all_reduce(comm_call(rank, comm_tag(CommOp::Finalize, 0, 3), what), v, 6, ZD_COMM_F64,
                              ZD_REDUCE_MAX);
  }));
  if (v[0] != -v[3] || v[1] != -v[4] || v[2] != -v[5])
    fail(ZD_ERR_INVALID_STATE,
         "the ranks of another node registered different parameters (" +
             (v[0] != -v[3] ? "counts from " + std::to_string(static_cast<int64_t>(-v[3])) + " to " +
                                  std::to_string(static_cast<int64_t>(v[0]))
                            : std::string("same count, different names, modules, types or shapes")) +
             "); every rank must register the same parameters in the same order");
}

// Several nodes: each node staged its first rank's initial values, but
// the job starts from rank 0's. Rank 0 broadcasts which parameters it gave
// values for, then the values, in chunks so that a rank's scratch stays
// small; the first rank of every other node receives them into the staged
// copy, its other ranks into scratch they drop.
void Model::share_initial_values(RankState& rs, int rank) {
  auto& params = registry_.params();
  const bool receiver = rank == first_local_ && rank != 0;
  std::vector<float> given(params.size());
  for (size_t i = 0; i < params.size(); ++i) given[i] = params[i].staged_init.empty() ? 0.0f : 1.0f;
  const std::string what = "finalize: rank 0's initial values to every node";
  uint64_t id = 4;
  auto broadcast = [&](float* buf, uint64_t count) {
    wait(issue(rs, [&, rank, buf, count] {
      plugins_.comm->broadcast(comm_call(rank, comm_tag(CommOp::Finalize, 0, id), what), buf, count, ZD_COMM_F32,
                               0);
    }));
    ++id;
  };
  broadcast(given.data(), given.size());
  constexpr uint64_t kChunk = uint64_t{4} << 20;  // elements: 16 MiB of scratch per rank
  std::vector<float> scratch;
  for (size_t i = 0; i < params.size(); ++i) {
    ParamRecord& p = params[i];
    if (given[i] == 0.0f) {
      // Rank 0 gave none: this node's values must not stand in for them.
      if (receiver) std::vector<float>().swap(p.staged_init);
      continue;
    }
    const auto numel = static_cast<uint64_t>(p.numel);
    if (receiver) p.staged_init.resize(numel);
    for (uint64_t at = 0; at < numel; at += kChunk) {
      const uint64_t n = std::min(kChunk, numel - at);
      float* buf;
      if (rank == 0 || receiver) {
        buf = p.staged_init.data() + at;
      } else {
        scratch.resize(n);
        buf = scratch.data();
      }
      broadcast(buf, n);
    }
  }
  // No rank of this node reads the staged values before its first rank has
  // written them.
  const std::string done = "finalize: every node has rank 0's initial values";
  wait(issue(rs, [&, rank] {
    plugins_.comm->barrier(comm_call(rank, comm_tag(CommOp::Finalize, 1, 0), done));
  }));
}

void Model::lay_out_once() {
  std::lock_guard<std::mutex> lock(reg_mu_);
  if (laid_out_) return;
  LayoutPolicy policy;
  policy.partitioning = partitioned(ZD_PARTITION_PARAMS)      ? Partitioning::Param
                        : partitioned(ZD_PARTITION_OPTIMIZER) ? Partitioning::Group
                                                              : Partitioning::Replicated;
  const PartitionerInstance* part = plugins_.partitioner.get();
  policy.stride = [part](uint64_t numel, uint64_t align) { return part->shard_stride(numel, align); };
  policy.persistence_threshold = part->persistence_threshold();
  registry_.lay_out(policy);
  decide_placement();
  laid_out_ = true;
}

// Asks the policy once per parameter and kind; the defaults come from the
// offload table. Called under reg_mu_, once, so every rank places alike.
void Model::decide_placement() {
  const OffloadConfig& off = config_.offload;
  const bool p3 = partitioned(ZD_PARTITION_PARAMS);
  placement_.assign(registry_.params().size(), Placement{});
  std::vector<std::string> problems;
  for (size_t i = 0; i < registry_.params().size(); ++i) {
    const ParamRecord& p = registry_.params()[i];
    Placement& pl = placement_[i];
    const auto numel = static_cast<uint64_t>(p.numel);
    auto ask = [&](const char* kind, uint64_t bytes, zd_tier fallback, bool* chosen) {
      zd_tier t = fallback;
      if (policy_) {
        TensorInfo ti{p.name, kind, registry_.module(p.module).name, numel, bytes};
        if (auto choice = policy_->placement(ti)) {
          t = *choice;
          if (chosen) *chosen = true;
        }
      }
      return t;
    };
    pl.params = ask("params", numel * dtype_size(p.dtype), p3 ? off.params : ZD_TIER_DEVICE, nullptr);
    pl.master = ask("master", numel * 4, off.optimizer, &pl.master_explicit);
    pl.optimizer = ask("optimizer", numel * 4 * plugins_.optimizer->state_slots(), off.optimizer,
                       &pl.optimizer_explicit);
    if (!p3 && pl.params != ZD_TIER_DEVICE)
      problems.push_back("parameter '" + p.name + "': its working copy can leave the device tier only at "
                         "ZeRO stage 3 (trainers compute with it in place); it was placed on " +
                         tier_name(pl.params));
    for (auto [kind, t] : {std::pair<const char*, zd_tier>{"shard", pl.params}, {"master", pl.master},
                           {"optimizer state", pl.optimizer}}) {
      if (t == ZD_TIER_NVME && off.nvme_paths.empty())
        problems.push_back("parameter '" + p.name + "': its " + kind +
                           " is placed on nvme, but offload.nvme_path names no directory");
    }
  }
  if (!problems.empty()) {
    std::string msg = "the placement of the model state cannot be done (" + config_.source + "):";
    for (const auto& m : problems) msg += "\n  " + m;
    fail(ZD_ERR_CONFIG, msg);
  }
}

// Tier boundaries fall on multiples of this many elements, so every NVMe
// transfer starts at an aligned offset whatever the element size.
uint64_t Model::tier_granule() const {
  return nvme_tier_align_.load() / 2;  // the smallest element is 2 bytes
}

std::vector<TierRun> Model::tier_runs(size_t group, int rank, Holds what) const {
  const ParamGroup& g = registry_.groups()[group];
  const bool by_param = registry_.partitioning() == Partitioning::Param;
  if (what == Holds::Params && !by_param) return {{g.full_numel, ZD_TIER_DEVICE}};
  const uint64_t dom_lo = by_param ? 0 : owned_begin(g, rank);
  const uint64_t dom_n = by_param ? g.flat_numel : owned_count(g);
  // Each parameter covers its elements and the alignment gap after them.
  std::vector<TierRun> raw;
  std::vector<bool> defaulted;  // the run's tier is the offload default
  for (size_t k = 0; k < g.params.size(); ++k) {
    const ParamRecord& p = registry_.param(g.params[k]);
    const ParamRecord* next = k + 1 < g.params.size() ? &registry_.param(g.params[k + 1]) : nullptr;
    const uint64_t lo = by_param ? p.flat_offset : p.full_offset;
    const uint64_t hi = next ? (by_param ? next->flat_offset : next->full_offset)
                             : (by_param ? g.flat_numel : g.full_numel);
    const uint64_t a = std::max(lo, dom_lo), b = std::min(hi, dom_lo + dom_n);
    if (a >= b) continue;
    const Placement& pl = placement_[static_cast<size_t>(g.params[k])];
    zd_tier t = ZD_TIER_DEVICE;
    bool dflt = false;
    switch (what) {
      case Holds::Params: t = pl.params; break;
      case Holds::Master: t = pl.master; dflt = !pl.master_explicit; break;
      case Holds::Optimizer: t = pl.optimizer; dflt = !pl.optimizer_explicit; break;
    }
    raw.push_back({b - a, t});
    defaulted.push_back(dflt && t != ZD_TIER_DEVICE);
  }
  // The offload ratio: only that share of the defaulted elements leaves the
  // device, the first ones in order.
  const double ratio = config_.offload.ratio;
  if (what != Holds::Params && ratio < 1.0) {
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

Model::NeedTable Model::need_table(int rank) const {
  NeedTable need(ZD_TIER_COUNT);
  const uint32_t slots = plugins_.optimizer->state_slots();
  const uint64_t nvme_align = nvme_alignment();
  auto bytes_in = [&](zd_tier t, uint64_t b) {
    switch (t) {
      case ZD_TIER_DEVICE: return align_up(b, DevicePool::kAlign);
      case ZD_TIER_HOST: return align_up(b, 64);
      default: return align_up(b, nvme_align);
    }
  };
  auto add_runs = [&](const std::vector<TierRun>& runs, size_t esz, zd_mem_kind kind, uint32_t copies) {
    for (const TierRun& r : runs)
      need[static_cast<size_t>(r.tier)][kind] += bytes_in(r.tier, r.count * esz) * copies;
  };
  const bool p3 = partitioned(ZD_PARTITION_PARAMS);
  for (size_t gi = 0; gi < registry_.groups().size(); ++gi) {
    const ParamGroup& g = registry_.groups()[gi];
    const uint64_t grad_len = p3 ? g.flat_numel : partitioned(ZD_PARTITION_GRADS) ? g.stride : g.full_numel;
    need[ZD_TIER_DEVICE][ZD_MEM_GRADS] += bytes_in(ZD_TIER_DEVICE, grad_len * dtype_size(grad_dtype(g)));
    add_runs(tier_runs(gi, rank, Holds::Params), dtype_size(g.dtype), ZD_MEM_PARAMS, 1);
    add_runs(tier_runs(gi, rank, Holds::Master), 4, ZD_MEM_MASTER, 1);
    if (slots) add_runs(tier_runs(gi, rank, Holds::Optimizer), 4, ZD_MEM_OPTIMIZER, slots);
    need[ZD_TIER_DEVICE][ZD_MEM_OPTIMIZER] += compression_bytes(gi);
  }
  if (p3)
    for (const ParamRecord& p : registry_.params())
      if (p.persistent)
        need[ZD_TIER_DEVICE][ZD_MEM_PARAMS] +=
            bytes_in(ZD_TIER_DEVICE, p.stride * static_cast<uint64_t>(world_size_) * dtype_size(p.dtype));
  const auto staging = staging_layout(rank);
  for (uint64_t b : staging)
    need[ZD_TIER_HOST][ZD_MEM_BUFFERS] += b * static_cast<uint64_t>(config_.offload.buffer_count);
  return need;
}

std::vector<uint64_t> Model::staging_layout(int rank) const {
  const uint32_t slots = plugins_.optimizer->state_slots();
  bool master = false, state = false, working = false;
  size_t working_esz = 0;
  for (size_t gi = 0; gi < registry_.groups().size(); ++gi) {
    auto on_nvme = [&](Holds h) {
      for (const TierRun& r : tier_runs(gi, rank, h))
        if (r.tier == ZD_TIER_NVME) return true;
      return false;
    };
    master = master || on_nvme(Holds::Master);
    state = state || (slots && on_nvme(Holds::Optimizer));
    if (on_nvme(Holds::Params)) {
      working = true;
      working_esz = std::max(working_esz, dtype_size(registry_.groups()[gi].dtype));
    }
  }
  if (!master && !state && !working) return {};
  const uint64_t tile = config_.offload.nvme_tile_elems, align = nvme_alignment();
  std::vector<uint64_t> layout;
  layout.push_back(master ? align_up(tile * 4, align) : 0);
  for (uint32_t s = 0; s < slots; ++s) layout.push_back(state ? align_up(tile * 4, align) : 0);
  layout.push_back(working ? align_up(tile * working_esz, align) : 0);
  return layout;
}

Model::TierPlan Model::plan(int rank) {
  lay_out_once();
  TierPlan p;
  p.need = need_table(rank);
  for (int t = 0; t < ZD_TIER_COUNT; ++t) p.budget[static_cast<size_t>(t)] = ranks_[0]->ledger.budget(t);
  return p;
}

std::string Model::plan_table(const TierPlan& plan, bool* fits) const {
  bool over = false;
  std::ostringstream table;
  table << "  tier     params      grads       master      optimizer   buffers     total       budget\n";
  for (int t = 0; t < ZD_TIER_COUNT; ++t) {
    const auto& n = plan.need[static_cast<size_t>(t)];
    uint64_t total = 0;
    for (uint64_t b : n) total += b;
    const uint64_t budget = plan.budget[static_cast<size_t>(t)];
    if (total == 0 && budget == MemoryLedger::kNoBudget) continue;
    const bool tier_over = budget != MemoryLedger::kNoBudget && total > budget;
    over = over || tier_over;
    char line[256];
    auto f = [](uint64_t b) { return format_bytes(b); };
    std::snprintf(line, sizeof line, "  %-8s %-11s %-11s %-11s %-11s %-11s %-11s %-11s%s\n", tier_name(t),
                  f(n[ZD_MEM_PARAMS]).c_str(), f(n[ZD_MEM_GRADS]).c_str(), f(n[ZD_MEM_MASTER]).c_str(),
                  f(n[ZD_MEM_OPTIMIZER]).c_str(), f(n[ZD_MEM_BUFFERS]).c_str(), f(total).c_str(),
                  budget == MemoryLedger::kNoBudget ? "none" : f(budget).c_str(),
                  tier_over ? "  <- over budget" : "");
    table << line;
  }
  if (fits) *fits = !over;
  return table.str();
}

void Model::check_budget_table() const {
  // The rank that needs the most in each cell (ranks differ only by padding).
  TierPlan worst;
  worst.need = need_table(0);
  for (int r = 1; r < world_size_; ++r) {
    const NeedTable n = need_table(r);
    for (size_t t = 0; t < n.size(); ++t)
      for (size_t k = 0; k < n[t].size(); ++k) worst.need[t][k] = std::max(worst.need[t][k], n[t][k]);
  }
  for (int t = 0; t < ZD_TIER_COUNT; ++t) worst.budget[static_cast<size_t>(t)] = ranks_[0]->ledger.budget(t);
  bool fits = true;
  const std::string table = plan_table(worst, &fits);
  if (!fits)
    fail(ZD_ERR_BUDGET, "the model state does not fit its memory budgets (per rank):\n" + table +
                            "raise the budget in " + config_.source + " or move state to another tier");
}

void Model::set_up_tiers(RankState& rs, int rank) {
  bool host = false, nvme = false;
  for (size_t gi = 0; gi < registry_.groups().size(); ++gi)
    for (Holds h : {Holds::Params, Holds::Master, Holds::Optimizer})
      for (const TierRun& r : tier_runs(gi, rank, h)) {
        host = host || r.tier == ZD_TIER_HOST;
        nvme = nvme || r.tier == ZD_TIER_NVME;
      }
  zd_tier_config cfg{};
  cfg.struct_size = sizeof cfg;
  cfg.rank = rank;
  cfg.world_size = world_size_;
  cfg.local_rank = rank - first_local_;
  std::vector<const char*> paths;
  for (const auto& p : config_.offload.nvme_paths) paths.push_back(p.c_str());
  cfg.paths = paths.data();
  cfg.path_count = static_cast<int32_t>(paths.size());
  if (host && !rs.host) {
    if (!plugins_.host_tier) fail(ZD_ERR_PLUGIN, "state is placed on the host tier, but no host tier plugin is loaded");
    rs.host = TierInstance::create(plugins_.host_tier, config_.offload.host_values, cfg);
    log_info("rank " + std::to_string(rank) + ": " + rs.host->describe());
    // The optimizer updates host-resident state: with several ranks, each
    // runs it on the cores next to its memory — unless those are simply all
    // the cores we have (one memory node), where the shared pool is better.
    std::vector<int> cpus = rs.host->cpus();
    if (world_size_ > 1 && !cpus.empty() && cpus != affinity_cpus()) {
      if (config_.threads && cpus.size() > config_.threads) cpus.resize(config_.threads);
      rs.pool_near = std::make_unique<ThreadPool>(cpus);
    }
  }
  if (nvme && !rs.nvme) {
    if (!plugins_.nvme_tier) fail(ZD_ERR_PLUGIN, "state is placed on the nvme tier, but no nvme tier plugin is loaded");
    rs.nvme = TierInstance::create(plugins_.nvme_tier, config_.offload.nvme_values, cfg);
    const uint64_t align = rs.nvme->alignment();
    uint64_t seen = nvme_tier_align_.load();
    while (align > seen && !nvme_tier_align_.compare_exchange_weak(seen, align)) {
    }
    log_info("rank " + std::to_string(rank) + ": " + rs.nvme->describe());
  }
}

std::vector<int> Model::optimizer_cpus(int rank) const {
  const RankState& rs = rank_state(rank);
  return rs.pool_near ? rs.pool_near->cpus() : std::vector<int>{};
}

std::string Model::tier_description(int rank, zd_tier tier) const {
  const RankState& rs = rank_state(rank);
  if (tier == ZD_TIER_HOST && rs.host) return rs.host->describe();
  if (tier == ZD_TIER_NVME && rs.nvme) return rs.nvme->describe();
  return "";
}

}  // namespace zerod
