// Model: construction, registration, finalize, whole-parameter access,
// failure handling and introspection. The per-step calls are in
// model_calls.cpp, the step in model_step.cpp.
#include "model_state.h"

#include "dtype.h"
#include "error.h"
#include "grad_math.h"
#include "log.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

namespace zerod {

Model::Call::Call(Model& m, int rank, const char* name, zd_module_id module) : m_(m), rank_(rank) {
  m.rank_state(rank);  // checks the rank
  std::string mod;
  if (module >= 0 && static_cast<size_t>(module) < m.registry_.modules().size())
    mod = m.registry_.module(module).name;
  m.require_healthy();  // a refused call is not recorded as the rank being in it
  m.activity_.enter(rank, name, mod);
}

Model::Call::~Call() {
  const RankState& rs = m_.rank_state(rank_);
  m_.activity_.leave(rank_, rs.applied, rs.micro_step);
}

Model::Model(JobConfig config, ModelPlugins plugins, JobPolicy* policy, int world_size, int first_local_rank,
             int local_ranks)
    : config_(std::move(config)),
      plugins_(std::move(plugins)),
      policy_(policy),
      world_size_(world_size),
      first_local_(first_local_rank),
      partitions_(0),
      registry_(world_size),
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
  partitions_ = plugins_.partitioner->partitions();
  // Stage 3 without stage 2 and 1 would gather into a state nobody reduces.
  if ((partitioned(ZD_PARTITION_PARAMS) && !partitioned(ZD_PARTITION_GRADS)) ||
      (partitioned(ZD_PARTITION_GRADS) && !partitioned(ZD_PARTITION_OPTIMIZER)))
    fail(ZD_ERR_CONFIG, "partitioner '" + plugins_.partitioner->plugin().name() +
                            "' partitions parameters or gradients without what comes before "
                            "them (optimizer state, then gradients); zerod cannot run that");
  if (local_ranks < world_size_) activity_.set_local(first_local_, local_ranks);
  base_lr_ = plugins_.optimizer->value("lr", 0.0);
  check_compression_support();
  for (int r = first_local_; r < first_local_ + local_ranks; ++r) {
    auto rs = std::make_unique<RankState>();
    rs->ledger.set_budget(ZD_TIER_DEVICE, config_.device_budget);
    rs->ledger.set_budget(ZD_TIER_HOST, config_.host_budget);
    rs->ledger.set_budget(ZD_TIER_NVME, config_.nvme_budget);
    rs->pool = std::make_unique<DevicePool>(rs->ledger, uint64_t{64} << 20,
                                            "zerod-rank" + std::to_string(r));
    rs->stream = std::make_unique<CommStream>(world_size_ > 1);
    rs->scaler = LossScaler(config_.loss_scale);
    ranks_.push_back(std::move(rs));
  }
}

