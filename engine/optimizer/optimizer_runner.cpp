#include "optimizer/optimizer_runner.h"

#include "memory/align.h"
#include "runtime/dtype.h"
#include "error.h"
#include "memory/transfers.h"
#include "runtime/workers.h"
#include "observe/probe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <optional>
#include <utility>

namespace zerod {

void OptimizerRunner::reserve_staging() {
  const std::vector<uint64_t> layout = placement_.staging_layout(res_.rank);
  if (layout.empty()) return;
  const auto sets = static_cast<size_t>(ctx_.config.offload.buffer_count);
  uint64_t bytes = 0;
  for (uint64_t b : layout) bytes += b * sets;
  res_.ledger.charge(ZD_TIER_HOST, ZD_MEM_BUFFERS, bytes,
                     "the NVMe staging buffers (offload.buffer_count x offload.tile_size per operand)");
  staging_charged_ = bytes;
  const uint64_t align = placement_.nvme_alignment();
  staging_.resize(sets);
  for (auto& set : staging_)
    for (uint64_t b : layout) {
      set.emplace_back(b ? b : align, align);
      res_.device->register_host(set.back().data(), set.back().size());
    }
}

void OptimizerRunner::release_staging() {
  for (auto& set : staging_)
    for (AlignedBuffer& b : set) res_.device->unregister_host(b.data());
  staging_.clear();
  work_staging_.release();
  res_.ledger.release(ZD_TIER_HOST, ZD_MEM_BUFFERS, staging_charged_);
  staging_charged_ = 0;
}

GradStats OptimizerRunner::gradient_stats(bool local) {
  // Gradients are in the pool or in host memory, one memory per kind: the
  // one whose adds leave squared-norm partials (host memory) and the other.
  std::vector<GradSpan> summed, partials;
  const Memory* summed_in = nullptr;
  const Memory* partials_in = nullptr;
  std::vector<size_t> partial_groups;
  const auto& groups = ctx_.registry.groups();
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const ParamGroup& g = groups[gi];
    const OwnedGrad og = local ? grads_.local_grad(gi) : grads_.owned(gi);
    const GradSpan span{og.data, ctx_.grad_dtype(g), local ? g.full_numel : ctx_.owned_count(g)};
    if (og.memory->leaves_norms()) {
      partials.push_back(span);
      partial_groups.push_back(gi);
      partials_in = og.memory;
    } else {
      summed.push_back(span);
      summed_in = og.memory;
    }
  }
  double s = 0.0;
  if (!summed.empty()) s += summed_in->sumsq(summed).sumsq;
  // The owned gradients in host memory: mostly summed already by the adds
  // of the window's last micro-batch (GradReducer::host_sumsq).
  if (!partials.empty()) s += local ? partials_in->sumsq(partials).sumsq : grads_.host_sumsq(partial_groups);
  if ((local || ctx_.partitioned(ZD_PARTITION_OPTIMIZER)) && ctx_.world_size > 1) {
    // Each rank holds a part (or its own gradient): the global sum (inf and
    // NaN carry through).
    const std::string what = "step: all-reduce of the gradient norm";
    ctx_.run(*res_.stream, [&] {
      ctx_.comm().all_reduce(ctx_.comm_call(res_.rank, comm_tag(CommOp::Stats, 0, 0), what), &s, 1, ZD_COMM_F64,
                             ZD_REDUCE_SUM);
    });
  }
  GradStats out;
  out.sumsq = s;
  out.finite = std::isfinite(s);
  return out;
}

