// A device the host cannot address, emulated on the CPU: what the engine
// does on a GPU, tested on machines without one. Its blocks have addresses
// in a reserved range that is not readable or writable (PROT_NONE): the
// engine touching device memory from the host, anywhere, crashes. Its
// operations translate those addresses to a backing mapping and run the
// cpu device's code there, so a model on it must end exactly where the
// same model on the cpu device ends. Each operation checks that its
// operands are on the side it expects (device or host) and fails naming
// the call if not.
//
// Its transfers (upload, download) are asynchronous, like a GPU's copy
// engines: a thread per direction does each one a little later, in order.
// Work that reads what a transfer writes without waiting for it first
// (transfer_wait on the host, stream_waits before device work) reads the
// old bytes, so a model that forgets a wait does not end where the cpu
// device ends. Device work is done when its call returns, so stream_waits
// is the host waiting.
//
// Two uses: in-process tests (tests/engine), and a daemon's ranks (job
// scripts' device = "emulated", opened by open_shared_device): there the
// backing mapping is one sealed memfd, exported to the trainer, which maps
// it and reads and writes views in it as host memory, as a trainer on a GPU
// does through the cuda device's exported pool. An embedded trainer cannot
// use it (its views would be the unreadable addresses).
#pragma once

#include "memory/arena.h"
#include "runtime/workers.h"
#include "device.h"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace zerod {

class EmulatedDevice : public Device {
 public:
  // `exported`: the backing memory is a memfd the daemon passes to the
  // trainer (views then say ZD_DEVICE_CPU: the trainer's mapping is host
  // memory to it); else private memory (views say ZD_DEVICE_CUDA, so no
  // host code takes them for its own).
  EmulatedDevice(MemoryLedger& ledger, Workers& workers, bool exported, const std::string& name,
                 uint64_t space = uint64_t{8} << 30);
  ~EmulatedDevice() override;

  const char* name() const override { return "emulated"; }
  int32_t dlpack_type() const override { return arena_ ? ZD_DEVICE_CPU : ZD_DEVICE_CUDA; }
  int32_t ordinal() const override { return arena_ ? 0 : 7; }
  std::string describe() const override;
  bool host_addressable() const override { return false; }
  bool has_streams() const override { return true; }

  Block allocate(uint64_t bytes, zd_mem_kind kind, const std::string& what) override;
  // Filled with 0xFF bytes, not zeros: NaN in every float dtype, so a
  // block read before the caller wrote all of it shows in the results.
  Block allocate_for_overwrite(uint64_t bytes, zd_mem_kind kind, const std::string& what) override;
  void release(const Block& b, zd_mem_kind kind) override;
  // As a GPU rounds its blocks (cudaMalloc's alignment).
  static constexpr uint64_t kBlockAlign = 256;
  uint64_t block_align() const override { return kBlockAlign; }
  std::vector<PoolExport> exports() const override;
  void register_host(void* p, uint64_t) override { on_host(p, "register_host"); }
  void unregister_host(void* p) override { on_host(p, "unregister_host"); }

  void copy_to_device(void* dst, const void* src, uint64_t n) override;
  void copy_to_host(void* dst, const void* src, uint64_t n) override;
  uint64_t upload(void* dst, const void* src, uint64_t n) override;
  uint64_t mark() override { return 0; }  // device work is done when its call returns
  uint64_t download(void* dst, const void* src, uint64_t n, uint64_t after) override;
  void upload_after_stream() override {}  // device work is done already
  void transfer_wait(uint64_t t) override;
  void stream_waits(uint64_t t) override { transfer_wait(t); }
  // Transfers issued so far, per direction (a test checks they were used).
  uint64_t transfers(bool down) const;

  // Peers are other ranks' emulated devices in this process: their memory
  // is reached through their own translation, never the host's pointers.
  void wait_peer_mark(const Device&, uint64_t) override {}  // device work is done already
  void copy_peer(void* dst, const Device& peer, const void* src, uint64_t n) override;
  void sum_peers(void* dst, zd_dtype dt, uint64_t n, const std::vector<PeerSpan>& srcs) override;
  // Peer copies and sums so far (a test checks collectives used them).
  uint64_t peer_ops() const { return peer_ops_.load(); }

  void copy_within(void* dst, const void* src, uint64_t n) override;
  void zero(void* dst, uint64_t n) override;
  void accumulate(const void* s, zd_dtype sdt, void* d, zd_dtype ddt, uint64_t n) override;
  void accumulate_scaled(const void* s, zd_dtype sdt, void* d, zd_dtype ddt, uint64_t n, float f) override;
  void scale(void* p, zd_dtype dt, uint64_t n, float f) override;
  GradStats grad_stats(const std::vector<GradSpan>& spans) override;
  bool runs(const OptimizerInstance&) const override { return true; }  // the CPU kernels
  void optimizer_update(const OptimizerInstance& opt, const zd_optimizer_update& u, bool zero_grad) override;
  void set_trainer_stream(void*) override {}
  void trainer_waits() override {}
  void wait_for_trainer() override {}
  void synchronize() override {}

  // For the trainer's side of an in-process test: whether p is device
  // memory, and where its bytes really are.
  bool holds(const void* p) const { return p >= fake_ && p < fake_ + space_; }
  std::byte* on_device(const void* p, const char* call) const;

 private:
  static const EmulatedDevice& of(const Device& d);
  // A block of the pool, every byte set to `fill`.
  Block take(uint64_t bytes, zd_mem_kind kind, const std::string& what, std::byte fill);
  template <typename T>
  T* on_host(T* p, const char* call) const {
    if (holds(p)) fail_host(call);
    return p;
  }
  [[noreturn]] static void fail_host(const char* call);

  // One direction's copy engine: runs each transfer in issue order, each
  // kLagUs after the one before it may start.
  class Lane {
   public:
    static constexpr int kLagUs = 100;
    uint64_t push(std::function<void()> copy);
    void wait(uint64_t t);
    uint64_t issued() const;
    void stop();

   private:
    void loop();
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::function<void()>> queue_;
    uint64_t issued_ = 0, done_ = 0;
    bool stop_ = false;
    std::thread worker_;
  };
  static constexpr uint64_t kDownBit = uint64_t{1} << 63;

  MemoryLedger& ledger_;
  Workers& workers_;
  uint64_t space_;
  Lane lanes_[2];  // uploads, downloads
  std::atomic<uint64_t> peer_ops_{0};
  std::byte* fake_ = nullptr;
  std::byte* real_ = nullptr;
  std::unique_ptr<SharedArena> arena_;  // the backing memory when exported
  std::mutex mu_;
  RangeHeap heap_;
};

}  // namespace zerod
