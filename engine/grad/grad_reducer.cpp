#include "grad/grad_reducer.h"

#include "runtime/dtype.h"
#include "grad/grad_math.h"

#include <algorithm>
#include <memory>
#include <utility>

namespace zerod {

namespace {

// A bucket's packed buffers, shared by the tasks that use them (its
// reduction on the rank's stream, its add on the accumulators' thread) and
// given back to the device when the last of those goes: ran to the end,
// threw (the collective failed: a peer lost, a timeout), or was dropped
// unrun. Released only on success, a failed bucket's buffers stayed
// charged to the rank's device buffers, and a kept model grew by a bucket
// at every lost rank until its restart was refused for the budget. The
// last owner may be the stream's thread, the accumulators' or the rank's
// own (a stream torn down with tasks left); Device::release takes the
// pool's lock, as the releases those threads made before did.
class BucketBlocks {
 public:
  explicit BucketBlocks(Device& device) : device_(device) {}
  ~BucketBlocks() {
    if (send) device_.release(send, ZD_MEM_BUFFERS);
    if (recv) device_.release(recv, ZD_MEM_BUFFERS);
  }
  BucketBlocks(const BucketBlocks&) = delete;
  BucketBlocks& operator=(const BucketBlocks&) = delete;

  Block send;  // the packed contributions (reduced in place at stage 2)
  Block recv;  // stage 3: this rank's reduced shard