std::vector<OptimizerRunner::Piece> OptimizerRunner::pieces(bool per_tensor) const {
  const auto& groups = ctx_.registry.groups();
  const uint32_t slots = ctx_.optimizer().state_slots();
  const bool p3 = ctx_.params_partitioned();
  std::vector<Piece> out;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const ParamGroup& g = groups[gi];
    const GroupBuffers& b = buffers_.groups()[gi];
    const uint64_t n = ctx_.owned_count(g), wbase = p3 ? 0 : ctx_.owned_begin(g, res_.rank);
    // Cut wherever any operand changes segment.
    std::vector<uint64_t> cuts = {0, n};
    auto add_cuts = [&](const TieredBuffer& buf, uint64_t base) {
      for (const auto& s : buf.segments()) {
        if (s.begin >= base && s.begin - base < n) cuts.push_back(s.begin - base);
        if (s.begin + s.count > base && s.begin + s.count - base < n) cuts.push_back(s.begin + s.count - base);
      }
    };
    add_cuts(b.master, 0);
    for (uint32_t s = 0; s < slots; ++s) add_cuts(b.state[s], 0);
    add_cuts(b.working, wbase);
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    const std::vector<TensorSpan> spans = per_tensor ? tensor_spans(gi) : std::vector<TensorSpan>{};
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      const uint64_t lo = cuts[i], len = cuts[i + 1] - cuts[i];
      bool staged = !b.master.addressable(lo, len) || !b.working.addressable(wbase + lo, len);
      // The master's memory updates the piece when every state slot is in
      // it too; else the host does (its loops reach both).
      Memory* mem = b.master.segment_at(lo).memory;
      for (uint32_t s = 0; s < slots; ++s) {
        staged = staged || !b.state[s].addressable(lo, len);
        if (b.state[s].segment_at(lo).memory != mem) mem = &res_.host_memory;
      }
      const zd_tier tier = staged ? ZD_TIER_NVME : mem->tier();
      // A planned pass calls the plugin within one tensor at a time. Staged
      // pieces keep their aligned tiles and split each tile instead.
      if (!per_tensor || staged) {
        out.push_back({gi, lo, len, tier, -1, staged ? nullptr : mem});
        continue;
      }
      for (const TensorSpan& t : spans) {
        const uint64_t a = std::max(lo, t.at), z = std::min(lo + len, t.at + t.count);
        if (a < z) out.push_back({gi, a, z - a, tier, t.tensor, mem});  // elements between tensors: zero, and stay zero
      }
    }
  }
  return out;
}

std::vector<OptimizerRunner::TensorSpan> OptimizerRunner::tensor_spans(size_t gi) const {
  std::vector<TensorSpan> spans;
  for (zd_param_id pid : ctx_.registry.groups()[gi].params) {
    const ModelContext::OwnedSpan sp = ctx_.owned_span(ctx_.registry.param(pid), res_.rank);
    if (sp.count) spans.push_back({sp.at, sp.count, pid});
  }
  std::sort(spans.begin(), spans.end(), [](const TensorSpan& x, const TensorSpan& y) { return x.at < y.at; });
  return spans;
}

zd_optimizer_update OptimizerRunner::base_update(const PassArgs& a, const Piece& pc) const {
  zd_optimizer_update u{};
  u.struct_size = sizeof u;
  // 0 (fp32) unless the job keeps bf16 state: a plugin older than v4 reads
  // this field as reserved, and is never given anything else.
  u.state_dtype = ctx_.state_dtype() == ZD_DTYPE_F32 ? 0 : ctx_.state_dtype();
  u.grad_scale = a.grad_scale;
  u.lr = a.lr;
  u.step = a.t;
  if (a.planned) {
    u.kind = a.kind;
    u.pass = a.pass;
    // u.exchange: opened where the pass runs (update_in_memory, update_staged).
    const uint32_t k = ctx_.optimizer().tensor_scalars();
    if (k && a.scalars && pc.tensor >= 0) u.tensor = a.scalars + static_cast<uint64_t>(pc.tensor) * k;
  }
  return u;
}

std::byte* OptimizerRunner::grad_of(const Piece& pc) const {
  const ParamGroup& g = ctx_.registry.groups()[pc.group];
  return grads_.owned(pc.group).data + pc.begin * dtype_size(ctx_.grad_dtype(g));
}

