#include "cpu_device.h"

#include "error.h"

#include <cstring>

namespace zerod {

CpuDevice::CpuDevice(MemoryLedger& ledger, Workers& workers, uint64_t chunk_bytes, std::string name)
    : pool_(ledger, chunk_bytes, std::move(name)), workers_(workers) {}

std::string CpuDevice::describe() const { return "cpu device: a shared-memory pool in host RAM"; }

Block CpuDevice::allocate(uint64_t bytes, zd_mem_kind kind, const std::string& what) {
  return pool_.allocate(bytes, kind, what);
}

Block CpuDevice::allocate_for_overwrite(uint64_t bytes, zd_mem_kind kind, const std::string& what) {
  return pool_.allocate(bytes, kind, what, false);
}

void CpuDevice::release(const Block& block, zd_mem_kind kind) { pool_.release(block, kind); }

std::vector<PoolExport> CpuDevice::exports() const {
  std::vector<PoolExport> out;
  for (const SharedArena* a : pool_.arenas()) out.push_back({a->id(), a->size(), a->fd(), ZD_DEVICE_CPU, 0});
  return out;
}

void CpuDevice::copy_to_device(void* dst, const void* src, uint64_t bytes) { std::memcpy(dst, src, bytes); }
void CpuDevice::copy_to_host(void* dst, const void* src, uint64_t bytes) { std::memcpy(dst, src, bytes); }
void CpuDevice::copy_within(void* dst, const void* src, uint64_t bytes) { std::memmove(dst, src, bytes); }
void CpuDevice::zero(void* dst, uint64_t bytes) { std::memset(dst, 0, bytes); }

void CpuDevice::sum_peers(void* dst, zd_dtype dt, uint64_t n, const std::vector<PeerSpan>& srcs) {
  std::vector<const void*> from;
  for (const PeerSpan& s : srcs) from.push_back(s.data);
  sum_sources(from.data(), from.size(), dst, dt, n);
}

void CpuDevice::accumulate(const void* src, zd_dtype src_dt, void* dst, zd_dtype dst_dt, uint64_t n) {
  zerod::accumulate(src, src_dt, dst, dst_dt, n);
}

void CpuDevice::accumulate_scaled(const void* src, zd_dtype src_dt, void* dst, zd_dtype dst_dt, uint64_t n,
                                  float factor) {
  zerod::accumulate_scaled(src, src_dt, dst, dst_dt, n, factor);
}

void CpuDevice::scale(void* p, zd_dtype dt, uint64_t n, float factor) { scale_in_place(p, dt, n, factor); }

GradStats CpuDevice::grad_stats(const std::vector<GradSpan>& spans) { return parallel_grad_stats(workers_, spans); }

void CpuDevice::optimizer_update(const OptimizerInstance& opt, const zd_optimizer_update& u, bool zero_grad) {
  parallel_update(workers_, opt, u, zero_grad);
}

void CpuDevice::set_trainer_stream(void* stream) {
  if (stream)
    fail(ZD_ERR_INVALID_ARGUMENT,
         "zd_model_set_stream: this job computes on the cpu device, which has no streams; pass NULL, or set "
         "device = \"cuda\" in the job script to train on a GPU");
}

}  // namespace zerod