 private:
  Device& device_;
};

}  // namespace

void GradReducer::reset() {
  release();
  out_ = res_.transfers.leaving_stream("gradients out");
  params_.assign(ctx_.registry.params().size(), ParamEntry{});
  buckets_.assign(ctx_.registry.groups().size(), {});
  bucket_elems_.assign(ctx_.registry.groups().size(), 0);
  bucket_seq_ = 0;
  local_ = false;
  norm_at_.clear();
  uint64_t tiles = 0;
  for (const ParamRecord& p : ctx_.registry.params()) {
    norm_at_.push_back(tiles);
    tiles += (ctx_.owned_span(p, res_.rank).count + kTile - 1) / kTile;
  }
  norm_sums_.assign(tiles, 0.0);
  norm_valid_.assign(ctx_.registry.params().size(), 0);
  in_window_.assign(ctx_.registry.params().size(), 0);
  settled_.assign(ctx_.registry.params().size(), 0);
  handed_.assign(ctx_.registry.params().size(), 0);
  left_as_read_ = false;
  {
    const TierSet tiers = res_.tiers();
    const auto& groups = ctx_.registry.groups();
    window_.resize(groups.size());
    for (size_t gi = 0; gi < groups.size(); ++gi)
      if (placement_.window_on_device(gi, res_.rank))
        window_[gi].allocate(tiers, dtype_size(ctx_.grad_dtype(groups[gi])), {{ctx_.owned_count(groups[gi]), ZD_TIER_DEVICE}},
                             ZD_MEM_GRADS, "the gradient accumulation window of group " + std::to_string(gi) +
                                               " on the device (offload.accumulate)");
  }
  // One buffer a group in the group's gradient tier, of numel(group)
  // elements of its gradient dtype; on a refusal, none (and the error).
  auto per_group = [this](std::vector<TieredBuffer>& out, auto numel, zd_mem_kind kind, const std::string& name,
                          const std::string& why) {
    const TierSet tiers = res_.tiers();
    const auto& groups = ctx_.registry.groups();
    try {
      for (size_t gi = 0; gi < groups.size(); ++gi) {
        const ParamGroup& g = groups[gi];
        out.emplace_back();
        out.back().allocate(tiers, dtype_size(ctx_.grad_dtype(g)), {{numel(g), buffers_.groups()[gi].grad_tier()}},
                            kind, "the " + name + " of group " + std::to_string(gi) + " (" + why + ")");
      }
    } catch (...) {
      for (TieredBuffer& b : out) b.release(tiers);
      out.clear();
      throw;
    }
  };
  if (ctx_.partitioned(ZD_PARTITION_GRADS) && ctx_.optimizer().compresses())
    per_group(whole_, [](const ParamGroup& g) { return g.full_numel; }, ZD_MEM_GRADS,
              "whole local gradients", "a compressing optimizer's local steps");
  // Stage 1 on several ranks: each step reduce-scatters the whole gradients
  // into the owned range of each group, here, beside the accumulators
  // (Placement::need_table counts them, BUFFERS in the gradients' tier).
  // Allocated once: a step never asks for them, so a budget the plan fits
  // is not refused at the first step.
  if (stage1_reduces())
    per_group(reduced_, [](const ParamGroup& g) { return g.stride; }, ZD_MEM_BUFFERS,
              "reduced gradient range", "stage 1: the owned part of the averaged gradients");
}

void GradReducer::set_local(bool local) {
  if (local && ctx_.partitioned(ZD_PARTITION_GRADS) && whole_.empty())
    fail(ZD_ERR_INTERNAL, "a window with local gradients, but no whole local buffer was allocated");
  local_ = local;
}

OwnedGrad GradReducer::local_grad(size_t gi) const {
  if (!whole_.empty()) {
    const TieredBuffer::Segment& s = whole_[gi].segments().front();
    return {s.ptr, s.tier, s.memory};
  }
  const GroupBuffers& b = buffers_.groups()[gi];
  return {b.grad_data(), b.grad_tier(), &b.grad_memory()};
}

void GradReducer::release() {
  out_.reset();  // its tasks hold buckets and write the accumulators
  release_transient();
  release_reduced();
  res_.transfers.gradient_staging().release();
  const TierSet tiers = res_.tiers();
  for (TieredBuffer& w : whole_) w.release(tiers);
  whole_.clear();
  for (TieredBuffer& w : window_) w.release(tiers);
  window_.clear();
}

void GradReducer::release_transient() {
  for (ParamEntry& e : params_) {
    if (e.view) res_.device->release(e.view, ZD_MEM_BUFFERS);
    e = ParamEntry{};
  }
  for (auto& bucket : buckets_) {
    for (Pending& pg : bucket) res_.device->release(pg.view, ZD_MEM_BUFFERS);
    bucket.clear();
  }
  std::fill(bucket_elems_.begin(), bucket_elems_.end(), 0);
}

std::byte* GradReducer::accumulator(const ParamRecord& p) const {
  const ParamGroup& g = ctx_.registry.groups()[static_cast<size_t>(p.group)];
  return local_grad(static_cast<size_t>(p.group)).data + p.full_offset * dtype_size(ctx_.grad_dtype(g));
}

void GradReducer::open(const ModuleRecord& mod) {
  const bool reduce = reducing();
  std::vector<zd_param_id> given;
  try {
    for (zd_param_id pid : mod.params) {
      const ParamRecord& p = ctx_.registry.param(pid);
      const ParamGroup& g = ctx_.registry.groups()[static_cast<size_t>(p.group)];
      ParamEntry& e = params_[static_cast<size_t>(pid)];
      const bool direct = !reduce && !e.touched && ctx_.grad_dtype(g) == p.dtype &&
                          local_grad(static_cast<size_t>(p.group)).memory->trainer_views();
      if (!direct && !e.view) {
        e.view = allocate_transient(static_cast<uint64_t>(p.numel) * dtype_size(p.dtype),
                                    "the gradient view of parameter '" + p.name + "'");
        given.push_back(pid);
      }
    }
  } catch (...) {
    for (zd_param_id pid : given) {
      ParamEntry& e = params_[static_cast<size_t>(pid)];
      res_.device->release(e.view, ZD_MEM_BUFFERS);
      e.view = Block{};
    }
    throw;
  }
}

void GradReducer::activate(const ModuleRecord& mod) {
  for (zd_param_id pid : mod.params) params_[static_cast<size_t>(pid)].view_active = true;
}

void GradReducer::cancel(const ModuleRecord& mod) {
  for (zd_param_id pid : mod.params) {
    ParamEntry& e = params_[static_cast<size_t>(pid)];
    if (e.view && !e.view_active) {
      res_.device->release(e.view, ZD_MEM_BUFFERS);
      e.view = Block{};
    }
  }
}

void GradReducer::close(const ModuleRecord& mod) {
  const bool reduce = reducing();
  // What the trainer wrote into the buffers is read from here on.
  res_.device->wait_for_trainer();
  bool bucket_full = false;
  for (zd_param_id pid : mod.params) {
    const ParamRecord& p = ctx_.registry.param(pid);
    const ParamGroup& g = ctx_.registry.groups()[static_cast<size_t>(p.group)];
    ParamEntry& e = params_[static_cast<size_t>(pid)];
    if (reduce) {
      const auto gi = static_cast<size_t>(p.group);
      buckets_[gi].push_back(Pending{pid, e.view, !e.touched});
      bucket_elems_[gi] += static_cast<uint64_t>(p.numel);
      bucket_full = bucket_full || bucket_elems_[gi] >= ctx_.plugins.partitioner->bucket_elements();
    } else if (e.view) {
      const Memory& mem = *local_grad(static_cast<size_t>(p.group)).memory;
      const bool fuse = fuse_norm(mem, final_);
      const NormTiles norm = norm_of(pid);
      const PoolAdd add{e.view.ptr, p.dtype, accumulator(p), ctx_.grad_dtype(g), static_cast<uint64_t>(p.numel),
                        !e.touched, fuse ? norm : NormTiles{nullptr, 0}};
      mem.add_from_pool(std::span(&add, 1), mem.ready_mark());
      norm_valid_[static_cast<size_t>(pid)] = fuse ? 1 : 0;
      res_.device->release(e.view, ZD_MEM_BUFFERS);
    }
    e.view = Block{};
    e.view_active = false;
    e.touched = true;
  }
  if (bucket_full) flush();  // sends every group's pending gradients
}

ViewInfo GradReducer::view(zd_param_id param) const {
  const ParamRecord& p = ctx_.registry.param(param);
  const ParamEntry& e = params_[static_cast<size_t>(param)];
  ViewInfo v;
  if (e.view) {
    v.data = e.view.ptr;
    v.arena = e.view.arena;
    v.offset = e.view.offset;
  } else {
    const Block& acc = whole_.empty() ? buffers_.of(p).grad_block()
                                      : whole_[static_cast<size_t>(p.group)].segments().front().block;
    v.data = accumulator(p);
    v.arena = acc.arena;
    v.offset = acc.offset + p.full_offset * dtype_size(p.dtype);
  }
  v.bytes = static_cast<uint64_t>(p.numel) * dtype_size(p.dtype);
  v.dtype = p.dtype;
  v.shape = &p.shape;
  v.read_only = false;
  return v;
}

void GradReducer::flush() {
  for (size_t gi = 0; gi < buckets_.size(); ++gi)
    if (!buckets_[gi].empty()) send_bucket(gi);
}

void GradReducer::drain() {
  if (out_) ctx_.drain(*out_);
}

void GradReducer::settle_windows() {
  std::vector<std::vector<zd_param_id>> by_group(ctx_.registry.groups().size());
  for (size_t i = 0; i < in_window_.size(); ++i) {
    if (!in_window_[i]) continue;
    const auto pid = static_cast<zd_param_id>(i);
    by_group[static_cast<size_t>(ctx_.registry.param(pid).group)].push_back(pid);
  }
  uint64_t ready = 0;
  for (size_t gi = 0; gi < by_group.size(); ++gi) {
    if (by_group[gi].empty()) continue;
    if (!ready) ready = res_.device->mark();
    settle_window(gi, by_group[gi], ready, final_);
  }
}

std::byte* GradReducer::window_at(size_t group, uint64_t at) const {
  return window_[group].addr(0) + at * dtype_size(ctx_.grad_dtype(ctx_.registry.groups()[group]));
}

void GradReducer::settle_window(size_t gi, const std::vector<zd_param_id>& pids, uint64_t ready, bool final) {
  GroupBuffers& b = buffers_.groups()[gi];
  const zd_dtype gdt = ctx_.grad_dtype(ctx_.registry.groups()[gi]);
  const size_t esz = dtype_size(gdt);
  const bool fuse = fuse_norm(b.grad_memory(), final);
  std::vector<PoolAdd> adds;
  std::vector<std::pair<std::byte*, uint64_t>> ranges;  // the window's, cleared after
  bool again = false;
  for (const zd_param_id pid : pids) {
    const ParamRecord& p = ctx_.registry.param(pid);
    const ModelContext::OwnedSpan sp = ctx_.owned_span(p, res_.rank);
    // At stage 3 a shard's padding travels with it (zeros).
    const uint64_t at = ctx_.params_partitioned() ? p.flat_offset : sp.at;
    const uint64_t n = ctx_.params_partitioned() ? p.stride : sp.count;
    in_window_[static_cast<size_t>(pid)] = 0;
    if (n == 0) continue;
    // The accumulators hold nothing of this window yet (written, not added
    // to), unless a module's second backward in the last micro-batch sent
    // more after the first sum left.
    char& settled = settled_[static_cast<size_t>(pid)];
    again = again || settled;
    adds.push_back(PoolAdd{window_at(gi, at), gdt, b.grad_data() + at * esz, gdt, n, /*first=*/!settled,
                           fuse ? norm_of(pid) : NormTiles{nullptr, 0}});
    settled = 1;
    norm_valid_[static_cast<size_t>(pid)] = fuse ? 1 : 0;
    ranges.emplace_back(window_at(gi, at), n * esz);
  }
  // Settled before in this window: this thread zeroed the range after that
  // download, on zerod's stream, after `ready` (and the add since, which
  // send_bucket issued after that zero). On a GPU the zero is queued, not
  // done, so this download waits for a mark taken now (found on an H200,
  // 2026-11-27: overlap's cuda_stage2_host_f32_window_on_device read a
  // window's sum twice).
  if (again) ready = res_.device->mark();
  b.grad_memory().add_from_pool(adds, ready);
  // Their downloads are done (add_from_pool waited): the ranges are free
  // for the next window.
  for (const auto& [at, bytes] : ranges) res_.device->zero(at, bytes);
}

void GradReducer::to_accumulators(std::function<void()> fn) { out_->enqueue(std::move(fn)); }

Block GradReducer::allocate_transient(uint64_t bytes, const std::string& what) {
  try {
    return res_.device->allocate(bytes, ZD_MEM_BUFFERS, what);
  } catch (const Error& e) {
    if (e.code() != ZD_ERR_BUDGET) throw;
  }
  settle_transients();
  return res_.device->allocate(bytes, ZD_MEM_BUFFERS, what);
}

void GradReducer::settle_transients() {
  // The buckets sent before give their buffers back once reduced (on the
  // rank's stream) and handed to the accumulators (out_).
  ctx_.drain(*res_.stream);
  drain();
}

// Sends a group's pending gradients to their owners on the rank's stream:
// each contribution is scaled by 1/world (ranks average; pre-dividing keeps
// 16-bit sums in range) and packed; the owners add what they receive into
// their accumulators. Stage 3 reduce-scatters shards of equal stride; stage 2
// all-reduces the bucket and each rank keeps what falls in its range.
void GradReducer::send_bucket(size_t gi) {
  Device& d = *res_.device;
  const ParamGroup& g = ctx_.registry.groups()[gi];
  const bool p3 = ctx_.params_partitioned();
  const auto world = static_cast<uint64_t>(ctx_.world_size);
  const float inv = 1.0f / static_cast<float>(ctx_.world_size);
  // The bucket is packed, reduced and added in the accumulators' type, as
  // stages 0-1 reduce: with grad_accum_dtype = "fp32" a 16-bit contribution
  // is widened before it is divided and summed over ranks (twice the bytes
  // on the wire). Reduced in its own 16-bit type, each micro-batch's mean
  // was rounded before it reached the exact accumulators.
  const zd_dtype gdt = ctx_.grad_dtype(g);
  const size_t esz = dtype_size(gdt);
  // Where each contribution sits in the packed bucket.
  auto offsets = std::make_shared<std::vector<uint64_t>>();
  uint64_t len = 0;
  for (const Pending& pg : buckets_[gi]) {
    const ParamRecord& p = ctx_.registry.param(pg.param);
    offsets->push_back(len);
    len += p3 ? p.stride : static_cast<uint64_t>(p.numel);
  }
  const uint64_t send_len = p3 ? len * world : len;
  // The packed buffers first: a refusal (ZD_ERR_BUDGET) leaves the bucket,
  // its count and the tags as they were, so the contributions stay pending
  // and the next flush (the same zd_step made again) sends them. Taken out
  // before, they were released with the refusal and a repeated zd_step
  // applied an update without them. A send taken before a refused recv
  // goes back with `blocks`.
  auto blocks = std::make_shared<BucketBlocks>(d);
  try {
    blocks->send = allocate_transient(send_len * esz, "a gradient bucket");
    if (p3) blocks->recv = allocate_transient(len * esz, "a gradient bucket");
  } catch (const Error& e) {
    if (e.code() != ZD_ERR_BUDGET) throw;
    fail(e.code(), std::string(e.what()) + "; the bucket's gradients stay pending: the next zd_step sends them "
                                           "(a refused zd_step can be made again)");
  }
  std::byte* const send = blocks->send.ptr;
  std::byte* const recv = blocks->recv.ptr;
  auto pending = std::make_shared<std::vector<Pending>>(std::move(buckets_[gi]));
  buckets_[gi].clear();
  bucket_elems_[gi] = 0;
  const uint64_t seq = ++bucket_seq_;
  // Packing happens now, on the rank's thread: the views are done with.
  observe::EventArgs a;
  a.value = static_cast<int64_t>(seq);
  a.bytes = send_len * esz;
  observe::Span pack(res_.probe, "grads", "pack bucket", a);
  for (size_t i = 0; i < pending->size(); ++i) {
    const Pending& pg = (*pending)[i];
    const ParamRecord& p = ctx_.registry.param(pg.param);
    const auto numel = static_cast<uint64_t>(p.numel);
    // The view holds the parameter's own type (grad_view).
    const size_t vsz = dtype_size(p.dtype);
    if (p3) {
      for (uint64_t k = 0; k < world; ++k) {
        const uint64_t lo = k * p.stride;
        if (lo >= numel) break;
        const uint64_t n = std::min(p.stride, numel - lo);
        d.accumulate_scaled(pg.view.ptr + lo * vsz, p.dtype, send + (k * len + (*offsets)[i]) * esz, gdt, n, inv);
      }
    } else {
      d.accumulate_scaled(pg.view.ptr, p.dtype, send + (*offsets)[i] * esz, gdt, numel, inv);
    }
    d.release(pg.view, ZD_MEM_BUFFERS);
  }
  pack.end();
  const bool fuse = fuse_norm(buffers_.groups()[gi].grad_memory(), final_);
  const bool last = final_;
  auto what = std::make_shared<std::string>(std::string("reducing gradients (bucket ") + std::to_string(seq) +
                                            "): " + (p3 ? "reduce-scatter" : "all-reduce"));
  // Both tasks below hold the packed buffers (blocks): the last of them to
  // go gives them back, whether it ran to the end or not.
  ctx_.issue(*res_.stream, [this, gi, pending, offsets, len, blocks, send, recv, what, seq, p3, gdt, esz, a, fuse,
                            last] {
    observe::Span span(res_.probe, "grads", "reduce bucket", a);
    const zd_comm_call c = ctx_.comm_call(res_.rank, comm_tag(CommOp::Reduce, gi, seq), *what);
    if (p3)
      res_.pool_memory.reduce_scatter(ctx_, c, send, recv, len, gdt);
    else
      res_.pool_memory.all_reduce(ctx_, c, send, len, gdt);
    // Where each contribution's owned part is now, and where it goes in
    // the owned range.
    const ParamGroup& grp = ctx_.registry.groups()[gi];
    auto part = [this, &grp, offsets, blocks, send, recv, p3, esz](size_t i, zd_param_id pid, uint64_t* at,
                                                                uint64_t* n) -> const std::byte* {
      const ParamRecord& p = ctx_.registry.param(pid);
      if (p3) {
        *at = p.flat_offset;
        *n = p.stride;
        return recv + (*offsets)[i] * esz;
      }
      uint64_t lo, hi;
      ctx_.owned_part(p, res_.rank, &lo, &hi);
      *at = lo - ctx_.owned_begin(grp, res_.rank);
      *n = hi > lo ? hi - lo : 0;
      return send + ((*offsets)[i] + lo - p.full_offset) * esz;
    };
    if (windowed(gi)) {
      // The window on the device takes every micro-batch's contribution;
      // the last micro-batch's sum is what leaves (below).
      // A parameter whose range a settle took already this window (a
      // module's second backward in the last micro-batch): that settle
      // zeroes the range on the accumulators' thread once its download is
      // done. This add goes after that zero, or the zero would wipe it.
      for (const Pending& pg : *pending)
        if (handed_[static_cast<size_t>(pg.param)]) {
          drain();
          break;
        }
      for (size_t i = 0; i < pending->size(); ++i) {
        uint64_t at, n;
        const std::byte* src = part(i, (*pending)[i].param, &at, &n);
        if (n) res_.device->accumulate(src, gdt, window_at(gi, at), gdt, n);
        in_window_[static_cast<size_t>((*pending)[i].param)] = 1;
      }
      if (!last) return;  // not the window's last micro-batch
      for (const Pending& pg : *pending) handed_[static_cast<size_t>(pg.param)] = 1;
      const uint64_t ready = res_.device->mark();
      to_accumulators([this, gi, pending, a, ready, last] {
        observe::Span add(res_.probe, "grads", "window to accumulators", a);
        // A bucket that held every micro-batch of the window (no bucket
        // filled before the boundary: stage 2's large buckets) lists a
        // parameter once per micro-batch; the window held all of them at
        // `ready`, so one settle takes them all.
        std::vector<zd_param_id> pids;
        for (const Pending& pg : *pending) pids.push_back(pg.param);
        std::sort(pids.begin(), pids.end());
        pids.erase(std::unique(pids.begin(), pids.end()), pids.end());
        settle_window(gi, pids, ready, last);
      });
      return;
    }
    const uint64_t ready = res_.device->mark();
    to_accumulators([this, gi, pending, part, gdt, esz, a, fuse, ready] {
      observe::Span add(res_.probe, "grads", "bucket to accumulators", a);
      GroupBuffers& b = buffers_.groups()[gi];
      // One call for the bucket: its downloads follow each other without a
      // pause (Transfers::add_to_host). A parameter listed twice (two
      // micro-batches in one bucket) adds in order, as before.
      std::vector<PoolAdd> adds;
      adds.reserve(pending->size());
      for (size_t i = 0; i < pending->size(); ++i) {
        const zd_param_id pid = (*pending)[i].param;
        uint64_t at, n;
        const std::byte* src = part(i, pid, &at, &n);
        if (n)
          adds.push_back(PoolAdd{src, gdt, b.grad_data() + at * esz, gdt, n, (*pending)[i].first,
                                 fuse ? norm_of(pid) : NormTiles{nullptr, 0}});
        norm_valid_[static_cast<size_t>(pid)] = fuse ? 1 : 0;
      }
      b.grad_memory().add_from_pool(adds, ready);
    });
  });
}

// Stages 0-1: the gradients are whole on every rank until the boundary.
// They are averaged over ranks (pre-divided, then summed); stage 0
// all-reduces them, stage 1 reduce-scatters them so each rank receives the
// range it owns.
void GradReducer::reduce_for_step() {
  if (ctx_.partitioned(ZD_PARTITION_GRADS) || ctx_.world_size == 1) return;
  const auto& groups = ctx_.registry.groups();
  const float inv = 1.0f / static_cast<float>(ctx_.world_size);
  const bool stage1 = ctx_.partitioned(ZD_PARTITION_OPTIMIZER);
  // Nothing is allocated here (the reduced ranges were at finalize): the
  // only failure left is the collective's, which breaks the job.
  if (stage1 && reduced_.size() != groups.size())
    fail(ZD_ERR_INTERNAL, "stage 1 on several ranks, but the reduced gradient ranges were not allocated at finalize");
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const ParamGroup& g = groups[gi];
    GroupBuffers& b = buffers_.groups()[gi];
    b.grad_memory().scale(b.grad_data(), ctx_.grad_dtype(g), g.full_numel, inv);
  }
  const std::string what = stage1 ? "step: reduce-scatter of the gradients" : "step: all-reduce of the gradients";
  observe::Span span(res_.probe, "grads", "reduce gradients", {}, &res_.probe.counters().reduce_wait_ns);
  const int rank = res_.rank;
  ctx_.run(*res_.stream, [&] {
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      const ParamGroup& g = groups[gi];
      GroupBuffers& b = buffers_.groups()[gi];
      const zd_comm_call c = ctx_.comm_call(rank, comm_tag(CommOp::StepReduce, gi, 0), what);
      const zd_dtype dt = ctx_.grad_dtype(g);
      // The accumulators' memory runs the collective where it is (the
      // reduced range is allocated in the same tier).
      const Memory& mem = b.grad_memory();
      if (stage1)
        mem.reduce_scatter(ctx_, c, b.grad_data(), reduced_[gi].addr(0), g.stride, dt);
      else
        mem.all_reduce(ctx_, c, b.grad_data(), g.full_numel, dt);
    }
  });
  reduced_ready_ = stage1;
}

