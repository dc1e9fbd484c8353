#include "model.h"

#include "dtype.h"
#include "error.h"
#include "grad_math.h"
#include "log.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

namespace zerod {

namespace {

// Elements per optimizer task: small enough that the four arrays of a tile
// stay in L2 while the gradient is zeroed right after its update.
constexpr uint64_t kTile = uint64_t{1} << 15;

const char* stage_error =
    "ZeRO stages 1-3 are not built yet (the daemon and ZeRO issue); use zero = { stage = 0 }";

}  // namespace

Model::Model(JobConfig config, std::unique_ptr<OptimizerInstance> optimizer, JobPolicy* policy,
             int world_size)
    : config_(std::move(config)),
      optimizer_(std::move(optimizer)),
      policy_(policy),
      world_size_(world_size),
      registry_(1),
      scaler_(config_.loss_scale),
      pool_(config_.threads) {
  if (!optimizer_) fail(ZD_ERR_INTERNAL, "a model needs an optimizer");
  if (world_size_ < 1) fail(ZD_ERR_INVALID_ARGUMENT, "world size must be at least 1");
  if (config_.zero_stage != 0) fail(ZD_ERR_NOT_IMPLEMENTED, stage_error);
  if (world_size_ != 1)
    fail(ZD_ERR_NOT_IMPLEMENTED, "more than one rank needs the daemon, which is not built yet");
  if (config_.gradient_accumulation_steps < 1)
    fail(ZD_ERR_INVALID_ARGUMENT, "gradient_accumulation_steps must be at least 1");
  const int lr_at = optimizer_->plugin().value_index("lr");
  base_lr_ = lr_at >= 0 ? optimizer_->values().at(static_cast<size_t>(lr_at)) : 0.0;
  for (int r = 0; r < world_size_; ++r) {
    auto rs = std::make_unique<RankState>();
    rs->ledger.set_budget(ZD_TIER_DEVICE, config_.device_budget);
    rs->pool = std::make_unique<DevicePool>(rs->ledger, uint64_t{64} << 20,
                                            "zerod-rank" + std::to_string(r));
    ranks_.push_back(std::move(rs));
  }
}

Model::~Model() {
  for (auto& rs : ranks_) release_rank(*rs);
}

Model::RankState& Model::rank_state(int rank) {
  if (rank < 0 || rank >= world_size_)
    fail(ZD_ERR_INVALID_ARGUMENT, "rank " + std::to_string(rank) + " is outside the job's " +
                                      std::to_string(world_size_) + " ranks");
  return *ranks_[static_cast<size_t>(rank)];
}

const Model::RankState& Model::rank_state(int rank) const {
  return const_cast<Model*>(this)->rank_state(rank);
}

const MemoryLedger& Model::ledger(int rank) const { return rank_state(rank).ledger; }
const DevicePool& Model::device_pool(int rank) const { return *rank_state(rank).pool; }

void Model::require_finalized(const char* call) const {
  if (!finalized_)
    fail(ZD_ERR_INVALID_STATE, std::string(call) + " before zd_model_finalize: register the "
                                                   "parameters, then finalize the model first");
}

std::string Model::module_label(zd_module_id m) const {
  return "module '" + registry_.module(m).name + "'";
}

zd_dtype Model::grad_dtype(const ParamGroup& g) const {
  return config_.grad_accum_dtype ? config_.grad_accum_dtype : g.dtype;
}

// ---------------------------------------------------------------------------
// Registration and placement

zd_param_id Model::register_param(const std::string& name, const std::string& module,
                                  zd_dtype dtype, std::vector<int64_t> shape, const void* init,
                                  zd_dtype init_dtype) {
  if (finalized_)
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
  int64_t numel = 1;
  for (int64_t e : shape) numel *= (e > 0 ? e : 1);
  std::vector<float> staged;
  // Shape errors are reported by the registry before the copy is made.
  const zd_param_id id = registry_.add(name, module, dtype, std::move(shape), {});
  if (init) {
    staged.resize(static_cast<size_t>(numel));
    convert(init, init_dtype, staged.data(), ZD_DTYPE_F32, staged.size());
    registry_.params()[static_cast<size_t>(id)].staged_init = std::move(staged);
  }
  return id;
}

void Model::check_budget_table(
    const std::vector<std::array<uint64_t, ZD_MEM_KIND_COUNT>>& need) const {
  bool over = false;
  std::ostringstream table;
  table << "  tier     params      grads       master      optimizer   total       budget\n";
  for (int t = 0; t < ZD_TIER_COUNT; ++t) {
    uint64_t total = 0;
    for (uint64_t b : need[static_cast<size_t>(t)]) total += b;
    const uint64_t budget = ranks_[0]->ledger.budget(t);
    if (total == 0 && budget == MemoryLedger::kNoBudget) continue;
    const bool tier_over = budget != MemoryLedger::kNoBudget && total > budget;
    over = over || tier_over;
    char line[256];
    auto f = [](uint64_t b) { return format_bytes(b); };
    std::snprintf(line, sizeof line, "  %-8s %-11s %-11s %-11s %-11s %-11s %-11s%s\n",
                  tier_name(t), f(need[t][ZD_MEM_PARAMS]).c_str(), f(need[t][ZD_MEM_GRADS]).c_str(),
                  f(need[t][ZD_MEM_MASTER]).c_str(), f(need[t][ZD_MEM_OPTIMIZER]).c_str(),
                  f(total).c_str(),
                  budget == MemoryLedger::kNoBudget ? "none" : f(budget).c_str(),
                  tier_over ? "  <- over budget" : "");
    table << line;
  }
  if (over)
    fail(ZD_ERR_BUDGET, "the model state does not fit its memory budgets (per rank):\n" +
                            table.str() + "raise the budget in " + config_.source +
                            " or move state to another tier");
}

void Model::finalize() {
  if (finalized_)
    fail(ZD_ERR_INVALID_STATE, "zd_model_finalize called twice; the model is already finalized");
  if (registry_.params().empty())
    fail(ZD_ERR_INVALID_STATE, "zd_model_finalize with no parameters registered");
  registry_.lay_out();

  // What each tier must hold, checked against the budgets before anything
  // is allocated, so a model that does not fit is refused with the table.
  std::vector<std::array<uint64_t, ZD_MEM_KIND_COUNT>> need(ZD_TIER_COUNT);
  const uint32_t slots = optimizer_->state_slots();
  for (const ParamGroup& g : registry_.groups()) {
    auto& dev = need[ZD_TIER_DEVICE];
    dev[ZD_MEM_PARAMS] += g.full_numel * dtype_size(g.dtype);
    dev[ZD_MEM_GRADS] += g.full_numel * dtype_size(grad_dtype(g));
    dev[ZD_MEM_MASTER] += g.flat_numel * 4;
    dev[ZD_MEM_OPTIMIZER] += g.flat_numel * 4 * slots;
  }
  check_budget_table(need);

  for (int r = 0; r < world_size_; ++r) {
    RankState& rs = *ranks_[static_cast<size_t>(r)];
    try {
      allocate_rank(rs, r);
    } catch (...) {
      for (auto& other : ranks_) release_rank(*other);
      throw;
    }
  }
  // The staged initial values are in place now; give their memory back.
  for (ParamRecord& p : registry_.params()) std::vector<float>().swap(p.staged_init);
  finalized_ = true;
}

void Model::allocate_rank(RankState& rs, int rank) {
  const uint32_t slots = optimizer_->state_slots();
  const auto& groups = registry_.groups();
  rs.groups.resize(groups.size());
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const ParamGroup& g = groups[gi];
    GroupBuffers& b = rs.groups[gi];
    const std::string what = std::string("group ") + dtype_name(g.dtype) + " of rank " +
                             std::to_string(rank);
    b.working = rs.pool->allocate(g.full_numel * dtype_size(g.dtype), ZD_MEM_PARAMS,
                                  "the working copies of " + what);
    b.grad = rs.pool->allocate(g.full_numel * dtype_size(grad_dtype(g)), ZD_MEM_GRADS,
                               "the gradients of " + what);
    b.master = rs.pool->allocate(g.flat_numel * 4, ZD_MEM_MASTER, "the master copies of " + what);
    for (uint32_t s = 0; s < slots; ++s)
      b.state[s] = rs.pool->allocate(g.flat_numel * 4, ZD_MEM_OPTIMIZER,
                                     "optimizer state '" + optimizer_->state_name(s) + "' of " + what);
  }
  for (const ParamRecord& p : registry_.params()) {
    if (p.staged_init.empty()) continue;
    GroupBuffers& b = rs.groups[static_cast<size_t>(p.group)];
    const uint64_t start = static_cast<uint64_t>(rank) * p.shard_numel;
    const uint64_t real = p.shard_real(rank);
    std::memcpy(b.master.as<float>() + p.flat_offset, p.staged_init.data() + start, real * 4);
    const size_t esz = dtype_size(p.dtype);
    convert(p.staged_init.data(), ZD_DTYPE_F32, b.working.ptr + p.full_offset * esz, p.dtype,
            static_cast<size_t>(p.numel));
  }
  rs.modules.assign(registry_.modules().size(), ModuleActivity{});
  rs.grad_views.assign(registry_.params().size(), GradView{});
  rs.grad_touched.assign(registry_.params().size(), 0);
  rs.active_modules = 0;
}

