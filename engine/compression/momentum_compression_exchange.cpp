// MomentumCompression's EXCHANGE: the comm plugin's 1-bit compressed
// average with the error feedback kept here, the kept average (a sign bit
// per element and a scale per chunk) and the exchange buffers each segment
// is assembled in (momentum_compression.h, momentum_compression_internal.h).
#include "compression/momentum_compression_internal.h"

#include "error.h"
#include "observe/probe.h"
#include "compression/sign_kernels.h"
#include "checkpoint/state_io.h"
#include "runtime/workers.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

namespace zerod {

using namespace compression_detail;

namespace {

// The bytes of the kept signs of elements [e0, e0 + n) of a group (a bit
// each from bit e0), in a window: whole bytes, the ends shared with the
// neighbouring segments' bits.
HostWindow sign_bytes(const TieredBuffer& signs, uint64_t e0, uint64_t n, HostWindow::Access access) {
  const uint64_t b0 = e0 / 8, b1 = (e0 + n + 7) / 8;
  return HostWindow(signs, b0, b1 - b0, 1, access, "the kept signs");
}

struct CopySpan {
  void* dst;
  const void* src;
  uint64_t bytes;
};

// Copies the spans on the rank's workers, a MiB at a time: a fused group's
// copies to and from the exchange buffer are hundreds of megabytes a step,
// which one thread moves at a fraction of the memory's rate (about 9% of
// 1-bit LAMB's stage-0 step went to these copies on one thread).
void copy_on_workers(Workers& workers, const std::vector<CopySpan>& spans) {
  constexpr uint64_t kBytes = uint64_t{1} << 20;
  std::vector<std::pair<size_t, uint64_t>> tasks;  // (span, first byte)
  for (size_t i = 0; i < spans.size(); ++i)
    for (uint64_t at = 0; at < spans[i].bytes; at += kBytes) tasks.emplace_back(i, at);
  if (tasks.size() <= 1) {
    for (const CopySpan& c : spans) std::memcpy(c.dst, c.src, c.bytes);
    return;
  }
  workers.run(tasks.size(), [&](size_t t) {
    const CopySpan& c = spans[tasks[t].first];
    const uint64_t at = tasks[t].second;
    std::memcpy(static_cast<std::byte*>(c.dst) + at, static_cast<const std::byte*>(c.src) + at,
                std::min(kBytes, c.bytes - at));
  });
}

}  // namespace

void MomentumCompression::allocate_exchange_buffers() {
  const auto& groups = ctx_.registry.groups();
  const TierSet tiers = res_.tiers();
  std::array<uint64_t, ZD_TIER_COUNT> scratch{};
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const zd_tier tier = buffers_.groups()[gi].grad_tier();
    owned_.emplace_back();
    owned_.back().allocate(tiers, 4, {{exchange_count(ctx_, groups[gi]), tier}}, ZD_MEM_BUFFERS,
                           "the exchange buffer of group " + std::to_string(gi) + " of rank " +
                               std::to_string(res_.rank));
    const auto t = static_cast<size_t>(tier);
    scratch[t] = std::max(scratch[t], scratch_count(ctx_, gi, res_.rank));
  }
  for (size_t t = 0; t < scratch.size(); ++t)
    if (scratch[t] != 0)
      scratch_[t].allocate(tiers, 4, {{scratch[t], static_cast<zd_tier>(t)}}, ZD_MEM_BUFFERS,
                           "the packed exchange buffer of rank " + std::to_string(res_.rank));
}

TieredBuffer& MomentumCompression::scratch(size_t gi, uint64_t count) {
  const zd_tier tier = buffers_.groups()[gi].grad_tier();
  TieredBuffer& b = scratch_[static_cast<size_t>(tier)];
  if (b.count() < count) {
    // Allocated at finalize for the layouts the optimizer's plans exchange
    // in (scratch_count); a step whose plan uses another (a plugin whose
    // plans differ from those the plan read) grows it past the plan.
    const TierSet tiers = res_.tiers();
    b.release(tiers);
    b.allocate(tiers, 4, {{count, tier}}, ZD_MEM_BUFFERS, "the packed exchange buffer of a compressed step");
  }
  return b;
}

