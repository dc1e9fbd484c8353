// The device a rank computes on, behind one small interface: its memory pool
// and the few things the engine does to that memory itself — copies between
// it and host memory, fills, gradient arithmetic, the statistics a step
// needs, and the optimizer's update of state that lives there. The engine
// calls these for every byte in the device tier, whatever the device is.
//
// Two peers implement it (DESIGN.md §9): `cpu`, a bounded pool of shared
// memory that stands in for a GPU on machines without one (and in every
// test), and `cuda`, HBM on an NVIDIA GPU (built when nvcc is found).
//
// Ordering. Work is issued on zerod's own stream for the rank: each call is
// ordered after the calls before it. A call returns once its host-side
// inputs may be reused; device memory it writes is ready for later work on
// zerod's stream, and for the host after synchronize() (calls that hand a
// result to the host — copy_to_host, grad_stats — wait for it themselves).
// The trainer computes on a stream of its own: trainer_waits() makes the
// trainer's later work wait for zerod's work issued so far (after a begin
// call made parameters resident, after a step wrote the working copies), and
// wait_for_trainer() makes zerod's later work wait for what the trainer
// issued so far (gradients it wrote before backward_end). On the cpu device
// every call completes before it returns and both are no-ops.
#pragma once

#include "memory/arena.h"
#include "grad/grad_math.h"

#include <zerod/zerod.h>
#include <zerod/zerod_plugin.h>

#include <cstdint>
#include <string>
#include <vector>

namespace zerod {

class OptimizerInstance;

// A region of a rank's device pool that another process maps (daemon
// mode): the daemon passes its fd once over the socket (SCM_RIGHTS), and a
// view is (id, offset, length) in it, as Blocks say.
struct PoolExport {
  int32_t id = 0;  // the arena number of the Blocks inside it
  uint64_t size = 0;
  int fd = -1;  // owned by the device; whoever sends it passes a copy
  // ZD_DEVICE_CPU: a sealed memfd, mapped with mmap. ZD_DEVICE_CUDA: a CUDA
  // virtual-memory allocation, imported and mapped on GPU device_id
  // (device/cuda_shared.h).
  int32_t device_type = ZD_DEVICE_CPU;
  int32_t device_id = 0;
};

// Daemon mode on a device with streams: what orders a trainer's stream, in
// its own process, against zerod's stream (device/cuda_shared.h,
// SharedSignals): a sealed memfd page of signals (device/signal_page.h),
// `page_fd`, which both processes map and register with the GPU. The fd is
// owned by the device; whoever sends it passes a copy. -1 where there is
// none. zerod records kZerodDone where
// trainer_waits() would make a local trainer's stream wait, and the
// trainer's stream waits for it after each begin call; the trainer records
// kTrainerDone on its stream before each call, and wait_for_trainer() makes
// zerod's stream wait for it.
struct StreamLink {
  int page_fd = -1;
};

class Device {
 public:
  virtual ~Device() = default;

  virtual const char* name() const = 0;    // "cpu", "cuda"
  virtual int32_t dlpack_type() const = 0; // ZD_DEVICE_CPU or ZD_DEVICE_CUDA (DLPack's numbers)
  virtual int32_t ordinal() const = 0;     // the device id views report
  virtual std::string describe() const = 0;
  // Whether host code may read and write pool memory through its pointers.
  virtual bool host_addressable() const = 0;
  // Whether the device orders work on streams, so that the trainer's stream
  // (set_trainer_stream) matters to what zerod has issued: a GPU, and the
  // emulated device standing in for one. The cpu device does each call
  // before it returns and has no stream to change.
  virtual bool has_streams() const = 0;
  // `ranks` ranks of this process have their pools on this device (a
  // daemon's ranks sharing one GPU): a budget the device chose itself (the
  // job set none) becomes this rank's share of it, not the whole of it for
  // each. A budget the job set is left as it is.
  virtual void share_default_budget(int ranks) { (void)ranks; }
  // The memory of the one GPU this pool is on, in all; 0 where the pool is
  // not one device's (the cpu device: host memory).
  virtual uint64_t memory_total() const { return 0; }
  // The 16 bytes of that GPU's UUID (the same in every process, whatever
  // its numbering of the GPUs); empty where the pool is not a GPU's.
  virtual std::string gpu_uuid() const { return {}; }