Model::~Model() {
  // Streams first: a task still running may touch the buffers.
  for (auto& rs : ranks_) rs->stream.reset();
  for (auto& rs : ranks_) release_rank(*rs);
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

const Model::RankState& Model::rank_state(int rank) const {
  return const_cast<Model*>(this)->rank_state(rank);
}

const MemoryLedger& Model::ledger(int rank) const { return rank_state(rank).ledger; }
const DevicePool& Model::device_pool(int rank) const { return *rank_state(rank).pool; }
StepFigures Model::last_step(int rank) const { return rank_state(rank).last; }
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

std::string Model::module_label(zd_module_id m) const {
  return "module '" + registry_.module(m).name + "'";
}

zd_dtype Model::grad_dtype(const ParamGroup& g) const {
  return config_.grad_accum_dtype ? config_.grad_accum_dtype : g.dtype;
}

uint64_t Model::owned_begin(const ParamGroup& g, int rank) const {
  return registry_.partitioning() == Partitioning::Group ? static_cast<uint64_t>(rank) * g.stride : 0;
}

uint64_t Model::owned_count(const ParamGroup& g) const {
  switch (registry_.partitioning()) {
    case Partitioning::Replicated: return g.full_numel;
    case Partitioning::Group: return g.stride;
    default: return g.flat_numel;
  }
}

// ---------------------------------------------------------------------------
// Failures

// The first failure breaks the job: it is kept, with where each rank was,
// and logged once. Caller holds reg_mu_.
void Model::mark_broken_locked(zd_status code, const std::string& message) {
  if (broken_.empty()) {
    broken_code_ = code;
    broken_ = message + "\nwhere each rank was:\n" + activity_.describe() + "\nthe job cannot continue";
    log_message(ZD_LOG_ERROR, broken_);
  }
  is_broken_.store(true);
}

void Model::broken_by(const Error& e) {
  std::string message;
  zd_status code;
  {
    std::lock_guard<std::mutex> lock(reg_mu_);
    mark_broken_locked(e.code(), e.what());
    message = broken_;
    code = broken_code_;
  }
  fail(code, message);
}

void Model::rank_lost(int rank, const std::string& reason) {
  if (!is_local(rank)) return;
  activity_.mark_lost(rank, reason);
  const std::string message = "rank " + std::to_string(rank) + " was lost: " + reason;
  {
    std::lock_guard<std::mutex> lock(reg_mu_);
    mark_broken_locked(ZD_ERR_PEER_LOST, message);
  }
  // Wakes every rank waiting for the lost one in a collective.
  plugins_.comm->abort(ZD_ERR_PEER_LOST, message);
}

void Model::rank_left(int rank, const std::string& reason) {
  if (!is_local(rank)) return;
  activity_.mark_lost(rank, reason);
  plugins_.comm->abort(ZD_ERR_PEER_LOST, "rank " + std::to_string(rank) + " left the job: " + reason);
}

zd_comm_call Model::comm_call(int rank, uint64_t tag, const std::string& what) const {
  zd_comm_call c{};
  c.struct_size = sizeof c;
  c.rank = rank;
  c.tag = tag;
  const double t = config_.comm_timeout_s;
  c.timeout_ms = t > 0 ? static_cast<uint32_t>(std::min(t * 1000.0, 4.0e9)) : 0;
  c.what = what.c_str();  // the caller keeps the string alive for the call
  return c;
}

CommStream::Ticket Model::issue(RankState& rs, std::function<void()> fn) {
  return rs.stream->enqueue(std::move(fn));
}

void Model::wait(const CommStream::Ticket& t) {
  try {
    t.wait();
  } catch (const Error& e) {
    broken_by(e);
  }
}

void Model::drain(RankState& rs) {
  try {
    rs.stream->drain();
  } catch (const Error& e) {
    broken_by(e);
  }
}

// ---------------------------------------------------------------------------
// Registration

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
    id = registry_.add(name, module, dtype, std::move(shape), {});
  }
  // Rank 0's values win; a node without rank 0 stages its first rank's and
  // replaces them with rank 0's at finalize (share_initial_values).
  if (init && rank == first_local_) {
    ParamRecord& p = registry_.params()[static_cast<size_t>(id)];
    p.staged_init.resize(static_cast<size_t>(p.numel));
    convert(init, init_dtype, p.staged_init.data(), ZD_DTYPE_F32, p.staged_init.size());
  }
  ++rs.registered;
  return id;
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
  }
  // Every rank has registered everything once all are here.
  const std::string what = "finalize: every rank registered";
  wait(issue(rs, [&, rank] {
    plugins_.comm->barrier(comm_call(rank, comm_tag(CommOp::Finalize, 0, 1), what));
  }));
  check_registrations();
  if (local_ranks() < world_size_) {
    check_registrations_across_nodes(rs, rank);
    share_initial_values(rs, rank);
  }
  lay_out_once();
  try {
    set_up_tiers(rs, rank);
    check_budget_table();
    allocate_rank(rs, rank);
  } catch (...) {
    release_rank(rs);
    throw;
  }
  const std::string what2 = "finalize: every rank placed its state";
  wait(issue(rs, [&, rank] {
    plugins_.comm->barrier(comm_call(rank, comm_tag(CommOp::Finalize, 0, 2), what2));
  }));
  if (partitioned(ZD_PARTITION_PARAMS)) gather_persistent(rs, rank);
  rs.finalized = true;
  {
    // The initial values are in place on every rank now.
    std::lock_guard<std::mutex> lock(reg_mu_);
    if (!finalized_.load())
      for (ParamRecord& p : registry_.params()) std::vector<float>().swap(p.staged_init);
    finalized_.store(true);
  }
}

