// Model::step: at an accumulation boundary, reduce the gradients to their
// owners, check for overflow, take the global norm, clip, and run the
// optimizer on the owned range, writing the working copies in the same
// pass; then hand the new working copies to every rank that needs them.
#include "model_state.h"

#include "dtype.h"
#include "error.h"
#include "grad_math.h"
#include "log.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace zerod {

double Model::learning_rate(int64_t step) {
  if (!policy_) return base_lr_;
  // Every rank asks for the same steps; the script runs once per step.
  std::lock_guard<std::mutex> lock(reg_mu_);
  for (const auto& [s, lr] : lr_cache_)
    if (s == step) return lr;
  double lr = base_lr_;
  if (auto v = policy_->lr(step)) {
    if (!std::isfinite(*v) || *v < 0)
      fail(ZD_ERR_CONFIG, config_.source + ": lr(" + std::to_string(step) + ") returned " +
                              std::to_string(*v) + "; a learning rate must be finite and >= 0");
    lr = *v;
  }
  lr_cache_.emplace_back(step, lr);
  if (lr_cache_.size() > 8) lr_cache_.erase(lr_cache_.begin());
  return lr;
}

// Stages 0-1: the gradients are whole on every rank until the boundary.
// They are averaged over ranks (pre-divided, then summed); stage 0
// all-reduces them, stage 1 reduce-scatters them so each rank receives the
// range it owns (into *stage1_shards, one block per group).
void Model::reduce_for_step(RankState& rs, int rank, std::vector<Block>* stage1_shards) {
  if (partitioned(ZD_PARTITION_GRADS) || world_size_ == 1) return;
  const auto& groups = registry_.groups();
  const float inv = 1.0f / static_cast<float>(world_size_);
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const ParamGroup& g = groups[gi];
    const zd_dtype gdt = grad_dtype(g);
    GroupBuffers& b = rs.groups[gi];
    scale_in_place(b.grad.ptr, gdt, g.full_numel, inv);
    if (partitioned(ZD_PARTITION_OPTIMIZER)) {
      stage1_shards->push_back(rs.pool->allocate(g.stride * dtype_size(gdt), ZD_MEM_BUFFERS,
                                                 "the reduced gradient range"));
    }
  }
  const std::string what = partitioned(ZD_PARTITION_OPTIMIZER) ? "step: reduce-scatter of the gradients"
                                                               : "step: all-reduce of the gradients";
  wait(issue(rs, [&, rank] {
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      const ParamGroup& g = groups[gi];
      const zd_comm_call c = comm_call(rank, comm_tag(CommOp::StepReduce, gi, 0), what);
      const zd_comm_dtype dt = comm_dtype(grad_dtype(g));
      if (partitioned(ZD_PARTITION_OPTIMIZER))
        plugins_.comm->reduce_scatter(c, rs.groups[gi].grad.ptr, (*stage1_shards)[gi].ptr, g.stride, dt,
                                      ZD_REDUCE_SUM);
      else
        plugins_.comm->all_reduce(c, rs.groups[gi].grad.ptr, g.full_numel, dt, ZD_REDUCE_SUM);
    }
  }));
}

namespace {

struct Task {
  size_t group;
  uint64_t begin, count;
};

}  // namespace

// The gradient a rank's optimizer reads for group gi, at its owned range.
// The gradient of the range this rank owns in group gi: the reduced range
// (stage 1), the shard (stages 2-3), or that range of the whole gradient.
std::byte* Model::owned_grad(RankState& rs, int rank, size_t gi, const std::vector<Block>& stage1_shards) const {
  if (!stage1_shards.empty()) return stage1_shards[gi].ptr;
  const ParamGroup& g = registry_.groups()[gi];
  std::byte* grad = rs.groups[gi].grad.ptr;
  return partitioned(ZD_PARTITION_GRADS) ? grad : grad + owned_begin(g, rank) * dtype_size(grad_dtype(g));
}

void Model::gradient_stats(RankState& rs, int rank, const std::vector<Block>& stage1_shards,
                           double* sumsq, bool* finite, bool local) {
  std::vector<Task> tasks;
  const auto& groups = registry_.groups();
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const uint64_t n = local ? groups[gi].full_numel : owned_count(groups[gi]);
    for (uint64_t b = 0; b < n; b += kTile) tasks.push_back({gi, b, std::min(kTile, n - b)});
  }
  std::vector<GradStats> partial(tasks.size());
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    pool_.run(tasks.size(), [&](size_t i) {
      const Task& t = tasks[i];
      const ParamGroup& g = groups[t.group];
      const zd_dtype dt = grad_dtype(g);
      const size_t gsz = dtype_size(dt);
      std::byte* base = local ? rs.groups[t.group].grad.ptr : owned_grad(rs, rank, t.group, stage1_shards);
      partial[i] = grad_stats(base + t.begin * gsz, dt, t.count);
    });
  }
  // Summed in task order so the norm does not depend on thread timing.
  double s = 0.0;
  for (const GradStats& p : partial) s += p.sumsq;
  if ((local || partitioned(ZD_PARTITION_OPTIMIZER)) && world_size_ > 1) {
    // Each rank holds a part (or its own gradient): the global sum (inf and
    // NaN carry through).
    const std::string what = "step: all-reduce of the gradient norm";
    wait(issue(rs, [&, rank] {
      plugins_.comm->all_reduce(comm_call(rank, comm_tag(CommOp::Stats, 0, 0), what), &s, 1,
                                ZD_COMM_F64, ZD_REDUCE_SUM);
    }));
  }
  *sumsq = s;
  *finite = std::isfinite(s);
}

