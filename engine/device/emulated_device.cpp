#include "emulated_device.h"

#include "runtime/dtype.h"
#include "error.h"
#include "grad/grad_math.h"
#include "runtime/plugin_host.h"
#include "runtime/workers.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstring>

namespace zerod {

EmulatedDevice::EmulatedDevice(MemoryLedger& ledger, Workers& workers, bool exported, const std::string& name,
                               uint64_t space)
    : ledger_(ledger), workers_(workers), space_(space), heap_(space) {
  fake_ = static_cast<std::byte*>(mmap(nullptr, space_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
  if (fake_ == MAP_FAILED) fail(ZD_ERR_OUT_OF_MEMORY, "emulated device: reserving its address space");
  if (exported) {
    // One arena, sparse: only what blocks use is ever touched. Its id is 0,
    // the first (and only) export.
    arena_ = std::make_unique<SharedArena>(0, space_, name.empty() ? "zerod-emulated" : name);
    real_ = arena_->base();
  } else {
    real_ = static_cast<std::byte*>(
        mmap(nullptr, space_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
    if (real_ == MAP_FAILED) {
      munmap(fake_, space_);
      fail(ZD_ERR_OUT_OF_MEMORY, "emulated device: mapping its memory");
    }
  }
}

EmulatedDevice::~EmulatedDevice() {
  for (Lane& l : lanes_) l.stop();
  munmap(fake_, space_);
  if (!arena_) munmap(real_, space_);
}

std::string EmulatedDevice::describe() const {
  return std::string("emulated device: memory the engine cannot address, on the CPU (for tests") +
         (arena_ ? "; exported to the trainer)" : ")");
}

Block EmulatedDevice::allocate(uint64_t bytes, zd_mem_kind kind, const std::string& what) {
  return take(bytes, kind, what, std::byte{0});
}

Block EmulatedDevice::allocate_for_overwrite(uint64_t bytes, zd_mem_kind kind, const std::string& what) {
  return take(bytes, kind, what, std::byte{0xFF});
}

Block EmulatedDevice::take(uint64_t bytes, zd_mem_kind kind, const std::string& what, std::byte fill) {
  const uint64_t size = (std::max<uint64_t>(bytes, 1) + kBlockAlign - 1) / kBlockAlign * kBlockAlign;
  ledger_.charge(ZD_TIER_DEVICE, kind, size, what);
  uint64_t off = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!heap_.allocate(size, kBlockAlign, &off)) {
      ledger_.release(ZD_TIER_DEVICE, kind, size);
      fail(ZD_ERR_OUT_OF_MEMORY, "emulated device: out of its " + format_bytes(space_) + " for " + what);
    }
  }
  std::memset(real_ + off, std::to_integer<int>(fill), size);
  return Block{fake_ + off, size, arena_ ? arena_->id() : -1, arena_ ? off : 0};
}

void EmulatedDevice::release(const Block& b, zd_mem_kind kind) {
  if (!b) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    heap_.release(static_cast<uint64_t>(on_device(b.ptr, "release") - real_), b.bytes);
  }
  ledger_.release(ZD_TIER_DEVICE, kind, b.bytes);
}

std::vector<PoolExport> EmulatedDevice::exports() const {
  if (!arena_) return {};
  return {PoolExport{arena_->id(), arena_->size(), arena_->fd(), ZD_DEVICE_CPU, 0}};
}

void EmulatedDevice::copy_to_device(void* dst, const void* src, uint64_t n) {
  std::memcpy(on_device(dst, "copy_to_device"), on_host(src, "copy_to_device"), n);
}
void EmulatedDevice::copy_to_host(void* dst, const void* src, uint64_t n) {
  std::memcpy(on_host(dst, "copy_to_host"), on_device(src, "copy_to_host"), n);
}
uint64_t EmulatedDevice::upload(void* dst, const void* src, uint64_t n) {
  std::byte* d = on_device(dst, "upload");
  const void* h = on_host(src, "upload");
  return lanes_[0].push([=] { std::memcpy(d, h, n); });
}
uint64_t EmulatedDevice::download(void* dst, const void* src, uint64_t n, uint64_t) {
  void* h = on_host(dst, "download");
  const std::byte* d = on_device(src, "download");
  return lanes_[1].push([=] { std::memcpy(h, d, n); }) | kDownBit;
}
void EmulatedDevice::transfer_wait(uint64_t t) {
  if (t) lanes_[(t & kDownBit) ? 1 : 0].wait(t & ~kDownBit);
}
uint64_t EmulatedDevice::transfers(bool down) const { return lanes_[down ? 1 : 0].issued(); }

void EmulatedDevice::copy_peer(void* dst, const Device& peer, const void* src, uint64_t n) {
  std::memmove(on_device(dst, "copy_peer"), of(peer).on_device(src, "copy_peer"), n);
  ++peer_ops_;
}
void EmulatedDevice::sum_peers(void* dst, zd_dtype dt, uint64_t n, const std::vector<PeerSpan>& srcs) {
  std::vector<const void*> from;
  for (const PeerSpan& s : srcs) from.push_back(of(*s.device).on_device(s.data, "sum_peers"));
  sum_sources(from.data(), from.size(), on_device(dst, "sum_peers"), dt, n);
  ++peer_ops_;
}

void EmulatedDevice::copy_within(void* dst, const void* src, uint64_t n) {
  std::memmove(on_device(dst, "copy_within"), on_device(src, "copy_within"), n);
}
void EmulatedDevice::zero(void* dst, uint64_t n) { std::memset(on_device(dst, "zero"), 0, n); }
void EmulatedDevice::accumulate(const void* s, zd_dtype sdt, void* d, zd_dtype ddt, uint64_t n) {
  zerod::accumulate(on_device(s, "accumulate"), sdt, on_device(d, "accumulate"), ddt, n);
}
void EmulatedDevice::accumulate_scaled(const void* s, zd_dtype sdt, void* d, zd_dtype ddt, uint64_t n, float f) {
  zerod::accumulate_scaled(on_device(s, "accumulate_scaled"), sdt, on_device(d, "accumulate_scaled"), ddt, n, f);
}
void EmulatedDevice::scale(void* p, zd_dtype dt, uint64_t n, float f) {
  scale_in_place(on_device(p, "scale"), dt, n, f);
}
GradStats EmulatedDevice::grad_stats(const std::vector<GradSpan>& spans) {
  std::vector<GradSpan> real = spans;
  for (auto& s : real) s.data = on_device(s.data, "grad_stats");
  return parallel_grad_stats(workers_, real);
}
void EmulatedDevice::optimizer_update(const OptimizerInstance& opt, const zd_optimizer_update& u, bool zero_grad) {
  zd_optimizer_update r = u;
  r.master = reinterpret_cast<float*>(on_device(u.master, "optimizer_update"));
  if (u.grad) r.grad = on_device(u.grad, "optimizer_update");
  if (u.work) r.work = on_device(u.work, "optimizer_update");
  for (uint32_t k = 0; k < opt.state_slots(); ++k)
    r.state[k] = reinterpret_cast<float*>(on_device(u.state[k], "optimizer_update"));
  parallel_update(workers_, opt, r, zero_grad);
}

const EmulatedDevice& EmulatedDevice::of(const Device& d) {
  const auto* o = dynamic_cast<const EmulatedDevice*>(&d.unwrapped());
  if (!o) fail(ZD_ERR_INTERNAL, "emulated device: a peer that is not an emulated device");
  return *o;
}

std::byte* EmulatedDevice::on_device(const void* p, const char* call) const {
  if (!holds(p))
    fail(ZD_ERR_INTERNAL, std::string("emulated device: ") + call + " got a host pointer where device memory belongs");
  return real_ + (static_cast<const std::byte*>(p) - fake_);
}

void EmulatedDevice::fail_host(const char* call) {
  fail(ZD_ERR_INTERNAL, std::string("emulated device: ") + call + " got device memory where host memory belongs");
}

uint64_t EmulatedDevice::Lane::push(std::function<void()> copy) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!worker_.joinable()) worker_ = std::thread([this] { loop(); });
  queue_.push_back(std::move(copy));
  cv_.notify_all();
  return ++issued_;
}
void EmulatedDevice::Lane::wait(uint64_t t) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_ >= t; });
}
uint64_t EmulatedDevice::Lane::issued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return issued_;
}
void EmulatedDevice::Lane::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  if (worker_.joinable()) worker_.join();
}
void EmulatedDevice::Lane::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;
    std::function<void()> copy = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(kLagUs));
    copy();
    lock.lock();
    ++done_;
    cv_.notify_all();
  }
}

}  // namespace zerod
