// Model: the optimizer runs where the state lives. A rank's owned range is
// cut into pieces in which every operand (master, each state slot, the
// stage-3 working shard) stays in one tier. Pieces in memory (device pool,
// host) are updated in place, in tiles, on the thread pool. Pieces with an
// operand on NVMe stream through staging buffers: while the CPU updates tile
// j, tile j+1.. are being read and tile j-1 written (ZeRO-Infinity's
// pipeline), so a step waits on the disk only when the disk is the
// bottleneck.
#include "model_state.h"

#include "dtype.h"
#include "error.h"

#include <algorithm>
#include <cstring>

namespace zerod {

struct Model::Piece {
  size_t group;
  uint64_t begin, count;  // in the rank's owned range
  bool staged;            // some operand is on NVMe
};

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

void Model::apply_optimizer(RankState& rs, int rank, const std::vector<Block>& stage1_shards,
                            double grad_scale, double lr, int64_t t, bool with_grad) {
  const auto& groups = registry_.groups();
  const uint32_t slots = plugins_.optimizer->state_slots();
  const bool p3 = partitioned(ZD_PARTITION_PARAMS);
  // Pieces: cut wherever any operand changes segment.
  std::vector<Piece> pieces;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const ParamGroup& g = groups[gi];
    GroupBuffers& b = rs.groups[gi];
    const uint64_t n = owned_count(g), wbase = p3 ? 0 : owned_begin(g, rank);
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
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      const uint64_t lo = cuts[i], len = cuts[i + 1] - cuts[i];
      bool staged = !b.master.addressable(lo, len) || !b.working.addressable(wbase + lo, len);
      for (uint32_t s = 0; s < slots; ++s) staged = staged || !b.state[s].addressable(lo, len);
      pieces.push_back({gi, lo, len, staged});
    }
  }

  auto grad_base = [&](size_t gi) { return owned_grad(rs, rank, gi, stage1_shards); };

  // Pieces in memory: every tile of every such piece in one parallel run.
  struct Task {
    size_t group;
    uint64_t begin, count;
  };
  std::vector<Task> tasks;
  for (const Piece& pc : pieces)
    if (!pc.staged)
      for (uint64_t b = 0; b < pc.count; b += kTile)
        tasks.push_back({pc.group, pc.begin + b, std::min(kTile, pc.count - b)});
  {
    run_on_pool(rs, tasks.size(), [&](size_t i) {
      const Task& task = tasks[i];
      const ParamGroup& g = groups[task.group];
      GroupBuffers& b = rs.groups[task.group];
      const zd_dtype gdt = grad_dtype(g);
      const size_t gsz = dtype_size(gdt);
      std::byte* grad = grad_base(task.group) + task.begin * gsz;
      zd_optimizer_update u{};
      u.struct_size = sizeof u;
      u.count = task.count;
      u.master = reinterpret_cast<float*>(b.master.addr(task.begin));
      u.grad = with_grad ? grad : nullptr;
      u.grad_dtype = gdt;
      u.work = b.working.addr((p3 ? 0 : owned_begin(g, rank)) + task.begin);
      u.work_dtype = g.dtype;
      for (uint32_t s = 0; s < slots; ++s) u.state[s] = reinterpret_cast<float*>(b.state[s].addr(task.begin));
      u.grad_scale = grad_scale;
      u.lr = lr;
      u.step = t;
      plugins_.optimizer->update(ZD_ISA_AUTO, u);
      // Zeroed while the tile is still in cache: the next window starts clean.
      if (with_grad) std::memset(grad, 0, task.count * gsz);
    });
  }
  for (const Piece& pc : pieces)
    if (pc.staged) update_staged(rs, rank, pc, grad_base(pc.group), grad_scale, lr, t, with_grad);
}

void Model::run_on_pool(RankState& rs, size_t n, const std::function<void(size_t)>& fn) {
  if (rs.pool_near) {
    rs.pool_near->run(n, fn);  // the rank's own threads: no other rank uses them
    return;
  }
  std::lock_guard<std::mutex> lock(pool_mu_);
  pool_.run(n, fn);
}

