#include "momentum_compression.h"

#include "align.h"
#include "dtype.h"
#include "error.h"
#include "workers.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace zerod {

uint64_t compression_chunk(uint64_t count, int world) {
  const auto w = static_cast<uint64_t>(world);
  return ((count + w - 1) / w + 7) / 8 * 8;
}

// Each parameter is compressed on its own, as DeepSpeed does: one scale per
// tensor (an embedding and a layer norm's bias are not of one magnitude),
// error feedback per tensor. Per group the buffers hold every parameter's
// part: worker errors and sign bits at the parameter's element offset, server
// errors and scales one after another in registration order.
namespace {

uint64_t server_elems(const Registry& reg, const ParamGroup& g, int world) {
  uint64_t n = 0;
  for (zd_param_id pid : g.params) n += compression_chunk(static_cast<uint64_t>(reg.param(pid).numel), world);
  return n;
}

}  // namespace

uint64_t compression_bytes(const ModelContext& ctx, size_t group) {
  if (ctx.optimizer().compression_start() <= 0 || ctx.world_size == 1) return 0;
  const ParamGroup& g = ctx.registry.groups()[group];
  const uint64_t n = g.full_numel;
  auto pool = [](uint64_t b) { return align_up(b, DevicePool::kAlign); };
  uint64_t bytes = pool(n * 4) + pool(server_elems(ctx.registry, g, ctx.world_size) * 4);
  if (ctx.partitioned(ZD_PARTITION_OPTIMIZER))
    bytes += pool((n + 7) / 8) + pool(g.params.size() * static_cast<uint64_t>(ctx.world_size) * 4);
  return bytes;
}

void check_compression_support(const ModelContext& ctx) {
  if (ctx.optimizer().compression_start() <= 0) return;
  const std::string opt = "optimizer '" + ctx.optimizer().plugin().name() + "'";
  if (ctx.partitioned(ZD_PARTITION_GRADS))
    fail(ZD_ERR_CONFIG, opt + " averages each rank's local momentum (1-bit compressed), which needs the rank's "
                              "whole local gradient; ZeRO stages 2 and 3 reduce-scatter the gradients during "
                              "backward and keep only a shard of them. Use zero = { stage = 0 } or { stage = 1 }");
  if (ctx.world_size > 1 && !ctx.comm().has_compression())
    fail(ZD_ERR_CONFIG, opt + " needs a comm plugin with compressed all-reduce (plugin ABI version 2); '" +
                            ctx.comm().plugin().name() + "' offers version 1");
}

bool MomentumCompression::enabled() const { return ctx_.optimizer().compression_start() > 0; }

bool MomentumCompression::active(int64_t applied) const {
  const int64_t start = ctx_.optimizer().compression_start();
  return start > 0 && applied + 1 >= start;
}

void MomentumCompression::allocate() {
  if (!enabled() || ctx_.world_size == 1) return;
  const auto& groups = ctx_.registry.groups();
  Device& d = *res_.device;
  groups_.resize(groups.size());
  try {
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      const ParamGroup& g = groups[gi];
      const uint64_t n = g.full_numel;
      Buffers& c = groups_[gi];
      const std::string of = " of group " + std::to_string(gi) + " of rank " + std::to_string(res_.rank);
      c.worker_error = d.allocate(n * 4, ZD_MEM_OPTIMIZER, "the worker error feedback" + of);
      c.server_error = d.allocate(server_elems(ctx_.registry, g, ctx_.world_size) * 4, ZD_MEM_OPTIMIZER,
                                  "the server error feedback" + of);
      if (ctx_.partitioned(ZD_PARTITION_OPTIMIZER)) {
        c.signs = d.allocate((n + 7) / 8, ZD_MEM_OPTIMIZER, "the last compressed momentum" + of);
        c.scales = d.allocate(g.params.size() * static_cast<uint64_t>(ctx_.world_size) * 4, ZD_MEM_OPTIMIZER,
                              "the last compressed momentum's scales" + of);
      }
    }
  } catch (...) {
    release();
    throw;
  }
  reset();
}

void MomentumCompression::release() {
  for (Buffers& c : groups_)
    for (Block* b : {&c.worker_error, &c.server_error, &c.signs, &c.scales}) {
      res_.device->release(*b, ZD_MEM_OPTIMIZER);
      *b = Block{};
    }
  groups_.clear();
}

void MomentumCompression::reset() {
  for (Buffers& c : groups_) {
    for (Block* b : {&c.worker_error, &c.server_error})
      if (*b) std::memset(b->ptr, 0, b->bytes);
    c.have_average = false;
  }
}