void Model::release_rank(RankState& rs) {
  for (GroupBuffers& b : rs.groups) {
    rs.pool->release(b.working, ZD_MEM_PARAMS);
    rs.pool->release(b.grad, ZD_MEM_GRADS);
    rs.pool->release(b.master, ZD_MEM_MASTER);
    for (Block& s : b.state) rs.pool->release(s, ZD_MEM_OPTIMIZER);
  }
  rs.groups.clear();
  for (GradView& v : rs.grad_views) rs.pool->release(v.block, ZD_MEM_BUFFERS);
  rs.grad_views.clear();
}

// ---------------------------------------------------------------------------
// Call order

void Model::forward_begin(int rank, zd_module_id module) {
  require_finalized("zd_forward_begin");
  RankState& rs = rank_state(rank);
  registry_.module(module);
  ModuleActivity& a = rs.modules[static_cast<size_t>(module)];
  if (a.forward)
    fail(ZD_ERR_INVALID_STATE, module_label(module) +
                                   " is already in forward: zd_forward_begin called twice "
                                   "without zd_forward_end");
  if (a.backward)
    fail(ZD_ERR_INVALID_STATE, module_label(module) +
                                   " is in backward: call zd_backward_end before running its "
                                   "forward again");
  // Stage 0: the working copies are always resident; nothing to gather.
  a.forward = true;
  ++rs.active_modules;
}