void Model::update_staged(RankState& rs, int rank, const Piece& pc, std::byte* grad_base,
                          double grad_scale, double lr, int64_t t, bool with_grad) {
  const ParamGroup& g = registry_.groups()[pc.group];
  GroupBuffers& b = rs.groups[pc.group];
  const uint32_t slots = plugins_.optimizer->state_slots();
  const bool p3 = partitioned(ZD_PARTITION_PARAMS);
  TierInstance& nvme = *rs.nvme;
  const uint64_t align = nvme.alignment();
  const zd_dtype gdt = grad_dtype(g);
  const size_t gsz = dtype_size(gdt);

  std::vector<Operand> ops;
  ops.push_back({&b.master, 0, 4, true, false});
  for (uint32_t s = 0; s < slots; ++s) ops.push_back({&b.state[s], 0, 4, true, false});
  ops.push_back({&b.working, p3 ? 0 : owned_begin(g, rank), dtype_size(g.dtype), false, false});
  for (Operand& op : ops) op.staged = !op.buf->addressable(op.base + pc.begin, pc.count);

  // Staging: the B sets of one tile per operand reserved at finalize.
  const uint64_t T = config_.offload.nvme_tile_elems;
  auto& sets = rs.staging;
  const size_t B = sets.size();
  if (B < 3 || sets[0].size() != ops.size())
    fail(ZD_ERR_INTERNAL, "the NVMe staging buffers were not reserved at finalize");
  for (size_t k = 0; k < ops.size(); ++k)
    if (ops[k].staged && sets[0][k].size() < align_up(T * ops[k].esz, align))
      fail(ZD_ERR_INTERNAL, "an NVMe staging buffer is smaller than a tile");

  const uint64_t tiles = (pc.count + T - 1) / T;
  std::vector<uint64_t> reading(B, 0), writing(B, 0);  // tickets; 0 = none
  // The transfers of one tile for the staged operands that `want`.
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
    if (writing[set]) {  // the set's last tile must be on disk before it is refilled
      nvme.wait(writing[set]);
      writing[set] = 0;
    }
    auto ios = ios_for(j, false);
    reading[set] = ios.empty() ? 0 : nvme.submit(ios.data(), static_cast<uint32_t>(ios.size()));
  };

  try {
    const uint64_t ahead = B - 2;  // tiles read ahead; the set before them is still being written
    uint64_t next = 0;
    for (uint64_t j = 0; j < tiles; ++j) {
      while (next < tiles && next <= j + ahead) start_read(next++);
      const size_t set = j % B;
      if (reading[set]) {
        nvme.wait(reading[set]);
        reading[set] = 0;
      }
      const uint64_t first = pc.begin + j * T, len = std::min(T, pc.count - j * T);
      std::byte* grad = grad_base + first * gsz;
      auto ptr = [&](size_t k, uint64_t off) -> std::byte* {
        const Operand& op = ops[k];
        return op.staged ? sets[set][k].data() + off * op.esz : op.buf->addr(op.base + first + off);
      };
      const uint64_t subtasks = (len + kTile - 1) / kTile;
      {
        run_on_pool(rs, subtasks, [&](size_t i) {
          const uint64_t off = i * kTile, n = std::min(kTile, len - off);
          zd_optimizer_update u{};
          u.struct_size = sizeof u;
          u.count = n;
          u.master = reinterpret_cast<float*>(ptr(0, off));
          u.grad = with_grad ? grad + off * gsz : nullptr;
          u.grad_dtype = gdt;
          u.work = ptr(ops.size() - 1, off);
          u.work_dtype = g.dtype;
          for (uint32_t s = 0; s < slots; ++s) u.state[s] = reinterpret_cast<float*>(ptr(1 + s, off));
          u.grad_scale = grad_scale;
          u.lr = lr;
          u.step = t;
          plugins_.optimizer->update(ZD_ISA_AUTO, u);
          if (with_grad) std::memset(grad + off * gsz, 0, n * gsz);
        });
      }
      auto ios = ios_for(j, true);
      if (!ios.empty()) writing[set] = nvme.submit(ios.data(), static_cast<uint32_t>(ios.size()));
    }
    for (size_t s = 0; s < B; ++s)
      if (writing[s]) nvme.wait(writing[s]);
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
