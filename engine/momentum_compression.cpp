#include "momentum_compression.h"

#include "align.h"
#include "dtype.h"
#include "error.h"
#include "log.h"
#include "observe/probe.h"
#include "state_io.h"
#include "workers.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace zerod {

uint64_t compression_chunk(uint64_t count, int world) {
  const auto w = static_cast<uint64_t>(world);
  return ((count + w - 1) / w + 7) / 8 * 8;
}

// Per group the buffers hold every tensor's part in the group's packed order
// (registration order, no gaps): worker errors and sign bits at the
// tensor's packed offset, server error chunks and scales one tensor after
// another. A fused exchange packs the whole group as one buffer and uses
// the first chunk and the first world scales.
namespace {

uint64_t packed_count(const Registry& reg, const ParamGroup& g) {
  uint64_t n = 0;
  for (zd_param_id pid : g.params) n += static_cast<uint64_t>(reg.param(pid).numel);
  return n;
}

// The owned exchange buffer's length: where the rank owns every element
// (stage 0, or one rank) it holds the group in its packed order, with none
// of the registry's padding between tensors, so a fused group is one piece
// of it whatever the tensors' sizes; else the owned range's layout.
bool owns_every_element(const ModelContext& ctx) {
  return ctx.world_size == 1 || !ctx.partitioned(ZD_PARTITION_OPTIMIZER);
}

uint64_t exchange_count(const ModelContext& ctx, const ParamGroup& g) {
  return owns_every_element(ctx) ? packed_count(ctx.registry, g) : ctx.owned_count(g);
}

uint64_t server_elems(const Registry& reg, const ParamGroup& g, int world) {
  uint64_t n = 0;
  for (zd_param_id pid : g.params) n += compression_chunk(static_cast<uint64_t>(reg.param(pid).numel), world);
  return std::max(n, compression_chunk(packed_count(reg, g), world));
}

bool sign_bit(const uint8_t* bits, uint64_t e) { return (bits[e >> 3] >> (e & 7)) & 1; }

// The address of [at, at + n) where it lies in one memory segment of b
// (so one pointer covers it), else nullptr.
float* in_one_segment(const TieredBuffer& b, uint64_t at, uint64_t n) {
  if (!b.addressable(at, n)) return nullptr;
  const auto& seg = b.segment_at(at);
  if (at + n > seg.begin + seg.count) return nullptr;
  return reinterpret_cast<float*>(b.addr(at));
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

// x[i] = +sc where bit e0 + i is set, -sc where not, for i < n: a byte of
// signs at a time between the unaligned ends. With SSE2 (every x86-64) a
// byte becomes 8 floats in two stores: a clear bit flips sc's sign bit,
// which is -sc exactly (the plain loop took 4-5x as long on 25M elements,
// twice per compressed step at stages 1-3).
void unpack_signs(const uint8_t* bits, uint64_t e0, float sc, float* x, uint64_t n) {
  uint64_t i = 0;
  for (; i < n && ((e0 + i) & 7) != 0; ++i) x[i] = sign_bit(bits, e0 + i) ? sc : -sc;
#if defined(__SSE2__)
  const __m128i lo = _mm_setr_epi32(1, 2, 4, 8), hi = _mm_setr_epi32(16, 32, 64, 128);
  const __m128i sign = _mm_set1_epi32(INT32_MIN);
  const __m128 s = _mm_set1_ps(sc);
  for (; i + 8 <= n; i += 8) {
    const __m128i b = _mm_set1_epi32(bits[(e0 + i) >> 3]);
    const __m128i f0 = _mm_and_si128(_mm_cmpeq_epi32(_mm_and_si128(b, lo), _mm_setzero_si128()), sign);
    const __m128i f1 = _mm_and_si128(_mm_cmpeq_epi32(_mm_and_si128(b, hi), _mm_setzero_si128()), sign);
    _mm_storeu_ps(x + i, _mm_xor_ps(s, _mm_castsi128_ps(f0)));
    _mm_storeu_ps(x + i + 4, _mm_xor_ps(s, _mm_castsi128_ps(f1)));
  }
#endif
  for (; i + 8 <= n; i += 8) {
    const unsigned b = bits[(e0 + i) >> 3];
    for (unsigned j = 0; j < 8; ++j) x[i + j] = (b >> j) & 1u ? sc : -sc;
  }
  for (; i < n; ++i) x[i] = sign_bit(bits, e0 + i) ? sc : -sc;
}

// Bit e0 + i set where x[i] has no sign bit, cleared where it has, for
// i < n: whole bytes are written, the unaligned ends bit by bit (they may
// share a byte with the next tensor's bits).
void pack_signs(const float* x, uint64_t n, uint8_t* bits, uint64_t e0) {
  auto one = [&](uint64_t i) {
    const uint64_t e = e0 + i;
    const auto bit = static_cast<uint8_t>(1u << (e & 7));
    bits[e >> 3] = std::signbit(x[i]) ? static_cast<uint8_t>(bits[e >> 3] & ~bit)
                                      : static_cast<uint8_t>(bits[e >> 3] | bit);
  };
  uint64_t i = 0;
  for (; i < n && ((e0 + i) & 7) != 0; ++i) one(i);
#if defined(__SSE2__)
  // movmskps: the sign bits of 4 floats at once (a set bit is a clear one here).
  for (; i + 8 <= n; i += 8) {
    const int neg = _mm_movemask_ps(_mm_loadu_ps(x + i)) | (_mm_movemask_ps(_mm_loadu_ps(x + i + 4)) << 4);
    bits[(e0 + i) >> 3] = static_cast<uint8_t>(~neg);
  }
#endif
  for (; i + 8 <= n; i += 8) {
    unsigned b = 0;
    for (unsigned j = 0; j < 8; ++j) b |= (std::signbit(x[i + j]) ? 0u : 1u) << j;
    bits[(e0 + i) >> 3] = static_cast<uint8_t>(b);
  }
  for (; i < n; ++i) one(i);
}

}  // namespace

CompressionBytes compression_bytes(const ModelContext& ctx, size_t group) {
  CompressionBytes b;
  if (!ctx.optimizer().compresses()) return b;
  const ParamGroup& g = ctx.registry.groups()[group];
  if (ctx.partitioned(ZD_PARTITION_GRADS)) b.grads = g.full_numel * dtype_size(ctx.grad_dtype(g));
  b.buffers = exchange_count(ctx, g) * 4;
  if (ctx.world_size > 1) {
    const uint64_t n = packed_count(ctx.registry, g);
    b.optimizer = {n * 4, server_elems(ctx.registry, g, ctx.world_size) * 4};
    // The kept average, where the momentum is partitioned (stage 0 reads the slot).
    if (ctx.partitioned(ZD_PARTITION_OPTIMIZER))
      b.optimizer.insert(b.optimizer.end(), {(n + 7) / 8, g.params.size() * static_cast<uint64_t>(ctx.world_size) * 4});
    // compression.replay: a whole copy of each slot a replayed step reads
    // (1-bit Adam: its variance; 0/1 Adam: m and v, replay_slots() says why;
    // 1-bit LAMB: m and v).
    if (ctx.config.compression_replay) {
      for (uint32_t k = std::popcount(replay_slots(ctx.optimizer())); k > 0; --k) b.optimizer.push_back(g.full_numel * 4);
      // Stage 3: and of the parameters, which forward and backward copy.
      if (ctx.params_partitioned()) b.params = g.full_numel * 4;
    }
  }
  return b;
}

uint32_t replay_slots(const OptimizerInstance& opt) {
  // What the run's compressed steps replay: those of a step long after
  // every warm-up, and those of a compressed step at the start (the first
  // step, told it is no warm-up step). They can differ: 0/1 Adam's 1-bit
  // gradient steps before its variance freezes replay m and v, its momentum
  // syncs after it only v. The replicas of both are allocated as the steps
  // come (m's given back once the syncs begin), so the plan's peak counts
  // both. A plugin that never replays answers 0 in both.
  constexpr int64_t kLateStep = int64_t{1} << 50;
  if (!opt.compresses()) return 0;
  return opt.plan(kLateStep, -1, -1).replay_slots | opt.plan(1, 0, -1).replay_slots;
}

std::string compression_replay_refusal(const OptimizerInstance& opt, uint32_t partitions, zd_dtype precision) {
  if (!opt.compresses()) return "optimizer '" + opt.plugin().name() + "' never compresses; nothing to replay";
  if (replay_slots(opt) == 0)
    return "optimizer '" + opt.plugin().name() + "' plans no compressed step that another rank can replay (its " +
           "update of an element needs more than the exchanged values, that element's state and the per-tensor "
           "scalars), so its compressed steps all-gather the working copies; leave replay out";
  if ((partitions & ZD_PARTITION_OPTIMIZER) == 0)
    return "replays what stages 1-3 all-gather after a step or in forward and backward; at stage 0 every rank "
           "updates every element already (zero.stage = 1, 2 or 3)";
  if (precision != ZD_DTYPE_F32)
    return "needs fp32 working copies (precision = \"fp32\"): a 16-bit working copy is rounded from an fp32 master "
           "that only its owner holds, so no other rank can replay it bit for bit";
  return "";
}

void check_compression_support(const ModelContext& ctx) {
  const OptimizerInstance& opt = ctx.optimizer();
  opt.check_partitions(ctx.partitions);
  if (ctx.config.compression_replay) {
    const std::string why = compression_replay_refusal(opt, ctx.partitions, ctx.config.precision);
    if (!why.empty()) fail(ZD_ERR_CONFIG, "compression.replay: " + why);
  }
  if (opt.compresses() && ctx.world_size > 1 && !ctx.comm().has_compression())
    fail(ZD_ERR_CONFIG, "optimizer '" + opt.plugin().name() +
                            "' averages what the ranks exchange with 1-bit compression, which needs a comm plugin "
                            "with compressed all-reduce (plugin ABI version 2); '" +
                            ctx.comm().plugin().name() + "' offers version 1");
}

// ---------------------------------------------------------------------------

struct MomentumCompression::StepState {
  const zd_optimizer_plan& plan;
  double grad_scale;
  double lr;
  int64_t t;
  std::vector<TieredBuffer>* owned = nullptr;  // the exchange buffers (owned_) when the plan exchanges
  std::vector<double> stats;        // per tensor, from the last pass
  bool have_stats = false;
  uint32_t pass = 0;
  bool consumed = false;  // the local gradients were read (and zeroed)
  bool replay = false;    // the step is replayed over the elements other ranks own
};

void MomentumCompression::allocate_owned() {
  const auto& groups = ctx_.registry.groups();
  const TierSet tiers = res_.tiers();
  try {
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      owned_.emplace_back();
      owned_.back().allocate(tiers, 4, {{exchange_count(ctx_, groups[gi]), buffers_.groups()[gi].grad_tier()}},
                             ZD_MEM_BUFFERS, "the exchange buffer of a compressed step");
    }
  } catch (...) {
    for (TieredBuffer& b : owned_) b.release(tiers);
    owned_.clear();
    throw;
  }
}

