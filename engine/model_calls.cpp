// Model: the calls of a micro-batch — forward/backward begin and end, views,
// stage-3 residency (gather, release, prefetch along the recorded module
// order) and gradient reduction in buckets (stages 2-3).
#include "model_state.h"

#include "dtype.h"
#include "error.h"
#include "grad_math.h"
#include "log.h"

#include <algorithm>
#include <cstring>

namespace zerod {

// ---------------------------------------------------------------------------
// Stage 3: residency

// The rank's shard of a parameter, where the all-gather can read it: in
// place when it is in memory, else read from NVMe into *staged.
const std::byte* Model::shard_for_send(RankState& rs, const ParamRecord& p, std::vector<std::byte>* staged) {
  const TieredBuffer& w = rs.groups[static_cast<size_t>(p.group)].working;
  if (w.addressable(p.flat_offset, p.stride)) return w.addr(p.flat_offset);
  staged->resize(p.stride * dtype_size(p.dtype));
  w.read(rs.tiers(), p.flat_offset, p.stride, staged->data());
  return staged->data();
}

// Gathers a module's non-persistent parameters into fresh buffers on the
// rank's stream; the module counts as resident from now on. Throws (with
// nothing allocated) if the device budget cannot hold them.
void Model::gather_module(RankState& rs, int rank, zd_module_id m) {
  const ModuleRecord& mod = registry_.module(m);
  ModuleState& ms = rs.modules[static_cast<size_t>(m)];
  std::vector<zd_param_id> todo;
  uint64_t elems = 0;
  for (zd_param_id pid : mod.params) {
    const ParamRecord& p = registry_.param(pid);
    if (p.persistent || rs.params[static_cast<size_t>(pid)].gathered) continue;
    todo.push_back(pid);
    elems += p.stride * static_cast<uint64_t>(world_size_);
  }
  // Allocate everything first, so a module that does not fit is refused
  // whole, before any collective is issued.
  std::vector<Block> blocks;
  try {
    for (zd_param_id pid : todo) {
      const ParamRecord& p = registry_.param(pid);
      blocks.push_back(rs.pool->allocate(p.stride * static_cast<uint64_t>(world_size_) * dtype_size(p.dtype),
                                         ZD_MEM_PARAMS, "gathering " + module_label(m)));
    }
  } catch (const Error& e) {
    for (const Block& b : blocks) rs.pool->release(b, ZD_MEM_PARAMS);
    if (e.code() != ZD_ERR_BUDGET) throw;
    uint64_t bytes = 0;
    for (zd_param_id pid : todo) {
      const ParamRecord& p = registry_.param(pid);
      bytes += p.stride * static_cast<uint64_t>(world_size_) * dtype_size(p.dtype);
    }
    fail(ZD_ERR_BUDGET, module_label(m) + " needs " + format_bytes(bytes) +
                            " of gathered parameters in the device tier, which holds " +
                            format_bytes(rs.ledger.current(ZD_TIER_DEVICE, ZD_MEM_ALL)) + " of its " +
                            format_bytes(rs.ledger.budget(ZD_TIER_DEVICE)) +
                            " budget on rank " + std::to_string(rank) + " (" + e.what() + ")");
  }
  for (size_t i = 0; i < todo.size(); ++i) rs.params[static_cast<size_t>(todo[i])].gathered = blocks[i];
  rs.live_elems += elems;
  ms.resident = true;
  if (todo.empty()) return;
  auto what = std::make_shared<std::string>("gathering " + module_label(m) + ": all-gather");
  ms.gather = issue(rs, [this, &rs, rank, todo, what, m] {
    for (zd_param_id pid : todo) {
      const ParamRecord& p = registry_.param(pid);
      std::vector<std::byte> staged;
      plugins_.comm->all_gather(
          comm_call(rank, comm_tag(CommOp::Gather, static_cast<uint64_t>(m), static_cast<uint64_t>(pid)), *what),
          shard_for_send(rs, p, &staged), rs.params[static_cast<size_t>(pid)].gathered.ptr, p.stride,
          comm_dtype(p.dtype));
    }
  });
}

void Model::release_module(RankState& rs, zd_module_id m) {
  ModuleState& ms = rs.modules[static_cast<size_t>(m)];
  if (!ms.resident) return;
  for (zd_param_id pid : registry_.module(m).params) {
    const ParamRecord& p = registry_.param(pid);
    ParamState& ps = rs.params[static_cast<size_t>(pid)];
    if (p.persistent || !ps.gathered) continue;
    rs.pool->release(ps.gathered, ZD_MEM_PARAMS);
    ps.gathered = Block{};
    rs.live_elems -= p.stride * static_cast<uint64_t>(world_size_);
  }
  ms.resident = false;
  ms.gather = CommStream::Ticket{};
}

void Model::release_all_gathered(RankState& rs) {
  for (size_t m = 0; m < rs.modules.size(); ++m) release_module(rs, static_cast<zd_module_id>(m));
}

void Model::gather_persistent(RankState& rs, int rank) {
  std::vector<zd_param_id> persistent;
  for (size_t i = 0; i < registry_.params().size(); ++i)
    if (registry_.params()[i].persistent) persistent.push_back(static_cast<zd_param_id>(i));
  if (persistent.empty()) return;
  for (zd_param_id pid : persistent) {
    ParamState& ps = rs.params[static_cast<size_t>(pid)];
    if (ps.gathered) continue;
    const ParamRecord& p = registry_.param(pid);
    ps.gathered = rs.pool->allocate(p.stride * static_cast<uint64_t>(world_size_) * dtype_size(p.dtype),
                                    ZD_MEM_PARAMS, "persistent parameter '" + p.name + "'");
  }
  const std::string what = "gathering the persistent parameters: all-gather";
  wait(issue(rs, [&, rank] {
    for (zd_param_id pid : persistent) {
      const ParamRecord& p = registry_.param(pid);
      std::vector<std::byte> staged;
      plugins_.comm->all_gather(
          comm_call(rank, comm_tag(CommOp::Persistent, 0, static_cast<uint64_t>(pid)), what),
          shard_for_send(rs, p, &staged), rs.params[static_cast<size_t>(pid)].gathered.ptr, p.stride,
          comm_dtype(p.dtype));
    }
  }));
}

// Makes module m's parameters resident for a begin call, and gathers the
// modules the recorded order says come next, within the prefetch budget.
void Model::make_resident(RankState& rs, int rank, zd_module_id m, bool backward) {
  ModuleState& ms = rs.modules[static_cast<size_t>(m)];
  if (!ms.resident) gather_module(rs, rank, m);
  Trace& tr = rs.trace;
  if (!tr.complete) {
    tr.order.emplace_back(backward, m);
  } else if (tr.valid) {
    if (tr.pos < tr.order.size() && tr.order[tr.pos] == std::make_pair(backward, m)) {
      ++tr.pos;
      // Prefetch: what follows in the recorded order, while the budget lasts.
      const uint64_t budget = plugins_.partitioner->prefetch_elements();
      const uint64_t max_live = plugins_.partitioner->max_live_elements();
      uint64_t fetched = 0;
      for (size_t j = tr.pos; j < tr.order.size() && fetched < budget; ++j) {
        const zd_module_id next = tr.order[j].second;
        if (rs.modules[static_cast<size_t>(next)].resident) continue;
        uint64_t elems = 0;
        for (zd_param_id pid : registry_.module(next).params) {
          const ParamRecord& p = registry_.param(pid);
          if (!p.persistent) elems += p.stride * static_cast<uint64_t>(world_size_);
        }
        if (rs.live_elems + elems > max_live) break;
        try {
          gather_module(rs, rank, next);
        } catch (const Error& e) {
          if (e.code() != ZD_ERR_BUDGET) throw;
          break;  // prefetch is best effort; the begin call will gather it
        }
        fetched += elems;
      }
    } else {
      // The module order changed: no more prefetch in this micro-batch.
      tr.valid = false;
      log_debug("rank " + std::to_string(rank) + ": " + module_label(m) +
                " begun out of the recorded order; prefetch off until the next micro-batch");
    }
  }
  wait(ms.gather);
}

// ---------------------------------------------------------------------------
// Call order

void Model::forward_begin(int rank, zd_module_id module) {
  Call call(*this, rank, "forward_begin", module);
  require_finalized("zd_forward_begin");
  RankState& rs = rank_state(rank);
  registry_.module(module);
  ModuleState& a = rs.modules[static_cast<size_t>(module)];
  if (a.forward)
    fail(ZD_ERR_INVALID_STATE, module_label(module) +
                                   " is already in forward: zd_forward_begin called twice "
                                   "without zd_forward_end");
  if (a.backward)
    fail(ZD_ERR_INVALID_STATE, module_label(module) +
                                   " is in backward: call zd_backward_end before running its "
                                   "forward again");
  if (partitioned(ZD_PARTITION_PARAMS)) make_resident(rs, rank, module, false);
  a.forward = true;
  ++rs.active_modules;
}

void Model::forward_end(int rank, zd_module_id module) {
  Call call(*this, rank, "forward_end", module);
  require_finalized("zd_forward_end");
  RankState& rs = rank_state(rank);
  registry_.module(module);
  ModuleState& a = rs.modules[static_cast<size_t>(module)];
  if (!a.forward)
    fail(ZD_ERR_INVALID_STATE, module_label(module) +
                                   " is not in forward: zd_forward_end without zd_forward_begin");
  a.forward = false;
  --rs.active_modules;
  if (partitioned(ZD_PARTITION_PARAMS)) release_module(rs, module);
}

std::byte* Model::grad_accumulator(RankState& rs, const ParamRecord& p) const {
  const ParamGroup& g = registry_.groups()[static_cast<size_t>(p.group)];
  return rs.groups[static_cast<size_t>(p.group)].grad.ptr +
         p.full_offset * dtype_size(grad_dtype(g));
}

void Model::backward_begin(int rank, zd_module_id module) {
  Call call(*this, rank, "backward_begin", module);
  require_finalized("zd_backward_begin");
  RankState& rs = rank_state(rank);
  const ModuleRecord& mod = registry_.module(module);
  ModuleState& a = rs.modules[static_cast<size_t>(module)];
  if (a.backward)
    fail(ZD_ERR_INVALID_STATE, module_label(module) +
                                   " is already in backward: zd_backward_begin called twice "
                                   "without zd_backward_end");
  if (a.forward)
    fail(ZD_ERR_INVALID_STATE, module_label(module) +
                                   " is still in forward: call zd_forward_end before "
                                   "zd_backward_begin");
  // Below stage 2 the first contribution of a window goes straight into the
  // (zero) accumulator when it has the parameter's dtype; everything else
  // gets a zeroed transient buffer, which backward_end adds in or hands to
  // a reduction bucket.
  const bool reduce = partitioned(ZD_PARTITION_GRADS);
  std::vector<zd_param_id> given;
  try {
    for (zd_param_id pid : mod.params) {
      const ParamRecord& p = registry_.param(pid);
      const ParamGroup& g = registry_.groups()[static_cast<size_t>(p.group)];
      ParamState& ps = rs.params[static_cast<size_t>(pid)];
      const bool direct = !reduce && !ps.touched && grad_dtype(g) == p.dtype;
      if (!direct) {
        ps.grad_view = rs.pool->allocate(static_cast<uint64_t>(p.numel) * dtype_size(p.dtype),
                                         ZD_MEM_BUFFERS, "the gradient view of parameter '" + p.name + "'");
        given.push_back(pid);
      }
    }
    if (partitioned(ZD_PARTITION_PARAMS)) make_resident(rs, rank, module, true);
  } catch (...) {
    for (zd_param_id pid : given) {
      ParamState& ps = rs.params[static_cast<size_t>(pid)];
      rs.pool->release(ps.grad_view, ZD_MEM_BUFFERS);
      ps.grad_view = Block{};
    }
    throw;
  }
  for (zd_param_id pid : mod.params) rs.params[static_cast<size_t>(pid)].view_active = true;
  a.backward = true;
  ++rs.active_modules;
}

void Model::backward_end(int rank, zd_module_id module) {
  Call call(*this, rank, "backward_end", module);
  require_finalized("zd_backward_end");
  RankState& rs = rank_state(rank);
  const ModuleRecord& mod = registry_.module(module);
  ModuleState& a = rs.modules[static_cast<size_t>(module)];
  if (!a.backward)
    fail(ZD_ERR_INVALID_STATE, module_label(module) +
                                   " is not in backward: zd_backward_end without "
                                   "zd_backward_begin");
  const bool reduce = partitioned(ZD_PARTITION_GRADS);
  bool bucket_full = false;
  for (zd_param_id pid : mod.params) {
    const ParamRecord& p = registry_.param(pid);
    const ParamGroup& g = registry_.groups()[static_cast<size_t>(p.group)];
    ParamState& ps = rs.params[static_cast<size_t>(pid)];
    if (reduce) {
      const auto gi = static_cast<size_t>(p.group);
      rs.buckets[gi].push_back(PendingGrad{pid, ps.grad_view});
      rs.bucket_elems[gi] += static_cast<uint64_t>(p.numel);
      bucket_full = bucket_full || rs.bucket_elems[gi] >= plugins_.partitioner->bucket_elements();
    } else if (ps.grad_view) {
      accumulate(ps.grad_view.ptr, p.dtype, grad_accumulator(rs, p), grad_dtype(g),
                 static_cast<uint64_t>(p.numel));
      rs.pool->release(ps.grad_view, ZD_MEM_BUFFERS);
    }
    ps.grad_view = Block{};
    ps.view_active = false;
    ps.touched = true;
  }
  a.backward = false;
  --rs.active_modules;
  if (partitioned(ZD_PARTITION_PARAMS)) release_module(rs, module);
  if (bucket_full) flush_bucket(rs, rank);  // sends every group's pending gradients
}

// ---------------------------------------------------------------------------
// Gradient reduction (stages 2-3)

// Sends every pending gradient to its owners on the rank's stream: each
// contribution is scaled by 1/world (ranks average; pre-dividing keeps
// 16-bit sums in range) and packed; the owners add what they receive into
// their accumulators. Stage 3 reduce-scatters shards of equal stride; stage 2
// all-reduces the bucket and each rank keeps what falls in its range.
void Model::flush_bucket(RankState& rs, int rank) {
  for (size_t gi = 0; gi < rs.buckets.size(); ++gi) {
    if (rs.buckets[gi].empty()) continue;
    auto pending = std::make_shared<std::vector<PendingGrad>>(std::move(rs.buckets[gi]));
    rs.buckets[gi].clear();
    rs.bucket_elems[gi] = 0;
    const uint64_t seq = ++rs.bucket_seq;
    const ParamGroup& g = registry_.groups()[gi];
    const bool p3 = partitioned(ZD_PARTITION_PARAMS);
    const auto world = static_cast<uint64_t>(world_size_);
    const float inv = 1.0f / static_cast<float>(world_size_);
    const zd_dtype dt = g.dtype;
    const size_t esz = dtype_size(dt);
    // Where each contribution sits in the packed bucket.
    auto offsets = std::make_shared<std::vector<uint64_t>>();
    uint64_t len = 0;
    for (const PendingGrad& pg : *pending) {
      const ParamRecord& p = registry_.param(pg.param);
      offsets->push_back(len);
      len += p3 ? p.stride : static_cast<uint64_t>(p.numel);
    }
    const uint64_t send_len = p3 ? len * world : len;
    Block send = rs.pool->allocate(send_len * esz, ZD_MEM_BUFFERS, "a gradient bucket");
    Block recv = p3 ? rs.pool->allocate(len * esz, ZD_MEM_BUFFERS, "a gradient bucket") : Block{};
    // Packing happens now, on the rank's thread: the views are done with.
    for (size_t i = 0; i < pending->size(); ++i) {
      const PendingGrad& pg = (*pending)[i];
      const ParamRecord& p = registry_.param(pg.param);
      const auto numel = static_cast<uint64_t>(p.numel);
      if (p3) {
        for (uint64_t k = 0; k < world; ++k) {
          const uint64_t lo = k * p.stride;
          if (lo >= numel) break;
          const uint64_t n = std::min(p.stride, numel - lo);
          accumulate_scaled(pg.view.ptr + lo * esz, dt, send.ptr + (k * len + (*offsets)[i]) * esz, dt,
                            n, inv);
        }
      } else {
        accumulate_scaled(pg.view.ptr, dt, send.ptr + (*offsets)[i] * esz, dt, numel, inv);
      }
      rs.pool->release(pg.view, ZD_MEM_BUFFERS);
    }
    auto what = std::make_shared<std::string>(
        std::string("reducing gradients (bucket ") + std::to_string(seq) + "): " +
        (p3 ? "reduce-scatter" : "all-reduce"));
    issue(rs, [this, &rs, rank, gi, pending, offsets, len, send, recv, what, seq, p3, dt, esz] {
      const ParamGroup& grp = registry_.groups()[gi];
      GroupBuffers& b = rs.groups[gi];
      const zd_dtype gdt = grad_dtype(grp);
      const size_t gsz = dtype_size(gdt);
      const zd_comm_call c = comm_call(rank, comm_tag(CommOp::Reduce, gi, seq), *what);
      if (p3) {
        plugins_.comm->reduce_scatter(c, send.ptr, recv.ptr, len, comm_dtype(dt), ZD_REDUCE_SUM);
        for (size_t i = 0; i < pending->size(); ++i) {
          const ParamRecord& p = registry_.param((*pending)[i].param);
          accumulate(recv.ptr + (*offsets)[i] * esz, dt, b.grad.ptr + p.flat_offset * gsz, gdt, p.stride);
        }
      } else {
        plugins_.comm->all_reduce(c, send.ptr, len, comm_dtype(dt), ZD_REDUCE_SUM);
        const uint64_t ob = owned_begin(grp, rank);
        for (size_t i = 0; i < pending->size(); ++i) {
          const ParamRecord& p = registry_.param((*pending)[i].param);
          const uint64_t lo = std::max(p.full_offset, ob);
          const uint64_t hi = std::min(p.full_offset + static_cast<uint64_t>(p.numel), ob + grp.stride);
          if (lo < hi)
            accumulate(send.ptr + ((*offsets)[i] + lo - p.full_offset) * esz, dt,
                       b.grad.ptr + (lo - ob) * gsz, gdt, hi - lo);
        }
      }
      rs.pool->release(send, ZD_MEM_BUFFERS);
      rs.pool->release(recv, ZD_MEM_BUFFERS);
    });
  }
}

// ---------------------------------------------------------------------------
// Views

ViewInfo Model::param_view(int rank, zd_param_id param) {
  require_finalized("zd_param_view");
  require_healthy();
  RankState& rs = rank_state(rank);
  const ParamRecord& p = registry_.param(param);
  const ModuleState& a = rs.modules[static_cast<size_t>(p.module)];
  if (!a.forward && !a.backward)
    fail(ZD_ERR_INVALID_STATE, "parameter '" + p.name + "' is not resident: its " +
                                   module_label(p.module) +
                                   " is not between a _begin and its _end call");
  const size_t esz = dtype_size(p.dtype);
  ViewInfo v;
  if (partitioned(ZD_PARTITION_PARAMS)) {
    const Block& gb = rs.params[static_cast<size_t>(param)].gathered;
    v.data = gb.ptr;
    v.arena = gb.arena;
    v.offset = gb.offset;
  } else {
    const auto& seg = rs.groups[static_cast<size_t>(p.group)].working.segment_at(p.full_offset);
    v.data = seg.ptr + (p.full_offset - seg.begin) * esz;
    v.arena = seg.block.arena;
    v.offset = seg.block.offset + (p.full_offset - seg.begin) * esz;
  }
  v.bytes = static_cast<uint64_t>(p.numel) * esz;
  v.dtype = p.dtype;
  v.shape = &p.shape;
  v.read_only = true;
  return v;
}

ViewInfo Model::grad_view(int rank, zd_param_id param) {
  require_finalized("zd_grad_view");
  require_healthy();
  RankState& rs = rank_state(rank);
  const ParamRecord& p = registry_.param(param);
  const ParamState& ps = rs.params[static_cast<size_t>(param)];
  if (!ps.view_active)
    fail(ZD_ERR_INVALID_STATE, "parameter '" + p.name + "' has no gradient buffer now: its " +
                                   module_label(p.module) +
                                   " is not between zd_backward_begin and zd_backward_end");
  const size_t esz = dtype_size(p.dtype);
  ViewInfo v;
  if (ps.grad_view) {
    v.data = ps.grad_view.ptr;
    v.arena = ps.grad_view.arena;
    v.offset = ps.grad_view.offset;
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

}  // namespace zerod
