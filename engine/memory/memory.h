// The memories a rank's bytes live in, each an object that does the work on
// its own bytes: copies in and out, fills, scaling, adding gradients into
// it, sums of squares, and the collectives over buffers in it. The caller
// says what is to happen to which bytes ("add this bucket into that
// segment"); the memory decides which processor touches them, in the manner
// of ggml's buffer types. Three of them per rank (RankResources):
//  - the device pool, through the rank's Device (its kernels, its
//    transfers); where the host cannot address the pool, collectives go
//    between the devices or bounce through host memory (device_comm.cpp);
//  - host memory, a CPU peer: the host's own loops and the rank's workers,
//    and the comm plugins reach it directly;
//  - NVMe, reached through I/O only (copies in and out of a segment).
// Each segment of a TieredBuffer carries its memory (BufferSegment::memory),
// so code that holds a segment never asks where it is.
#pragma once

#include "memory/arena.h"
#include "grad/grad_math.h"
#include "runtime/workers.h"

#include <zerod/zerod.h>
#include <zerod/zerod_plugin.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace zerod {

class HostScratch;
class Memory;
class ModelContext;
class OptimizerInstance;
struct RankResources;

// A run of a TieredBuffer's elements in one memory (TieredBuffer::Segment).
struct BufferSegment {
  uint64_t begin = 0;  // first element
  uint64_t count = 0;
  zd_tier tier = ZD_TIER_DEVICE;
  std::byte* ptr = nullptr;  // device and host (a device pointer in the device tier)
  Block block;               // device: the pool block
  uint64_t offset = 0;       // nvme: the extent in the rank's store
  uint64_t bytes = 0;        // charged to the ledger (nvme: rounded to the alignment)
  Memory* memory = nullptr;  // the memory that holds it and works on it
};

// One add of Memory::add_from_pool: dst[i] += src[i] for n elements.
// `first`: the window's first contribution. Host memory writes it over dst
// (which may still hold what the last update read: GradReducer::
// update_zeroes counts on that); a pool's memory adds it, into the zeros
// its updates leave. `norm` (sums null: none): where the memory
// leaves_norms(), each tile's squared-norm partials of what was written.
struct PoolAdd {
  const void* src;
  zd_dtype src_dt;
  void* dst;
  zd_dtype dst_dt;
  uint64_t n;
  bool first;
  NormTiles norm{nullptr, 0};
};

class Memory {
 public:
  virtual ~Memory() = default;
  virtual zd_tier tier() const = 0;
  // What holds these bytes, for `zerod status` and the tests (the device,
  // the host or NVMe tier plugin's own words; empty while there is none).
  virtual std::string describe() const = 0;

  // --- copies between this memory and host memory the caller holds ---
  // len bytes from byte `at` of segment s.
  virtual void read(const BufferSegment& s, uint64_t at, void* dst, uint64_t len) const {
    copy_out(dst, s.ptr + at, len);
  }
  virtual void write(const BufferSegment& s, uint64_t at, const void* src, uint64_t len) const {
    copy_in(s.ptr + at, src, len);
  }
  // By address (memories with addresses: the pool and host memory). Both
  // return when the bytes are where they go.
  virtual void copy_out(void* host_dst, const void* src, uint64_t bytes) const = 0;
  virtual void copy_in(void* dst, const void* host_src, uint64_t bytes) const = 0;
  // Copies bytes of this memory into the device pool, ordered on zerod's
  // stream after the work issued so far.
  virtual void copy_to_pool(void* pool_dst, const void* src, uint64_t bytes) const = 0;