void Model::forward_end(int rank, zd_module_id module) {
  require_finalized("zd_forward_end");
  RankState& rs = rank_state(rank);
  registry_.module(module);
  ModuleActivity& a = rs.modules[static_cast<size_t>(module)];
  if (!a.forward)
    fail(ZD_ERR_INVALID_STATE, module_label(module) +
                                   " is not in forward: zd_forward_end without zd_forward_begin");
  a.forward = false;
  --rs.active_modules;
}

std::byte* Model::grad_accumulator(RankState& rs, const ParamRecord& p) const {
  const ParamGroup& g = registry_.groups()[static_cast<size_t>(p.group)];
  return rs.groups[static_cast<size_t>(p.group)].grad.ptr +
         p.full_offset * dtype_size(grad_dtype(g));
}

void Model::backward_begin(int rank, zd_module_id module) {
  require_finalized("zd_backward_begin");
  RankState& rs = rank_state(rank);
  const ModuleRecord& mod = registry_.module(module);
  ModuleActivity& a = rs.modules[static_cast<size_t>(module)];
  if (a.backward)
    fail(ZD_ERR_INVALID_STATE, module_label(module) +
                                   " is already in backward: zd_backward_begin called twice "
                                   "without zd_backward_end");
  if (a.forward)
    fail(ZD_ERR_INVALID_STATE, module_label(module) +
                                   " is still in forward: call zd_forward_end before "
                                   "zd_backward_begin");
  // The first contribution of a window goes straight into the (zero)
  // accumulator when it has the parameter's dtype; later ones, and any other
  // dtype, get a zeroed transient buffer that backward_end adds in.
  std::vector<Block> taken;
  try {
    for (zd_param_id pid : mod.params) {
      const ParamRecord& p = registry_.param(pid);
      const ParamGroup& g = registry_.groups()[static_cast<size_t>(p.group)];
      GradView& v = rs.grad_views[static_cast<size_t>(pid)];
      const bool direct = !rs.grad_touched[static_cast<size_t>(pid)] && grad_dtype(g) == p.dtype;
      if (!direct) {
        v.block = rs.pool->allocate(static_cast<uint64_t>(p.numel) * dtype_size(p.dtype),
                                    ZD_MEM_BUFFERS, "the gradient view of parameter '" + p.name + "'");
        taken.push_back(v.block);
      }
    }
  } catch (...) {
    for (zd_param_id pid : mod.params) rs.grad_views[static_cast<size_t>(pid)].block = Block{};
    for (const Block& b : taken) rs.pool->release(b, ZD_MEM_BUFFERS);
    throw;
  }
  for (zd_param_id pid : mod.params) rs.grad_views[static_cast<size_t>(pid)].active = true;
  a.backward = true;
  ++rs.active_modules;
}