class OptimizerRunner::HostUpdates {
 public:
  explicit HostUpdates(OptimizerRunner& runner) : runner_(runner) { runner_.begin_host_updates(); }
  ~HostUpdates() {
    if (!ended_) runner_.abandon_host_updates();
  }
  HostUpdates(const HostUpdates&) = delete;
  HostUpdates& operator=(const HostUpdates&) = delete;
  void end() {
    ended_ = true;  // end_host_updates gives the ring back even when it throws
    runner_.end_host_updates(/*stream_waits=*/true);
  }

 private:
  OptimizerRunner& runner_;
  bool ended_ = false;
};

void OptimizerRunner::pass(const PassArgs& a) {
  const uint32_t nstats = a.planned ? ctx_.optimizer().tensor_stats() : 0;
  std::vector<double> piece_stats(nstats);
  std::vector<zd_stat_op> ops(nstats);
  for (uint32_t i = 0; i < nstats; ++i) ops[i] = ctx_.optimizer().stat_op(i);
  HostUpdates updates(*this);
  for (const Piece& pc : pieces(a.planned)) {
    std::byte* grad = grad_of(pc);
    observe::EventArgs ev;
    ev.tier = pc.tier;
    ev.value = static_cast<int64_t>(pc.count);
    observe::Span span(res_.probe, "optimizer", "optimizer piece", ev,
                       &res_.probe.counters().optimizer_ns[static_cast<size_t>(pc.tier)]);
    const zd_optimizer_update base = base_update(a, pc);
    if (pc.tier == ZD_TIER_NVME) {
      update_staged(pc, grad, base, a);
      continue;
    }
    std::fill(piece_stats.begin(), piece_stats.end(), 0.0);
    update_in_memory(pc, grad, base, a, piece_stats.data());
    if (nstats && a.stats)
      combine_stats(a.stats->data() + static_cast<uint64_t>(pc.tensor) * nstats, piece_stats.data(), nstats,
                    ops.data());
  }
  updates.end();
}

std::vector<OptimizerRunner::Piece> OptimizerRunner::host_pieces() const {
  std::vector<Piece> out;
  for (const Piece& pc : pieces(/*per_tensor=*/true))
    if (pc.tier == ZD_TIER_HOST) out.push_back(pc);
  return out;
}

void OptimizerRunner::pass_off_host(const PassArgs& a) {
  HostUpdates updates(*this);
  for (const Piece& pc : pieces(/*per_tensor=*/false)) {
    if (pc.tier == ZD_TIER_HOST) continue;
    observe::EventArgs ev;
    ev.tier = pc.tier;
    ev.value = static_cast<int64_t>(pc.count);
    observe::Span span(res_.probe, "optimizer", "optimizer piece", ev,
                       &res_.probe.counters().optimizer_ns[static_cast<size_t>(pc.tier)]);
    if (pc.tier == ZD_TIER_NVME)
      update_staged(pc, grad_of(pc), base_update(a, pc), a);
    else
      update_in_memory(pc, grad_of(pc), base_update(a, pc), a, nullptr);
  }
  updates.end();
}

void OptimizerRunner::begin_host_updates() {
  release_upload_ring();  // a no-op after any pass, failed or not (HostUpdates): kept so begin stands alone
  uploads_.next = 0;
  uploads_.last = 0;
  std::fill(std::begin(uploads_.ticket), std::end(uploads_.ticket), 0);
  res_.transfers.before_host_writes();
}

uint64_t OptimizerRunner::update_host_piece(const PassArgs& a, const Piece& pc) {
  observe::EventArgs ev;
  ev.tier = pc.tier;
  ev.value = static_cast<int64_t>(pc.count);
  observe::Span span(res_.probe, "optimizer", "optimizer piece", ev,
                     &res_.probe.counters().optimizer_ns[static_cast<size_t>(pc.tier)]);
  return update_in_memory(pc, grad_of(pc), base_update(a, pc), a, nullptr);
}

void OptimizerRunner::end_host_updates(bool stream_waits) {
  release_upload_ring();
  if (stream_waits) res_.device->stream_waits(uploads_.last);
}

void OptimizerRunner::abandon_host_updates() noexcept {
  try {
    release_upload_ring();
  } catch (...) {
    // An upload of the failed pass failed too (a device's failure is often
    // reported at every wait after it): the pass's own failure is already
    // on its way to the caller, and the ring is given back regardless.
  }
}

