#include "memory/memory.h"

#include "memory/align.h"
#include "comm/device_comm.h"
#include "runtime/dtype.h"
#include "error.h"
#include "model/model_context.h"
#include "model/rank_resources.h"

#include <algorithm>
#include <cstring>

namespace zerod {

// --- the device pool ---

std::string PoolMemory::describe() const { return res_.device ? res_.device->describe() : std::string(); }

void PoolMemory::copy_out(void* host_dst, const void* src, uint64_t bytes) const {
  res_.device->copy_to_host(host_dst, src, bytes);
}

void PoolMemory::copy_in(void* dst, const void* host_src, uint64_t bytes) const {
  res_.device->copy_to_device(dst, host_src, bytes);
}

void PoolMemory::copy_to_pool(void* pool_dst, const void* src, uint64_t bytes) const {
  res_.device->copy_within(pool_dst, src, bytes);
}

void PoolMemory::zero(void* p, uint64_t bytes) const { res_.device->zero(p, bytes); }

void PoolMemory::scale(void* p, zd_dtype dt, uint64_t n, float factor) const { res_.device->scale(p, dt, n, factor); }

GradStats PoolMemory::sumsq(const std::vector<GradSpan>& spans) const { return res_.device->grad_stats(spans); }

void PoolMemory::add_from_pool(std::span<const PoolAdd> adds, uint64_t) const {
  // On zerod's stream after the work that wrote src; the device's add
  // leaves no norm partials (leaves_norms()), and adding into zeros is an add.
  for (const PoolAdd& a : adds) res_.device->accumulate(a.src, a.src_dt, a.dst, a.dst_dt, a.n);
}

bool PoolMemory::plugins_reach() const { return res_.device->host_addressable(); }

bool PoolMemory::host_writes() const { return res_.device->host_addressable(); }

HostScratch& PoolMemory::host_scratch() const { return res_.transfers.host_scratch(); }

void PoolMemory::update(const OptimizerInstance& opt, const zd_optimizer_update& u, bool zero_grad) const {
  res_.device->optimizer_update(opt, u, zero_grad);
}

void PoolMemory::all_reduce(const ModelContext& ctx, const zd_comm_call& c, void* buf, uint64_t count,
                            zd_dtype dt) const {
  if (plugins_reach())
    ctx.comm().all_reduce(c, buf, count, comm_dtype(dt), ZD_REDUCE_SUM);
  else
    pool_all_reduce(ctx, res_, c, buf, count, dt);
}

void PoolMemory::reduce_scatter(const ModelContext& ctx, const zd_comm_call& c, const void* send, void* recv,
                                uint64_t recv_count, zd_dtype dt) const {
  if (plugins_reach())
    ctx.comm().reduce_scatter(c, send, recv, recv_count, comm_dtype(dt), ZD_REDUCE_SUM);
  else
    pool_reduce_scatter(ctx, res_, c, send, recv, recv_count, dt);
}

void PoolMemory::all_gather(const ModelContext& ctx, const zd_comm_call& c, const Memory& from, const void* send,
                            void* recv, uint64_t count, zd_dtype dt) const {
  if (plugins_reach())
    ctx.comm().all_gather(c, send, recv, count, comm_dtype(dt));
  else
    pool_all_gather(ctx, res_, c, from, send, recv, count, dt);
}

// --- host memory ---

std::string HostMemory::describe() const { return res_.host ? res_.host->describe() : std::string(); }

void HostMemory::copy_out(void* host_dst, const void* src, uint64_t bytes) const {
  std::memcpy(host_dst, src, bytes);
}

void HostMemory::copy_in(void* dst, const void* host_src, uint64_t bytes) const { std::memcpy(dst, host_src, bytes); }

void HostMemory::copy_to_pool(void* pool_dst, const void* src, uint64_t bytes) const {
  res_.transfers.upload_to_pool(pool_dst, src, bytes);
}

void HostMemory::zero(void* p, uint64_t bytes) const { std::memset(p, 0, bytes); }

void HostMemory::scale(void* p, zd_dtype dt, uint64_t n, float factor) const { scale_in_place(p, dt, n, factor); }

GradStats HostMemory::sumsq(const std::vector<GradSpan>& spans) const {
  return parallel_grad_stats(res_.workers, spans);
}

void HostMemory::add_from_pool(std::span<const PoolAdd> adds, uint64_t ready) const {
  res_.transfers.add_to_host(adds, ready);
}

HostScratch& HostMemory::host_scratch() const { return res_.transfers.host_scratch(); }

void HostMemory::update(const OptimizerInstance& opt, const zd_optimizer_update& u, bool zero_grad) const {
  parallel_update(res_.workers, opt, u, zero_grad);
}

// A download waits for the device work before it (Device::mark).
uint64_t HostMemory::ready_mark() const { return res_.device->mark(); }

void HostMemory::all_reduce(const ModelContext& ctx, const zd_comm_call& c, void* buf, uint64_t count,
                            zd_dtype dt) const {
  ctx.comm().all_reduce(c, buf, count, comm_dtype(dt), ZD_REDUCE_SUM);
}

void HostMemory::reduce_scatter(const ModelContext& ctx, const zd_comm_call& c, const void* send, void* recv,
                                uint64_t recv_count, zd_dtype dt) const {
  ctx.comm().reduce_scatter(c, send, recv, recv_count, comm_dtype(dt), ZD_REDUCE_SUM);
}

void HostMemory::all_gather(const ModelContext& ctx, const zd_comm_call& c, const Memory& from, const void* send,
                            void* recv, uint64_t count, zd_dtype dt) const {
  // Gathers land in the pool (PoolMemory::all_gather); into host memory the
  // plugins read a source elsewhere from a host copy of it.
  if (&from != this) {
    res_.transfers.bounce(from, send, count * dtype_size(dt), nullptr, 0, [&](const void* host_in, void*) {
      ctx.comm().all_gather(c, host_in, recv, count, comm_dtype(dt));
    });
    return;
  }
  ctx.comm().all_gather(c, send, recv, count, comm_dtype(dt));
}

// --- NVMe ---

namespace {

// One synchronous NVMe transfer, counted (and traced) as the rank's.
void nvme_transfer(RankResources& res, const zd_tier_io& io) {
  const int64_t t0 = observe::now_ns();
  res.nvme->wait(res.nvme->submit(&io, 1));
  observe::nvme_done(res.probe, io.write != 0, io.bytes, t0, observe::now_ns(), true);
}

// Whole aligned blocks around [at, at + len) of s: read them, patch them for
// a write (then write them back), or copy the range out of them.
void nvme_range(RankResources& res, const BufferSegment& s, uint64_t at, std::byte* mine, uint64_t len, bool write) {
  const uint64_t a = res.nvme->alignment();
  const uint64_t lo = at / a * a;
  const uint64_t hi = std::min(align_up(at + len, a), s.bytes);
  AlignedBuffer bounce(hi - lo, a);
  zd_tier_io io{s.offset + lo, hi - lo, bounce.data(), 0, 0};
  nvme_transfer(res, io);
  if (write) {
    std::memcpy(bounce.data() + (at - lo), mine, len);
    io.write = 1;
    nvme_transfer(res, io);
  } else {
    std::memcpy(mine, bounce.data() + (at - lo), len);
  }
}

}  // namespace

std::string NvmeMemory::describe() const { return res_.nvme ? res_.nvme->describe() : std::string(); }

void NvmeMemory::read(const BufferSegment& s, uint64_t at, void* dst, uint64_t len) const {
  nvme_range(res_, s, at, static_cast<std::byte*>(dst), len, false);
}

void NvmeMemory::write(const BufferSegment& s, uint64_t at, const void* src, uint64_t len) const {
  nvme_range(res_, s, at, static_cast<std::byte*>(const_cast<void*>(src)), len, true);
}

HostScratch& NvmeMemory::host_scratch() const { return res_.transfers.host_scratch(); }

void NvmeMemory::refuse(const char* op) {
  fail(ZD_ERR_INTERNAL, std::string("NVMe memory has no addresses: ") + op +
                            " on bytes in the nvme tier (stage them into host memory first)");
}

}  // namespace zerod