void Model::allocate_rank(RankState& rs, int rank) {
  const uint32_t slots = plugins_.optimizer->state_slots();
  const auto& groups = registry_.groups();
  const bool p3 = partitioned(ZD_PARTITION_PARAMS);
  const TierSet tiers = rs.tiers();
  rs.groups.resize(groups.size());
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const ParamGroup& g = groups[gi];
    GroupBuffers& b = rs.groups[gi];
    const std::string what = std::string("group ") + dtype_name(g.dtype) + " of rank " +
                             std::to_string(rank);
    const uint64_t grad_len = p3 ? g.flat_numel
                              : partitioned(ZD_PARTITION_GRADS) ? g.stride
                                                                : g.full_numel;
    b.working.allocate(tiers, dtype_size(g.dtype), tier_runs(gi, rank, Holds::Params), ZD_MEM_PARAMS,
                       "the working copies of " + what);
    b.grad = rs.pool->allocate(grad_len * dtype_size(grad_dtype(g)), ZD_MEM_GRADS,
                               "the gradients of " + what);
    b.master.allocate(tiers, 4, tier_runs(gi, rank, Holds::Master), ZD_MEM_MASTER,
                      "the master copies of " + what);
    for (uint32_t s = 0; s < slots; ++s)
      b.state[s].allocate(tiers, 4, tier_runs(gi, rank, Holds::Optimizer), ZD_MEM_OPTIMIZER,
                          "optimizer state '" + plugins_.optimizer->state_name(s) + "' of " + what);
  }
  // Initial values (rank 0's), into this rank's copies.
  for (const ParamRecord& p : registry_.params()) {
    if (p.staged_init.empty()) continue;
    const ParamGroup& g = groups[static_cast<size_t>(p.group)];
    GroupBuffers& b = rs.groups[static_cast<size_t>(p.group)];
    if (p3) {
      const uint64_t start = static_cast<uint64_t>(rank) * p.stride;
      const uint64_t real = p.shard_real(rank);
      if (real == 0) continue;  // a small parameter's last ranks hold only padding
      b.master.write(tiers, p.flat_offset, real, p.staged_init.data() + start);
      std::vector<std::byte> w(real * dtype_size(p.dtype));
      convert(p.staged_init.data() + start, ZD_DTYPE_F32, w.data(), p.dtype, real);
      b.working.write(tiers, p.flat_offset, real, w.data());
      continue;
    }
    convert(p.staged_init.data(), ZD_DTYPE_F32, b.working.addr(p.full_offset), p.dtype,
            static_cast<size_t>(p.numel));
    // The owned part of the master: the intersection with [begin, begin + count).
    const uint64_t ob = owned_begin(g, rank);
    const uint64_t lo = std::max(p.full_offset, ob);
    const uint64_t hi = std::min(p.full_offset + static_cast<uint64_t>(p.numel), ob + owned_count(g));
    if (lo < hi) b.master.write(tiers, lo - ob, hi - lo, p.staged_init.data() + (lo - p.full_offset));
  }
  allocate_compression(rs, rank);
  // The NVMe pipeline's staging sets, charged to the host tier for good.
  const std::vector<uint64_t> layout = staging_layout(rank);
  if (!layout.empty()) {
    const auto sets = static_cast<size_t>(config_.offload.buffer_count);
    uint64_t bytes = 0;
    for (uint64_t b : layout) bytes += b * sets;
    rs.ledger.charge(ZD_TIER_HOST, ZD_MEM_BUFFERS, bytes,
                     "the NVMe staging buffers (offload.buffer_count x offload.tile_size per operand)");
    rs.staging_charged = bytes;
    const uint64_t align = nvme_alignment();
    rs.staging.resize(sets);
    for (auto& set : rs.staging)
      for (uint64_t b : layout) set.emplace_back(b ? b : align, align);
  }
  rs.modules.assign(registry_.modules().size(), ModuleState{});
  rs.params.assign(registry_.params().size(), ParamState{});
  rs.buckets.assign(groups.size(), {});
  rs.bucket_elems.assign(groups.size(), 0);
  rs.active_modules = 0;
}

void Model::release_rank(RankState& rs) {
  const TierSet tiers = rs.tiers();
  for (ParamState& ps : rs.params) {
    rs.pool->release(ps.grad_view, ZD_MEM_BUFFERS);
    rs.pool->release(ps.gathered, ZD_MEM_PARAMS);
    ps = ParamState{};
  }
  for (auto& bucket : rs.buckets)
    for (PendingGrad& pg : bucket) rs.pool->release(pg.view, ZD_MEM_BUFFERS);
  rs.buckets.clear();
  for (GroupBuffers& b : rs.groups) {
    b.working.release(tiers);
    rs.pool->release(b.grad, ZD_MEM_GRADS);
    b.master.release(tiers);
    for (TieredBuffer& s : b.state) s.release(tiers);
  }
  release_compression(rs);
  rs.groups.clear();
  rs.staging.clear();
  rs.ledger.release(ZD_TIER_HOST, ZD_MEM_BUFFERS, rs.staging_charged);
  rs.staging_charged = 0;
}