void OptimizerRunner::release_upload_ring() {
  std::exception_ptr failed;
  for (uint64_t& t : uploads_.ticket) {
    try {
      res_.device->transfer_wait(std::exchange(t, 0));
    } catch (...) {
      // The other slots' uploads still read the buffer: wait for them too.
      if (!failed) failed = std::current_exception();
    }
  }
  uploads_.lease.reset();
  if (failed) std::rethrow_exception(failed);
}

uint64_t OptimizerRunner::update_in_memory(const Piece& pc, std::byte* grad, const zd_optimizer_update& base,
                                           const PassArgs& a, double* stats) {
  const bool with_grad = a.with_grad;
  const ParamGroup& g = ctx_.registry.groups()[pc.group];
  GroupBuffers& b = buffers_.groups()[pc.group];
  const uint32_t slots = ctx_.optimizer().state_slots();
  const uint64_t wbase = (ctx_.params_partitioned() ? 0 : ctx_.owned_begin(g, res_.rank)) + pc.begin;
  Device& d = *res_.device;
  zd_optimizer_update u = base;
  u.count = pc.count;
  u.master = reinterpret_cast<float*>(b.master.addr(pc.begin));
  u.grad = with_grad ? grad : nullptr;
  u.grad_dtype = ctx_.grad_dtype(g);
  u.work = b.working.addr(wbase);
  u.work_dtype = g.dtype;
  for (uint32_t s = 0; s < slots; ++s) u.state[s] = reinterpret_cast<float*>(b.state[s].addr(pc.begin));
  if (a.planned) {
    // The host runs planned passes (the plugin's kernels with the exchange
    // and per-tensor figures): each operand through a host window, which is
    // the operand itself where the host writes its memory, else a host copy
    // whose new values go back after the pass (HostWindow). The piece lies
    // in one segment of each buffer (pieces() cuts at every change).
    using W = HostWindow;
    W master(b.master, pc.begin, pc.count, 4, W::kReadWrite, "a planned pass's master");
    W state[ZD_OPTIMIZER_MAX_STATE];
    for (uint32_t s = 0; s < slots; ++s)
      state[s] = W(b.state[s], pc.begin, pc.count, ctx_.state_size(), W::kReadWrite, "a planned pass's state");
    W work(b.working, wbase, pc.count, dtype_size(g.dtype), W::kWrite, "a planned pass's working copy");
    // The gradient is read, and zeroed after the update (parallel_pass).
    W grad_w = with_grad ? W(*grads_.owned(pc.group).memory, grad, pc.count * dtype_size(u.grad_dtype), W::kReadWrite)
                         : W();
    // Passes of a plan that keeps no average may write the exchange buffer.
    W exchange;
    if (a.exchange && pc.tensor >= 0) {
      const PassArgs::ExchangeAt x = a.exchange(pc.group, static_cast<zd_param_id>(pc.tensor), pc.begin);
      exchange = W(*x.buffer, x.at, pc.count, 4, W::kReadWrite, "a planned pass's exchange buffer");
      u.exchange = exchange.f32();
    }
    u.master = master.f32();
    for (uint32_t s = 0; s < slots; ++s) u.state[s] = state[s].f32();
    u.work = work.data();
    if (with_grad) u.grad = grad_w.data();
    std::vector<zd_stat_op> ops(ctx_.optimizer().tensor_stats());
    for (uint32_t i = 0; i < ops.size(); ++i) ops[i] = ctx_.optimizer().stat_op(i);
    parallel_pass(res_.workers, ctx_.optimizer(), u, with_grad, static_cast<uint32_t>(ops.size()), ops.data(), stats);
    master.done();
    for (uint32_t s = 0; s < slots; ++s) state[s].done();
    work.done();
    grad_w.done();
    exchange.done();
    return 0;
  }
  // The piece's memory updates it, writing the working copy in place where
  // the working copy is in that memory too or the host writes it.
  const Memory& work_mem = *b.working.segment_at(wbase).memory;
  // Host accumulators stay as read (GradReducer::update_zeroes).
  const bool zero_grad = with_grad && grads_.update_zeroes(pc.group);
  if (&work_mem == pc.memory || work_mem.host_writes()) {
    pc.memory->update(ctx_.optimizer(), u, zero_grad);
    return 0;
  }
  // The state is in host memory, the working copy on a device the host
  // cannot write: each chunk's new working copy is written into a slot of
  // the upload ring and uploaded from there while the next chunk is updated.
  const size_t wsz = dtype_size(g.dtype);
  if (!uploads_.lease) uploads_.lease.emplace(work_staging_);
  const uint64_t slot_bytes = uploads_.lease->size() / kUploadSlots;
  if (pc.count == 0) return uploads_.last;
  // Equal chunks of at most a slot: a piece a little over a slot goes as
  // two halves, not a slot and a sliver that leaves most workers idle
  // (each chunk is one pass of the workers, ended by a barrier).
  const uint64_t most = slot_bytes / wsz;
  const uint64_t parts = (pc.count + most - 1) / most;
  const uint64_t chunk = std::min(most, ((pc.count + parts - 1) / parts + 63) / 64 * 64);
  for (uint64_t off = 0; off < pc.count; off += chunk) {
    const uint64_t n = std::min(chunk, pc.count - off);
    const size_t k = uploads_.next;
    uploads_.next = (k + 1) % kUploadSlots;
    d.transfer_wait(uploads_.ticket[k]);  // the slot's last upload has read it
    std::byte* scratch = uploads_.lease->data() + k * slot_bytes;
    zd_optimizer_update c = update_slice(u, slots, off, n);
    void* on_device = c.work;
    c.work = scratch;
    parallel_update(res_.workers, ctx_.optimizer(), c, zero_grad);
    uploads_.ticket[k] = uploads_.last = d.upload(on_device, scratch, n * wsz);
  }
  return uploads_.last;
}

