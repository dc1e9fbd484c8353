// The cpu device: a rank's "device" memory is a bounded pool of memfd arenas
// (DevicePool), so residency, budgets and offload behave as on a GPU, and the
// daemon can share the pool with its trainers. Work runs on the calling
// thread (copies, gradient arithmetic) or the rank's workers (statistics,
// the optimizer) and is complete when a call returns.
#pragma once

#include "device.h"
#include "runtime/workers.h"

#include <memory>

namespace zerod {

class CpuDevice final : public Device {
 public:
  // chunk_bytes: the size of each memfd arena the pool grows by.
  CpuDevice(MemoryLedger& ledger, Workers& workers, uint64_t chunk_bytes, std::string name);

  const char* name() const override { return "cpu"; }
  int32_t dlpack_type() const override { return ZD_DEVICE_CPU; }
  int32_t ordinal() const override { return 0; }
  std::string describe() const override;
  bool host_addressable() const override { return true; }
  bool has_streams() const override { return false; }

  Block allocate(uint64_t bytes, zd_mem_kind kind, const std::string& what) override;
  Block allocate_for_overwrite(uint64_t bytes, zd_mem_kind kind, const std::string& what) override;
  void release(const Block& block, zd_mem_kind kind) override;
  void step_ended() override { pool_.end_step(); }
  uint64_t pool_resident_bytes() const override { return pool_.resident_bytes(); }
  uint64_t block_align() const override { return DevicePool::kAlign; }
  std::vector<PoolExport> exports() const override;
  void register_host(void*, uint64_t) override {}
  void unregister_host(void*) override {}

  void copy_to_device(void* dst, const void* src, uint64_t bytes) override;
  void copy_to_host(void* dst, const void* src, uint64_t bytes) override;
  void copy_within(void* dst, const void* src, uint64_t bytes) override;
  // Transfers are copies on the calling thread, complete on return.
  uint64_t upload(void* dst, const void* src, uint64_t bytes) override {
    copy_to_device(dst, src, bytes);
    return 0;
  }
  uint64_t download(void* dst, const void* src, uint64_t bytes, uint64_t) override {
    copy_to_host(dst, src, bytes);
    return 0;
  }
  uint64_t mark() override { return 0; }
  void upload_after_stream() override {}
  void transfer_wait(uint64_t) override {}
  void stream_waits(uint64_t) override {}
  void wait_peer_mark(const Device&, uint64_t) override {}
  void copy_peer(void* dst, const Device&, const void* src, uint64_t bytes) override { copy_within(dst, src, bytes); }
  void sum_peers(void* dst, zd_dtype dt, uint64_t n, const std::vector<PeerSpan>& srcs) override;
  void zero(void* dst, uint64_t bytes) override;
  void accumulate(const void* src, zd_dtype src_dt, void* dst, zd_dtype dst_dt, uint64_t n) override;
  void accumulate_scaled(const void* src, zd_dtype src_dt, void* dst, zd_dtype dst_dt, uint64_t n,
                         float factor) override;
  void scale(void* p, zd_dtype dt, uint64_t n, float factor) override;
  GradStats grad_stats(const std::vector<GradSpan>& spans) override;
  bool runs(const OptimizerInstance&) const override { return true; }
  void optimizer_update(const OptimizerInstance& opt, const zd_optimizer_update& u, bool zero_grad) override;

  void set_trainer_stream(void* stream) override;
  void trainer_waits() override {}
  void wait_for_trainer() override {}
  void synchronize() override {}

 private:
  DevicePool pool_;
  Workers& workers_;
};

}  // namespace zerod
