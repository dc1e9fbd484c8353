#include "runtime/workers.h"

#include "runtime/dtype.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace zerod {

void Workers::run(size_t n, const std::function<void(size_t)>& fn) {
  if (near_) {
    std::lock_guard<std::mutex> lock(near_mu_);  // the rank's own threads: no other rank uses them
    near_->run(n, fn);
    return;
  }
  std::lock_guard<std::mutex> lock(*shared_mu_);
  shared_->run(n, fn);
}

void norm_tiles(const void* p, zd_dtype dt, uint64_t n, const NormTiles& norm) {
  const size_t esz = dtype_size(dt);
  for (uint64_t lo = 0; lo < n && lo < norm.real; lo += kTile)
    norm.sums[lo / kTile] =
        grad_stats(static_cast<const std::byte*>(p) + lo * esz, dt, std::min({kTile, n - lo, norm.real - lo})).sumsq;
}

void parallel_accumulate(Workers& w, const void* src, zd_dtype src_dt, void* dst, zd_dtype dst_dt, uint64_t n,
                         bool dst_is_zero, const NormTiles* norm) {
  // Larger tiles than the optimizer's: one add is a fraction of its work.
  // A multiple of the norm's tiles, so each add tile owns whole ones.
  constexpr uint64_t kAddTile = kTile * 8;
  const size_t ssz = dtype_size(src_dt), dsz = dtype_size(dst_dt);
  const uint64_t tiles = (n + kAddTile - 1) / kAddTile;
  w.run(tiles, [&](size_t i) {
    const uint64_t lo = i * kAddTile, m = std::min(kAddTile, n - lo);
    const std::byte* s = static_cast<const std::byte*>(src) + lo * ssz;
    std::byte* d = static_cast<std::byte*>(dst) + lo * dsz;
    if (dst_is_zero)
      assign_to_zero(s, src_dt, d, dst_dt, m);
    else
      accumulate(s, src_dt, d, dst_dt, m);
    if (norm && lo < norm->real)
      norm_tiles(d, dst_dt, m, NormTiles{norm->sums + lo / kTile, norm->real - lo});
  });
}

GradStats parallel_grad_stats(Workers& w, const std::vector<GradSpan>& spans) {
  struct Task {
    size_t span;
    uint64_t begin, count;
  };
  std::vector<Task> tasks;
  for (size_t s = 0; s < spans.size(); ++s)
    for (uint64_t b = 0; b < spans[s].count; b += kTile) tasks.push_back({s, b, std::min(kTile, spans[s].count - b)});
  std::vector<GradStats> partial(tasks.size());
  w.run(tasks.size(), [&](size_t i) {
    const Task& t = tasks[i];
    const GradSpan& s = spans[t.span];
    partial[i] = grad_stats(static_cast<const std::byte*>(s.data) + t.begin * dtype_size(s.dtype), s.dtype, t.count);
  });
  GradStats out;
  for (const GradStats& p : partial) out.sumsq += p.sumsq;
  out.finite = std::isfinite(out.sumsq);
  return out;
}

zd_optimizer_update update_slice(const zd_optimizer_update& u, uint32_t slots, uint64_t off, uint64_t n) {
  zd_optimizer_update s = u;
  s.count = n;
  if (s.master) s.master += off;
  if (s.grad) s.grad = static_cast<const std::byte*>(s.grad) + off * dtype_size(s.grad_dtype);
  if (s.work) s.work = static_cast<std::byte*>(s.work) + off * dtype_size(s.work_dtype);
  if (s.exchange) s.exchange += off;
  // The state's elements are 2 bytes where it is kept in bf16.
  const size_t ssz = u.state_dtype == ZD_DTYPE_BF16 ? 2 : 4;
  for (uint32_t k = 0; k < slots; ++k)
    if (s.state[k]) s.state[k] = reinterpret_cast<float*>(reinterpret_cast<std::byte*>(s.state[k]) + off * ssz);
  return s;
}

void parallel_update(Workers& w, const OptimizerInstance& opt, const zd_optimizer_update& u, bool zero_grad) {
  const uint32_t slots = opt.state_slots();
  const uint64_t tiles = (u.count + kTile - 1) / kTile;
  const size_t gsz = u.grad ? dtype_size(u.grad_dtype) : 0;
  w.run(tiles, [&](size_t i) {
    const uint64_t off = i * kTile, n = std::min(kTile, u.count - off);
    const zd_optimizer_update t = update_slice(u, slots, off, n);
    opt.update(ZD_ISA_AUTO, t);
    if (zero_grad && t.grad) std::memset(const_cast<void*>(t.grad), 0, n * gsz);
  });
}

void combine_stats(double* a, const double* b, uint32_t n, const zd_stat_op* ops) {
  for (uint32_t i = 0; i < n; ++i) a[i] = ops[i] == ZD_STAT_MAX ? std::max(a[i], b[i]) : a[i] + b[i];
}

void parallel_pass(Workers& w, const OptimizerInstance& opt, const zd_optimizer_update& u, bool zero_grad,
                   uint32_t nstats, const zd_stat_op* ops, double* stats) {
  const uint32_t slots = opt.state_slots();
  const uint64_t tiles = (u.count + kTile - 1) / kTile;
  const size_t gsz = u.grad ? dtype_size(u.grad_dtype) : 0;
  std::vector<double> partial(tiles * nstats, 0.0);
  w.run(tiles, [&](size_t i) {
    const uint64_t off = i * kTile, n = std::min(kTile, u.count - off);
    zd_optimizer_update t = update_slice(u, slots, off, n);
    t.stats = nstats ? partial.data() + i * nstats : nullptr;
    opt.update(ZD_ISA_AUTO, t);
    if (zero_grad && t.grad) std::memset(const_cast<void*>(t.grad), 0, n * gsz);
  });
  for (uint64_t i = 0; i < tiles; ++i) combine_stats(stats, partial.data() + i * nstats, nstats, ops);
}

void parallel_prepare(Workers& w, const OptimizerInstance& opt, const zd_optimizer_update& u) {
  const uint64_t tiles = (u.count + kTile - 1) / kTile;
  const size_t gsz = dtype_size(u.grad_dtype);
  w.run(tiles, [&](size_t i) {
    const uint64_t off = i * kTile, n = std::min(kTile, u.count - off);
    const zd_optimizer_update t = update_slice(u, 0, off, n);
    opt.prepare(ZD_ISA_AUTO, t);
    std::memset(const_cast<void*>(t.grad), 0, n * gsz);
  });
}

}  // namespace zerod