float* MomentumCompression::scratch(size_t gi, uint64_t count) {
  if (scratch_.empty() || scratch_.count() < count) {
    const TierSet tiers = res_.tiers();
    scratch_.release(tiers);
    scratch_.allocate(tiers, 4, {{count, buffers_.groups()[gi].grad_tier()}}, ZD_MEM_BUFFERS,
                      "the packed exchange buffer of a compressed step");
  }
  return reinterpret_cast<float*>(scratch_.addr(0));
}

void MomentumCompression::forget_average() {
  for (Group& c : groups_) c.have_average = c.average_in_buffer = false;
  replica_valid_ = 0;
  params_valid_ = false;
}

bool MomentumCompression::keeps() const { return ctx_.world_size > 1 && !owns_all(); }

bool MomentumCompression::owns_all() const { return owns_every_element(ctx_); }

void MomentumCompression::lay_out_groups() {
  const auto& groups = ctx_.registry.groups();
  groups_.clear();
  groups_.resize(groups.size());
  packed_at_.assign(ctx_.registry.params().size(), 0);
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    Group& c = groups_[gi];
    for (zd_param_id pid : groups[gi].params) {
      c.dense.push_back(c.dense_count);
      packed_at_[static_cast<size_t>(pid)] = c.dense_count;
      c.dense_count += static_cast<uint64_t>(ctx_.registry.param(pid).numel);
    }
  }
  scalars_.assign(ctx_.registry.params().size() * ctx_.optimizer().tensor_scalars(), 0.0f);
}

