// A device the host cannot address, emulated on the CPU, for testing what
// the engine does on a GPU without one. Its blocks have addresses in a
// reserved range that is not readable or writable (PROT_NONE): the engine
// touching device memory from the host, anywhere, crashes the test. Its
// operations translate those addresses to a backing mapping and run the
// cpu device's code there, so a model on it must end exactly where the same
// model on the cpu device ends. Each operation checks that its operands are
// on the side it expects (device or host) and fails naming the call if not.
//
// Its transfers (upload, download) are asynchronous, like a GPU's copy
// engines: a thread per direction does each one a little later, in order.
// Work that reads what a transfer writes without waiting for it first
// (transfer_wait on the host, stream_waits before device work) reads the
// old bytes, so a model on this device that forgets a wait does not end
// where the cpu device ends. Device work is done when its call returns, so
// stream_waits is the host waiting.
#pragma once

#include "arena.h"
#include "device/device.h"
#include "dtype.h"
#include "error.h"
#include "grad_math.h"
#include "plugin_host.h"
#include "workers.h"

#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace zerod_test {

class OpaqueDevice final : public zerod::Device {
 public:
  static constexpr uint64_t kSpace = uint64_t{8} << 30;  // address space, reserved, not committed

  OpaqueDevice(zerod::MemoryLedger& ledger, zerod::Workers& workers) : ledger_(ledger), workers_(workers) {
    fake_ = static_cast<std::byte*>(
        mmap(nullptr, kSpace, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
    real_ = static_cast<std::byte*>(
        mmap(nullptr, kSpace, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
    if (fake_ == MAP_FAILED || real_ == MAP_FAILED) zerod::fail(ZD_ERR_OUT_OF_MEMORY, "opaque device: mmap");
  }
  ~OpaqueDevice() override {
    for (Lane& l : lanes_) l.stop();
    munmap(fake_, kSpace);
    munmap(real_, kSpace);
  }

  const char* name() const override { return "opaque"; }
  int32_t dlpack_type() const override { return ZD_DEVICE_CUDA; }
  int32_t ordinal() const override { return 7; }
  std::string describe() const override { return "an emulated device the host cannot address (tests)"; }
  bool host_addressable() const override { return false; }

  zerod::Block allocate(uint64_t bytes, zd_mem_kind kind, const std::string& what) override {
    const uint64_t size = (std::max<uint64_t>(bytes, 1) + 255) / 256 * 256;
    ledger_.charge(ZD_TIER_DEVICE, kind, size, what);
    uint64_t off = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!heap_.allocate(size, 256, &off)) {
        ledger_.release(ZD_TIER_DEVICE, kind, size);
        zerod::fail(ZD_ERR_OUT_OF_MEMORY, "opaque device: out of address space for " + what);
      }
    }
    std::memset(real_ + off, 0, size);
    return zerod::Block{fake_ + off, size, -1, 0};
  }
  void release(const zerod::Block& b, zd_mem_kind kind) override {
    if (!b) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      heap_.release(static_cast<uint64_t>(on_device(b.ptr, "release") - real_), b.bytes);
    }
    ledger_.release(ZD_TIER_DEVICE, kind, b.bytes);
  }
  std::vector<zerod::PoolExport> exports() const override { return {}; }
  void register_host(void* p, uint64_t) override { on_host(p, "register_host"); }
  void unregister_host(void* p) override { on_host(p, "unregister_host"); }

  void copy_to_device(void* dst, const void* src, uint64_t n) override {
    std::memcpy(on_device(dst, "copy_to_device"), on_host(src, "copy_to_device"), n);
  }
  void copy_to_host(void* dst, const void* src, uint64_t n) override {
    std::memcpy(on_host(dst, "copy_to_host"), on_device(src, "copy_to_host"), n);
  }
  uint64_t upload(void* dst, const void* src, uint64_t n) override {
    std::byte* d = on_device(dst, "upload");
    const void* h = on_host(src, "upload");
    return lanes_[0].push([=] { std::memcpy(d, h, n); });
  }
  uint64_t mark() override { return 0; }  // device work is done when its call returns
  uint64_t download(void* dst, const void* src, uint64_t n, uint64_t) override {
    void* h = on_host(dst, "download");
    const std::byte* d = on_device(src, "download");
    return lanes_[1].push([=] { std::memcpy(h, d, n); }) | kDownBit;
  }
  void upload_after_stream() override {}  // device work is done already
  void transfer_wait(uint64_t t) override {
    if (t) lanes_[(t & kDownBit) ? 1 : 0].wait(t & ~kDownBit);
  }
  void stream_waits(uint64_t t) override { transfer_wait(t); }
  // Transfers issued so far, per direction (a test checks they were used).
  uint64_t transfers(bool down) const { return lanes_[down ? 1 : 0].issued(); }

  // Peers are other ranks' emulated devices in this process: their memory
  // is reached through their own translation, never the host's pointers.
  void wait_peer_mark(const zerod::Device&, uint64_t) override {}  // device work is done already
  void copy_peer(void* dst, const zerod::Device& peer, const void* src, uint64_t n) override {
    std::memmove(on_device(dst, "copy_peer"), of(peer).on_device(src, "copy_peer"), n);
    ++peer_ops_;
  }
  void sum_peers(void* dst, zd_dtype dt, uint64_t n, const std::vector<PeerSpan>& srcs) override {
    std::vector<const void*> from;
    for (const PeerSpan& s : srcs) from.push_back(of(*s.device).on_device(s.data, "sum_peers"));
    zerod::sum_sources(from.data(), from.size(), on_device(dst, "sum_peers"), dt, n);
    ++peer_ops_;
  }
  // Peer copies and sums so far (a test checks collectives used them).
  uint64_t peer_ops() const { return peer_ops_.load(); }

  void copy_within(void* dst, const void* src, uint64_t n) override {
    std::memmove(on_device(dst, "copy_within"), on_device(src, "copy_within"), n);
  }
  void zero(void* dst, uint64_t n) override { std::memset(on_device(dst, "zero"), 0, n); }
  void accumulate(const void* s, zd_dtype sdt, void* d, zd_dtype ddt, uint64_t n) override {
    zerod::accumulate(on_device(s, "accumulate"), sdt, on_device(d, "accumulate"), ddt, n);
  }
  void accumulate_scaled(const void* s, zd_dtype sdt, void* d, zd_dtype ddt, uint64_t n, float f) override {
    zerod::accumulate_scaled(on_device(s, "accumulate_scaled"), sdt, on_device(d, "accumulate_scaled"), ddt, n, f);
  }
  void scale(void* p, zd_dtype dt, uint64_t n, float f) override { zerod::scale_in_place(on_device(p, "scale"), dt, n, f); }
  zerod::GradStats grad_stats(const std::vector<zerod::GradSpan>& spans) override {
    std::vector<zerod::GradSpan> real = spans;
    for (auto& s : real) s.data = on_device(s.data, "grad_stats");
    return zerod::parallel_grad_stats(workers_, real);
  }
  bool runs(const zerod::OptimizerInstance&) const override { return true; }  // the CPU kernels
  void optimizer_update(const zerod::OptimizerInstance& opt, const zd_optimizer_update& u, bool zero_grad) override {
    zd_optimizer_update r = u;
    r.master = reinterpret_cast<float*>(on_device(u.master, "optimizer_update"));
    if (u.grad) r.grad = on_device(u.grad, "optimizer_update");
    if (u.work) r.work = on_device(u.work, "optimizer_update");
    for (uint32_t k = 0; k < opt.state_slots(); ++k) r.state[k] = reinterpret_cast<float*>(on_device(u.state[k], "optimizer_update"));
    zerod::parallel_update(workers_, opt, r, zero_grad);
  }
  void set_trainer_stream(void*) override {}
  void trainer_waits() override {}
  void wait_for_trainer() override {}
  void synchronize() override {}

  // For the trainer's side of a test: host copies of device memory.
  bool holds(const void* p) const { return p >= fake_ && p < fake_ + kSpace; }

 private:
  static const OpaqueDevice& of(const zerod::Device& d) {
    const auto* o = dynamic_cast<const OpaqueDevice*>(&d.unwrapped());
    if (!o) zerod::fail(ZD_ERR_INTERNAL, "opaque device: a peer that is not an opaque device");
    return *o;
  }
  std::byte* on_device(const void* p, const char* call) const {
    if (!holds(p)) zerod::fail(ZD_ERR_INTERNAL, std::string("opaque device: ") + call + " got a host pointer where device memory belongs");
    return real_ + (static_cast<const std::byte*>(p) - fake_);
  }
  template <typename T>
  T* on_host(T* p, const char* call) const {
    if (holds(p)) zerod::fail(ZD_ERR_INTERNAL, std::string("opaque device: ") + call + " got device memory where host memory belongs");
    return p;
  }

  // One direction's copy engine: runs each transfer in issue order, each
  // kLagUs after the one before it may start.
  class Lane {
   public:
    static constexpr int kLagUs = 100;
    uint64_t push(std::function<void()> copy) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!worker_.joinable()) worker_ = std::thread([this] { loop(); });
      queue_.push_back(std::move(copy));
      cv_.notify_all();
      return ++issued_;
    }
    void wait(uint64_t t) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return done_ >= t; });
    }
    uint64_t issued() const {
      std::lock_guard<std::mutex> lock(mu_);
      return issued_;
    }
    void stop() {
      {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
        cv_.notify_all();
      }
      if (worker_.joinable()) worker_.join();
    }

   private:
    void loop() {
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
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::function<void()>> queue_;
    uint64_t issued_ = 0, done_ = 0;
    bool stop_ = false;
    std::thread worker_;
  };
  static constexpr uint64_t kDownBit = uint64_t{1} << 63;

  zerod::MemoryLedger& ledger_;
  zerod::Workers& workers_;
  Lane lanes_[2];  // uploads, downloads
  std::atomic<uint64_t> peer_ops_{0};
  std::byte* fake_ = nullptr;
  std::byte* real_ = nullptr;
  std::mutex mu_;
  zerod::RangeHeap heap_{kSpace};
};

}  // namespace zerod_test