void Model::zero_gradients(RankState& rs) {
  for (GroupBuffers& b : rs.groups) std::memset(b.grad.ptr, 0, b.grad.bytes);
}

// Stages 1-2: each rank updated the working copies of its range; every rank
// needs them all (in place: each rank's range is already where it belongs).
void Model::gather_working_copies(RankState& rs, int rank) {
  if (registry_.partitioning() != Partitioning::Group || world_size_ == 1) return;
  const std::string what = "step: all-gather of the updated working copies";
  const auto& groups = registry_.groups();
  wait(issue(rs, [&, rank] {
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      const ParamGroup& g = groups[gi];
      std::byte* w = rs.groups[gi].working.addr(0);  // stages 1-2: one device segment
      plugins_.comm->all_gather(comm_call(rank, comm_tag(CommOp::GatherWorking, gi, 0), what),
                                w + owned_begin(g, rank) * dtype_size(g.dtype), w, g.stride,
                                comm_dtype(g.dtype));
    }
  }));
}

StepFigures Model::step(int rank) {
  Call call(*this, rank, "step");
  require_finalized("zd_step");
  RankState& rs = rank_state(rank);
  if (rs.active_modules > 0) {
    for (size_t m = 0; m < rs.modules.size(); ++m) {
      const ModuleState& a = rs.modules[m];
      if (a.forward || a.backward)
        fail(ZD_ERR_INVALID_STATE,
             "zd_step while " + module_label(static_cast<zd_module_id>(m)) + " is still in " +
                 (a.forward ? "forward: call zd_forward_end" : "backward: call zd_backward_end") +
                 " first");
    }
  }
  // The recorded module order is complete after the first micro-batch;
  // every micro-batch starts from its beginning.
  rs.trace.complete = true;
  rs.trace.valid = true;
  rs.trace.pos = 0;

  StepFigures f;
  f.micro_step = rs.micro_step + 1;
  f.step = rs.applied;
  f.loss_scale = rs.scaler.scale();
  const int64_t gas = config_.gradient_accumulation_steps;
  if (f.micro_step % gas != 0) {
    rs.micro_step = f.micro_step;
    rs.last = f;
    return f;
  }

  // An accumulation boundary. The learning rate is resolved first so a
  // failing lr() leaves the gradients and counters untouched.
  f.boundary = true;
  f.lr = learning_rate(rs.applied);
  if (partitioned(ZD_PARTITION_GRADS)) flush_bucket(rs, rank);
  drain(rs);
  if (partitioned(ZD_PARTITION_PARAMS)) release_all_gathered(rs);
  std::vector<Block> stage1_shards;
  struct Free {
    RankState& rs;
    std::vector<Block>& blocks;
    ~Free() {
      for (const Block& b : blocks) rs.pool->release(b, ZD_MEM_BUFFERS);
    }
  } free_shards{rs, stage1_shards};
  // A compressing optimizer (1-bit Adam) past its warm-up averages its
  // momentum instead: the gradients stay local.
  const bool compress = compressing(rs);
  if (!compress) reduce_for_step(rs, rank, &stage1_shards);

  double sumsq = 0.0;
  bool finite = true;
  gradient_stats(rs, rank, stage1_shards, &sumsq, &finite, compress);
  // Local gradients: the mean over ranks of their squared norms.
  if (compress) sumsq /= static_cast<double>(world_size_);
  const double scale = rs.scaler.scale();
  // Gradients were averaged over ranks (or are local) and summed over gas
  // micro-batches at the loss scale.
  const double denom = scale * static_cast<double>(gas);
  rs.micro_step = f.micro_step;
  if (!finite) {
    rs.scaler.update(true);
    zero_gradients(rs);
    f.skipped = true;
    f.grad_norm = std::nan("");
    f.loss_scale = rs.scaler.scale();
    if (!rs.scaler.dynamic() && rank == 0)
      log_warn("step " + std::to_string(rs.applied + 1) + " skipped: the gradients hold inf or NaN");
  } else {
    const double norm = std::sqrt(sumsq) / denom;
    double clip = 1.0;
    if (config_.gradient_clipping > 0.0 && norm > config_.gradient_clipping)
      clip = config_.gradient_clipping / (norm + 1e-6);
    try {
      if (compress)
        compressed_step(rs, rank, clip / denom, f.lr, rs.applied + 1);
      else
        apply_optimizer(rs, rank, stage1_shards, clip / denom, f.lr, rs.applied + 1);
    } catch (const Error& e) {
      // A tier failed part-way (a disk error): the tiles before it were
      // updated, the rest not. Nothing wrong was written, but this step is
      // half applied, so no further call may pretend otherwise.
      broken_by(Error(e.code(), std::string(e.what()) + "\nrank " + std::to_string(rank) +
                                    ": the optimizer step " + std::to_string(rs.applied + 1) +
                                    " stopped part-way; what is on disk is intact, but the step is "
                                    "half applied: restart from a checkpoint"));
    }
    // The masters have moved: the counters move with them, before any
    // collective below can fail (a restart then resumes from here).
    rs.scaler.update(false);
    ++rs.applied;
    if (!stage1_shards.empty()) zero_gradients(rs);  // the unreduced copies are stale
    gather_working_copies(rs, rank);
    if (partitioned(ZD_PARTITION_PARAMS)) {
      // Persistent parameters are refreshed from the new shards.
      for (size_t i = 0; i < registry_.params().size(); ++i) {
        ParamState& ps = rs.params[i];
        if (registry_.params()[i].persistent && ps.gathered) {
          rs.pool->release(ps.gathered, ZD_MEM_PARAMS);
          ps.gathered = Block{};
        }
      }
      gather_persistent(rs, rank);
    }
    f.applied = true;
    f.grad_norm = norm;
    f.loss_scale = rs.scaler.scale();
  }
  for (ParamState& ps : rs.params) ps.touched = false;
  f.step = rs.applied;
  rs.last = f;
  activity_.record_step(rank, f.lr, f.loss_scale, f.grad_norm, f.skipped);
  return f;
}

