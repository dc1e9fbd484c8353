// Model: construction, whole-parameter access, failure handling and
// introspection. Registration and finalize are in model_setup.cpp, the
// per-step calls in model_calls.cpp, the step and restarts in
// model_step.cpp.
#include "model/model_rank.h"

#include "checkpoint/checkpoint_io.h"
#include "device/select.h"
#include "runtime/dtype.h"
#include "error.h"
#include "log.h"
#include "checkpoint/state_io.h"
#include "observe/traced_device.h"
#include "observe/tracer.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <map>
#include <new>

namespace zerod {

Model::Call::Call(Model& m, int rank, const char* name, zd_module_id module, bool of_step, Update update)
    : m_(m), rank_(rank), name_(name), module_(module), t0_(0) {
  RankState& rs = m.rank_state(rank);  // checks the rank
  std::string mod;
  if (module >= 0 && static_cast<size_t>(module) < m.registry_.modules().size())
    mod = m.registry_.module(module).name;
  m.require_healthy();  // a refused call is not recorded as the rank being in it
  m.activity_.enter(rank, name, mod);
  // Every call but a forward's or backward's, and those that say they
  // touch none of it, reads or writes what the overlapped update writes: it
  // waits for the whole update. (Those wait for their module themselves.)
  if ((!of_step || module < 0) && update == Update::Touches) {
    try {
      m.wait_update(rs, -1);
    } catch (...) {
      m.activity_.leave(rank, rs.applied, rs.micro_step);
      throw;
    }
  }
  if (m.shard_board_) {
    // The last begin's gather is compared with the peers' now (a rank kept
    // waiting here is in this call for the job's "where each rank was").
    try {
      rs.residency.settle_gathers();
    } catch (...) {
      m.activity_.leave(rank, rs.applied, rs.micro_step);
      throw;
    }
  }
  // The first call of a step opens it (and may start recording): its span
  // begins when the step does, so the step's spans nest in it.
  observe::RankProbe& probe = rs.res.probe;
  const int64_t opened = of_step ? probe.call_entered() : 0;
  if (probe.tracing()) t0_ = opened ? opened : observe::now_ns();
  probe.open_memory_interval(rs.res.ledger, t0_);
}

Model::Call::~Call() {
  RankState& rs = m_.rank_state(rank_);
  m_.activity_.leave(rank_, rs.applied, rs.micro_step);
  observe::RankProbe& probe = rs.res.probe;
  if (!t0_ && !rs.boundary_reached) return;  // not tracing: nothing to time
  const int64_t t1 = observe::now_ns();
  if (t0_ && probe.tracing()) {
    observe::EventArgs a;
    a.module = module_;
    probe.span("call", name_, t0_, t1, a);
    probe.memory(rs.res.ledger);
  }
  if (rs.boundary_reached) {
    rs.boundary_reached = false;
    probe.boundary(rs.applied, t1);
  }
}

Model::Model(JobConfig config, ModelPlugins plugins, JobPolicy* policy, int world_size, int first_local_rank,
             int local_ranks, DeviceFactory open)
    : config_(std::move(config)),
      plugins_(std::move(plugins)),
      policy_(policy),
      world_size_(world_size),
      first_local_(first_local_rank),
      registry_(world_size),
      ctx_(config_, registry_, plugins_, world_size, *this),
      placement_(ctx_, policy),
      activity_(world_size < 1 ? 1 : world_size),
      pool_(config_.threads) {
  if (!plugins_.optimizer || !plugins_.partitioner || !plugins_.comm)
    fail(ZD_ERR_INTERNAL, "a model needs an optimizer, a partitioner and a comm plugin");
  if (world_size_ < 1) fail(ZD_ERR_INVALID_ARGUMENT, "world size must be at least 1");
  if (local_ranks < 0) local_ranks = world_size_ - first_local_;
  if (first_local_ < 0 || local_ranks < 1 || first_local_ + local_ranks > world_size_)
    fail(ZD_ERR_INVALID_ARGUMENT, "local ranks " + std::to_string(first_local_) + ".." +
                                      std::to_string(first_local_ + local_ranks - 1) + " are outside the job's " +
                                      std::to_string(world_size_) + " ranks");
  if (config_.gradient_accumulation_steps < 1)
    fail(ZD_ERR_INVALID_ARGUMENT, "gradient_accumulation_steps must be at least 1");
  ctx_.partitions = plugins_.partitioner->partitions();
  // Stage 3 without stage 2 and 1 would gather into a state nobody reduces.
  if ((ctx_.partitioned(ZD_PARTITION_PARAMS) && !ctx_.partitioned(ZD_PARTITION_GRADS)) ||
      (ctx_.partitioned(ZD_PARTITION_GRADS) && !ctx_.partitioned(ZD_PARTITION_OPTIMIZER)))
    fail(ZD_ERR_CONFIG, "partitioner '" + plugins_.partitioner->plugin().name() +
                            "' partitions parameters or gradients without what comes before "
                            "them (optimizer state, then gradients); zerod cannot run that");
  if (local_ranks < world_size_) activity_.set_local(first_local_, local_ranks);
  base_lr_ = plugins_.optimizer->value("lr", 0.0);
  check_compression_support(ctx_);
  if (const std::string why = plugins_.optimizer->state_dtype_refusal(config_.optimizer_state_dtype); !why.empty())
    fail(ZD_ERR_CONFIG, std::string("optimizer.state_dtype = \"") + precision_name(config_.optimizer_state_dtype) +
                            "\": " + why + " (" + config_.source + ")");
  if (!config_.trace.path.empty())
    if (const std::string why = observe::trace_path_problem(config_.trace.path); !why.empty())
      fail(ZD_ERR_CONFIG, "trace.path = \"" + config_.trace.path + "\": " + why + " (" + config_.source + ")");
  const std::string device = open ? config_.device : resolve_device(config_.device, config_.source);
  if (!open) open = open_device;
  for (int r = first_local_; r < first_local_ + local_ranks; ++r) {
    auto rs = std::make_unique<RankState>(ctx_, placement_, r, pool_, pool_mu_);
    RankResources& res = rs->res;
    res.ledger.set_budget(ZD_TIER_DEVICE, config_.device_budget);
    res.ledger.set_budget(ZD_TIER_HOST, config_.host_budget);
    res.ledger.set_budget(ZD_TIER_NVME, config_.nvme_budget);
    // A rank in this process (embedded) computes on the GPU its trainer has
    // current; a daemon's ranks on the GPU of their local rank.
    const int local_rank = world_size_ == 1 ? -1 : r - first_local_;
    res.device = open(device, res.ledger, res.workers, local_rank, "zerod-rank" + std::to_string(r));
    // Collectives and the device's copies overlap the trainer's calls on a
    // thread of the rank's own; one rank on the cpu device (no collectives,
    // no bytes travelling) has nothing to overlap with and runs them inline.
    res.stream = std::make_unique<CommStream>(world_size_ > 1 || res.transfers.bytes_travel());
    rs->scaler = LossScaler(config_.loss_scale);
    ranks_.push_back(std::move(rs));
  }
  share_gpus();
  // Stage 3 with the whole job in this process on the local comm plugin
  // (which copies between the ranks' buffers in this address space anyway):
  // gathers copy the peers' shards one-sided, the host copying them into
  // the pool (Residency::copy_shards). Elsewhere (mpi, several nodes, a pool
  // the host cannot write) they stay collectives.
  bool one_sided = ctx_.params_partitioned() && world_size_ > 1 && local_ranks == world_size_ &&
                   plugins_.comm->plugin().name() == "local";
  for (const auto& rs : ranks_) one_sided = one_sided && rs->res.pool_memory.host_writes();
  if (one_sided) {
    shard_board_ = std::make_unique<ShardBoard>(world_size_, config_.comm_timeout_s);
    ctx_.shards = shard_board_.get();
  }
  // Every rank of the job in this process on devices whose pools the comm
  // plugins cannot reach (a daemon's GPUs): collectives run between their
  // pools on the devices themselves (device_comm.cpp), not through host
  // memory.
  bool peers = world_size_ > 1 && local_ranks == world_size_;
  for (const auto& rs : ranks_) peers = peers && !rs->res.pool_memory.plugins_reach();
  if (peers) {
    peer_board_ = std::make_unique<PeerBoard>(world_size_, config_.comm_timeout_s);
    ctx_.peers = peer_board_.get();
  }
  snapshots_ = std::make_unique<Snapshots>(ctx_, first_local_, local_ranks);
  set_up_observing(local_ranks);
  // Momentum compression and per-tensor figures are the host's loops; on a
  // pool the host cannot write they reach their bytes through host windows
  // (HostWindow, memory/transfers.h), so every device runs them.
}

Model::~Model() {
  // An overlapped update writes the buffers until it is done.
  for (auto& rs : ranks_) {
    try {
      rs->update.finish();
    } catch (...) {
    }
  }
  // Snapshot writers read the buffers until they are done.
  if (snapshots_)
    for (auto& rs : ranks_) snapshots_->fence(rs->res.rank);
  // Streams first: a task still running may touch the buffers. A gather
  // still waiting for a peer's shards gives up.
  if (shard_board_) shard_board_->abort(ZD_ERR_INVALID_STATE, "the model was destroyed");
  if (peer_board_) peer_board_->abort(ZD_ERR_INVALID_STATE, "the model was destroyed");
  for (auto& rs : ranks_) rs->res.stream.reset();
  for (auto& rs : ranks_) release_rank(*rs);
  if (admission_)
    for (auto& rs : ranks_) admission_->release(rs->res.rank);
}

void Model::share_gpus() {
  // A daemon with more ranks than GPUs puts several on one GPU (local rank
  // modulo the GPUs): each rank's default budget is its part of that GPU's,
  // or every rank would plan for nearly all of its memory.
  std::map<int32_t, int> on_gpu;
  for (const auto& rs : ranks_)
    if (std::strcmp(rs->res.device->name(), "cuda") == 0) ++on_gpu[rs->res.device->ordinal()];
  std::map<int32_t, uint64_t> budgets;  // the ranks' device budgets together, by GPU
  for (const auto& rs : ranks_)
    if (std::strcmp(rs->res.device->name(), "cuda") == 0) {
      rs->res.device->share_default_budget(on_gpu[rs->res.device->ordinal()]);
      log_info("rank " + std::to_string(rs->res.rank) + ": " + rs->res.device->describe());
      const uint64_t b = rs->res.ledger.budget(ZD_TIER_DEVICE);
      uint64_t& sum = budgets[rs->res.device->ordinal()];
      sum = b == MemoryLedger::kNoBudget || sum == MemoryLedger::kNoBudget ? MemoryLedger::kNoBudget : sum + b;
    }
  // budgets.device is each rank's. Where the job's, times the ranks on one
  // GPU, is more than that GPU has, the budget no longer says when the
  // ranks are full: CUDA does, by refusing a chunk mid-step. A budget is a
  // ceiling, not a reservation (a job may need far less), so this is said
  // once, not refused.
  for (const auto& [gpu, sum] : budgets) {
    const auto& rs = *std::find_if(ranks_.begin(), ranks_.end(), [gpu = gpu](const auto& r) {
      return std::strcmp(r->res.device->name(), "cuda") == 0 && r->res.device->ordinal() == gpu;
    });
    const uint64_t total = rs->res.device->memory_total();
    const int n = on_gpu[gpu];
    if (n < 2 || total == 0 || sum == MemoryLedger::kNoBudget || sum <= total) continue;
    log_warn("budgets.device lets each of the " + std::to_string(n) + " ranks on GPU " + std::to_string(gpu) +
             " hold " + format_bytes(sum / static_cast<uint64_t>(n)) + ", " + format_bytes(sum) +
             " together: more than its " + format_bytes(total) +
             ", so CUDA, not the budget, would stop them mid-step (ZD_ERR_OUT_OF_MEMORY). budgets.device is per "
             "rank: set it to at most " + format_bytes(total / static_cast<uint64_t>(n)) +
             " (less what the trainers themselves use on that GPU), or leave it unset (each rank then gets its "
             "share of 90% of the free memory)");
  }
}

Model::RankState& Model::rank_state(int rank) {
  if (rank < 0 || rank >= world_size_)
    fail(ZD_ERR_INVALID_ARGUMENT, "rank " + std::to_string(rank) + " is outside the job's " +
                                      std::to_string(world_size_) + " ranks");
  if (!is_local(rank))
    fail(ZD_ERR_INVALID_ARGUMENT, "rank " + std::to_string(rank) + " is served by another node's daemon (this one "
                                      "serves ranks " + std::to_string(first_local_) + ".." +
                                      std::to_string(first_local_ + local_ranks() - 1) + ")");
  return *ranks_[static_cast<size_t>(rank - first_local_)];
}

const Model::RankState& Model::rank_state(int rank) const { return const_cast<Model*>(this)->rank_state(rank); }

const MemoryLedger& Model::ledger(int rank) const { return rank_state(rank).res.ledger; }
const Device& Model::device(int rank) const { return *rank_state(rank).res.device; }
StepFigures Model::last_step(int rank) const { return rank_state(rank).last; }

zd_comm_figures Model::comm_figures(int rank) const {
  zd_comm_figures f;
  {
    std::lock_guard<std::mutex> lock(comm_mu_);  // status and metrics call this while recover() may swap it
    f = plugins_.comm->figures(rank);
  }
  const observe::RankCounters& c = counters(rank);
  f.bytes_sent += c.direct_bytes_sent.load(std::memory_order_relaxed);
  f.collectives += c.direct_collectives.load(std::memory_order_relaxed);
  return f;
}

double Model::loss_scale(int rank) const { return rank_state(rank).scaler.scale(); }

void Model::require_finalized(const char* call) const {
  if (!finalized_.load())
    fail(ZD_ERR_INVALID_STATE, std::string(call) + " before zd_model_finalize: register the "
                                                   "parameters, then finalize the model first");
}

void Model::require_healthy() const {
  if (!is_broken_.load()) return;
  std::lock_guard<std::mutex> lock(const_cast<std::mutex&>(reg_mu_));
  fail(broken_code_, broken_);
}

std::string Model::broken_reason() const {
  std::lock_guard<std::mutex> lock(const_cast<std::mutex&>(reg_mu_));
  return broken_;
}

zd_status Model::broken_code() const {
  std::lock_guard<std::mutex> lock(const_cast<std::mutex&>(reg_mu_));
  return broken_code_;
}

std::optional<Error> Model::half_applied_step() const {
  {
    std::lock_guard<std::mutex> lock(const_cast<std::mutex&>(reg_mu_));
    if (half_applied_) return half_applied_;
  }
  return writes_apart();
}

std::optional<Error> Model::writes_apart() const {
  const RankState& first = *ranks_.front();
  const int64_t made = first.whole_writes.load();
  for (const auto& rs : ranks_) {
    const int64_t other = rs->whole_writes.load();
    if (other == made) continue;
    return Error(ZD_ERR_PEER_LOST,
                 "rank " + std::to_string(first.res.rank) + " made " + std::to_string(made) +
                     " zd_param_write or zd_optimizer_state_write calls, rank " + std::to_string(rs->res.rank) +
                     " made " + std::to_string(other) +
                     ": a rank was lost between the ranks' writes of the same value, which left it part written");
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------
// Failures

// The first failure breaks the job: it is kept, with where each rank was,
// and logged once. Caller holds reg_mu_.
bool Model::mark_broken_locked(zd_status code, const std::string& message, zd_log_level level) {
  const bool first = broken_.empty();
  if (first) {
    broken_code_ = code;
    broken_ = message + "\nwhere each rank was:\n" + activity_.describe() + "\nthe job cannot continue";
    log_message(level, broken_);
  }
  is_broken_.store(true);
  // Wakes every rank waiting for another in a one-sided gather or a
  // collective between devices.
  if (shard_board_) shard_board_->abort(broken_code_, broken_);
  if (peer_board_) peer_board_->abort(broken_code_, broken_);
  return first;
}

void Model::abort_collectives(zd_status code, const std::string& message) {
  // recover() swaps the comm under comm_mu_; never taken under reg_mu_.
  std::lock_guard<std::mutex> lock(comm_mu_);
  plugins_.comm->abort(code, message);
}

void Model::broken_by(const Error& e) { break_job(e, false); }

void Model::break_job(const Error& e, bool part_way) {
  std::string message;
  zd_status code;
  bool first;
  {
    std::lock_guard<std::mutex> lock(reg_mu_);
    if (part_way && !half_applied_) half_applied_.emplace(e);
    first = mark_broken_locked(e.code(), e.what());
    message = broken_;
    code = broken_code_;
  }
  // The other ranks may wait in a collective this rank will never join now
  // (a rank whose update failed does not reach the gather after it): they
  // fail at once with this failure, as when a rank is lost, not after
  // comm.timeout. Later failures are this one's echoes.
  if (first) abort_collectives(code, message);
  fail(code, message);
}

namespace {

// The exception being handled, as the error a failed write of the state
// reports: a tier's own, or running out of memory for a scratch buffer.
Error write_failure() {
  try {
    throw;
  } catch (const std::bad_alloc&) {
    return Error(ZD_ERR_OUT_OF_MEMORY, "out of memory (std::bad_alloc)");
  } catch (...) {
    return error_being_handled(ZD_ERR_IO);
  }
}

}  // namespace

void Model::write_stopped_part_way(int rank, const std::string& what) {
  const Error cause = write_failure();
  const std::string others = world_size_ > 1 ? ", which the other ranks may have finished" : "";
  break_job(Error(cause.code(), "rank " + std::to_string(rank) + "'s " + what + " stopped part-way" + others +
                                    ": this rank's copies of it are part the new value, part the old one, so no rank "
                                    "may train on, nor any restart resume, that mix (start again from a checkpoint "
                                    "or a snapshot): " + cause.what()),
            /*part_way=*/true);
}

void Model::rebuild_failed(int rank) {
  // A failure that broke the job first (a collective of the rebuild the
  // other ranks aborted, a wait on the board) is thrown as it was.
  const Error cause = write_failure();
  break_job(Error(cause.code(), "rank " + std::to_string(rank) +
                                    "'s rebuild of its working copies from its masters (a restart's "
                                    "zd_model_finalize) failed, which leaves them part rebuilt; its masters and "
                                    "optimizer state were only read, so a later restart may resume them: " +
                                    cause.what()),
            /*part_way=*/false);
}

void Model::rank_lost(int rank, const std::string& reason) {
  if (!is_local(rank)) return;
  activity_.mark_lost(rank, reason);
  const std::string message = "rank " + std::to_string(rank) + " was lost: " + reason;
  {
    std::lock_guard<std::mutex> lock(reg_mu_);
    mark_broken_locked(ZD_ERR_PEER_LOST, message);
  }
  // Wakes every rank waiting for the lost one in a collective. Called from
  // threads that are not ranks (the launcher, the daemon's stop).
  abort_collectives(ZD_ERR_PEER_LOST, message);
}

void Model::stop_job(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(reg_mu_);
    mark_broken_locked(ZD_ERR_PEER_LOST, reason, ZD_LOG_INFO);
  }
  abort_collectives(ZD_ERR_PEER_LOST, reason);
}

void Model::rank_joined(int rank) {
  if (is_local(rank)) activity_.mark_joined(rank);
}

void Model::rank_left(int rank, const std::string& reason) {
  if (!is_local(rank)) return;
  activity_.mark_lost(rank, reason);
  const std::string message = "rank " + std::to_string(rank) + " left the job: " + reason;
  if (shard_board_) shard_board_->rank_left(rank, message);
  if (peer_board_) peer_board_->abort(ZD_ERR_PEER_LOST, message);
  abort_collectives(ZD_ERR_PEER_LOST, message);
}

// ---------------------------------------------------------------------------
// Whole parameters and optimizer state

void check_whole_param(const char* call, const ParamRecord& p, zd_dtype dtype, const void* ptr,
                       uint64_t bytes) {
  if (!dtype_valid(dtype))
    fail(ZD_ERR_INVALID_ARGUMENT, std::string(call) + " of '" + p.name + "': invalid dtype " +
                                      std::to_string(dtype));
  const uint64_t want = static_cast<uint64_t>(p.numel) * dtype_size(dtype);
  if (bytes != want)
    fail(ZD_ERR_SHAPE_MISMATCH, std::string(call) + " of '" + p.name + "': it has " +
                                    std::to_string(p.numel) + " elements (" + std::to_string(want) +
                                    " bytes as " + dtype_name(dtype) + "), the buffer has " +
                                    std::to_string(bytes) + " bytes");
  if (!ptr) fail(ZD_ERR_INVALID_ARGUMENT, std::string(call) + " of '" + p.name + "': the buffer is NULL");
}

void Model::write_param(int rank, zd_param_id param, zd_dtype dtype, const void* src, uint64_t bytes) {
  Call call(*this, rank, "param_write");
  require_finalized("zd_param_write");
  RankState& rs = rank_state(rank);
  snapshots_->fence(rank);
  const ParamRecord& p = registry_.param(param);
  check_whole_param("zd_param_write", p, dtype, src, bytes);
  if (rs.active_modules > 0)
    fail(ZD_ERR_INVALID_STATE, "zd_param_write of '" + p.name +
                                   "' while modules are begun; write between steps");
  // The value as fp32, once; the working copies derive from it so they
  // agree with the master exactly.
  std::vector<float> v(static_cast<size_t>(p.numel));
  convert(src, dtype, v.data(), ZD_DTYPE_F32, v.size());
  // Gathers ahead still in flight end first: they read the shard written
  // here and write the gathered copy overwrite() updates (TSan found the
  // race).
  const ShardWrite phase(ctx_, *rs.res.stream, rank, "zd_param_write");
  try {
    rs.buffers.write_value(p, v.data());
    if (ctx_.params_partitioned()) {
      rs.residency.overwrite(param, v.data());
      rs.compression.write_whole_param(p, v.data());
    }
  } catch (...) {
    // Before the phase ends: the other ranks' gathers would copy the shard
    // as complete.
    write_stopped_part_way(rank, "zd_param_write of '" + p.name + "'");
  }
  rs.whole_writes.fetch_add(1);
}

void Model::read_param(int rank, zd_param_id param, zd_dtype dtype, void* dst, uint64_t bytes) {
  Call call(*this, rank, "param_read");
  require_finalized("zd_param_read");
  RankState& rs = rank_state(rank);
  const ParamRecord& p = registry_.param(param);
  check_whole_param("zd_param_read", p, dtype, dst, bytes);
  const std::vector<float> full = read_whole(ctx_, rs.res, rs.buffers, param, kMasterSlot, "param_read");
  convert(full.data(), ZD_DTYPE_F32, dst, dtype, static_cast<size_t>(p.numel));
}

namespace {

// A learning rate as the trainer would write it: the shortest text that
// reads back as the same double (3e-4, not 0.00029999999999999997).
std::string lr_text(double lr) {
  char b[64];
  const auto r = std::to_chars(b, b + sizeof b, lr);
  return std::string(b, r.ptr);
}

void check_slot(const char* call, const OptimizerInstance& opt, int slot) {
  const auto slots = static_cast<int>(opt.state_slots());
  if (slots == 0)
    fail(ZD_ERR_INVALID_ARGUMENT, std::string(call) + ": optimizer '" + opt.plugin().name() +
                                      "' keeps no state, so it has no state slot " + std::to_string(slot));
  if (slot < 0 || slot >= slots)
    fail(ZD_ERR_INVALID_ARGUMENT,
         std::string(call) + ": optimizer '" + opt.plugin().name() + "' has " + std::to_string(slots) +
             " state slot" + (slots == 1 ? "" : "s") + " (0.." + std::to_string(slots - 1) + ")" +
             ", not " + std::to_string(slot));
}

}  // namespace

void Model::read_state(int rank, zd_param_id param, int slot, zd_dtype dtype, void* dst, uint64_t bytes) {
  Call call(*this, rank, "optimizer_state_read");
  require_finalized("zd_optimizer_state_read");
  RankState& rs = rank_state(rank);
  const ParamRecord& p = registry_.param(param);
  check_slot("zd_optimizer_state_read", *plugins_.optimizer, slot);
  check_whole_param("zd_optimizer_state_read", p, dtype, dst, bytes);
  const std::vector<float> full = read_whole(ctx_, rs.res, rs.buffers, param, slot, "optimizer_state_read");
  convert(full.data(), ZD_DTYPE_F32, dst, dtype, static_cast<size_t>(p.numel));
}

void Model::write_state(int rank, zd_param_id param, int slot, zd_dtype dtype, const void* src, uint64_t bytes) {
  Call call(*this, rank, "optimizer_state_write");
  require_finalized("zd_optimizer_state_write");
  RankState& rs = rank_state(rank);
  const ParamRecord& p = registry_.param(param);
  check_slot("zd_optimizer_state_write", *plugins_.optimizer, slot);
  check_whole_param("zd_optimizer_state_write", p, dtype, src, bytes);
  if (rs.active_modules > 0)
    fail(ZD_ERR_INVALID_STATE, "zd_optimizer_state_write of '" + p.name +
                                   "' while modules are begun; write between steps");
  std::vector<float> v(static_cast<size_t>(p.numel));
  convert(src, dtype, v.data(), ZD_DTYPE_F32, v.size());
  snapshots_->fence(rank);
  try {
    write_own_part(ctx_, rs.res, rs.buffers, param, slot, v.data());
  } catch (...) {
    write_stopped_part_way(rank, "zd_optimizer_state_write of '" + p.name + "' (slot '" +
                                     plugins_.optimizer->state_name(static_cast<uint32_t>(slot)) + "')");
  }
  // The error feedback and the kept average restart; the per-tensor
  // scalars are the optimizer's state beside the slot and stay.
  rs.compression.reset();
  rs.whole_writes.fetch_add(1);
}

int64_t Model::applied_steps(int rank) const { return rank_state(rank).applied; }

void Model::discard_gradients(RankState& rs, const char* call) {
  const bool had = rs.grads.pending();
  rs.grads.discard();  // also leaves the window's local choice (set_local) to the next plan
  rs.plan_step = 0;    // the plan is asked again for the step the call set
  if (had && rs.res.rank == first_local_)
    log_warn(std::string(call) + " dropped the gradients of a backward that no zd_step applied: they were computed "
                                 "from the parameters before it, so the next update starts from the state it set");
}

void Model::set_applied_steps(int rank, int64_t step) {
  Call call(*this, rank, "set_step");
  require_finalized("zd_model_set_step");
  RankState& rs = rank_state(rank);
  if (step < 0) fail(ZD_ERR_INVALID_ARGUMENT, "zd_model_set_step: the step must be >= 0, got " + std::to_string(step));
  if (rs.active_modules > 0 || rs.micro_step % config_.gradient_accumulation_steps != 0)
    fail(ZD_ERR_INVALID_STATE, "zd_model_set_step inside an accumulation window; call it between steps");
  require_scalars_for_restore(rs, step);
  // Gradients of a backward no zd_step applied were computed from the
  // parameters before the restore: the next update would apply them to the
  // restored ones. They go, as on a load.
  discard_gradients(rs, "zd_model_set_step");
  rs.applied = step;
  rs.res.probe.restart(step);  // the trace's next step is step + 1, as zd_step_result's
  // The error feedback restarts (as after a load: a new step count is how a
  // trainer restores its own checkpoint, which holds none). The optimizer's
  // per-tensor scalars are its state, as m and v are, and stay: zeroed
  // here, a 1-bit LAMB past its freeze step never moved again. (A snapshot
  // still writing the error feedback finishes reading it first.)
  snapshots_->fence(rank);
  rs.compression.reset();
}

void Model::require_scalars_for_restore(const RankState& rs, int64_t step) {
  // The whole-tensor calls cannot restore the optimizer's per-tensor
  // scalars. A model that never held a run's (no update ran in it, no
  // checkpoint that holds them was loaded) and is set to a step whose next
  // update reads them would not go on as the run it came from: 1-bit LAMB
  // would apply lr * 0 and never move again. Refused before anything
  // changes, and alike on every rank (every rank's scalars agree).
  const OptimizerInstance& opt = *plugins_.optimizer;
  if (step == 0 || opt.tensor_scalars() == 0 || rs.buffers.tensor_scalars_set() ||
      plan_for(step + 1).kept_scalars == 0)
    return;
  fail(ZD_ERR_CONFIG,
       "step " + std::to_string(step) + ": optimizer '" + opt.plugin().name() +
           "' keeps per-tensor scalars (1-bit LAMB's frozen trust ratios, 0/1 Adam's sum of learning rates since "
           "its last sync) that update " + std::to_string(step + 1) + " reads, and this model holds none: "
           "zd_optimizer_state_write and zd_model_set_step do not carry them, so the run would not go on as the one "
           "it came from (1-bit LAMB would not move the parameters). Restore it with zd_model_save and "
           "zd_model_load (zerod.torch: save_checkpoint and load_checkpoint), which carry them");
}

void Model::set_lr(int rank, double lr) {
  // The update running behind the last zd_step took its lr at that
  // boundary (PassArgs) and this one is the next boundary's: no wait for
  // that update here, which would expose it whole to a trainer that sets
  // its lr right after each step.
  Call call(*this, rank, "set_lr", -1, false, Call::Update::Untouched);
  require_finalized("zd_model_set_lr");
  RankState& rs = rank_state(rank);
  const bool usable = std::isfinite(lr) && lr >= 0;
  // Inside an accumulation window is fine: the lr is read at the boundary.
  const bool between_modules = rs.active_modules == 0;
  // Every rank joins the comparison before refusing anything, so a refusal
  // on one rank is a refusal on all and no rank is left waiting in it.
  const LrAgreement agreed = agree_on_lr(rs, usable ? lr : 0.0, !usable, !between_modules);
  if (!usable)
    fail(ZD_ERR_INVALID_ARGUMENT, "zd_model_set_lr: the learning rate is " + lr_text(lr) +
                                      "; it must be finite and >= 0");
  if (agreed.some_unusable)
    fail(ZD_ERR_INVALID_ARGUMENT, "zd_model_set_lr: another rank set a learning rate that is not finite or < 0 "
                                  "(this rank set " + lr_text(lr) + "); the lr in force stays");
  if (!between_modules)
    fail(ZD_ERR_INVALID_STATE, "zd_model_set_lr while modules are begun; call it between modules (it sets the lr "
                               "from the next accumulation boundary on)");
  if (agreed.some_in_module)
    fail(ZD_ERR_INVALID_STATE, "zd_model_set_lr while another rank has modules begun; every rank calls it between "
                               "modules, and the lr in force stays");
  if (agreed.lowest != agreed.highest)
    fail(ZD_ERR_INVALID_ARGUMENT,
         "zd_model_set_lr: the ranks set different learning rates (from " + lr_text(agreed.lowest) + " to " +
             lr_text(agreed.highest) + "; rank " + std::to_string(rank) + " set " + lr_text(lr) +
             "); every rank must set the same lr, and the lr in force stays");
  rs.trainer_lr = lr;
}

// One all-reduce of (lr, -lr, unusable, in a module) with MAX: the lrs are
// equal everywhere exactly when max(lr) == -max(-lr), and either flag is set
// when any rank set it. Every rank sees the same four numbers, so every rank
// refuses alike and each keeps the lr it had: the ranks go on in step. An
// unusable lr is compared as 0 (a NaN would make MAX depend on the order).
Model::LrAgreement Model::agree_on_lr(RankState& rs, double lr, bool unusable, bool in_module) {
  double v[4] = {lr, -lr, unusable ? 1.0 : 0.0, in_module ? 1.0 : 0.0};
  if (world_size_ > 1) {
    const std::string what = "zd_model_set_lr: comparing the lr every rank set";
    const int rank = rs.res.rank;
    ctx_.run(*rs.res.stream, [&] {
      plugins_.comm->all_reduce(ctx_.comm_call(rank, comm_tag(CommOp::SetLr, 0, 0), what), v, 4, ZD_COMM_F64,
                                ZD_REDUCE_MAX);
    });
  }
  return LrAgreement{-v[1], v[0], v[2] != 0, v[3] != 0};
}

// ---------------------------------------------------------------------------
// Introspection

std::vector<int> Model::optimizer_cpus(int rank) const { return rank_state(rank).res.workers.cpus(); }

std::string Model::tier_description(int rank, zd_tier tier) const {
  RankState& rs = const_cast<RankState&>(rank_state(rank));
  if (tier < 0 || tier >= ZD_TIER_COUNT) return "";
  return rs.res.memory(tier).describe();
}

std::vector<float> Model::shard_values(int rank, zd_param_id param, ShardBuffer which) const {
  require_finalized("shard_values");
  RankState& rs = const_cast<RankState&>(rank_state(rank));
  const_cast<Model*>(this)->wait_update(rs, -1);
  rs.grads.drain();
  const ParamRecord& p = registry_.param(param);
  const ParamGroup& g = registry_.groups()[static_cast<size_t>(p.group)];
  GroupBuffers& b = rs.buffers.of(p);
  const bool p3 = ctx_.params_partitioned();
  // Stage 3: the shard with its padding; below: the owned part of the parameter.
  uint64_t first = 0, count = 0;
  const uint64_t ob = ctx_.owned_begin(g, rank);
  if (p3) {
    first = p.flat_offset;
    count = p.stride;
  } else {
    uint64_t lo, hi;
    ctx_.owned_part(p, rank, &lo, &hi);
    first = lo - ob;
    count = hi > lo ? hi - lo : 0;
  }
  std::vector<float> out(count);
  const TierSet tiers = rs.res.tiers();
  auto read_as_f32 = [&](const TieredBuffer& buf, uint64_t at, zd_dtype dt) {
    std::vector<std::byte> raw(count * dtype_size(dt));
    buf.read(tiers, at, count, raw.data());
    convert(raw.data(), dt, out.data(), ZD_DTYPE_F32, count);
  };
  switch (which) {
    case ShardBuffer::Master:
      b.master.read(tiers, first, count, out.data());
      break;
    case ShardBuffer::Gradient:
      read_as_f32(b.grad, p3 || ctx_.partitioned(ZD_PARTITION_GRADS) ? first : first + ob, ctx_.grad_dtype(g));
      break;
    case ShardBuffer::WorkingShard:
      read_as_f32(b.working, p3 ? first : first + ob, p.dtype);
      break;
  }
  return out;
}

void Model::sync(int rank) {
  RankState& rs = rank_state(rank);
  wait_update(rs, -1);
  snapshots_->fence(rank);
  ctx_.drain(*rs.res.stream);
  rs.grads.drain();
  rs.res.device->synchronize();
}

bool Model::resident(int rank, zd_param_id param) const {
  if (!ctx_.params_partitioned()) return true;
  return rank_state(rank).residency.resident(param);
}

uint64_t Model::live_elements(int rank) const { return rank_state(rank).residency.live_elements(); }

}  // namespace zerod