// ---------------------------------------------------------------------------
// Whole parameters

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
  const ParamRecord& p = registry_.param(param);
  check_whole_param("zd_param_write", p, dtype, src, bytes);
  if (rs.active_modules > 0)
    fail(ZD_ERR_INVALID_STATE, "zd_param_write of '" + p.name +
                                   "' while modules are begun; write between steps");
  // The value as fp32, once; the working copies derive from it so they
  // agree with the master exactly.
  const auto numel = static_cast<uint64_t>(p.numel);
  std::vector<float> v(numel);
  convert(src, dtype, v.data(), ZD_DTYPE_F32, numel);
  const ParamGroup& g = registry_.groups()[static_cast<size_t>(p.group)];
  GroupBuffers& b = rs.groups[static_cast<size_t>(p.group)];
  const size_t esz = dtype_size(p.dtype);
  const TierSet tiers = rs.tiers();
  if (partitioned(ZD_PARTITION_PARAMS)) {
    const uint64_t start = static_cast<uint64_t>(rank) * p.stride;
    const uint64_t real = p.shard_real(rank);
    b.master.write(tiers, p.flat_offset, real, v.data() + start);
    std::vector<std::byte> w(real * esz);
    convert(v.data() + start, ZD_DTYPE_F32, w.data(), p.dtype, real);
    b.working.write(tiers, p.flat_offset, real, w.data());
    const ParamState& ps = rs.params[static_cast<size_t>(param)];
    if (ps.gathered) convert(v.data(), ZD_DTYPE_F32, ps.gathered.ptr, p.dtype, numel);
    return;
  }
  convert(v.data(), ZD_DTYPE_F32, b.working.addr(p.full_offset), p.dtype, numel);
  const uint64_t ob = owned_begin(g, rank);
  const uint64_t lo = std::max(p.full_offset, ob);
  const uint64_t hi = std::min(p.full_offset + numel, ob + owned_count(g));
  if (lo < hi) b.master.write(tiers, lo - ob, hi - lo, v.data() + (lo - p.full_offset));
}

// ---------------------------------------------------------------------------
// Introspection for tests

std::vector<float> Model::shard_values(int rank, zd_param_id param, ShardBuffer which) const {
  require_finalized("shard_values");
  const RankState& rs = rank_state(rank);
  const ParamRecord& p = registry_.param(param);
  const ParamGroup& g = registry_.groups()[static_cast<size_t>(p.group)];
  const GroupBuffers& b = rs.groups[static_cast<size_t>(p.group)];
  const bool p3 = partitioned(ZD_PARTITION_PARAMS);
  // Stage 3: the shard with its padding; below: the owned part of the parameter.
  uint64_t first = 0, count = 0, ob = owned_begin(g, rank);
  if (p3) {
    first = p.flat_offset;
    count = p.stride;
  } else {
    const uint64_t lo = std::max(p.full_offset, ob);
    const uint64_t hi = std::min(p.full_offset + static_cast<uint64_t>(p.numel), ob + owned_count(g));
    first = lo - ob;
    count = hi > lo ? hi - lo : 0;
  }
  std::vector<float> out(count);
  const TierSet tiers = const_cast<RankState&>(rs).tiers();
  switch (which) {
    case ShardBuffer::Master:
      b.master.read(tiers, first, count, out.data());
      break;
    case ShardBuffer::Gradient: {
      const zd_dtype gd = grad_dtype(g);
      const uint64_t at = p3 || partitioned(ZD_PARTITION_GRADS) ? first : first + ob;
      convert(b.grad.ptr + at * dtype_size(gd), gd, out.data(), ZD_DTYPE_F32, count);
      break;
    }
    case ShardBuffer::WorkingShard: {
      const uint64_t at = p3 ? first : first + ob;
      std::vector<std::byte> w(count * dtype_size(p.dtype));
      b.working.read(tiers, at, count, w.data());
      convert(w.data(), p.dtype, out.data(), ZD_DTYPE_F32, count);
      break;
    }
  }
  return out;
}

void Model::sync(int rank) { drain(rank_state(rank)); }

bool Model::resident(int rank, zd_param_id param) const {
  const RankState& rs = rank_state(rank);
  if (!partitioned(ZD_PARTITION_PARAMS)) return true;
  return static_cast<bool>(rs.params.at(static_cast<size_t>(param)).gathered);
}

}  // namespace zerod