void MomentumCompression::allocate() {
  lay_out_groups();
  if (!ctx_.optimizer().compresses() || ctx_.world_size == 1) return;
  const auto& groups = ctx_.registry.groups();
  const TierSet tiers = res_.tiers();
  const auto world = static_cast<uint64_t>(ctx_.world_size);
  try {
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      const ParamGroup& g = groups[gi];
      Group& c = groups_[gi];
      const zd_tier tier = buffers_.groups()[gi].grad_tier();
      const std::string of = " of group " + std::to_string(gi) + " of rank " + std::to_string(res_.rank);
      c.worker_error.allocate(tiers, 4, {{c.dense_count, tier}}, ZD_MEM_OPTIMIZER, "the worker error feedback" + of);
      c.server_error.allocate(tiers, 4, {{server_elems(ctx_.registry, g, ctx_.world_size), tier}}, ZD_MEM_OPTIMIZER,
                              "the server error feedback" + of);
      if (!keeps()) continue;
      c.signs.allocate(tiers, 1, {{(c.dense_count + 7) / 8, tier}}, ZD_MEM_OPTIMIZER,
                       "the kept compressed average" + of);
      c.scales.allocate(tiers, 4, {{g.params.size() * world, tier}}, ZD_MEM_OPTIMIZER,
                        "the kept compressed average's scales" + of);
    }
  } catch (...) {
    release();
    throw;
  }
}

void MomentumCompression::release() {
  const TierSet tiers = res_.tiers();
  for (Group& c : groups_) {
    for (TieredBuffer* b : {&c.worker_error, &c.server_error, &c.signs, &c.scales}) b->release(tiers);
    for (TieredBuffer& b : c.replica) b.release(tiers);
    c.params.release(tiers);
  }
  replica_valid_ = 0;
  params_valid_ = false;
  for (TieredBuffer& b : owned_) b.release(tiers);
  owned_.clear();
  scratch_.release(tiers);
  groups_.clear();
  packed_at_.clear();
  scalars_.clear();
}

