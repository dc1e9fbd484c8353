// A Device that records its host<->device copies on the timeline and passes
// every call to the device it wraps. A model wraps its ranks' devices in it
// only when the job records a trace, so a job without one pays nothing.
#pragma once

#include "device/device.h"
#include "probe.h"

#include <memory>

namespace zerod::observe {

class TracedDevice final : public Device {
 public:
  TracedDevice(std::unique_ptr<Device> inner, const RankProbe& probe) : d_(std::move(inner)), probe_(probe) {}

  const char* name() const override { return d_->name(); }
  int32_t dlpack_type() const override { return d_->dlpack_type(); }
  int32_t ordinal() const override { return d_->ordinal(); }
  std::string describe() const override { return d_->describe(); }
  bool host_addressable() const override { return d_->host_addressable(); }
  bool has_streams() const override { return d_->has_streams(); }
  void share_default_budget(int ranks) override { d_->share_default_budget(ranks); }
  uint64_t memory_total() const override { return d_->memory_total(); }
  std::string gpu_uuid() const override { return d_->gpu_uuid(); }
  Block allocate(uint64_t bytes, zd_mem_kind kind, const std::string& what) override {
    return d_->allocate(bytes, kind, what);
  }
  Block allocate_for_overwrite(uint64_t bytes, zd_mem_kind kind, const std::string& what) override {
    return d_->allocate_for_overwrite(bytes, kind, what);
  }
  void release(const Block& block, zd_mem_kind kind) override { d_->release(block, kind); }
  uint64_t block_align() const override { return d_->block_align(); }
  std::vector<PoolExport> exports() const override { return d_->exports(); }
  void step_ended() override { d_->step_ended(); }
  uint64_t pool_resident_bytes() const override { return d_->pool_resident_bytes(); }
  StreamLink stream_link() const override { return d_->stream_link(); }
  void register_host(void* ptr, uint64_t bytes) override { d_->register_host(ptr, bytes); }
  void unregister_host(void* ptr) override { d_->unregister_host(ptr); }
  void copy_to_device(void* dst, const void* src, uint64_t bytes) override;
  void copy_to_host(void* dst, const void* src, uint64_t bytes) override;
  void copy_within(void* dst, const void* src, uint64_t bytes) override;
  uint64_t upload(void* dst, const void* src, uint64_t bytes) override;
  uint64_t download(void* dst, const void* src, uint64_t bytes, uint64_t after) override;
  uint64_t mark() override { return d_->mark(); }
  void upload_after_stream() override { d_->upload_after_stream(); }
  void transfer_wait(uint64_t ticket) override;
  void stream_waits(uint64_t ticket) override { d_->stream_waits(ticket); }
  void wait_peer_mark(const Device& peer, uint64_t mark) override { d_->wait_peer_mark(peer, mark); }
  void copy_peer(void* dst, const Device& peer, const void* src, uint64_t bytes) override {
    d_->copy_peer(dst, peer, src, bytes);
  }
  void sum_peers(void* dst, zd_dtype dt, uint64_t n, const std::vector<PeerSpan>& srcs) override {
    d_->sum_peers(dst, dt, n, srcs);
  }
  const Device& unwrapped() const override { return d_->unwrapped(); }
  void zero(void* dst, uint64_t bytes) override { d_->zero(dst, bytes); }
  void accumulate(const void* src, zd_dtype src_dt, void* dst, zd_dtype dst_dt, uint64_t n) override {
    d_->accumulate(src, src_dt, dst, dst_dt, n);
  }
  void accumulate_scaled(const void* src, zd_dtype src_dt, void* dst, zd_dtype dst_dt, uint64_t n,
                         float factor) override {
    d_->accumulate_scaled(src, src_dt, dst, dst_dt, n, factor);
  }
  void scale(void* p, zd_dtype dt, uint64_t n, float factor) override { d_->scale(p, dt, n, factor); }
  GradStats grad_stats(const std::vector<GradSpan>& spans) override { return d_->grad_stats(spans); }
  bool runs(const OptimizerInstance& opt) const override { return d_->runs(opt); }
  void optimizer_update(const OptimizerInstance& opt, const zd_optimizer_update& u, bool zero_grad) override;
  void set_trainer_stream(void* stream) override { d_->set_trainer_stream(stream); }
  void trainer_waits() override { d_->trainer_waits(); }
  void trainer_waits_for(uint64_t mark) override { d_->trainer_waits_for(mark); }
  void wait_for_trainer() override { d_->wait_for_trainer(); }
  bool trainer_pending() const override { return d_->trainer_pending(); }
  void release_trainer() const override { d_->release_trainer(); }
  void synchronize() override { d_->synchronize(); }

  const Device& inner() const { return *d_; }

 private:
  std::unique_ptr<Device> d_;
  const RankProbe& probe_;
};

}  // namespace zerod::observe