  // --- work on bytes in this memory ---
  virtual void zero(void* p, uint64_t bytes) const = 0;
  // p[i] *= factor.
  virtual void scale(void* p, zd_dtype dt, uint64_t n, float factor) const = 0;
  // The sum of squares of the spans (in double) and whether it is finite.
  virtual GradStats sumsq(const std::vector<GradSpan>& spans) const = 0;
  // For each add in order, dst[i] += src[i] for its n elements, dst here,
  // src in the device pool (a gradient view, a reduced bucket, the
  // accumulation window). Several at once keep the downloads of a memory
  // the host cannot address flowing from one to the next. `ready`:
  // ready_mark() taken when zerod's work that wrote every src was issued.
  virtual void add_from_pool(std::span<const PoolAdd> adds, uint64_t ready) const = 0;
  // What add_from_pool's `ready` must be for src written by zerod's work
  // issued so far (0: this memory's adds are ordered on zerod's stream
  // anyway).
  virtual uint64_t ready_mark() const = 0;
  // Whether add_from_pool can leave squared-norm partials (the host's adds
  // do, tile by tile while the tile is in cache; the device's do not).
  virtual bool leaves_norms() const = 0;
  // Whether the trainer may be handed a view into this memory (a block of
  // the device pool, which the trainer writes its gradients into).
  virtual bool trainer_views() const = 0;
  // Whether the host's own loops may write these bytes in place (host
  // memory, the pool of a host-addressable device); else what the host
  // makes for them goes through Transfers (an upload).
  virtual bool host_writes() const = 0;
  // Where the host's copies of these bytes live while a loop works on them
  // (HostWindow, where the host does not write them in place): the rank's
  // host scratch (host_scratch.h), counted in the host tier.
  virtual HostScratch& host_scratch() const = 0;
  // The optimizer's update where master and state are in this memory, by
  // the processor that works on it (the device's kernels, or the plugin's
  // CPU kernels in tiles on the rank's workers); with zero_grad each
  // gradient range is zeroed after its update.
  virtual void update(const OptimizerInstance& opt, const zd_optimizer_update& u, bool zero_grad) const = 0;

  // --- collectives over buffers in this memory (on the rank's stream) ---
  // buf: count elements, summed over ranks in place.
  virtual void all_reduce(const ModelContext& ctx, const zd_comm_call& c, void* buf, uint64_t count,
                          zd_dtype dt) const = 0;
  // send: recv_count * world elements, recv: recv_count elements, both here.
  virtual void reduce_scatter(const ModelContext& ctx, const zd_comm_call& c, const void* send, void* recv,
                              uint64_t recv_count, zd_dtype dt) const = 0;
  // send: count elements in `from`; recv: count * world elements here.
  virtual void all_gather(const ModelContext& ctx, const zd_comm_call& c, const Memory& from, const void* send,
                          void* recv, uint64_t count, zd_dtype dt) const = 0;
  // Whether the devices of one process read bytes of this memory with their
  // own peer copies (the pool's peer collectives need their sources there).
  virtual bool peer_readable() const = 0;
  // Whether the comm plugins read and write these bytes themselves (host
  // memory, and the pool where it is host memory: the cpu device); else the
  // collectives above go between the devices or bounce (device_comm.cpp).
  virtual bool plugins_reach() const = 0;
};

// The device pool of a rank, through its Device (looked up at each call:
// the model may wrap the device in a tracing decorator after this is made).
class PoolMemory final : public Memory {
 public:
  explicit PoolMemory(RankResources& res) : res_(res) {}
  zd_tier tier() const override { return ZD_TIER_DEVICE; }
  std::string describe() const override;
  void copy_out(void* host_dst, const void* src, uint64_t bytes) const override;
  void copy_in(void* dst, const void* host_src, uint64_t bytes) const override;
  void copy_to_pool(void* pool_dst, const void* src, uint64_t bytes) const override;
  void zero(void* p, uint64_t bytes) const override;
  void scale(void* p, zd_dtype dt, uint64_t n, float factor) const override;
  GradStats sumsq(const std::vector<GradSpan>& spans) const override;
  void add_from_pool(std::span<const PoolAdd> adds, uint64_t ready) const override;
  uint64_t ready_mark() const override { return 0; }
  bool leaves_norms() const override { return false; }
  bool trainer_views() const override { return true; }
  bool host_writes() const override;
  HostScratch& host_scratch() const override;
  void update(const OptimizerInstance& opt, const zd_optimizer_update& u, bool zero_grad) const override;
  void all_reduce(const ModelContext& ctx, const zd_comm_call& c, void* buf, uint64_t count,
                  zd_dtype dt) const override;
  void reduce_scatter(const ModelContext& ctx, const zd_comm_call& c, const void* send, void* recv,
                      uint64_t recv_count, zd_dtype dt) const override;
  void all_gather(const ModelContext& ctx, const zd_comm_call& c, const Memory& from, const void* send, void* recv,
                  uint64_t count, zd_dtype dt) const override;
  bool peer_readable() const override { return true; }
  bool plugins_reach() const override;

