// Model: steps of an optimizer that averages its momentum compressed instead
// of the gradients (plugin ABI v2: 1-bit Adam). Per group, each rank folds
// its local gradient into the momentum (the plugin's momentum()), the comm
// plugin averages that momentum with 1-bit compression and error feedback,
// and the plugin's update() applies it with its frozen second moment.
//
// Stage 0 keeps the whole momentum on every rank. Stage 1 keeps only the
// owned range of it (like every optimizer state at stage 1); the whole
// previous average every rank needs for its next local momentum is kept as
// what the compressed average is exactly — one sign bit per element and one
// scale per chunk — so it costs 1/32 of the fp32 momentum. The first
// compressed step after the warm-up (or a checkpoint load) gathers the fp32
// shards once instead. Stages 2-3 are refused: they keep only a shard of the
// gradient, and the local momentum needs all of it.
#include "model_state.h"

#include "dtype.h"
#include "error.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace zerod {

// The chunk length of zd_comm_v2::compressed_all_reduce (its header comment
// is the specification): count / world rounded up to a multiple of 8.
uint64_t compression_chunk(uint64_t count, int world) {
  const auto w = static_cast<uint64_t>(world);
  return ((count + w - 1) / w + 7) / 8 * 8;
}

bool Model::compressing(const RankState& rs) const {
  const int64_t start = plugins_.optimizer->compression_start();
  return start > 0 && rs.applied + 1 >= start;
}

void Model::check_compression_support() const {
  if (plugins_.optimizer->compression_start() <= 0) return;
  const std::string opt = "optimizer '" + plugins_.optimizer->plugin().name() + "'";
  if (partitioned(ZD_PARTITION_GRADS))
    fail(ZD_ERR_CONFIG, opt + " averages each rank's local momentum (1-bit compressed), which needs the rank's "
                              "whole local gradient; ZeRO stages 2 and 3 reduce-scatter the gradients during "
                              "backward and keep only a shard of them. Use zero = { stage = 0 } or { stage = 1 }");
  if (world_size_ > 1 && !plugins_.comm->has_compression())
    fail(ZD_ERR_CONFIG, opt + " needs a comm plugin with compressed all-reduce (plugin ABI version 2); '" +
                            plugins_.comm->plugin().name() + "' offers version 1");
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

// Device-pool bytes of the error feedback (and at stage 1 the packed average)
// per group, for the plan and the ledger.
uint64_t Model::compression_bytes(size_t group) const {
  if (plugins_.optimizer->compression_start() <= 0 || world_size_ == 1) return 0;
  const ParamGroup& g = registry_.groups()[group];
  const uint64_t n = g.full_numel;
  auto pool = [](uint64_t b) { return align_up(b, DevicePool::kAlign); };
  uint64_t bytes = pool(n * 4) + pool(server_elems(registry_, g, world_size_) * 4);
  if (partitioned(ZD_PARTITION_OPTIMIZER))
    bytes += pool((n + 7) / 8) + pool(g.params.size() * static_cast<uint64_t>(world_size_) * 4);
  return bytes;
}

void Model::allocate_compression(RankState& rs, int rank) {
  if (plugins_.optimizer->compression_start() <= 0 || world_size_ == 1) return;
  const auto& groups = registry_.groups();
  rs.compression.resize(groups.size());
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const ParamGroup& g = groups[gi];
    const uint64_t n = g.full_numel;
    Compression& c = rs.compression[gi];
    const std::string of = " of group " + std::to_string(gi) + " of rank " + std::to_string(rank);
    c.worker_error = rs.pool->allocate(n * 4, ZD_MEM_OPTIMIZER, "the worker error feedback" + of);
    c.server_error = rs.pool->allocate(server_elems(registry_, g, world_size_) * 4, ZD_MEM_OPTIMIZER,
                                       "the server error feedback" + of);
    if (partitioned(ZD_PARTITION_OPTIMIZER)) {
      c.signs = rs.pool->allocate((n + 7) / 8, ZD_MEM_OPTIMIZER, "the last compressed momentum" + of);
      c.scales = rs.pool->allocate(g.params.size() * static_cast<uint64_t>(world_size_) * 4, ZD_MEM_OPTIMIZER,
                                   "the last compressed momentum's scales" + of);
    }
  }
  reset_compression(rs);
}

void Model::release_compression(RankState& rs) {
  for (Compression& c : rs.compression)
    for (Block* b : {&c.worker_error, &c.server_error, &c.signs, &c.scales}) {
      rs.pool->release(*b, ZD_MEM_OPTIMIZER);
      *b = Block{};
    }
  rs.compression.clear();
}

void Model::reset_compression(RankState& rs) {
  for (Compression& c : rs.compression) {
    for (Block* b : {&c.worker_error, &c.server_error})
      if (*b) std::memset(b->ptr, 0, b->bytes);
    c.have_average = false;
  }
}