void MomentumCompression::reset() {
  for (Group& c : groups_) {
    for (TieredBuffer* b : {&c.worker_error, &c.server_error})
      if (!b->empty()) std::memset(b->addr(0), 0, b->count() * 4);
    c.have_average = c.average_in_buffer = false;
  }
  replica_valid_ = 0;
  params_valid_ = false;
  std::fill(scalars_.begin(), scalars_.end(), 0.0f);
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
  const auto* bits = reinterpret_cast<const uint8_t*>(c.signs.addr(0));
  const auto* scales = reinterpret_cast<const float*>(c.scales.addr(0)) + s.scales_at;
  const uint64_t chunk = compression_chunk(s.count, ctx_.world_size);
  observe::Span span(res_.probe, "optimizer", "rebuild average");
  // In tiles on the rank's workers, a chunk (one scale) at a time within each.
  const uint64_t tiles = (s.count + kTile - 1) / kTile;
  res_.workers.run(tiles, [&](size_t t) {
    const uint64_t lo = t * kTile, hi = std::min(s.count, lo + kTile);
    for (uint64_t a = lo; a < hi;) {
      const uint64_t r = a / chunk, z = std::min(hi, (r + 1) * chunk);
      unpack_signs(bits, s.dense + a, scales[r], x + a, z - a);
      a = z;
    }
  });
}

void MomentumCompression::exchange(size_t gi, const Segment& s, float* x, bool keep) {
  Group& c = groups_[gi];
  const int rank = res_.rank;
  const std::string what = "step: compressed all-reduce of the exchange buffer";
  float* we = reinterpret_cast<float*>(c.worker_error.addr(0)) + s.dense;
  float* se = reinterpret_cast<float*>(c.server_error.addr(0)) + s.server_at;
  ctx_.run(*res_.stream, [&] {
    ctx_.comm().compressed_all_reduce(ctx_.comm_call(rank, comm_tag(CommOp::StepReduce, gi, s.tag), what), x, s.count,
                                      we, se);
  });
  if (!keep) return;
  // Keep the average as it is: a sign bit per element, a scale per chunk.
  observe::Span span(res_.probe, "optimizer", "keep average");
  const auto world = static_cast<uint64_t>(ctx_.world_size);
  const uint64_t chunk = compression_chunk(s.count, ctx_.world_size);
  auto* bits = reinterpret_cast<uint8_t*>(c.signs.addr(0));
  auto* scales = reinterpret_cast<float*>(c.scales.addr(0)) + s.scales_at;
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
    if (lo < hi) pack_signs(x + lo, hi - lo, bits, s.dense + lo);
  });
}

// The segment's values of the elements this rank owns into the owned
// exchange buffer, and back.
void MomentumCompression::scatter_owned(StepState& st, size_t gi, const Segment& s, const float* x) const {
  std::vector<CopySpan> spans;
  for (const auto& [from, at] : owned_parts(gi, s)) spans.push_back({(*st.owned)[gi].addr(at.at), x + from, at.count * 4});
  copy_on_workers(res_.workers, spans);
}