HostWindow MomentumCompression::segment_window(StepState& st, size_t gi, const Segment& s, HostWindow::Access access,
                                               bool* in_place) {
  const int64_t at = owned_whole(st, gi, s);
  *in_place = at >= 0;
  if (at >= 0)
    return HostWindow((*st.owned)[gi], static_cast<uint64_t>(at), s.count, 4, access, "the exchange buffer");
  return HostWindow(scratch(gi, s.count), 0, s.count, 4, access, "the packed exchange buffer");
}

std::vector<MomentumCompression::Segment> MomentumCompression::segments(size_t gi, bool fused) const {
  const ParamGroup& g = ctx_.registry.groups()[gi];
  const Group& c = groups_[gi];
  const auto world = static_cast<uint64_t>(ctx_.world_size);
  std::vector<Segment> out;
  if (fused) {
    Segment s;
    s.params = g.params;
    s.count = c.dense_count;
    s.tag = uint64_t{1} << 40;
    s.fused = true;
    out.push_back(std::move(s));
    return out;
  }
  uint64_t server_at = 0;
  for (size_t k = 0; k < g.params.size(); ++k) {
    const ParamRecord& p = ctx_.registry.param(g.params[k]);
    Segment s;
    s.params = {g.params[k]};
    s.dense = c.dense[k];
    s.count = static_cast<uint64_t>(p.numel);
    s.server_at = server_at;
    s.scales_at = k * world;
    s.tag = (uint64_t{1} << 40) | static_cast<uint64_t>(g.params[k]);
    server_at += compression_chunk(s.count, ctx_.world_size);
    out.push_back(std::move(s));
  }
  return out;
}

// The kept average, exactly: chunk r of the segment is its scale times the signs.
void MomentumCompression::fill_from_average(size_t gi, const Segment& s, float* x) const {
  const Group& c = groups_[gi];
  // The segment's bits from bit e0 of the window's first byte.
  const HostWindow bits_w = sign_bytes(c.signs, s.dense, s.count, HostWindow::kRead);
  const HostWindow scales_w(c.scales, s.scales_at, static_cast<uint64_t>(ctx_.world_size), 4, HostWindow::kRead,
                            "the kept average's scales");
  const auto* bits = reinterpret_cast<const uint8_t*>(bits_w.data());
  const uint64_t e0 = s.dense & 7;
  const float* scales = scales_w.f32();
  const uint64_t chunk = compression_chunk(s.count, ctx_.world_size);
  observe::Span span(res_.probe, "optimizer", "rebuild average");
  // In tiles on the rank's workers, a chunk (one scale) at a time within each.
  const uint64_t tiles = (s.count + kTile - 1) / kTile;
  res_.workers.run(tiles, [&](size_t t) {
    const uint64_t lo = t * kTile, hi = std::min(s.count, lo + kTile);
    for (uint64_t a = lo; a < hi;) {
      const uint64_t r = a / chunk, z = std::min(hi, (r + 1) * chunk);
      unpack_signs(bits, e0 + a, scales[r], x + a, z - a);
      a = z;
    }
  });
}

