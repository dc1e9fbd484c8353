// Model: registration and finalize — the parameters each rank registers,
// checked alike on every rank (and across nodes), their initial values
// shared, the layout laid out once, and at finalize each rank's tiers,
// budgets and buffers (model.h). Construction, whole-parameter access,
// failure handling and introspection are in model.cpp.
#include "model/model_rank.h"

#include "checkpoint/checkpoint_io.h"
#include "device/select.h"
#include "runtime/dtype.h"
#include "error.h"
#include "log.h"
#include "checkpoint/state_io.h"
#include "observe/traced_device.h"

#include <algorithm>
#include <stdexcept>
#include <cmath>
#include <cstring>

namespace zerod {

zd_param_id Model::register_param(int rank, const std::string& name, const std::string& module,
                                  zd_dtype dtype, std::vector<int64_t> shape, const void* init,
                                  zd_dtype init_dtype) {
  Call call(*this, rank, "register_param");
  RankState& rs = rank_state(rank);
  if (rs.finalized || finalized_.load())
    fail(ZD_ERR_INVALID_STATE, "parameter '" + name + "' registered after zd_model_finalize; "
                               "register every parameter before finalizing");
  if (!dtype_valid(dtype))
    fail(ZD_ERR_INVALID_ARGUMENT, "parameter '" + name + "' has an invalid dtype (" +
                                      std::to_string(dtype) + ")");
  if (dtype != ZD_DTYPE_F32 && dtype != config_.precision)
    fail(ZD_ERR_INVALID_ARGUMENT,
         "parameter '" + name + "' is " + dtype_name(dtype) + " but the job's precision is \"" +
             precision_name(config_.precision) + "\": register it as f32 or set precision = \"" +
             (dtype == ZD_DTYPE_BF16 ? "bf16" : "fp16") + "\" in " + config_.source);
  if (init_dtype == 0) init_dtype = dtype;
  if (init && !dtype_valid(init_dtype))
    fail(ZD_ERR_INVALID_ARGUMENT, "parameter '" + name + "' has an invalid init_dtype (" +
                                      std::to_string(init_dtype) + ")");

  std::lock_guard<std::mutex> lock(reg_mu_);
  const auto index = static_cast<size_t>(rs.registered);
  zd_param_id id;
  if (index < registry_.params().size()) {
    // Another rank registered this one first: it must be the same parameter.
    const ParamRecord& p = registry_.params()[index];
    const std::string& pm = registry_.module(p.module).name;
    if (p.name != name || pm != module || p.dtype != dtype || p.shape != shape) {
      auto describe = [](const std::string& n, const std::string& m, zd_dtype dt,
                         const std::vector<int64_t>& s) {
        std::string t = "'" + n + "' (module '" + m + "', " + dtype_name(dt) + ", [";
        for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
        return t + "])";
      };
      fail(ZD_ERR_INVALID_ARGUMENT,
           "rank " + std::to_string(rank) + " registered parameter #" + std::to_string(index) +
               " as " + describe(name, module, dtype, shape) + ", but another rank registered " +
               describe(p.name, pm, p.dtype, p.shape) +
               "; every rank must register the same parameters in the same order");
    }
    id = static_cast<zd_param_id>(index);
  } else {
    id = registry_.add(name, module, dtype, std::move(shape));
    registered_numel_ += static_cast<uint64_t>(registry_.params().back().numel);
  }
  // Rank 0's values win; a node without rank 0 stages its first rank's and
  // replaces them with rank 0's at finalize (share_initial_values).
  if (init && rank == first_local_) {
    ParamRecord& p = registry_.params()[static_cast<size_t>(id)];
    p.staged_init.assign(init, init_dtype, static_cast<uint64_t>(p.numel));
  }
  ++rs.registered;
  return id;
}

Model::RegistrySummary Model::registry_summary() const {
  std::lock_guard<std::mutex> lock(const_cast<std::mutex&>(reg_mu_));
  // Counted as they register, not summed here: an observer asking without
  // a pause would hold the lock the registering ranks need for as long.
  return RegistrySummary{registry_.params().size(), registry_.modules().size(), registered_numel_};
}

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
void Model::check_registrations_across_nodes(RankState& rs) {
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
  const int rank = rs.res.rank;
  ctx_.run(*rs.res.stream, [&] {
    plugins_.comm->all_reduce(ctx_.comm_call(rank, comm_tag(CommOp::Finalize, 0, 3), what), v, 6, ZD_COMM_F64,
                              ZD_REDUCE_MAX);
  });
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
void Model::share_initial_values(RankState& rs) {
  const int rank = rs.res.rank;
  auto& params = registry_.params();
  const bool receiver = rank == first_local_ && rank != 0;
  // Per parameter: 0 when rank 0 gave no values, else the dtype it staged
  // them in (the other nodes stage rank 0's in the same).
  std::vector<float> given(params.size());
  for (size_t i = 0; i < params.size(); ++i)
    given[i] = params[i].staged_init.empty() ? 0.0f : static_cast<float>(params[i].staged_init.dtype);
  const std::string what = "finalize: rank 0's initial values to every node";
  uint64_t id = 4;
  auto broadcast = [&](void* buf, uint64_t count, zd_dtype dt) {
    ctx_.run(*rs.res.stream, [&, buf, count, dt] {
      plugins_.comm->broadcast(ctx_.comm_call(rank, comm_tag(CommOp::Finalize, 0, id), what), buf, count,
                               comm_dtype(dt), 0);
    });
    ++id;
  };
  broadcast(given.data(), given.size(), ZD_DTYPE_F32);
  constexpr uint64_t kChunk = uint64_t{4} << 20;  // elements: up to 16 MiB of scratch per rank
  std::vector<std::byte> scratch;
  for (size_t i = 0; i < params.size(); ++i) {
    ParamRecord& p = params[i];
    if (given[i] == 0.0f) {
      // Rank 0 gave none: this node's values must not stand in for them.
      if (receiver) p.staged_init.clear();
      continue;
    }
    const auto dt = static_cast<zd_dtype>(given[i]);
    const auto numel = static_cast<uint64_t>(p.numel);
    const size_t esz = dtype_size(dt);
    if (receiver) p.staged_init.resize(dt, numel);
    for (uint64_t at = 0; at < numel; at += kChunk) {
      const uint64_t n = std::min(kChunk, numel - at);
      std::byte* buf;
      if (rank == 0 || receiver) {
        buf = p.staged_init.bytes.data() + at * esz;
      } else {
        scratch.resize(n * esz);
        buf = scratch.data();
      }
      broadcast(buf, n, dt);
    }
  }
  // No rank of this node reads the staged values before its first rank has
  // written them.
  const std::string done = "finalize: every node has rank 0's initial values";
  ctx_.run(*rs.res.stream, [&] {
    plugins_.comm->barrier(ctx_.comm_call(rank, comm_tag(CommOp::Finalize, 1, 0), done));
  });
}

void Model::lay_out_once() {
  std::lock_guard<std::mutex> lock(reg_mu_);
  if (laid_out_) return;
  LayoutPolicy policy;
  policy.partitioning = ctx_.partitioned(ZD_PARTITION_PARAMS)      ? Partitioning::Param
                        : ctx_.partitioned(ZD_PARTITION_OPTIMIZER) ? Partitioning::Group
                                                                   : Partitioning::Replicated;
  const PartitionerInstance* part = plugins_.partitioner.get();
  policy.stride = [part](uint64_t numel, uint64_t align) { return part->shard_stride(numel, align); };
  policy.persistence_threshold = part->persistence_threshold();
  if (plugins_.optimizer->compresses()) policy.param_align = 8;
  const RankResources& first = ranks_.front()->res;
  // Placed first: on a device the host cannot address, where the masters
  // are decides the groups (Placement::state_class).
  placement_.decide(first.device->host_addressable());
  policy.group_class = [this](size_t param) { return placement_.state_class(param); };
  registry_.lay_out(policy);
  if (const std::string split = split_fused_exchange_warning(ctx_); !split.empty()) log_warn(split);
  placement_.set_device_block_align(first.device->block_align());
  placement_.decide_window(first.ledger.budget(ZD_TIER_DEVICE), first.transfers.bytes_travel(), first.rank);
  laid_out_ = true;
  if (tracer_) {
    observe::TraceContext tc;
    tc.job = config_.source;
    for (const ModuleRecord& m : registry_.modules()) tc.modules.push_back(m.name);
    tc.tag_purposes = comm_purposes();
    tc.world_size = world_size_;
    tc.zero_stage = config_.zero_stage;
    tracer_->set_context(std::move(tc));
  }
}

// The live counters of every rank, the board that says which rank a
// collective waited for, and, when the job asks for a trace, the tracer
// (and devices that record their copies on it).
void Model::set_up_observing(int local_ranks) {
  if (!config_.trace.path.empty()) {
    observe::TraceSettings ts;
    ts.path = config_.trace.path;
    ts.from = config_.trace.from_step;
    ts.to = config_.trace.to_step;
    ts.events_per_thread = config_.trace.events_per_thread;
    tracer_ = std::make_unique<observe::Tracer>(std::move(ts), first_local_, local_ranks);
  }
  board_ = std::make_unique<observe::CollectiveBoard>(first_local_, local_ranks);
  for (auto& rs : ranks_) {
    RankResources& res = rs->res;
    res.probe.attach(tracer_.get(), first_local_, local_ranks);
    board_->bind(res.rank, &res.probe);
    if (tracer_) res.device = std::make_unique<observe::TracedDevice>(std::move(res.device), res.probe);
  }
  plugins_.comm->observe_with(board_.get());
}

const observe::RankCounters& Model::counters(int rank) const { return rank_state(rank).res.probe.counters(); }

void Model::report(int rank, uint64_t tokens, uint64_t samples, bool has_loss, double loss) {
  RankState& rs = rank_state(rank);
  rs.res.probe.report(tokens, samples, has_loss, loss, rs.applied);
}

void Model::set_up_tiers(RankState& rs) {
  RankResources& res = rs.res;
  const int rank = res.rank;
  zd_tier_config cfg{};
  cfg.struct_size = sizeof cfg;
  cfg.rank = rank;
  cfg.world_size = world_size_;
  cfg.local_rank = rank - first_local_;
  std::vector<const char*> paths;
  for (const auto& p : config_.offload.nvme_paths) paths.push_back(p.c_str());
  cfg.paths = paths.data();
  cfg.path_count = static_cast<int32_t>(paths.size());
  if (placement_.uses(rank, ZD_TIER_HOST) && !res.host) {
    if (!plugins_.host_tier) fail(ZD_ERR_PLUGIN, "state is placed on the host tier, but no host tier plugin is loaded");
    res.host = TierInstance::create(plugins_.host_tier, config_.offload.host_values, cfg);
    log_info("rank " + std::to_string(rank) + ": " + res.host->describe());
    // The optimizer updates host-resident state: with several ranks, each
    // runs it on the cores next to its memory — unless those are simply all
    // the cores we have (one memory node), where the shared pool is better.
    std::vector<int> cpus = res.host->cpus();
    if (world_size_ > 1 && !cpus.empty() && cpus != affinity_cpus()) {
      if (config_.threads && cpus.size() > config_.threads) cpus.resize(config_.threads);
      res.workers.pin(cpus);
    }
  }
  if (placement_.uses(rank, ZD_TIER_NVME) && !res.nvme) {
    if (!plugins_.nvme_tier) fail(ZD_ERR_PLUGIN, "state is placed on the nvme tier, but no nvme tier plugin is loaded");
    res.nvme = TierInstance::create(plugins_.nvme_tier, config_.offload.nvme_values, cfg);
    placement_.raise_nvme_alignment(res.nvme->alignment());
    log_info("rank " + std::to_string(rank) + ": " + res.nvme->describe());
  }
}

// Every local rank's, not only the calling one's: a model is admitted to
// the node's memory whole or not at all (MemoryAdmission).
std::map<int, TierBytes> Model::local_needs() const {
  std::map<int, TierBytes> needs;
  for (int rank = first_local_; rank < first_local_ + local_ranks(); ++rank) {
    TierBytes& need = needs[rank];
    const auto table = placement_.need_table(rank);
    for (size_t t = 0; t < need.size(); ++t)
      for (const uint64_t bytes : table[t]) need[t] = saturating_add(need[t], bytes);
  }
  return needs;
}

void Model::finalize(int rank) {
  Call call(*this, rank, "finalize");
  RankState& rs = rank_state(rank);
  if (rs.finalized)
    fail(ZD_ERR_INVALID_STATE, "zd_model_finalize called twice; the model is already finalized");
  {
    std::lock_guard<std::mutex> lock(reg_mu_);
    if (rs.registered == 0)
      fail(ZD_ERR_INVALID_STATE, "zd_model_finalize with no parameters registered");
    if (!initial_values_lost_.empty()) fail(ZD_ERR_INVALID_STATE, initial_values_lost_);
  }
  // Every rank has registered everything once all are here.
  const std::string what = "finalize: every rank registered";
  ctx_.run(*rs.res.stream, [&] {
    plugins_.comm->barrier(ctx_.comm_call(rank, comm_tag(CommOp::Finalize, 0, 1), what));
  });
  check_registrations();
  if (local_ranks() < world_size_) {
    check_registrations_across_nodes(rs);
    share_initial_values(rs);
  }
  lay_out_once();
  // Everything after the admission is undone when it fails (a snapshot that
  // cannot be resumed from, the node's memory refused), so that a retried
  // finalize allocates the state once: TieredBuffer::allocate appends, and
  // a retry over what a failed attempt kept held it all twice (the ledger
  // and the node's charge doubled, the NVMe extents reserved again). A
  // resume that fails in a job of several breaks the job first
  // (undo_finalize).
  bool resuming = false;
  try {
    place_rank(rs);
    share_placement(rs);
    resume_from_snapshot(rs, &resuming);
  } catch (...) {
    undo_finalize(rs, resuming);
    throw;
  }
  rs.finalized = true;
  finalized_.store(true);
}

void Model::place_rank(RankState& rs) {
  const int rank = rs.res.rank;
  placement_.check_device(*rs.res.device, rs.res.pool_memory, rank);
  set_up_tiers(rs);
  std::array<uint64_t, ZD_TIER_COUNT> budgets{};
  for (int t = 0; t < ZD_TIER_COUNT; ++t) budgets[static_cast<size_t>(t)] = rs.res.ledger.budget(t);
  placement_.check_budgets(budgets);
  if (admission_) admission_->admit(rank, local_needs());
  allocate_rank(rs);
}

void Model::share_placement(RankState& rs) {
  const int rank = rs.res.rank;
  if (shard_board_) {
    // Where the other ranks' gathers find this rank's shards (the barrier
    // below publishes them): a shard whose elements are not all at one
    // address (on NVMe, or across a tier boundary) is gathered by the
    // collective, which copies it out first.
    std::vector<const std::byte*> shards(registry_.params().size(), nullptr);
    for (size_t i = 0; i < shards.size(); ++i) {
      const ParamRecord& p = registry_.params()[i];
      const TieredBuffer& w = rs.buffers.of(p).working;
      if (!p.persistent && w.in_one_segment(p.flat_offset, p.stride)) shards[i] = w.addr(p.flat_offset);
    }
    shard_board_->publish(rank, std::move(shards));
  }
  const std::string what = "finalize: every rank placed its state";
  ctx_.run(*rs.res.stream, [&] {
    plugins_.comm->barrier(ctx_.comm_call(rank, comm_tag(CommOp::Finalize, 0, 2), what));
  });
  if (ctx_.params_partitioned()) {
    rs.residency.gather_persistent();
    const auto table = placement_.need_table(rank);
    uint64_t planned = 0;
    for (const uint64_t bytes : table[ZD_TIER_DEVICE]) planned += bytes;
    rs.residency.agree_prefetch_room(planned);
  }
}

void Model::resume_from_snapshot(RankState& rs, bool* resuming) {
  // The newest snapshot every rank can read and verify (agreed between the
  // ranks, across nodes too), if the job takes snapshots.
  const auto src = snapshots_->start(rs.res.rank, rs.res, rs.buffers);
  if (!src) return;
  *resuming = true;
  restore_rank(rs, *src, /*verified=*/true);
  if (rs.res.rank == first_local_)
    log_info("resumed from the snapshot " + src->dir() + " at step " + std::to_string(src->manifest().step));
}

// A rank that fails before its resume begins is one no other rank can
// finish its finalize without: each later step is a collective it joins
// (the snapshot agreement's refusal fails every rank at once), so the others
// meet its absence there (comm.timeout, or its connection's end) and none
// reads the shards it published. Its resume has no collective after its
// write phase, though, and the shard board hands a rank's shards out once
// that phase ended, failed or not (a begin call copies at once, having
// checked only ShardBoard::readable): the others may finish theirs and
// gather this rank's shards. So a resume that fails in a job of several
// breaks the job before anything goes: the other ranks' next calls and
// waits fail, naming this finalize. A gather past that check may still be
// copying, and nothing says when it is done: on a shard board the rank
// keeps its state until the model is destroyed (which aborts the board and
// ends the streams first). Such a job cannot retry anyway.
void Model::undo_finalize(RankState& rs, bool resuming) {
  put_back_initial_values(rs, resuming);  // from the masters: before they are released
  if (resuming && world_size_ > 1) {
    break_for_failed_resume(rs.res.rank);
    if (shard_board_) return;
  }
  release_rank(rs);
  // The NVMe store only grows: a tier reserves and never releases, so
  // the extents this attempt reserved before it failed would stay in the
  // store file, and a retry would reserve after them and need them twice.
  // Closing the store frees them all; a retry opens a fresh one
  // (set_up_tiers), and the disk's free space is what it has.
  rs.res.nvme.reset();
  if (admission_) admission_->release(rs.res.rank);
}

void Model::break_for_failed_resume(int rank) {
  const Error cause = error_being_handled();
  const std::string message = "rank " + std::to_string(rank) +
                              "'s zd_model_finalize failed part-way through its resume from a snapshot, which the "
                              "other ranks may have finished: " + cause.what();
  std::string broken;
  zd_status code;
  bool first;
  {
    std::lock_guard<std::mutex> lock(reg_mu_);
    // The rank's masters are part the snapshot's, part its initial values
    // (or given back), while the other ranks' finalize may have ended well:
    // half applied, as a load that stopped part-way, so that no restart
    // (daemon.keep_state) rebuilds working copies from them.
    if (!half_applied_) half_applied_.emplace(cause.code(), message);
    first = mark_broken_locked(cause.code(), message);  // aborts the shard board too
    broken = broken_;
    code = broken_code_;
  }
  // Not under reg_mu_ (abort_collectives takes comm_mu_). Later failures
  // are this one's echoes, as in break_job.
  if (first) abort_collectives(code, broken);
}

void Model::allocate_rank(RankState& rs) {
  rs.buffers.allocate_values(placement_);
  drop_initial_values(rs);
  rs.buffers.allocate_state(placement_);
  rs.compression.allocate();
  rs.optimizer.reserve_staging();
  rs.modules.assign(registry_.modules().size(), RankState::ModuleCalls{});
  rs.residency.reset();
  rs.grads.reset();
  rs.update.reset();
  // The page-locked staging buffers and the host scratch the plan counts,
  // now: a host budget that cannot hold them refuses here, not on the
  // thread that moves the first gradients off the device (which broke the
  // job), nor at the first compressed step.
  const Placement::HostStagingNeed staging = placement_.host_staging(rs.res.rank);
  rs.res.transfers.reserve_staging(staging.gradients != 0, staging.working != 0,
                                   placement_.host_windows(rs.res.rank));
  rs.active_modules = 0;
}

// Held beside the state they would be 2 bytes a parameter of a bf16 model
// over what training holds (4 of an fp32 one), at finalize, the job's
// highest point: a model sized to the host's memory by what its training
// holds was killed there. Dropped once every local rank has written them
// (they are one copy for the node's ranks), before any rank allocates the
// rest, they sit beside the working copies and masters only.
void Model::drop_initial_values(RankState& rs) {
  {
    std::lock_guard<std::mutex> lock(reg_mu_);
    took_initial_values_.resize(static_cast<size_t>(local_ranks()));
    took_initial_values_[static_cast<size_t>(rs.res.rank - first_local_)] = 1;
    const bool every_rank_took =
        std::all_of(took_initial_values_.begin(), took_initial_values_.end(), [](char took) { return took != 0; });
    auto& params = registry_.params();
    for (size_t i = 0; every_rank_took && i < params.size(); ++i) {
      if (params[i].staged_init.empty()) continue;
      dropped_initial_values_.emplace_back(i, params[i].staged_init.dtype);
      params[i].staged_init.clear();
    }
  }
  // No rank allocates the rest while this node still holds them. Every rank
  // of every node waits here (a rule the same on each), not only a node's
  // several.
  if (world_size_ == 1) return;
  const int rank = rs.res.rank;
  const std::string what = "finalize: every rank wrote the initial values";
  ctx_.run(*rs.res.stream, [&] {
    plugins_.comm->barrier(ctx_.comm_call(rank, comm_tag(CommOp::Finalize, 3, 0), what));
  });
}

void Model::put_back_initial_values(RankState& rs, bool masters_overwritten) noexcept {
  std::lock_guard<std::mutex> lock(reg_mu_);
  const auto local = static_cast<size_t>(rs.res.rank - first_local_);
  if (local >= took_initial_values_.size() || !took_initial_values_[local]) return;
  took_initial_values_[local] = 0;
  if (dropped_initial_values_.empty()) return;  // still staged (or none were registered)
  const std::string again = "; destroy the model and create it again";
  if (world_size_ > 1) {
    initial_values_lost_ = "an earlier zd_model_finalize failed after its ranks had dropped the registered initial "
                           "values, and a job of several ranks cannot put them back" + again;
    return;
  }
  if (masters_overwritten) {
    initial_values_lost_ = "an earlier zd_model_finalize failed while it resumed from a snapshot, which had begun "
                           "to overwrite the masters that hold the registered initial values" + again;
    return;
  }
  std::string unreadable;
  try {
    restage_initial_values(rs);
    dropped_initial_values_.clear();
    return;
  } catch (const std::exception& e) {
    unreadable = e.what();
  } catch (...) {
    unreadable = "an unknown error";
  }
  // Unreadable masters: the retry is refused, saying which.
  initial_values_lost_ = "an earlier zd_model_finalize failed after it had dropped the registered initial values, "
                         "and reading them back from the masters failed (" + unreadable + ")" + again;
}

// A master is its initial value widened to fp32, and narrowing it back to
// the dtype the value was staged in gives that value again, bit for bit.
void Model::restage_initial_values(RankState& rs) {
  auto& params = registry_.params();
  std::vector<float> whole;
  for (const auto& [index, dtype] : dropped_initial_values_) {
    ParamRecord& p = params[index];
    const auto numel = static_cast<uint64_t>(p.numel);
    whole.resize(numel);
    try {
      rs.buffers.read_value(p, whole.data());
    } catch (const std::exception& e) {
      throw std::runtime_error("the master of '" + p.name + "': " + e.what());
    }
    p.staged_init.resize(dtype, numel);
    convert(whole.data(), ZD_DTYPE_F32, p.staged_init.bytes.data(), dtype, numel);
  }
}

void Model::release_rank(RankState& rs) {
  try {
    rs.update.finish();
  } catch (...) {
  }
  rs.grads.release();
  rs.residency.clear();
  rs.optimizer.release_staging();
  rs.compression.release();
  rs.buffers.release();
}

TierPlan Model::plan(int rank) {
  lay_out_once();
  // What finalize refuses before it counts (a placement the device cannot
  // run) is refused here too: a plan that fits is one finalize takes.
  // Every rank's device is of the job's one kind.
  const RankState& rs = rank_state(rank);
  std::call_once(plan_device_checked_,
                 [&] { placement_.check_device(*rs.res.device, rs.res.pool_memory, rank); });
  TierPlan p;
  p.need = placement_.need_table(rank);
  for (int t = 0; t < ZD_TIER_COUNT; ++t) p.budget[static_cast<size_t>(t)] = rs.res.ledger.budget(t);
  return p;
}

}  // namespace zerod
