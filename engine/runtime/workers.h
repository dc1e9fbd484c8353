// The CPU threads that run a rank's index-parallel loops (the optimizer on
// state in memory, gradient statistics), and those loops themselves.
//
// A rank uses its own threads when they were placed next to its host memory
// (the host tier names the cores), else the model's shared pool, one rank at
// a time. The loops cut work into tiles of kTile elements and combine their
// results in tile order, so a figure never depends on thread timing.
#pragma once

#include "grad/grad_math.h"
#include "runtime/plugin_host.h"
#include "runtime/thread_pool.h"

#include <zerod/zerod_plugin.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace zerod {

// Elements per optimizer or statistics task: small enough that the arrays of
// a tile stay in L2 while the gradient is zeroed right after its update, and
// no smaller than the optimizer kernels' optim::kStreamWork, from which they
// write the working copy by streaming stores (engine_units_test holds it).
constexpr uint64_t kTile = uint64_t{1} << 15;

class Workers {
 public:
  Workers(ThreadPool& shared, std::mutex& shared_mu) : shared_(&shared), shared_mu_(&shared_mu) {}

  // From now on the rank's loops run on threads pinned to these CPUs.
  void pin(const std::vector<int>& cpus) { near_ = std::make_unique<ThreadPool>(cpus); }
  // The CPUs the rank's own threads run on; empty while it uses the shared pool.
  std::vector<int> cpus() const { return near_ ? near_->cpus() : std::vector<int>{}; }

  // Calls fn(i) for i in [0, n) on the rank's threads; rethrows the first error.
  // Safe from several threads of the rank at once (its calls and its
  // collectives stream): one run at a time.
  void run(size_t n, const std::function<void(size_t)>& fn);

 private:
  ThreadPool* shared_;
  std::mutex* shared_mu_;
  std::unique_ptr<ThreadPool> near_;
  std::mutex near_mu_;
};

// The sum of squares of every span (and whether it is finite), summed tile
// by tile in span order.
GradStats parallel_grad_stats(Workers& w, const std::vector<GradSpan>& spans);

// Where an add leaves the squared norm of what it wrote: sums[k] = the sum
// of squares of dst elements [k * kTile, min((k + 1) * kTile, real)), as
// grad_stats gives it, for every tile that begins below real.
struct NormTiles {
  double* sums;
  uint64_t real;
};

// dst[i] += src[i] for n elements of host memory (dtypes converted), in
// tiles on the workers; with dst_is_zero, assign_to_zero() instead (the same
// result without reading dst). With norm, each tile's squares are summed
// right after it is written, while it is in the cache.
void parallel_accumulate(Workers& w, const void* src, zd_dtype src_dt, void* dst, zd_dtype dst_dt, uint64_t n,
                         bool dst_is_zero = false, const NormTiles* norm = nullptr);
// The NormTiles figures of n elements at p, on the calling thread.
void norm_tiles(const void* p, zd_dtype dt, uint64_t n, const NormTiles& norm);

// An optimizer update over u.count elements, in tiles on the workers; with
// zero_grad each tile's gradient is zeroed right after its update (the next
// accumulation window starts clean while the tile is still in cache).
void parallel_update(Workers& w, const OptimizerInstance& opt, const zd_optimizer_update& u, bool zero_grad);

// The same update restricted to elements [off, off + n) of u.
zd_optimizer_update update_slice(const zd_optimizer_update& u, uint32_t slots, uint64_t off, uint64_t n);

// A pass of a planned step (zd_optimizer_v3) over u.count elements of one
// tensor, in tiles like parallel_update. Each tile fills statistics of its
// own (nstats, combined by ops[i]: a sum or a max); they are combined into
// `stats` in tile order, so the figure never depends on thread timing.
void parallel_pass(Workers& w, const OptimizerInstance& opt, const zd_optimizer_update& u, bool zero_grad,
                   uint32_t nstats, const zd_stat_op* ops, double* stats);

// Combines statistics b into a (n of them, by ops).
void combine_stats(double* a, const double* b, uint32_t n, const zd_stat_op* ops);

// prepare() of a planned step over u.count elements of one tensor, in tiles;
// each tile's gradient is zeroed after it (it has been folded in).
void parallel_prepare(Workers& w, const OptimizerInstance& opt, const zd_optimizer_update& u);

}  // namespace zerod