void Model::recover(std::unique_ptr<CommInstance> comm) {
  // The old streams' tasks have all ended (their collectives failed); a new
  // stream per rank, then the new comm they will call.
  for (auto& rs : ranks_) rs->stream = std::make_unique<CommStream>(world_size_ > 1);
  plugins_.comm = std::move(comm);
  const int64_t gas = config_.gradient_accumulation_steps;
  for (auto& rsp : ranks_) {
    RankState& rs = *rsp;
    for (size_t i = 0; i < rs.params.size(); ++i) {
      ParamState& ps = rs.params[i];
      rs.pool->release(ps.grad_view, ZD_MEM_BUFFERS);
      if (ps.gathered && !registry_.params()[i].persistent) {
        rs.pool->release(ps.gathered, ZD_MEM_PARAMS);
        ps.gathered = Block{};
      }
      ps.grad_view = Block{};
      ps.view_active = false;
      ps.touched = false;
    }
    for (auto& bucket : rs.buckets) {
      for (PendingGrad& pg : bucket) rs.pool->release(pg.view, ZD_MEM_BUFFERS);
      bucket.clear();
    }
    std::fill(rs.bucket_elems.begin(), rs.bucket_elems.end(), 0);
    rs.bucket_seq = 0;  // tags restart with the new comm, equal on every rank
    for (ModuleState& ms : rs.modules) ms = ModuleState{};
    rs.active_modules = 0;
    rs.live_elems = 0;
    rs.trace = Trace{};
    rs.micro_step = rs.applied * gas;  // the interrupted window's gradients are gone
    zero_gradients(rs);
  }
  activity_.clear_lost();
  std::lock_guard<std::mutex> lock(reg_mu_);
  broken_.clear();
  broken_code_ = ZD_OK;
  is_broken_.store(false);
  lr_cache_.clear();
}

void Model::rebuild_working_copies(int rank) {
  Call call(*this, rank, "rebuild");
  RankState& rs = rank_state(rank);
  const bool p3 = partitioned(ZD_PARTITION_PARAMS);
  const auto& groups = registry_.groups();
  const TierSet tiers = rs.tiers();
  constexpr uint64_t kChunk = uint64_t{1} << 20;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const ParamGroup& g = groups[gi];
    GroupBuffers& b = rs.groups[gi];
    const size_t esz = dtype_size(g.dtype);
    const uint64_t at = p3 ? 0 : owned_begin(g, rank);
    std::vector<float> m;
    std::vector<std::byte> w;
    for (uint64_t e = 0; e < owned_count(g); e += kChunk) {
      const uint64_t n = std::min(kChunk, owned_count(g) - e);
      m.resize(n);
      w.resize(n * esz);
      b.master.read(tiers, e, n, m.data());
      convert(m.data(), ZD_DTYPE_F32, w.data(), g.dtype, n);
      b.working.write(tiers, at + e, n, w.data());
    }
  }
  gather_working_copies(rs, rank);
  if (p3) {
    for (size_t i = 0; i < rs.params.size(); ++i) {
      ParamState& ps = rs.params[i];
      if (registry_.params()[i].persistent && ps.gathered) {
        rs.pool->release(ps.gathered, ZD_MEM_PARAMS);
        ps.gathered = Block{};
      }
    }
    gather_persistent(rs, rank);
  }
}

}  // namespace zerod