  // --- the pool: zero-filled, aligned blocks, charged to the rank's ledger
  // in the device tier. Throws ZD_ERR_BUDGET (naming `what`) past the device
  // budget, ZD_ERR_OUT_OF_MEMORY when the device refuses. ---
  virtual Block allocate(uint64_t bytes, zd_mem_kind kind, const std::string& what) = 0;
  // A block whose every byte the caller writes before anything reads it (a
  // gathered copy of parameters, a sum's scratch): as allocate(), but not
  // zero-filled where the device can skip the fill. On a GPU the fill is a
  // memset on zerod's stream ahead of each gather, as many bytes again as
  // the gather writes; on the cpu device a host memset under the pool's
  // lock. The emulated device fills it with 0xFF bytes instead (NaN in
  // every float dtype), so that a read before the write shows in results.
  virtual Block allocate_for_overwrite(uint64_t bytes, zd_mem_kind kind, const std::string& what) {
    return allocate(bytes, kind, what);
  }
  virtual void release(const Block& block, zd_mem_kind kind) = 0;
  // The rank's step ended (zd_step at an accumulation boundary): a pool
  // may give back to the system memory its free blocks hold that the step
  // did not use (the cpu device does; a GPU pool keeps its chunks).
  virtual void step_ended() {}
  // The host RAM the pool holds now, where its memory is the host's (the
  // cpu device: the pages of its live blocks and those its steps reuse,
  // which the ledger's bytes do not count); 0 where it does not say.
  virtual uint64_t pool_resident_bytes() const { return 0; }
  // Every block is rounded up to a multiple of this, and charged so: the
  // plan (Placement::need_table) rounds the device row alike, so that it
  // is the ledger's figure on every device (a GPU's 256 bytes, the cpu
  // pool's 64).
  virtual uint64_t block_align() const = 0;
  // The regions blocks live in that another process can map (the daemon
  // passes them to its trainers), in creation order; empty when the pool
  // cannot be shared.
  virtual std::vector<PoolExport> exports() const = 0;
  virtual StreamLink stream_link() const { return {}; }

  // Host memory the engine allocates itself and the device copies from and
  // to often (the NVMe staging buffers): the cuda device page-locks it so
  // copies run asynchronously at full speed. (The host tier plugin
  // page-locks its own allocations.)
  virtual void register_host(void* ptr, uint64_t bytes) = 0;
  virtual void unregister_host(void* ptr) = 0;

  // --- work on zerod's stream ---
  virtual void copy_to_device(void* dst, const void* src, uint64_t bytes) = 0;
  // Returns when dst holds the bytes.
  virtual void copy_to_host(void* dst, const void* src, uint64_t bytes) = 0;
  virtual void copy_within(void* dst, const void* src, uint64_t bytes) = 0;
  virtual void zero(void* dst, uint64_t bytes) = 0;
  // dst[i] += src[i] (16-bit results rounded to nearest even); both on the device.
  virtual void accumulate(const void* src, zd_dtype src_dt, void* dst, zd_dtype dst_dt, uint64_t n) = 0;
  // dst[i] += factor * src[i]; both on the device.
  virtual void accumulate_scaled(const void* src, zd_dtype src_dt, void* dst, zd_dtype dst_dt, uint64_t n,
                                 float factor) = 0;
  // p[i] *= factor.
  virtual void scale(void* p, zd_dtype dt, uint64_t n, float factor) = 0;
  // The sum of squares of all spans (in double) and whether it is finite;
  // returns when the figure is known.
  virtual GradStats grad_stats(const std::vector<GradSpan>& spans) = 0;
  // Whether the optimizer plugin has kernels for this device (the cuda
  // device runs the plugin's update_cuda).
  virtual bool runs(const OptimizerInstance& opt) const = 0;
  // The optimizer's update where every operand of u is in the pool; with
  // zero_grad the gradient range is zeroed after its update.
  virtual void optimizer_update(const OptimizerInstance& opt, const zd_optimizer_update& u, bool zero_grad) = 0;