void Model::backward_end(int rank, zd_module_id module) {
  require_finalized("zd_backward_end");
  RankState& rs = rank_state(rank);
  const ModuleRecord& mod = registry_.module(module);
  ModuleActivity& a = rs.modules[static_cast<size_t>(module)];
  if (!a.backward)
    fail(ZD_ERR_INVALID_STATE, module_label(module) +
                                   " is not in backward: zd_backward_end without "
                                   "zd_backward_begin");
  for (zd_param_id pid : mod.params) {
    const ParamRecord& p = registry_.param(pid);
    const ParamGroup& g = registry_.groups()[static_cast<size_t>(p.group)];
    GradView& v = rs.grad_views[static_cast<size_t>(pid)];
    if (v.block) {
      accumulate(v.block.ptr, p.dtype, grad_accumulator(rs, p), grad_dtype(g),
                 static_cast<uint64_t>(p.numel));
      rs.pool->release(v.block, ZD_MEM_BUFFERS);
      v.block = Block{};
    }
    v.active = false;
    rs.grad_touched[static_cast<size_t>(pid)] = 1;
  }
  a.backward = false;
  --rs.active_modules;
}

ViewInfo Model::param_view(int rank, zd_param_id param) const {
  require_finalized("zd_param_view");
  const RankState& rs = rank_state(rank);
  const ParamRecord& p = registry_.param(param);
  const ModuleActivity& a = rs.modules[static_cast<size_t>(p.module)];
  if (!a.forward && !a.backward)
    fail(ZD_ERR_INVALID_STATE, "parameter '" + p.name + "' is not resident: its " +
                                   module_label(p.module) +
                                   " is not between a _begin and its _end call");
  const size_t esz = dtype_size(p.dtype);
  const Block& w = rs.groups[static_cast<size_t>(p.group)].working;
  ViewInfo v;
  v.data = w.ptr + p.full_offset * esz;
  v.bytes = static_cast<uint64_t>(p.numel) * esz;
  v.arena = w.arena;
  v.offset = w.offset + p.full_offset * esz;
  v.dtype = p.dtype;
  v.shape = &p.shape;
  v.read_only = true;
  return v;
}

ViewInfo Model::grad_view(int rank, zd_param_id param) const {
  require_finalized("zd_grad_view");
  RankState& rs = const_cast<Model*>(this)->rank_state(rank);
  const ParamRecord& p = registry_.param(param);
  const GradView& gv = rs.grad_views[static_cast<size_t>(param)];
  if (!gv.active)
    fail(ZD_ERR_INVALID_STATE, "parameter '" + p.name + "' has no gradient buffer now: its " +
                                   module_label(p.module) +
                                   " is not between zd_backward_begin and zd_backward_end");
  const size_t esz = dtype_size(p.dtype);
  ViewInfo v;
  if (gv.block) {
    v.data = gv.block.ptr;
    v.arena = gv.block.arena;
    v.offset = gv.block.offset;
  } else {
    const Block& acc = rs.groups[static_cast<size_t>(p.group)].grad;
    v.data = grad_accumulator(rs, p);
    v.arena = acc.arena;
    v.offset = acc.offset + p.full_offset * esz;
  }
  v.bytes = static_cast<uint64_t>(p.numel) * esz;
  v.dtype = p.dtype;
  v.shape = &p.shape;
  v.read_only = false;
  return v;
}

// ---------------------------------------------------------------------------
// The step

double Model::learning_rate(int64_t step) const {
  if (policy_) {
    if (auto lr = policy_->lr(step)) {
      if (!std::isfinite(*lr) || *lr < 0)
        fail(ZD_ERR_CONFIG, config_.source + ": lr(" + std::to_string(step) + ") returned " +
                                std::to_string(*lr) + "; a learning rate must be finite and >= 0");
      return *lr;
    }
  }
  return base_lr_;
}