void MomentumCompression::gather_owned(StepState& st, size_t gi, const Segment& s, float* x) const {
  std::vector<CopySpan> spans;
  for (const auto& [from, at] : owned_parts(gi, s)) spans.push_back({x + from, (*st.owned)[gi].addr(at.at), at.count * 4});
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
float* MomentumCompression::owned_whole(StepState& st, size_t gi, const Segment& s) const {
  if (st.owned == nullptr || s.count == 0 || s.params.empty()) return nullptr;
  const Group& c = groups_[gi];
  if (owns_all()) {
    float* const x = in_one_segment((*st.owned)[gi], s.dense, s.count);
    if (x == nullptr) fail(ZD_ERR_INTERNAL, "the packed exchange buffer is not one piece of memory");
    return x;
  }
  uint64_t base = 0;
  bool found = false;
  for (size_t j = 0; j < s.params.size(); ++j) {
    const ParamRecord& p = ctx_.registry.param(s.params[j]);
    if (p.numel == 0) continue;  // nowhere in either layout
    const ModelContext::OwnedSpan sp = ctx_.owned_span(p, res_.rank);
    if (sp.from != 0 || sp.count != static_cast<uint64_t>(p.numel)) return nullptr;
    const uint64_t off = in_segment(c, s, j);
    if (sp.at < off) return nullptr;
    if (!found) {
      base = sp.at - off;
      found = true;
    } else if (sp.at - off != base) {
      return nullptr;
    }
  }
  return in_one_segment((*st.owned)[gi], base, s.count);
}

// The segment's whole values of a state slot into x: on the workers where
// the rank holds every tensor whole in memory (stage 0), else tensor by
// tensor from the owners (read_whole_into).
void MomentumCompression::read_slot(size_t gi, const Segment& s, int slot, float* x) {
  const Group& c = groups_[gi];
  std::vector<CopySpan> spans;
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
    const float* src = sp.from == 0 && sp.count == n ? in_one_segment(b, sp.at, n) : nullptr;
    direct = src != nullptr;
    if (direct) spans.push_back({x + in_segment(c, s, j), src, n * 4});
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
float* MomentumCompression::exchange_of(const StepState& st, size_t gi, zd_param_id pid, uint64_t at) const {
  const TieredBuffer& b = (*st.owned)[gi];
  if (!owns_all()) return reinterpret_cast<float*>(b.addr(at));
  const ModelContext::OwnedSpan sp = ctx_.owned_span(ctx_.registry.param(pid), res_.rank);
  return reinterpret_cast<float*>(b.addr(packed_at_[static_cast<size_t>(pid)] + (at - sp.at)));
}

// What every update call of this step says of tensor pid: the types, the
// step's scale, lr and number, the plan's kind, the pass, and the tensor's
// scalars.
zd_optimizer_update MomentumCompression::step_update(const StepState& st, const ParamGroup& g, zd_param_id pid,
                                                     uint32_t pass) {
  const uint32_t k = ctx_.optimizer().tensor_scalars();
  zd_optimizer_update u{};
  u.struct_size = sizeof u;
  u.grad_dtype = ctx_.grad_dtype(g);
  u.work_dtype = g.dtype;
  u.grad_scale = st.grad_scale;
  u.lr = st.lr;
  u.step = st.t;
  u.kind = st.plan.kind;
  u.pass = pass;
  u.tensor = k ? scalars_.data() + static_cast<uint64_t>(pid) * k : nullptr;
  return u;
}

// PREPARE (and the EXCHANGE after it), segment by segment: only one
// segment's whole values are held at a time.
void MomentumCompression::prepare(StepState& st, bool then_exchange) {
  const auto& groups = ctx_.registry.groups();
  const zd_optimizer_plan& plan = st.plan;
  const bool several = ctx_.world_size > 1;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const ParamGroup& g = groups[gi];
    Group& c = groups_[gi];
    const OwnedGrad local = grads_.local_grad(gi);
    const size_t gsz = dtype_size(ctx_.grad_dtype(g));
    const bool held = plan.keep_average && c.average_in_buffer;
    const int32_t in = !plan.keep_average                    ? ZD_EXCHANGE_IN_ZERO
                       : (keeps() && c.have_average) || held ? ZD_EXCHANGE_IN_AVERAGE
                                                             : ZD_EXCHANGE_IN_SLOT;
    c.average_in_buffer = false;
    // A replayed step of a model exchanged as one segment (one group,
    // fused: 1-bit LAMB's) leaves the whole average in the scratch buffer,
    // which nothing else uses before the next step: it stays there, as
    // stage 0's stays in its exchange buffer, instead of being packed to
    // bits and rebuilt from them (the same values: the exchange's average
    // is a scale per chunk times the signs). Anything that moves the state
    // on clears average_in_buffer (run, forget_average, reset).
    const bool one_segment = st.replay && then_exchange && plan.keep_average && plan.fused != 0 && groups.size() == 1;
    bool in_scratch = false;
    for (const Segment& s : segments(gi, plan.fused != 0)) {
      // Every element is written below unless the plan starts from zero.
      float* const direct = owned_whole(st, gi, s);
      float* const xs = direct != nullptr ? direct : scratch(gi, s.count);
      in_scratch = one_segment && direct == nullptr;
      if (in == ZD_EXCHANGE_IN_ZERO) {
        std::memset(xs, 0, s.count * 4);
      } else if (held) {
        // In the buffer already (owns_all: every segment is in place).
      } else if (in == ZD_EXCHANGE_IN_AVERAGE) {
        fill_from_average(gi, s, xs);
      } else if (in == ZD_EXCHANGE_IN_SLOT) {
        read_slot(gi, s, static_cast<int>(ctx_.optimizer().average_slot()), xs);
      }
      for (zd_param_id pid : s.params) {
        const ParamRecord& p = ctx_.registry.param(pid);
        zd_optimizer_update u = step_update(st, g, pid, 0);
        u.count = static_cast<uint64_t>(p.numel);
        u.grad = local.data + p.full_offset * gsz;
        u.exchange = xs + (packed_at_[static_cast<size_t>(pid)] - s.dense);
        u.exchange_in = in;
        parallel_prepare(res_.workers, ctx_.optimizer(), u);
      }
      if (then_exchange && several) exchange(gi, s, xs, plan.keep_average != 0 && keeps() && !in_scratch);
      if (then_exchange && st.replay) replay(st, gi, s, xs, 1);
      if (direct == nullptr) scatter_owned(st, gi, s, xs);
    }
    // The kept bits are current unless the average stayed in the scratch.
    if (then_exchange && plan.keep_average && keeps()) c.have_average = !in_scratch;
    c.average_in_buffer = then_exchange && plan.keep_average && (owns_all() || in_scratch);
  }
  st.consumed = true;
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
      float* const direct = owned_whole(st, gi, s);
      float* const x = direct != nullptr ? direct : scratch(gi, s.count);
      if (direct == nullptr) gather_owned(st, gi, s, x);
      exchange(gi, s, x, st.plan.keep_average != 0 && keeps());
      if (direct == nullptr) scatter_owned(st, gi, s, x);
    }
    if (st.plan.keep_average && keeps()) groups_[gi].have_average = true;
  }
}