OwnedGrad GradReducer::owned(size_t gi) const {
  const GroupBuffers& b = buffers_.groups()[gi];
  if (reduced_ready_) return {reduced_[gi].addr(0), b.grad_tier(), &b.grad_memory()};
  const ParamGroup& g = ctx_.registry.groups()[gi];
  std::byte* grad = b.grad_data();
  if (!ctx_.partitioned(ZD_PARTITION_GRADS))
    grad += ctx_.owned_begin(g, res_.rank) * dtype_size(ctx_.grad_dtype(g));
  return {grad, b.grad_tier(), &b.grad_memory()};
}

bool GradReducer::update_zeroes(size_t gi) const {
  // Host memory (HostMemory) is the one that writes a window's first
  // contribution over its range (PoolAdd::first); the pool's adds it, and
  // trainers write into the pool's accumulators directly (open()). A
  // planned pass (zd_optimizer_v3) still zeroes what it reads; the
  // boundary then zeroes zeros for untouched parameters, which is harmless.
  const Memory& mem = buffers_.groups()[gi].grad_memory();
  return ctx_.optimizer().compresses() || mem.trainer_views() || !mem.host_writes();
}

void GradReducer::clear_untouched() {
  if (!left_as_read_) return;
  left_as_read_ = false;
  for (size_t gi = 0; gi < ctx_.registry.groups().size(); ++gi) {
    if (update_zeroes(gi)) continue;
    const OwnedGrad og = owned(gi);
    const size_t esz = dtype_size(ctx_.grad_dtype(ctx_.registry.groups()[gi]));
    for (zd_param_id pid : ctx_.registry.groups()[gi].params) {
      if (params_[static_cast<size_t>(pid)].touched) continue;
      const ModelContext::OwnedSpan sp = ctx_.owned_span(ctx_.registry.param(pid), res_.rank);
      if (sp.count) og.memory->zero(og.data + sp.at * esz, sp.count * esz);
    }
  }
}