  // --- transfers beside zerod's stream ---
  // Copies between pool memory and host memory on queues of their own, one
  // per direction (a GPU's copy engines), so that gradients leaving the
  // device never hold up parameters arriving, and neither waits behind
  // zerod's kernels: a traced offloaded step on an H100 had the backward's
  // gathers queued behind the gradient copies for 300 ms of a 930 ms step.
  // Each returns a ticket (0: already complete): transfer_wait(t) makes the
  // host wait for it and every earlier transfer in its direction,
  // stream_waits(t) makes zerod's later work wait for it. Host memory given
  // to a transfer must stay valid, and unchanged (upload) or unread
  // (download), until the host waited for it.
  // A download is ordered after the mark() it names (its source was written
  // by zerod's work before it; 0: after nothing). An upload is ordered only
  // after earlier uploads, and
  // after zerod's work issued before the last upload_after_stream(): call
  // that before uploading into memory zerod's stream may still be reading
  // (a block just released to the pool, a shard a gather reads).
  virtual uint64_t upload(void* dst, const void* src, uint64_t bytes) = 0;
  virtual uint64_t download(void* dst, const void* src, uint64_t bytes, uint64_t after) = 0;
  // A point in zerod's work issued so far, for downloads to wait on (0:
  // nothing pending). Taken where the bytes are ready (a bucket just
  // reduced), not where the download is issued: the thread that downloads
  // runs behind, and by then zerod's stream holds later work (it waits on
  // the trainer's backward), which a download must not wait for. On an H200
  // that wait serialised the last micro-batch's gradients behind the whole
  // backward, about 600 ms of a 1040 ms step.
  virtual uint64_t mark() = 0;
  virtual void upload_after_stream() = 0;
  virtual void transfer_wait(uint64_t ticket) = 0;
  virtual void stream_waits(uint64_t ticket) = 0;

  // --- collectives between the devices of one process (PeerBoard) ---
  // `peer` is another rank's device of the same kind in this process; its
  // memory is read with the device's own copies, never through the host.
  // zerod's stream waits for the peer's mark().
  virtual void wait_peer_mark(const Device& peer, uint64_t mark) = 0;
  // bytes from src in peer's pool to dst in this one, on zerod's stream.
  virtual void copy_peer(void* dst, const Device& peer, const void* src, uint64_t bytes) = 0;
  // dst[i] = the sum over k, in k's order, of srcs[k][i] (each on this
  // device or a peer): as the local comm plugin sums, 16-bit values in fp32
  // and rounded once, so that ranks and plugins agree to the bit.
  struct PeerSpan {
    const Device* device;
    const void* data;
  };
  virtual void sum_peers(void* dst, zd_dtype dt, uint64_t n, const std::vector<PeerSpan>& srcs) = 0;
  // The device this one wraps (TracedDevice), else itself: what a peer
  // looks into.
  virtual const Device& unwrapped() const { return *this; }

  // --- the trainer's stream ---
  // The stream the trainer computes on (a cudaStream_t; nullptr = the
  // default stream). The cpu device accepts only nullptr.
  virtual void set_trainer_stream(void* stream) = 0;
  virtual void trainer_waits() = 0;
  // As trainer_waits(), but only for zerod's work up to `mark` (a mark()
  // taken right after the work whose results the trainer reads was issued;
  // 0: nothing pending). A forward then waits for its own module's gather,
  // not for the gathers of later modules issued after it (prefetch), which
  // a wait at the end of zerod's stream also held it behind. Where the
  // trainer's stream cannot wait for a point (a trainer in another
  // process), it waits for all of zerod's work so far, as trainer_waits().
  virtual void trainer_waits_for(uint64_t mark) {
    (void)mark;
    trainer_waits();
  }
  virtual void wait_for_trainer() = 0;
  // A daemon's rank whose trainer process is gone: whether the trainer's
  // latest record of kTrainerDone has not run yet (a trainer killed with
  // work still queued on its stream never runs it, so zerod's stream would
  // wait for it forever), and the release of that wait. Call
  // release_trainer() only once the trainer can no longer run work on the
  // GPU (its process has exited). Without a StreamLink, neither applies.
  virtual bool trainer_pending() const { return false; }
  virtual void release_trainer() const {}
  // The host waits until zerod's work issued so far is done.
  virtual void synchronize() = 0;
};

}  // namespace zerod