void MomentumCompression::tensor_step(StepState& st, zd_plan_op op) {
  const OptimizerInstance& opt = ctx_.optimizer();
  if (opt.tensor_scalars() == 0 && opt.tensor_stats() == 0) return;
  const auto& params = ctx_.registry.params();
  std::vector<uint64_t> numel;
  numel.reserve(params.size());
  for (const ParamRecord& p : params) numel.push_back(static_cast<uint64_t>(p.numel));
  zd_tensor_step s{};
  s.struct_size = sizeof s;
  s.kind = st.plan.kind;
  s.op = op;
  s.pass = op == ZD_OP_PASS || op == ZD_OP_PASS_GRAD ? st.pass : 0;
  s.step = st.t;
  s.lr = st.lr;
  s.tensors = params.size();
  s.numel = numel.data();
  s.stats = st.have_stats ? st.stats.data() : nullptr;
  s.scalars = scalars_.empty() ? nullptr : scalars_.data();
  opt.tensor_step(s);
}

void MomentumCompression::pass(StepState& st, bool with_grad) {
  const OptimizerInstance& opt = ctx_.optimizer();
  const uint32_t nstats = opt.tensor_stats();
  st.stats.assign(ctx_.registry.params().size() * nstats, 0.0);
  OptimizerRunner::PassArgs a;
  a.grad_scale = st.grad_scale;
  a.lr = st.lr;
  a.t = st.t;
  a.with_grad = with_grad;
  a.planned = true;
  a.kind = st.plan.kind;
  a.pass = st.pass;
  if (st.owned != nullptr)
    a.exchange = [this, &st](size_t gi, zd_param_id pid, uint64_t at) { return exchange_of(st, gi, pid, at); };
  a.scalars = scalars_.empty() ? nullptr : scalars_.data();
  a.stats = nstats ? &st.stats : nullptr;
  runner_.pass(a);
  if (with_grad) st.consumed = true;
  st.have_stats = nstats > 0;
  combine_stats(st);
  // The first pass was replayed with the exchange (prepare); a later one
  // (1-bit LAMB's, which applies the trust ratio the owners' statistics
  // gave) is replayed here, after the owners' pass and the tensor_step that
  // set the scalars it reads, the same on every rank.
  if (st.replay && st.pass > 1)
    for (size_t gi = 0; gi < ctx_.registry.groups().size(); ++gi)
      for (const Segment& s : segments(gi, st.plan.fused != 0)) replay(st, gi, s, nullptr, st.pass);
}

// Each owner summed (or maxed) its part of every tensor: combine them, so
// that every rank's tensor_step sees the same figures.
void MomentumCompression::combine_stats(StepState& st) {
  const OptimizerInstance& opt = ctx_.optimizer();
  const uint32_t nstats = opt.tensor_stats();
  if (nstats == 0 || owns_all()) return;
  for (zd_stat_op op : {ZD_STAT_SUM, ZD_STAT_MAX}) {
    std::vector<double> v;
    std::vector<size_t> at;
    for (size_t i = 0; i < st.stats.size(); ++i)
      if (opt.stat_op(static_cast<uint32_t>(i % nstats)) == op) {
        v.push_back(st.stats[i]);
        at.push_back(i);
      }
    if (v.empty()) continue;
    const std::string what = "step: all-reduce of the optimizer's per-tensor statistics";
    ctx_.run(*res_.stream, [&] {
      ctx_.comm().all_reduce(ctx_.comm_call(res_.rank, comm_tag(CommOp::Stats, op == ZD_STAT_SUM ? 1 : 2, st.pass), what),
                             v.data(), v.size(), ZD_COMM_F64, op == ZD_STAT_SUM ? ZD_REDUCE_SUM : ZD_REDUCE_MAX);
    });
    for (size_t j = 0; j < at.size(); ++j) st.stats[at[j]] = v[j];
  }
}