void MomentumCompression::exchange(size_t gi, const Segment& s, float* x, bool keep) {
  Group& c = groups_[gi];
  const int rank = res_.rank;
  const std::string what = "step: compressed all-reduce of the exchange buffer";
  // The error feedback where the comm plugin reaches it (x is the host's).
  HostWindow we(c.worker_error, s.dense, s.count, 4, HostWindow::kReadWrite, "the worker error feedback");
  HostWindow se(c.server_error, s.server_at, compression_chunk(s.count, ctx_.world_size), 4, HostWindow::kReadWrite,
                "the server error feedback");
  ctx_.run(*res_.stream, [&] {
    ctx_.comm().compressed_all_reduce(ctx_.comm_call(rank, comm_tag(CommOp::StepReduce, gi, s.tag), what), x, s.count,
                                      we.f32(), se.f32());
  });
  we.done();
  se.done();
  // What the error feedback holds now, for checkpoints (error_spans).
  errors_live_ = true;
  c.errors_fused = s.fused;
  if (!keep) return;
  // Keep the average as it is: a sign bit per element, a scale per chunk.
  observe::Span span(res_.probe, "optimizer", "keep average");
  const auto world = static_cast<uint64_t>(ctx_.world_size);
  const uint64_t chunk = compression_chunk(s.count, ctx_.world_size);
  // The end bytes are shared with the neighbouring segments' bits, which
  // keep their values: read as well as written.
  HostWindow bits_w = sign_bytes(c.signs, s.dense, s.count, HostWindow::kReadWrite);
  HostWindow scales_w(c.scales, s.scales_at, world, 4, HostWindow::kWrite, "the kept average's scales");
  auto* bits = reinterpret_cast<uint8_t*>(bits_w.data());
  const uint64_t e0 = s.dense & 7;
  float* scales = scales_w.f32();
  for (uint64_t r = 0; r < world; ++r) {
    const uint64_t lo = r * chunk;
    scales[r] = lo < s.count ? std::fabs(x[lo]) : 0.0f;
  }
  // In tiles on the rank's workers; every boundary between tiles falls on a
  // whole byte of bits, so no two tiles write the same byte.
  const uint64_t head = std::min(s.count, (8 - (s.dense & 7)) & 7);
  const uint64_t tiles = 1 + (s.count - head + kTile - 1) / kTile;
  res_.workers.run(tiles, [&](size_t t) {
    const uint64_t lo = t == 0 ? 0 : head + (t - 1) * kTile;
    const uint64_t hi = std::min(s.count, head + t * kTile);
    if (lo < hi) pack_signs(x + lo, hi - lo, bits, e0 + lo);
  });
  bits_w.done();
  scales_w.done();
}

// The segment's values of the elements this rank owns into the owned
// exchange buffer, and back, through host windows over the buffer's spans
// (each a tensor's part, in its one memory segment).
void MomentumCompression::scatter_owned(StepState& st, size_t gi, const Segment& s, const float* x) const {
  std::vector<CopySpan> spans;
  std::vector<HostWindow> to;
  for (const auto& [from, at] : owned_parts(gi, s)) {
    to.emplace_back((*st.owned)[gi], at.at, at.count, 4, HostWindow::kWrite, "the exchange buffer");
    spans.push_back({to.back().data(), x + from, at.count * 4});
  }
  copy_on_workers(res_.workers, spans);
  for (HostWindow& w : to) w.done();
}

void MomentumCompression::gather_owned(StepState& st, size_t gi, const Segment& s, float* x) const {
  std::vector<CopySpan> spans;
  std::vector<HostWindow> from_w;
  for (const auto& [from, at] : owned_parts(gi, s)) {
    from_w.emplace_back((*st.owned)[gi], at.at, at.count, 4, HostWindow::kRead, "the exchange buffer");
    spans.push_back({x + from, from_w.back().data(), at.count * 4});
  }
  copy_on_workers(res_.workers, spans);
}

// Where the segment's tensor j starts in it: a one-tensor segment is that
// tensor; the fused segment is the group's tensors, in order.
uint64_t MomentumCompression::in_segment(const Group& c, const Segment& s, size_t j) {
  return s.params.size() == 1 ? 0 : c.dense[j] - s.dense;
}

// Where each of the segment's tensors has elements this rank owns: their
// first element in the segment and their span in the owned buffer.
std::vector<std::pair<uint64_t, ModelContext::OwnedSpan>> MomentumCompression::owned_parts(size_t gi,
                                                                                        const Segment& s) const {
  const Group& c = groups_[gi];
  std::vector<std::pair<uint64_t, ModelContext::OwnedSpan>> out;
  for (size_t j = 0; j < s.params.size(); ++j) {
    const ModelContext::OwnedSpan sp = ctx_.owned_span(ctx_.registry.param(s.params[j]), res_.rank);
    if (sp.count == 0) continue;
    out.emplace_back(in_segment(c, s, j) + sp.from, sp);
  }
  return out;
}