 private:
  RankResources& res_;
};

// Host memory: the CPU works on it (its own loops, the rank's workers), and
// what comes from the device pool arrives through the rank's Transfers.
class HostMemory final : public Memory {
 public:
  explicit HostMemory(RankResources& res) : res_(res) {}
  zd_tier tier() const override { return ZD_TIER_HOST; }
  std::string describe() const override;
  void copy_out(void* host_dst, const void* src, uint64_t bytes) const override;
  void copy_in(void* dst, const void* host_src, uint64_t bytes) const override;
  void copy_to_pool(void* pool_dst, const void* src, uint64_t bytes) const override;
  void zero(void* p, uint64_t bytes) const override;
  void scale(void* p, zd_dtype dt, uint64_t n, float factor) const override;
  GradStats sumsq(const std::vector<GradSpan>& spans) const override;
  void add_from_pool(std::span<const PoolAdd> adds, uint64_t ready) const override;
  uint64_t ready_mark() const override;
  bool leaves_norms() const override { return true; }
  bool trainer_views() const override { return false; }
  bool host_writes() const override { return true; }
  HostScratch& host_scratch() const override;
  void update(const OptimizerInstance& opt, const zd_optimizer_update& u, bool zero_grad) const override;
  void all_reduce(const ModelContext& ctx, const zd_comm_call& c, void* buf, uint64_t count,
                  zd_dtype dt) const override;
  void reduce_scatter(const ModelContext& ctx, const zd_comm_call& c, const void* send, void* recv,
                      uint64_t recv_count, zd_dtype dt) const override;
  void all_gather(const ModelContext& ctx, const zd_comm_call& c, const Memory& from, const void* send, void* recv,
                  uint64_t count, zd_dtype dt) const override;
  bool peer_readable() const override { return false; }
  bool plugins_reach() const override { return true; }

 private:
  RankResources& res_;
};

// NVMe: extents of the rank's store, reached by synchronous I/O through an
// aligned bounce buffer (read and write). Its bytes have no address, so
// everything else is refused naming the operation (a caller that gets here
// forgot to stage them; OptimizerRunner streams NVMe operands itself).
class NvmeMemory final : public Memory {
 public:
  explicit NvmeMemory(RankResources& res) : res_(res) {}
  zd_tier tier() const override { return ZD_TIER_NVME; }
  std::string describe() const override;
  void read(const BufferSegment& s, uint64_t at, void* dst, uint64_t len) const override;
  void write(const BufferSegment& s, uint64_t at, const void* src, uint64_t len) const override;
  void copy_out(void*, const void*, uint64_t) const override { refuse("copy_out"); }
  void copy_in(void*, const void*, uint64_t) const override { refuse("copy_in"); }
  void copy_to_pool(void*, const void*, uint64_t) const override { refuse("copy_to_pool"); }
  void zero(void*, uint64_t) const override { refuse("zero"); }
  void scale(void*, zd_dtype, uint64_t, float) const override { refuse("scale"); }
  GradStats sumsq(const std::vector<GradSpan>&) const override { refuse("sumsq"); }
  void add_from_pool(std::span<const PoolAdd>, uint64_t) const override { refuse("add_from_pool"); }
  uint64_t ready_mark() const override { return 0; }
  bool leaves_norms() const override { return false; }
  bool trainer_views() const override { return false; }
  bool host_writes() const override { return false; }
  HostScratch& host_scratch() const override;
  void update(const OptimizerInstance&, const zd_optimizer_update&, bool) const override { refuse("update"); }
  void all_reduce(const ModelContext&, const zd_comm_call&, void*, uint64_t, zd_dtype) const override {
    refuse("all_reduce");
  }
  void reduce_scatter(const ModelContext&, const zd_comm_call&, const void*, void*, uint64_t,
                      zd_dtype) const override {
    refuse("reduce_scatter");
  }
  void all_gather(const ModelContext&, const zd_comm_call&, const Memory&, const void*, void*, uint64_t,
                  zd_dtype) const override {
    refuse("all_gather");
  }
  bool peer_readable() const override { return false; }
  bool plugins_reach() const override { return false; }

 private:
  [[noreturn]] static void refuse(const char* op);
  RankResources& res_;
};

}  // namespace zerod