bool MomentumCompression::run(const zd_optimizer_plan& plan, double grad_scale, double lr, int64_t t) {
  if (groups_.empty()) lay_out_groups();
  StepState st{plan, grad_scale, lr, t, nullptr, {}, false, 0, false, replays(plan)};
  // A plan without a prepare that starts from the average moves the slot on
  // some other way: the buffer no longer holds what it was made from.
  bool prepares = false;
  for (zd_plan_op op : plan.ops) prepares = prepares || op == ZD_OP_PREPARE;
  if (!plan.keep_average || !prepares)
    for (Group& c : groups_) c.average_in_buffer = false;
  // A plan that keeps no average moves the average slot on; the replicas
  // stay valid if this step replays them (0/1 Adam's m), as below.
  if (!plan.keep_average)
    for (Group& c : groups_) c.have_average = false;
  if (!st.replay) {
    // A step that is not replayed may change what the replicas copied.
    replica_valid_ = 0;
  } else if (replica_valid_ != plan.replay_slots) {
    fill_replica(plan.replay_slots);
    replica_valid_ = plan.replay_slots;
  }
  // Stage 3: the replay moves the whole copy of the parameters on from the
  // owners' values before the step; it is current again once the owners'
  // parts are copied in at the end (a step that fails part-way leaves it
  // invalid).
  const bool whole_params = st.replay && ctx_.params_partitioned();
  if (whole_params && !params_valid_) fill_params();
  params_valid_ = false;
  if (plan.reset_errors)
    for (Group& c : groups_)
      for (TieredBuffer* b : {&c.worker_error, &c.server_error})
        if (!b->empty()) std::memset(b->addr(0), 0, b->count() * 4);
  bool exchanges = false;
  for (zd_plan_op op : plan.ops) exchanges = exchanges || op == ZD_OP_PREPARE || op == ZD_OP_EXCHANGE;
  if (exchanges) {
    if (owned_.empty()) allocate_owned();
    st.owned = &owned_;
  }
  for (size_t i = 0; i < ZD_PLAN_MAX_OPS && plan.ops[i] != ZD_OP_END; ++i) {
    const zd_plan_op op = plan.ops[i];
    switch (op) {
      case ZD_OP_PREPARE: {
        tensor_step(st, op);
        const bool then = i + 1 < ZD_PLAN_MAX_OPS && plan.ops[i + 1] == ZD_OP_EXCHANGE;
        prepare(st, then);
        if (then) ++i;
        break;
      }
      case ZD_OP_EXCHANGE:
        if (!owns_all())
          fail(ZD_ERR_CONFIG, "optimizer '" + ctx_.optimizer().plugin().name() + "' planned update " +
                                  std::to_string(t) + " to exchange what a pass wrote over the rank's own part only; "
                                  "that needs every rank to own every element (ZeRO stage 0)");
        exchange_in_place(st);
        break;
      case ZD_OP_PASS:
      case ZD_OP_PASS_GRAD:
        if (op == ZD_OP_PASS_GRAD && plan.grads == ZD_GRADS_LOCAL && !owns_all())
          fail(ZD_ERR_CONFIG, "optimizer '" + ctx_.optimizer().plugin().name() + "' planned update " +
                                  std::to_string(t) + " as a pass over each rank's own local gradient, which needs "
                                  "every rank to own every element (ZeRO stage 0)");
        ++st.pass;
        tensor_step(st, op);
        pass(st, op == ZD_OP_PASS_GRAD);
        break;
      default: fail(ZD_ERR_INTERNAL, "an unknown op in a checked plan");
    }
  }
  tensor_step(st, ZD_OP_END);
  if (plan.grads == ZD_GRADS_LOCAL && !st.consumed) grads_.zero();
  if (whole_params) {
    copy_owned_params();
    params_valid_ = true;
  }
  return st.replay;
}

// ---------------------------------------------------------------------------
// compression.replay

bool MomentumCompression::replays(const zd_optimizer_plan& plan) const {
  const OptimizerInstance& opt = ctx_.optimizer();
  // plan() checked the shape (PREPARE, EXCHANGE, then passes only).
  // Statistics over whole tensors are the owners': a replayed pass adds to
  // none, and reads the scalars every rank's tensor_step made of them.
  if (plan.replay_slots == 0 || !keeps()) return false;
  for (const ParamGroup& g : ctx_.registry.groups())
    if (g.dtype != ZD_DTYPE_F32) return false;
  if (!ctx_.config.compression_replay) {
    if (!replay_hinted_ && res_.rank == 0) {
      const bool p3 = ctx_.params_partitioned();
      log_info("optimizer '" + opt.plugin().name() + "': " +
               (p3 ? "forward and backward all-gather the fp32 parameters after each compressed step"
                   : "each compressed step all-gathers the fp32 working copies afterwards") +
               " (4 bytes per parameter, against 1 bit per parameter exchanged); compression.replay = true "
               "replays the step on every rank instead, for whole copies of " +
               std::to_string(std::popcount(plan.replay_slots)) + " state slot(s)" +
               (p3 ? " and the parameters" : "") + " in memory (4 bytes per parameter each)");
    }
    replay_hinted_ = true;
    return false;
  }
  return res_.device->host_addressable();
}

// Every rank copies the owners' values of the replayed slots, whole: a
// collective (each owner broadcasts its part), once after the slots last
// changed. Only the slots whose copies are not valid are copied; the copy
// of a slot this plan does not replay is given back (0/1 Adam's m once its
// variance froze: its momentum syncs replay v alone). Every rank calls this
// with the same plan and the same replica_valid_, so the broadcasts match.
void MomentumCompression::fill_replica(uint32_t slots) {
  const auto& groups = ctx_.registry.groups();
  const TierSet tiers = res_.tiers();
  const OptimizerInstance& opt = ctx_.optimizer();
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    Group& c = groups_[gi];
    for (uint32_t k = 0; k < ZD_OPTIMIZER_MAX_STATE; ++k) {
      TieredBuffer& r = c.replica[k];
      if ((slots >> k & 1u) == 0) {
        r.release(tiers);
        continue;
      }
      if ((replica_valid_ >> k & 1u) != 0) continue;
      if (r.empty())
        r.allocate(tiers, 4, {{groups[gi].full_numel, buffers_.groups()[gi].grad_tier()}}, ZD_MEM_OPTIMIZER,
                   "the whole copy of state slot '" + opt.state_name(k) + "' of group " + std::to_string(gi) +
                       " (compression.replay)");
      auto* base = reinterpret_cast<float*>(r.addr(0));
      for (zd_param_id pid : groups[gi].params)
        read_whole_into(ctx_, res_, buffers_, pid, static_cast<int>(k), "step: compression.replay",
                        base + ctx_.registry.param(pid).full_offset);
    }
  }
}