void GradReducer::end_step(bool applied) {
  // A skipped step drops its gradients. An applied one zeroed the owned
  // range as it went, or left it as read (update_zeroes), except at stage
  // 1, where it read a reduced copy: the whole unreduced gradients are
  // stale.
  if (!applied || reduced_ready_) {
    zero();
  } else {
    left_as_read_ = true;
  }
  reduced_ready_ = false;
  for (ParamEntry& e : params_) e.touched = false;
  forget_norms();
  std::fill(settled_.begin(), settled_.end(), 0);
  std::fill(handed_.begin(), handed_.end(), 0);
}

double GradReducer::host_sumsq(const std::vector<size_t>& groups) {
  struct Task {
    zd_param_id param;
    uint64_t tile;
  };
  std::vector<Task> tasks;
  for (size_t gi : groups)
    for (zd_param_id pid : ctx_.registry.groups()[gi].params) {
      if (norm_valid_[static_cast<size_t>(pid)]) continue;
      const uint64_t count = norm_of(pid).real;
      for (uint64_t k = 0; k * kTile < count; ++k) tasks.push_back({pid, k});
    }
  res_.workers.run(tasks.size(), [&](size_t i) {
    const ParamRecord& p = ctx_.registry.param(tasks[i].param);
    const ParamGroup& g = ctx_.registry.groups()[static_cast<size_t>(p.group)];
    const zd_dtype gdt = ctx_.grad_dtype(g);
    const NormTiles norm = norm_of(tasks[i].param);
    const uint64_t lo = tasks[i].tile * kTile;
    const std::byte* at = owned(static_cast<size_t>(p.group)).data +
                          (ctx_.owned_span(p, res_.rank).at + lo) * dtype_size(gdt);
    norm_tiles(at, gdt, std::min(kTile, norm.real - lo), NormTiles{norm.sums + tasks[i].tile, norm.real - lo});
  });
  double s = 0.0;
  for (size_t gi : groups)
    for (zd_param_id pid : ctx_.registry.groups()[gi].params) {
      const NormTiles norm = norm_of(pid);
      for (uint64_t k = 0; k * kTile < norm.real; ++k) s += norm.sums[k];
    }
  return s;
}