void Model::compressed_step(RankState& rs, int rank, double grad_scale, double lr, int64_t t) {
  const auto& groups = registry_.groups();
  const uint32_t mslot = plugins_.optimizer->momentum_slot();
  const bool stage1 = partitioned(ZD_PARTITION_OPTIMIZER);
  const TierSet tiers = rs.tiers();
  const auto world = static_cast<uint64_t>(world_size_);
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const ParamGroup& g = groups[gi];
    GroupBuffers& b = rs.groups[gi];
    TieredBuffer& m = b.state[mslot];
    const uint64_t n = g.full_numel;
    const zd_dtype gdt = grad_dtype(g);
    const size_t gsz = dtype_size(gdt);
    Compression* comp = world_size_ > 1 ? &rs.compression[gi] : nullptr;

    // M: the whole momentum of the group (the previous average).
    Block scratch;
    struct Release {
      DevicePool& pool;
      Block& b;
      ~Release() { pool.release(b, ZD_MEM_BUFFERS); }
    } release{*rs.pool, scratch};
    float* M = nullptr;
    if (!stage1 && m.addressable(0, n)) {
      M = reinterpret_cast<float*>(m.addr(0));
    } else {
      const uint64_t len = stage1 ? g.stride * world : n;
      scratch = rs.pool->allocate(len * 4, ZD_MEM_BUFFERS, "the whole momentum of a compressed step");
      M = scratch.as<float>();  // zeroed by the pool
      if (!stage1) {
        m.read(tiers, 0, n, M);
      } else if (comp && comp->have_average) {
        // Exactly the last average: per parameter, chunk r is its scale
        // times the signs.
        const auto* bits = comp->signs.as<const uint8_t>();
        const auto* scales = comp->scales.as<const float>();
        for (size_t k = 0; k < g.params.size(); ++k) {
          const ParamRecord& p = registry_.param(g.params[k]);
          const auto numel = static_cast<uint64_t>(p.numel);
          const uint64_t chunk = compression_chunk(numel, world_size_);
          for (uint64_t i = 0; i < numel; ++i) {
            const uint64_t e = p.full_offset + i;
            const float s = scales[k * world + i / chunk];
            M[e] = (bits[e >> 3] >> (e & 7)) & 1 ? s : -s;
          }
        }
      } else {
        m.read(tiers, 0, owned_count(g), M + owned_begin(g, rank));
        if (world_size_ > 1) {
          const std::string what = "step: all-gather of the momentum before its first compressed average";
          wait(issue(rs, [&, rank] {
            plugins_.comm->all_gather(comm_call(rank, comm_tag(CommOp::StepReduce, gi, 1), what),
                                      M + owned_begin(g, rank), M, g.stride, ZD_COMM_F32);
          }));
        }
      }
    }

    // The local momentum, from the local gradient (zeroed as it is used).
    const uint64_t tasks = (n + kTile - 1) / kTile;
    run_on_pool(rs, tasks, [&](size_t i) {
      const uint64_t off = i * kTile, len = std::min(kTile, n - off);
      zd_optimizer_update u{};
      u.struct_size = sizeof u;
      u.count = len;
      u.grad = b.grad.ptr + off * gsz;
      u.grad_dtype = gdt;
      u.work_dtype = g.dtype;
      u.state[mslot] = M + off;
      u.grad_scale = grad_scale;
      u.lr = lr;
      u.step = t;
      plugins_.optimizer->momentum(ZD_ISA_AUTO, u);
      std::memset(b.grad.ptr + off * gsz, 0, len * gsz);
    });

    if (comp) {
      const std::string what = "step: compressed all-reduce of the momentum";
      uint64_t server_at = 0;
      for (size_t k = 0; k < g.params.size(); ++k) {
        const zd_param_id pid = g.params[k];
        const ParamRecord& p = registry_.param(pid);
        const auto numel = static_cast<uint64_t>(p.numel);
        float* x = M + p.full_offset;
        float* we = comp->worker_error.as<float>() + p.full_offset;
        float* se = comp->server_error.as<float>() + server_at;
        server_at += compression_chunk(numel, world_size_);
        wait(issue(rs, [&, rank, pid, x, we, se, numel] {
          plugins_.comm->compressed_all_reduce(
              comm_call(rank, comm_tag(CommOp::StepReduce, gi, (uint64_t{1} << 40) | static_cast<uint64_t>(pid)), what),
              x, numel, we, se);
        }));
        if (stage1) {
          // Keep the average as it is: a sign bit per element, a scale per chunk.
          const uint64_t chunk = compression_chunk(numel, world_size_);
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
      m.write(tiers, 0, owned_count(g), M + owned_begin(g, rank));
    else if (scratch)
      m.write(tiers, 0, n, M);
  }
  // The update with the averaged momentum; the gradients are already folded in.
  apply_optimizer(rs, rank, {}, 1.0, lr, t, /*with_grad=*/false);
}

}  // namespace zerod