void MomentumCompression::step(double grad_scale, double lr, int64_t t) {
  const auto& groups = ctx_.registry.groups();
  const uint32_t mslot = ctx_.optimizer().momentum_slot();
  const bool stage1 = ctx_.partitioned(ZD_PARTITION_OPTIMIZER);
  const TierSet tiers = res_.tiers();
  const int rank = res_.rank;
  const int world_size = ctx_.world_size;
  const auto world = static_cast<uint64_t>(world_size);
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const ParamGroup& g = groups[gi];
    GroupBuffers& b = buffers_.groups()[gi];
    TieredBuffer& m = b.state[mslot];
    const uint64_t n = g.full_numel;
    const zd_dtype gdt = ctx_.grad_dtype(g);
    const size_t gsz = dtype_size(gdt);
    Buffers* comp = world_size > 1 ? &groups_[gi] : nullptr;

    // M: the whole momentum of the group (the previous average).
    Block scratch;
    struct Release {
      Device& d;
      Block& b;
      ~Release() { d.release(b, ZD_MEM_BUFFERS); }
    } release_scratch{*res_.device, scratch};
    float* M = nullptr;
    if (!stage1 && m.addressable(0, n)) {
      M = reinterpret_cast<float*>(m.addr(0));
    } else {
      const uint64_t len = stage1 ? g.stride * world : n;
      scratch = res_.device->allocate(len * 4, ZD_MEM_BUFFERS, "the whole momentum of a compressed step");
      M = scratch.as<float>();  // zeroed by the pool
      if (!stage1) {
        m.read(tiers, 0, n, M);
      } else if (comp && comp->have_average) {
        // Exactly the last average: per parameter, chunk r is its scale
        // times the signs.
        const auto* bits = comp->signs.as<const uint8_t>();
        const auto* scales = comp->scales.as<const float>();
        for (size_t k = 0; k < g.params.size(); ++k) {
          const ParamRecord& p = ctx_.registry.param(g.params[k]);
          const auto numel = static_cast<uint64_t>(p.numel);
          const uint64_t chunk = compression_chunk(numel, world_size);
          for (uint64_t i = 0; i < numel; ++i) {
            const uint64_t e = p.full_offset + i;
            const float s = scales[k * world + i / chunk];
            M[e] = (bits[e >> 3] >> (e & 7)) & 1 ? s : -s;
          }
        }
      } else {
        m.read(tiers, 0, ctx_.owned_count(g), M + ctx_.owned_begin(g, rank));
        if (world_size > 1) {
          const std::string what = "step: all-gather of the momentum before its first compressed average";
          ctx_.run(*res_.stream, [&] {
            ctx_.comm().all_gather(ctx_.comm_call(rank, comm_tag(CommOp::StepReduce, gi, 1), what),
                                   M + ctx_.owned_begin(g, rank), M, g.stride, ZD_COMM_F32);
          });
        }
      }
    }

    // The local momentum, from the local gradient (zeroed as it is used).
    std::byte* grad = b.grad_data();
    const uint64_t tasks = (n + kTile - 1) / kTile;
    res_.workers.run(tasks, [&](size_t i) {
      const uint64_t off = i * kTile, len = std::min(kTile, n - off);
      zd_optimizer_update u{};
      u.struct_size = sizeof u;
      u.count = len;
      u.grad = grad + off * gsz;
      u.grad_dtype = gdt;
      u.work_dtype = g.dtype;
      u.state[mslot] = M + off;
      u.grad_scale = grad_scale;
      u.lr = lr;
      u.step = t;
      ctx_.optimizer().momentum(ZD_ISA_AUTO, u);
      std::memset(grad + off * gsz, 0, len * gsz);
    });

    if (comp) {
      const std::string what = "step: compressed all-reduce of the momentum";
      uint64_t server_at = 0;
      for (size_t k = 0; k < g.params.size(); ++k) {
        const zd_param_id pid = g.params[k];
        const ParamRecord& p = ctx_.registry.param(pid);
        const auto numel = static_cast<uint64_t>(p.numel);
        float* x = M + p.full_offset;
        float* we = comp->worker_error.as<float>() + p.full_offset;
        float* se = comp->server_error.as<float>() + server_at;
        server_at += compression_chunk(numel, world_size);
        ctx_.run(*res_.stream, [&, pid, x, we, se, numel] {
          ctx_.comm().compressed_all_reduce(
              ctx_.comm_call(rank, comm_tag(CommOp::StepReduce, gi, (uint64_t{1} << 40) | static_cast<uint64_t>(pid)),
                             what),
              x, numel, we, se);
        });
        if (stage1) {
          // Keep the average as it is: a sign bit per element, a scale per chunk.
          const uint64_t chunk = compression_chunk(numel, world_size);
          auto* bits = comp->signs.as<uint8_t>();
          auto* scales = comp->scales.as<float>() + k * world;
          for (uint64_t r = 0; r < world; ++r) {
            const uint64_t lo = r * chunk;
            scales[r] = lo < numel ? std::fabs(x[lo]) : 0.0f;
          }
          for (uint64_t i = 0; i < numel; ++i) {
            const uint64_t e = p.full_offset + i;
            const auto bit = static_cast<uint8_t>(1u << (e & 7));
            bits[e >> 3] = std::signbit(x[i]) ? static_cast<uint8_t>(bits[e >> 3] & ~bit)
                                              : static_cast<uint8_t>(bits[e >> 3] | bit);
          }
        }
      }
      if (stage1) comp->have_average = true;
    }
    if (stage1)
      m.write(tiers, 0, ctx_.owned_count(g), M + ctx_.owned_begin(g, rank));
    else if (scratch)
      m.write(tiers, 0, n, M);
  }
  // The update with the averaged momentum; the gradients are already folded in.
  runner_.apply(1.0, lr, t, /*with_grad=*/false);
}

}  // namespace zerod