void GradReducer::release_reduced() {
  const TierSet tiers = res_.tiers();
  for (TieredBuffer& r : reduced_) r.release(tiers);
  reduced_.clear();
}

void GradReducer::zero() {
  forget_norms();
  auto clear = [&](const TieredBuffer& buf) {
    const TieredBuffer::Segment& s = buf.segments().front();
    s.memory->zero(s.ptr, s.bytes);
  };
  for (GroupBuffers& b : buffers_.groups()) clear(b.grad);
  for (const TieredBuffer& w : whole_) clear(w);
  for (const TieredBuffer& w : window_)
    if (!w.empty()) clear(w);
  std::fill(in_window_.begin(), in_window_.end(), 0);
  std::fill(settled_.begin(), settled_.end(), 0);
  std::fill(handed_.begin(), handed_.end(), 0);
  left_as_read_ = false;
}

void GradReducer::restart() {
  // Contributions still on their way to the accumulators land first (they
  // are cleared below); a failure among them belonged to the failed step.
  if (out_) {
    try {
      out_->drain();
    } catch (...) {
    }
  }
  // The buckets sent before gave their buffers back with their tasks
  // (BucketBlocks), which the failed collectives ended; what was never
  // sent goes here.
  release_transient();
  local_ = false;
  reduced_ready_ = false;
  bucket_seq_ = 0;  // tags restart with the new comm, equal on every rank
  zero();
}

bool GradReducer::pending() const {
  for (const ParamEntry& e : params_)
    if (e.touched) return true;
  return false;
}

void GradReducer::discard() {
  // What was sent lands first (its reductions are collectives every rank
  // made; a failure among them breaks the job, as at a step), then
  // everything of the window goes. The bucket tags go on: the comm is the
  // same, and every rank sent the same buckets.
  settle_transients();
  release_transient();
  local_ = false;
  reduced_ready_ = false;
  zero();
}

}  // namespace zerod