// Stage 3: every rank copies every owner's parameters, whole, before the
// first replayed step after one that was not (an all-gather per tensor, as
// forward would have made; every rank decides alike, so the collectives
// match).
void MomentumCompression::fill_params() {
  const auto& groups = ctx_.registry.groups();
  const TierSet tiers = res_.tiers();
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    TieredBuffer& b = groups_[gi].params;
    if (b.empty())
      b.allocate(tiers, 4, {{groups[gi].full_numel, buffers_.groups()[gi].grad_tier()}}, ZD_MEM_PARAMS,
                 "the whole copy of the parameters of group " + std::to_string(gi) + " (compression.replay)");
    auto* base = reinterpret_cast<float*>(b.addr(0));
    for (zd_param_id pid : groups[gi].params)
      read_whole_into(ctx_, res_, buffers_, pid, kMasterSlot, "step: compression.replay",
                      base + ctx_.registry.param(pid).full_offset);
  }
}

// Stage 3, after a replayed step: the rank's own new parameters (its
// working shard, what an all-gather would send) into its whole copy, where
// the replay wrote everyone else's.
void MomentumCompression::copy_owned_params() {
  const TierSet tiers = res_.tiers();
  for (const ParamRecord& p : ctx_.registry.params()) {
    const ModelContext::OwnedSpan own = ctx_.owned_span(p, res_.rank);
    if (own.count == 0) continue;
    buffers_.of(p).working.read(tiers, own.at, own.count, params_of(p) + own.from);
  }
}

float* MomentumCompression::params_of(const ParamRecord& p) const {
  return reinterpret_cast<float*>(groups_[static_cast<size_t>(p.group)].params.addr(0)) + p.full_offset;
}

const float* MomentumCompression::whole_param(const ParamRecord& p) const {
  return params_valid_ ? params_of(p) : nullptr;
}

void MomentumCompression::write_whole_param(const ParamRecord& p, const float* whole) {
  if (params_valid_) std::memcpy(params_of(p), whole, static_cast<size_t>(p.numel) * 4);
}

// Pass `pass` of the step over the segment's elements that other ranks own,
// on this rank's fp32 working copy, from the exchanged average x (the first
// pass; NULL for a later one, which reads no exchange): what each owner's
// pass computes for its master, element for element. Statistics a replayed
// pass gathers are thrown away: the owners' are the ones combined.
void MomentumCompression::replay(StepState& st, size_t gi, const Segment& s, const float* x, uint32_t pass) {
  const OptimizerInstance& opt = ctx_.optimizer();
  const ParamGroup& g = ctx_.registry.groups()[gi];
  const Group& c = groups_[gi];
  const uint32_t slots = opt.state_slots(), mask = st.plan.replay_slots, nstats = opt.tensor_stats();
  // Stages 1-2: the rank's whole working copy; stage 3: its whole copy of
  // the parameters (both fp32, in the full layout).
  const TieredBuffer& whole = ctx_.params_partitioned() ? c.params : buffers_.groups()[gi].working;
  auto* working = reinterpret_cast<float*>(whole.addr(0));
  observe::Span span(res_.probe, "optimizer", "replay");
  for (zd_param_id pid : s.params) {
    const ParamRecord& p = ctx_.registry.param(pid);
    const uint64_t begin = p.full_offset, end = begin + static_cast<uint64_t>(p.numel);
    const ModelContext::OwnedSpan own = ctx_.owned_span(p, res_.rank);
    uint64_t lo = begin + own.from, hi = lo + own.count;
    if (lo >= hi) lo = hi = end;  // none of it is this rank's: all of it is replayed
    const float* px = x != nullptr ? x + (packed_at_[static_cast<size_t>(pid)] - s.dense) : nullptr;
    for (const auto& [a, b] : {std::pair{begin, lo}, std::pair{hi, end}}) {
      if (a >= b) continue;
      zd_optimizer_update u = step_update(st, g, pid, pass);
      u.count = b - a;
      u.master = working + a;
      u.exchange = px != nullptr ? const_cast<float*>(px + (a - begin)) : nullptr;
      for (uint32_t k = 0; k < slots; ++k)
        if (mask >> k & 1u) u.state[k] = reinterpret_cast<float*>(c.replica[k].addr(0)) + a;
      const uint64_t tiles = (u.count + kTile - 1) / kTile;
      res_.workers.run(tiles, [&](size_t i) {
        const uint64_t off = i * kTile, n = std::min(kTile, u.count - off);
        zd_optimizer_update tile = update_slice(u, slots, off, n);
        // The slots the pass writes or does not read: scratch, per thread.
        thread_local std::vector<float> scratch;
        thread_local std::vector<double> discarded;
        scratch.resize(kTile);
        for (uint32_t k = 0; k < slots; ++k)
          if ((mask >> k & 1u) == 0) tile.state[k] = scratch.data();
        if (nstats > 0) {
          discarded.assign(nstats, 0.0);
          tile.stats = discarded.data();
        }
        opt.update(ZD_ISA_AUTO, tile);
      });
    }
  }
}

}  // namespace zerod