namespace {

// One operand of the update in a piece.
struct Operand {
  TieredBuffer* buf;
  uint64_t base;  // element of the buffer at piece element 0
  size_t esz;
  bool read;      // its old values are needed (master, state; not the working copy)
  bool staged;    // on NVMe in this piece
};

}  // namespace

// `grad` is the piece's own gradient (grad_of: it starts at pc.begin), so a
// tile's is at its offset inside the piece, not at its place in the group.
void OptimizerRunner::update_staged(const Piece& pc, std::byte* grad, const zd_optimizer_update& base,
                                    const PassArgs& a) {
  const bool with_grad = a.with_grad;
  const bool zero_grad = with_grad && grads_.update_zeroes(pc.group);  // host accumulators stay as read
  const uint32_t nstats = a.planned ? ctx_.optimizer().tensor_stats() : 0;
  std::vector<zd_stat_op> stat_ops(nstats);
  for (uint32_t i = 0; i < nstats; ++i) stat_ops[i] = ctx_.optimizer().stat_op(i);
  const std::vector<TensorSpan> spans = a.planned ? tensor_spans(pc.group) : std::vector<TensorSpan>{};
  std::vector<double> sub_stats(nstats);
  const uint32_t nscalars = ctx_.optimizer().tensor_scalars();
  // A planned pass over one staged tile: one call per tensor in it.
  auto planned_tile = [&](const zd_optimizer_update& u, uint64_t first) {
    for (const TensorSpan& t : spans) {
      const uint64_t lo = std::max(first, t.at), hi = std::min(first + u.count, t.at + t.count);
      if (lo >= hi) continue;
      zd_optimizer_update sub = update_slice(u, ctx_.optimizer().state_slots(), lo - first, hi - lo);
      HostWindow exchange;
      if (a.exchange) {
        const PassArgs::ExchangeAt x = a.exchange(pc.group, static_cast<zd_param_id>(t.tensor), lo);
        exchange = HostWindow(*x.buffer, x.at, hi - lo, 4, HostWindow::kReadWrite, "a staged pass's exchange buffer");
      }
      sub.exchange = exchange.f32();
      sub.tensor = nscalars && a.scalars ? a.scalars + static_cast<uint64_t>(t.tensor) * nscalars : nullptr;
      std::fill(sub_stats.begin(), sub_stats.end(), 0.0);
      parallel_pass(res_.workers, ctx_.optimizer(), sub, with_grad, nstats, stat_ops.data(), sub_stats.data());
      exchange.done();
      if (nstats && a.stats)
        combine_stats(a.stats->data() + static_cast<uint64_t>(t.tensor) * nstats, sub_stats.data(), nstats,
                      stat_ops.data());
    }
  };
  const ParamGroup& g = ctx_.registry.groups()[pc.group];
  GroupBuffers& b = buffers_.groups()[pc.group];
  const uint32_t slots = ctx_.optimizer().state_slots();
  const bool p3 = ctx_.params_partitioned();
  TierInstance& nvme = *res_.nvme;
  Device& d = *res_.device;
  const uint64_t align = nvme.alignment();
  const zd_dtype gdt = ctx_.grad_dtype(g);
  const size_t gsz = dtype_size(gdt);

  std::vector<Operand> ops;
  ops.push_back({&b.master, 0, 4, true, false});
  for (uint32_t s = 0; s < slots; ++s) ops.push_back({&b.state[s], 0, ctx_.state_size(), true, false});
  ops.push_back({&b.working, p3 ? 0 : ctx_.owned_begin(g, res_.rank), dtype_size(g.dtype), false, false});
  for (Operand& op : ops) op.staged = !op.buf->addressable(op.base + pc.begin, pc.count);
  const size_t work_k = ops.size() - 1;
  // A working copy in memory on a device the host cannot write goes through
  // host memory, tile by tile.
  const Operand& wop = ops[work_k];
  const bool work_via_host = !wop.staged && !wop.buf->segment_at(wop.base + pc.begin).memory->host_writes();

  // Staging: the B sets of one tile per operand reserved at finalize.
  const uint64_t T = ctx_.config.offload.nvme_tile_elems;
  auto& sets = staging_;
  const size_t B = sets.size();
  if (B < 3 || sets[0].size() != ops.size())
    fail(ZD_ERR_INTERNAL, "the NVMe staging buffers were not reserved at finalize");
  for (size_t k = 0; k < ops.size(); ++k)
    if (ops[k].staged && sets[0][k].size() < align_up(T * ops[k].esz, align))
      fail(ZD_ERR_INTERNAL, "an NVMe staging buffer is smaller than a tile");
  // The working copy's tile through the page-locked staging buffer where it
  // fits (it does at the default tile size), else through the host scratch
  // (pageable; the plan counts a tile of it: Placement::host_windows).
  std::optional<HostStaging::Lease> work_lease;
  HostScratch::Lease work_pageable;
  std::byte* work_scratch = nullptr;
  if (work_via_host) {
    release_upload_ring();  // the same page-locked buffer
    work_lease.emplace(work_staging_);
    if (work_lease->size() >= T * wop.esz) {
      work_scratch = work_lease->data();
    } else {
      work_lease.reset();
      work_pageable = res_.transfers.host_scratch().take(T * wop.esz, "an NVMe tile of the working copy");
      work_scratch = work_pageable.data();
    }
  }

  const uint64_t tiles = (pc.count + T - 1) / T;
  std::vector<uint64_t> reading(B, 0), writing(B, 0);  // tickets; 0 = none
  // When each set's transfer was submitted and its bytes, for the timeline.
  std::vector<int64_t> read_at(B, 0), write_at(B, 0);
  std::vector<uint64_t> read_bytes(B, 0), write_bytes(B, 0);
  const observe::RankProbe& probe = res_.probe;
  auto io_bytes = [](const std::vector<zd_tier_io>& ios) {
    uint64_t n = 0;
    for (const zd_tier_io& io : ios) n += io.bytes;
    return n;
  };
  // Waits for a set's transfer: the time blocked is the rank's NVMe wait.
  auto wait_io = [&](uint64_t& ticket, int64_t at, uint64_t bytes, bool write) {
    observe::EventArgs ev;
    ev.bytes = bytes;
    ev.flags = write ? observe::kFlagWrite : 0;
    {
      observe::Span s(probe, "nvme", write ? "wait for nvme write" : "wait for nvme read", ev,
                      &probe.counters().nvme_wait_ns);
      nvme.wait(ticket);
    }
    ticket = 0;
    observe::nvme_done(probe, write, bytes, at, observe::now_ns(), false);
  };
  // The transfers of one tile for the staged operands that need them.
  auto ios_for = [&](uint64_t j, bool write) {
    std::vector<zd_tier_io> ios;
    const uint64_t first = pc.begin + j * T, len = std::min(T, pc.count - j * T);
    for (size_t k = 0; k < ops.size(); ++k) {
      const Operand& op = ops[k];
      if (!op.staged || (!write && !op.read)) continue;
      const uint64_t e = op.base + first;
      const auto& seg = op.buf->segment_at(e);
      const uint64_t at = (e - seg.begin) * op.esz;
      const uint64_t bytes = std::min(align_up(len * op.esz, align), seg.bytes - at);
      ios.push_back({seg.offset + at, bytes, sets[j % B][k].data(), write ? 1 : 0, 0});
    }
    return ios;
  };
  auto start_read = [&](uint64_t j) {
    const size_t set = j % B;
    if (writing[set]) wait_io(writing[set], write_at[set], write_bytes[set], true);  // on disk before it is refilled
    auto ios = ios_for(j, false);
    read_at[set] = observe::now_ns();
    read_bytes[set] = io_bytes(ios);
    reading[set] = ios.empty() ? 0 : nvme.submit(ios.data(), static_cast<uint32_t>(ios.size()));
  };

  try {
    const uint64_t ahead = B - 2;  // tiles read ahead; the set before them is still being written
    uint64_t next = 0;
    for (uint64_t j = 0; j < tiles; ++j) {
      while (next < tiles && next <= j + ahead) start_read(next++);
      const size_t set = j % B;
      if (reading[set]) wait_io(reading[set], read_at[set], read_bytes[set], false);
      const uint64_t first = pc.begin + j * T, len = std::min(T, pc.count - j * T);
      auto ptr = [&](size_t k) -> std::byte* {
        const Operand& op = ops[k];
        if (op.staged) return sets[set][k].data();
        if (k == work_k && work_via_host) return work_scratch;
        return op.buf->addr(op.base + first);
      };
      zd_optimizer_update u = base;
      u.count = len;
      u.master = reinterpret_cast<float*>(ptr(0));
      u.grad = with_grad ? grad + (first - pc.begin) * gsz : nullptr;
      u.grad_dtype = gdt;
      u.work = ptr(work_k);
      u.work_dtype = g.dtype;
      for (uint32_t s = 0; s < slots; ++s) u.state[s] = reinterpret_cast<float*>(ptr(1 + s));
      if (a.planned)
        planned_tile(u, first);
      else
        parallel_update(res_.workers, ctx_.optimizer(), u, zero_grad);
      if (work_via_host) d.copy_to_device(wop.buf->addr(wop.base + first), work_scratch, len * wop.esz);
      auto ios = ios_for(j, true);
      write_at[set] = observe::now_ns();
      write_bytes[set] = io_bytes(ios);
      if (!ios.empty()) writing[set] = nvme.submit(ios.data(), static_cast<uint32_t>(ios.size()));
    }
    for (size_t s = 0; s < B; ++s)
      if (writing[s]) wait_io(writing[s], write_at[s], write_bytes[s], true);
  } catch (...) {
    // Nothing may still be in flight into buffers that are about to go.
    for (size_t s = 0; s < B; ++s) {
      try {
        if (reading[s]) nvme.wait(reading[s]);
        if (writing[s]) nvme.wait(writing[s]);
      } catch (...) {
      }
    }
    throw;
  }
}

}  // namespace zerod