// Where a segment can be prepared and exchanged in place: the owned
// exchange buffer, when the rank owns each of the segment's tensors whole
// and they lie there in the segment's packed order, with nothing between
// them, in one memory segment; else nullptr (a scratch copy, then
// scatter_owned). Where the rank owns every element (stage 0) the buffer is
// in packed order (exchange_count), so every segment is in place, a fused
// group's too; at stages 1-3 a tensor held whole by one owner can be.
int64_t MomentumCompression::owned_whole(StepState& st, size_t gi, const Segment& s) const {
  if (st.owned == nullptr || s.count == 0 || s.params.empty()) return -1;
  const Group& c = groups_[gi];
  if (owns_all()) {
    if (!(*st.owned)[gi].in_one_segment(s.dense, s.count))
      fail(ZD_ERR_INTERNAL, "the packed exchange buffer is not one piece of memory");
    return static_cast<int64_t>(s.dense);
  }
  // The same answer as the plan's (scratch_count), which sized the scratch buffer.
  std::vector<uint64_t> at;
  at.reserve(s.params.size());
  for (size_t j = 0; j < s.params.size(); ++j) at.push_back(in_segment(c, s, j));
  const int64_t base = owned_piece(ctx_, res_.rank, ctx_.registry.groups()[gi], s.params, at, s.count);
  return base >= 0 && (*st.owned)[gi].in_one_segment(static_cast<uint64_t>(base), s.count) ? base : -1;
}

// The segment's whole values of a state slot into x: on the workers where
// the rank holds every tensor whole in memory (stage 0), else tensor by
// tensor from the owners (read_whole_into).
void MomentumCompression::read_slot(size_t gi, const Segment& s, int slot, float* x) {
  const Group& c = groups_[gi];
  std::vector<CopySpan> spans;
  std::vector<HostWindow> from_w;
  bool direct = owns_all();
  for (size_t j = 0; j < s.params.size() && direct; ++j) {
    const ParamRecord& p = ctx_.registry.param(s.params[j]);
    const TieredBuffer& b = buffers_.of(p).state[static_cast<size_t>(slot)];
    // Where the rank's state of p starts, in the layout of its stage (by
    // full offset, or by flat offset and stride where parameters are
    // partitioned and one rank owns them all).
    const ModelContext::OwnedSpan sp = ctx_.owned_span(p, res_.rank);
    const auto n = static_cast<uint64_t>(p.numel);
    if (n == 0) continue;
    direct = sp.from == 0 && sp.count == n && b.in_one_segment(sp.at, n);
    if (!direct) break;
    from_w.emplace_back(b, sp.at, n, 4, HostWindow::kRead, "a state slot");
    spans.push_back({x + in_segment(c, s, j), from_w.back().data(), n * 4});
  }
  if (direct) {
    copy_on_workers(res_.workers, spans);
    return;
  }
  for (size_t j = 0; j < s.params.size(); ++j)
    read_whole_into(ctx_, res_, buffers_, s.params[j], slot, "step", x + in_segment(c, s, j));
}

// The exchange buffer's values of tensor pid from element `at` of the
// rank's owned range: at the same place in the owned layout, or, where the
// buffer is in packed order (owns_all), at the tensor's packed offset.
OptimizerRunner::PassArgs::ExchangeAt MomentumCompression::exchange_of(const StepState& st, size_t gi,
                                                                       zd_param_id pid, uint64_t at) const {
  const TieredBuffer& b = (*st.owned)[gi];
  if (!owns_all()) return {&b, at};
  const ModelContext::OwnedSpan sp = ctx_.owned_span(ctx_.registry.param(pid), res_.rank);
  return {&b, packed_at_[static_cast<size_t>(pid)] + (at - sp.at)};
}

// An EXCHANGE of what a pass wrote: the rank owns every element (checked
// by the caller), so the owned buffer is the whole of each tensor.
void MomentumCompression::exchange_in_place(StepState& st) {
  // The buffer takes what a pass wrote, not an average a prepare starts from.
  for (Group& c : groups_) c.average_in_buffer = false;
  if (ctx_.world_size == 1) return;
  const auto& groups = ctx_.registry.groups();
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    for (const Segment& s : segments(gi, st.plan.fused != 0)) {
      // What a pass wrote is exchanged in place, or gathered into the
      // scratch buffer and scattered back.
      bool direct = false;
      HostWindow xw = segment_window(st, gi, s, HostWindow::kReadWrite, &direct);
      float* const x = xw.f32();
      if (!direct) gather_owned(st, gi, s, x);
      exchange(gi, s, x, st.plan.keep_average != 0 && keeps());
      if (!direct) scatter_owned(st, gi, s, x);
      xw.done();
    }
    if (st.plan.keep_average && keeps()) groups_[gi].have_average = true;
  }
}

}  // namespace zerod