void Model::gradient_stats(RankState& rs, double* sumsq, bool* finite) {
  struct Task {
    size_t group;
    uint64_t begin, count;
  };
  std::vector<Task> tasks;
  const auto& groups = registry_.groups();
  for (size_t gi = 0; gi < groups.size(); ++gi)
    for (uint64_t b = 0; b < groups[gi].full_numel; b += kTile)
      tasks.push_back({gi, b, std::min(kTile, groups[gi].full_numel - b)});
  std::vector<GradStats> partial(tasks.size());
  pool_.run(tasks.size(), [&](size_t i) {
    const Task& t = tasks[i];
    const zd_dtype dt = grad_dtype(groups[t.group]);
    partial[i] = grad_stats(rs.groups[t.group].grad.ptr + t.begin * dtype_size(dt), dt, t.count);
  });
  // Summed in task order so the norm does not depend on thread timing.
  double s = 0.0;
  bool ok = true;
  for (const GradStats& p : partial) {
    s += p.sumsq;
    ok = ok && p.finite;
  }
  *sumsq = s;
  *finite = ok && std::isfinite(s);
}

void Model::apply_optimizer(RankState& rs, double grad_scale, double lr, int64_t t) {
  struct Task {
    size_t group;
    uint64_t begin, count;
  };
  std::vector<Task> tasks;
  const auto& groups = registry_.groups();
  for (size_t gi = 0; gi < groups.size(); ++gi)
    for (uint64_t b = 0; b < groups[gi].flat_numel; b += kTile)
      tasks.push_back({gi, b, std::min(kTile, groups[gi].flat_numel - b)});
  const uint32_t slots = optimizer_->state_slots();
  pool_.run(tasks.size(), [&](size_t i) {
    const Task& task = tasks[i];
    const ParamGroup& g = groups[task.group];
    GroupBuffers& b = rs.groups[task.group];
    const zd_dtype gdt = grad_dtype(g);
    zd_optimizer_update u{};
    u.struct_size = sizeof u;
    u.count = task.count;
    u.master = b.master.as<float>() + task.begin;
    std::byte* grad = b.grad.ptr + task.begin * dtype_size(gdt);
    u.grad = grad;
    u.grad_dtype = gdt;
    u.work = b.working.ptr + task.begin * dtype_size(g.dtype);
    u.work_dtype = g.dtype;
    for (uint32_t s = 0; s < slots; ++s) u.state[s] = b.state[s].as<float>() + task.begin;
    u.grad_scale = grad_scale;
    u.lr = lr;
    u.step = t;
    optimizer_->update(ZD_ISA_AUTO, u);
    // Zeroed while the tile is still in cache: the next window starts clean.
    std::memset(grad, 0, task.count * dtype_size(gdt));
  });
}

void Model::zero_gradients(RankState& rs) {
  const auto& groups = registry_.groups();
  for (size_t gi = 0; gi < groups.size(); ++gi)
    std::memset(rs.groups[gi].grad.ptr, 0, rs.groups[gi].grad.bytes);
}

StepFigures Model::step(int rank) {
  require_finalized("zd_step");
  RankState& rs = rank_state(rank);
  if (rs.active_modules > 0) {
    for (size_t m = 0; m < rs.modules.size(); ++m) {
      const ModuleActivity& a = rs.modules[m];
      if (a.forward || a.backward)
        fail(ZD_ERR_INVALID_STATE,
             "zd_step while " + module_label(static_cast<zd_module_id>(m)) + " is still in " +
                 (a.forward ? "forward: call zd_forward_end" : "backward: call zd_backward_end") +
                 " first");
    }
  }
  StepFigures f;
  f.micro_step = micro_step_ + 1;
  f.step = applied_steps_;
  f.loss_scale = scaler_.scale();
  const int64_t gas = config_.gradient_accumulation_steps;
  if (f.micro_step % gas != 0) {
    micro_step_ = f.micro_step;
    return f;
  }

  // An accumulation boundary. The learning rate is resolved first so a
  // failing lr() leaves the gradients and counters untouched.
  f.boundary = true;
  f.lr = learning_rate(applied_steps_);
  double sumsq = 0.0;
  bool finite = true;
  gradient_stats(rs, &sumsq, &finite);
  const double scale = scaler_.scale();
  // Gradients were summed over gas micro-batches at the loss scale.
  const double denom = scale * static_cast<double>(gas);
  micro_step_ = f.micro_step;
  if (!finite) {
    scaler_.update(true);
    zero_gradients(rs);
    f.skipped = true;
    f.grad_norm = std::nan("");
    f.loss_scale = scaler_.scale();
    if (!scaler_.dynamic())
      log_warn("step " + std::to_string(applied_steps_ + 1) +
               " skipped: the gradients hold inf or NaN");
  } else {
    const double norm = std::sqrt(sumsq) / denom;
    double clip = 1.0;
    if (config_.gradient_clipping > 0.0 && norm > config_.gradient_clipping)
      clip = config_.gradient_clipping / (norm + 1e-6);
    apply_optimizer(rs, clip / denom, f.lr, applied_steps_ + 1);
    scaler_.update(false);
    ++applied_steps_;
    f.applied = true;
    f.grad_norm = norm;
    f.loss_scale = scaler_.scale();
  }
  std::fill(rs.grad_touched.begin(), rs.grad_touched.end(), 0);
  f.step = applied_steps_;
  return f;
}

// ---------------------------------------------------------------------------
// Whole parameters

void Model::read_param(zd_param_id param, zd_dtype dtype, void* dst, uint64_t bytes) const {
  require_finalized("zd_param_read");
  const ParamRecord& p = registry_.param(param);
  if (!dtype_valid(dtype))
    fail(ZD_ERR_INVALID_ARGUMENT, "zd_param_read of '" + p.name + "': invalid dtype " +
                                      std::to_string(dtype));
  const uint64_t want = static_cast<uint64_t>(p.numel) * dtype_size(dtype);
  if (bytes != want)
    fail(ZD_ERR_SHAPE_MISMATCH, "zd_param_read of '" + p.name + "': it has " +
                                    std::to_string(p.numel) + " elements (" + std::to_string(want) +
                                    " bytes as " + dtype_name(dtype) + "), the buffer has " +
                                    std::to_string(bytes) + " bytes");
  if (!dst) fail(ZD_ERR_INVALID_ARGUMENT, "zd_param_read of '" + p.name + "': dst is NULL");
  const RankState& rs = *ranks_[0];
  const float* master = rs.groups[static_cast<size_t>(p.group)].master.as<float>() + p.flat_offset;
  convert(master, ZD_DTYPE_F32, dst, dtype, static_cast<size_t>(p.numel));
}

void Model::write_param(zd_param_id param, zd_dtype dtype, const void* src, uint64_t bytes) {
  require_finalized("zd_param_write");
  const ParamRecord& p = registry_.param(param);
  if (!dtype_valid(dtype))
    fail(ZD_ERR_INVALID_ARGUMENT, "zd_param_write of '" + p.name + "': invalid dtype " +
                                      std::to_string(dtype));
  const uint64_t want = static_cast<uint64_t>(p.numel) * dtype_size(dtype);
  if (bytes != want)
    fail(ZD_ERR_SHAPE_MISMATCH, "zd_param_write of '" + p.name + "': it has " +
                                    std::to_string(p.numel) + " elements (" + std::to_string(want) +
                                    " bytes as " + dtype_name(dtype) + "), the buffer has " +
                                    std::to_string(bytes) + " bytes");
  if (!src) fail(ZD_ERR_INVALID_ARGUMENT, "zd_param_write of '" + p.name + "': src is NULL");
  for (const auto& rs : ranks_) {
    if (rs->active_modules > 0)
      fail(ZD_ERR_INVALID_STATE, "zd_param_write of '" + p.name +
                                     "' while modules are begun; write between steps");
  }
  for (int r = 0; r < world_size_; ++r) {
    RankState& rs = *ranks_[static_cast<size_t>(r)];
    GroupBuffers& b = rs.groups[static_cast<size_t>(p.group)];
    const uint64_t start = static_cast<uint64_t>(r) * p.shard_numel;
    const uint64_t real = p.shard_real(r);
    const size_t in_sz = dtype_size(dtype);
    convert(static_cast<const std::byte*>(src) + start * in_sz, dtype,
            b.master.as<float>() + p.flat_offset, ZD_DTYPE_F32, real);
    // The working copy is derived from the master so both agree exactly.
    const size_t esz = dtype_size(p.dtype);
    convert(b.master.as<float>() + p.flat_offset, ZD_DTYPE_F32, b.working.ptr + p.full_offset * esz,
            p.dtype, real);
  }
}

}  // namespace zerod
