// The cuda device. Every call sets the rank's GPU current on the calling
// thread (the rank's thread and its stream thread both call in) and issues
// its work on zerod's own stream, created non-blocking so that it never
// waits on the legacy default stream.
//
// The pool is a first-fit heap over chunks of cudaMalloc'ed memory, kept
// until the model goes (cudaFree synchronises the whole device). A daemon's
// device (shared) takes its chunks from CUDA virtual memory instead, each
// exportable as a file descriptor its trainer maps (cuda_shared.h), and
// orders the trainer's stream in the other process through stream signals
// in a host page both map (StreamLink, SharedSignals). A freed
// block may be reused by later work on zerod's stream at once: that work is
// ordered after whatever used it. The trainer reads and writes pool memory
// on its own stream only between a begin call (which makes the trainer's
// stream wait for zerod's work so far) and its end call (which makes
// zerod's later work wait for the trainer's), so reuse never races it.
#include "cuda_device.h"

#include "memory/arena.h"
#include "context_failure_watch.h"
#include "cuda_failure.h"
#include "cuda_shared.h"
#include "cuda_kernels.h"
#include "runtime/dtype.h"
#include "error.h"
#include "log.h"
#include "runtime/plugin_host.h"

#include <cuda_runtime.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <vector>

namespace zerod {

namespace {

std::string cuda_text(cudaError_t e) { return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e); }

// Checks a CUDA runtime call; on failure throws with what was being done
// (describe_cuda_failure: an error an earlier kernel left is not zerod's).
void check(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return;
  // The runtime keeps a failed call's error as its "last error" until read;
  // left there, torch would raise it from the trainer's next, unrelated
  // kernel launch. One an earlier kernel left in the context stays anyway
  // (describe_cuda_failure says so).
  cudaGetLastError();
  const CudaFailure f = describe_cuda_failure(e, cudaGetErrorName(e), cudaGetErrorString(e), "", what);
  fail(f.status, "cuda device: " + f.message);
}

constexpr uint64_t kAlign = 256;                      // cudaMalloc's own alignment
constexpr uint64_t kChunk = uint64_t{256} << 20;      // the pool grows by this much at least

class CudaDevice final : public Device {
 public:
  CudaDevice(MemoryLedger& ledger, int device, std::string name, bool shared)
      : ledger_(ledger), device_(device), name_(std::move(name)), shared_(shared) {
    // Only a daemon shares its device with a trainer in another process,
    // which reads this process's errors as its calls' (cuda_failure.h).
    if (shared_) name_cuda_failures_as_the_daemons(static_cast<int>(getpid()));
    check(cudaSetDevice(device_), "selecting GPU " + std::to_string(device_));
    if (shared_) signals_ = SharedSignals::create(device_, name_ + "'s stream signals");
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "creating zerod's stream");
    check(cudaEventCreateWithFlags(&copies_done_, cudaEventDisableTiming), "creating an event");
    check(cudaEventCreateWithFlags(&trainer_done_, cudaEventDisableTiming), "creating an event");
    check(cudaEventCreateWithFlags(&stream_mark_, cudaEventDisableTiming), "creating an event");
    for (Queue& q : queues_) {
      check(cudaStreamCreateWithFlags(&q.stream, cudaStreamNonBlocking), "creating a copy stream");
      for (cudaEvent_t& e : q.done) check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "creating an event");
    }
    marks_.stream = stream_;
    for (cudaEvent_t& e : marks_.done) check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "creating an event");
    check(cudaMalloc(&stats_, (cuda_kernels::kStatsBlocks + 1) * sizeof(double)), "allocating the statistics buffer");
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, device_), "reading the GPU's properties");
    size_t free_bytes = 0, total = 0;
    check(cudaMemGetInfo(&free_bytes, &total), "reading the GPU's free memory");
    description_ = "cuda device " + std::to_string(device_) + ": " + prop.name + ", " + format_bytes(total) +
                   " (" + format_bytes(free_bytes) + " free), sm_" + std::to_string(prop.major) +
                   std::to_string(prop.minor);
    gpu_description_ = description_;
    memory_total_ = total;
    gpu_uuid_.assign(prop.uuid.bytes, sizeof prop.uuid.bytes);
    if (ledger_.budget(ZD_TIER_DEVICE) == MemoryLedger::kNoBudget) {
      default_budget_ = static_cast<uint64_t>(kDefaultBudgetShare * static_cast<double>(free_bytes));
      set_default_budget(1);
    }
    if (shared_) context_watch_ = watch_context();  // last: its thread uses the stream and the signals
  }

  void share_default_budget(int ranks) override {
    if (default_budget_ != 0 && ranks > 1) set_default_budget(ranks);
  }
  uint64_t memory_total() const override { return memory_total_; }
  std::string gpu_uuid() const override { return gpu_uuid_; }

  ~CudaDevice() override {
    context_watch_.reset();  // first: its thread queries the stream destroyed below
    cudaSetDevice(device_);
    // Where the context failed, the sync returns at once, and a trainer
    // still waiting for zerod's last record is released.
    const cudaError_t synced = cudaStreamSynchronize(stream_);
    if (shared_) signals_.release_if_context_failed(synced);
    for (Queue& q : queues_) {
      cudaStreamSynchronize(q.stream);
      for (cudaEvent_t e : q.done) cudaEventDestroy(e);
      cudaStreamDestroy(q.stream);
    }
    cudaEventDestroy(stream_mark_);
    for (cudaEvent_t e : marks_.done) cudaEventDestroy(e);
    for (auto& [ptr, bytes] : registered_) cudaHostUnregister(ptr);
    for (Chunk& c : chunks_) {
      if (c.shared) {
        if (c.fd >= 0) ::close(c.fd);
        c.shared.reset();
      } else {
        cudaFree(c.base);
      }
    }
    cudaFree(stats_);
    cudaEventDestroy(copies_done_);
    cudaEventDestroy(trainer_done_);
    cudaStreamDestroy(stream_);
  }

  const char* name() const override { return "cuda"; }
  int32_t dlpack_type() const override { return ZD_DEVICE_CUDA; }
  int32_t ordinal() const override { return device_; }
  std::string describe() const override { return description_; }
  bool host_addressable() const override { return false; }
  bool has_streams() const override { return true; }

  Block allocate(uint64_t bytes, zd_mem_kind kind, const std::string& what) override {
    return take(bytes, kind, what, true);
  }

  Block allocate_for_overwrite(uint64_t bytes, zd_mem_kind kind, const std::string& what) override {
    return take(bytes, kind, what, false);
  }

  // A block of the pool; zero_fill: zeroed on zerod's stream.
  Block take(uint64_t bytes, zd_mem_kind kind, const std::string& what, bool zero_fill) {
    const uint64_t size = (std::max<uint64_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
    ledger_.charge(ZD_TIER_DEVICE, kind, size, what);
    try {
      current();
      std::byte* p = nullptr;
      uint64_t off = 0;
      int32_t arena = -1;
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (size_t i = 0; i < chunks_.size() && !p; ++i) {
          if (chunks_[i].heap.allocate(size, kAlign, &off)) {
            p = chunks_[i].base + off;
            arena = shared_ ? static_cast<int32_t>(i) : -1;
          }
        }
        if (!p) {
          grow(std::max(size, kChunk), what);
          Chunk& c = chunks_.back();
          c.heap.allocate(size, kAlign, &off);
          p = c.base + off;
          arena = shared_ ? static_cast<int32_t>(chunks_.size() - 1) : -1;
        }
      }
      if (zero_fill) checked(cudaMemsetAsync(p, 0, size, stream_), "zeroing " + what);
      return Block{p, size, arena, shared_ ? off : 0};
    } catch (...) {
      ledger_.release(ZD_TIER_DEVICE, kind, size);
      throw;
    }
  }

  uint64_t block_align() const override { return kAlign; }
  void release(const Block& block, zd_mem_kind kind) override {
    if (!block) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (Chunk& c : chunks_)
        if (block.ptr >= c.base && block.ptr < c.base + c.bytes) {
          c.heap.release(static_cast<uint64_t>(block.ptr - c.base), block.bytes);
          break;
        }
    }
    ledger_.release(ZD_TIER_DEVICE, kind, block.bytes);
  }

  std::vector<PoolExport> exports() const override {
    std::vector<PoolExport> out;
    if (!shared_) return out;
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < chunks_.size(); ++i)
      out.push_back({static_cast<int32_t>(i), chunks_[i].bytes, chunks_[i].fd, ZD_DEVICE_CUDA, device_});
    return out;
  }

  StreamLink stream_link() const override {
    if (!shared_) return {};
    return {signals_.page_fd()};
  }

  void register_host(void* ptr, uint64_t bytes) override {
    if (!ptr || bytes == 0) return;
    current();
    const cudaError_t e = cudaHostRegister(ptr, bytes, cudaHostRegisterDefault);
    if (e != cudaSuccess) {
      cudaGetLastError();
      log_warn("cuda device: cannot page-lock " + format_bytes(bytes) + " of host memory (" + cuda_text(e) +
               "); copies from it run at pageable speed");
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    registered_[ptr] = bytes;
  }

  void unregister_host(void* ptr) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = registered_.find(ptr);
      if (it == registered_.end()) return;
      registered_.erase(it);
    }
    current();
    cudaStreamSynchronize(stream_);  // nothing in flight may still read it
    cudaHostUnregister(ptr);
  }

  void copy_to_device(void* dst, const void* src, uint64_t bytes) override {
    current();
    checked(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "copying to the device");
    // From pageable memory the call returns once the source is staged; from
    // page-locked memory it returns at once, and the caller may reuse src.
    if (page_locked(src)) checked(cudaStreamSynchronize(stream_), "copying to the device");
  }

  void copy_to_host(void* dst, const void* src, uint64_t bytes) override {
    current();
    checked(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "copying to the host");
    checked(cudaStreamSynchronize(stream_), "copying to the host");
  }

  uint64_t upload(void* dst, const void* src, uint64_t bytes) override {
    current();
    Queue& q = queues_[kUp - 1];
    std::lock_guard<std::mutex> lock(q.mu);
    checked(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, q.stream), "uploading to the device");
    return record(q, kUp);
  }

  uint64_t download(void* dst, const void* src, uint64_t bytes, uint64_t after) override {
    current();
    Queue& q = queues_[kDown - 1];
    std::lock_guard<std::mutex> lock(q.mu);
    if (after) {
      std::lock_guard<std::mutex> marks(marks_.mu);
      checked(cudaStreamWaitEvent(q.stream, marks_.event_for(after), 0), "ordering a download after zerod's work");
    }
    checked(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, q.stream), "downloading from the device");
    return record(q, kDown);
  }

  uint64_t mark() override {
    current();
    std::lock_guard<std::mutex> lock(marks_.mu);
    return record(marks_, kMark);
  }

  void upload_after_stream() override {
    current();
    Queue& q = queues_[kUp - 1];
    std::lock_guard<std::mutex> lock(q.mu);
    std::lock_guard<std::mutex> mark(event_mu_);
    checked(cudaEventRecord(stream_mark_, stream_), "marking zerod's work");
    checked(cudaStreamWaitEvent(q.stream, stream_mark_, 0), "ordering uploads after zerod's work");
  }

  void transfer_wait(uint64_t ticket) override {
    if (ticket == 0) return;
    current();
    Queue& q = queues_[(ticket >> kDirShift) - 1];
    cudaEvent_t e;
    {
      std::lock_guard<std::mutex> lock(q.mu);
      e = q.event_for(ticket);
    }
    checked(cudaEventSynchronize(e), "waiting for a transfer");
  }

  void stream_waits(uint64_t ticket) override {
    if (ticket == 0) return;
    current();
    Queue& q = queues_[(ticket >> kDirShift) - 1];
    std::lock_guard<std::mutex> lock(q.mu);
    checked(cudaStreamWaitEvent(stream_, q.event_for(ticket), 0), "making zerod's stream wait for a transfer");
  }

  void wait_peer_mark(const Device& peer, uint64_t mark) override {
    if (mark == 0) return;
    current();
    const CudaDevice& p = of(peer);
    std::lock_guard<std::mutex> lock(p.marks_.mu);
    checked(cudaStreamWaitEvent(stream_, p.marks_.event_for(mark), 0), "waiting for a peer's work");
  }

  void copy_peer(void* dst, const Device& peer, const void* src, uint64_t bytes) override {
    current();
    checked(cudaMemcpyPeerAsync(dst, device_, src, of(peer).device_, bytes, stream_), "copying from a peer's memory");
  }

  void sum_peers(void* dst, zd_dtype dt, uint64_t n, const std::vector<PeerSpan>& srcs) override {
    current();
    // A source on another GPU is copied here first (peer access between
    // GPUs is not assumed); one on this GPU (ranks sharing it) is read where
    // it is.
    std::vector<const void*> from;
    std::vector<Block> copies;
    const uint64_t bytes = n * dtype_size(dt);
    try {
      for (const PeerSpan& s : srcs) {
        const CudaDevice& p = of(*s.device);
        if (p.device_ == device_) {
          from.push_back(s.data);
          continue;
        }
        copies.push_back(allocate_for_overwrite(bytes, ZD_MEM_BUFFERS, "a peer's gradients, copied for their sum"));
        checked(cudaMemcpyPeerAsync(copies.back().ptr, device_, s.data, p.device_, bytes, stream_),
              "copying from a peer's memory");
        from.push_back(copies.back().ptr);
      }
      if (from.size() > static_cast<size_t>(cuda_kernels::kMaxSources))
        fail(ZD_ERR_INTERNAL, "cuda device: a sum over " + std::to_string(from.size()) + " ranks; at most " +
                                  std::to_string(cuda_kernels::kMaxSources) + " in one process");
      checked_launch(cuda_kernels::sum_sources(from.data(), static_cast<int>(from.size()), dst, dt, n, stream_),
                   "summing the ranks' gradients");
    } catch (...) {
      for (const Block& b : copies) release(b, ZD_MEM_BUFFERS);
      throw;
    }
    // Later work on zerod's stream is ordered after the sum: the copies may go.
    for (const Block& b : copies) release(b, ZD_MEM_BUFFERS);
  }

  void copy_within(void* dst, const void* src, uint64_t bytes) override {
    current();
    checked(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "copying on the device");
  }

  void zero(void* dst, uint64_t bytes) override {
    current();
    checked(cudaMemsetAsync(dst, 0, bytes, stream_), "zeroing device memory");
  }

  void accumulate(const void* src, zd_dtype src_dt, void* dst, zd_dtype dst_dt, uint64_t n) override {
    current();
    checked_launch(cuda_kernels::accumulate(src, src_dt, dst, dst_dt, n, 1.0f, stream_), "adding gradients");
  }

  void accumulate_scaled(const void* src, zd_dtype src_dt, void* dst, zd_dtype dst_dt, uint64_t n,
                         float factor) override {
    current();
    checked_launch(cuda_kernels::accumulate(src, src_dt, dst, dst_dt, n, factor, stream_), "adding gradients");
  }

  void scale(void* p, zd_dtype dt, uint64_t n, float factor) override {
    current();
    checked_launch(cuda_kernels::scale(p, dt, n, factor, stream_), "scaling gradients");
  }

  GradStats grad_stats(const std::vector<GradSpan>& spans) override {
    current();
    std::lock_guard<std::mutex> lock(stats_mu_);
    checked(cudaMemsetAsync(stats_, 0, cuda_kernels::kStatsBlocks * sizeof(double), stream_), "clearing statistics");
    for (const GradSpan& s : spans)
      checked_launch(cuda_kernels::sumsq_add(s.data, s.dtype, s.count, stats_, stream_), "the gradient norm");
    double* out = stats_ + cuda_kernels::kStatsBlocks;
    checked_launch(cuda_kernels::sumsq_finish(stats_, out, stream_), "the gradient norm");
    GradStats g;
    checked(cudaMemcpyAsync(&g.sumsq, out, sizeof(double), cudaMemcpyDeviceToHost, stream_), "reading the norm");
    checked(cudaStreamSynchronize(stream_), "reading the norm");
    g.finite = std::isfinite(g.sumsq);
    return g;
  }

  bool runs(const OptimizerInstance& opt) const override { return opt.has_cuda(); }

  void optimizer_update(const OptimizerInstance& opt, const zd_optimizer_update& u, bool zero_grad) override {
    current();
    opt.update_cuda(u, stream_);
    if (zero_grad && u.grad)
      checked(cudaMemsetAsync(const_cast<void*>(u.grad), 0, u.count * dtype_size(u.grad_dtype), stream_),
            "zeroing gradients");
  }

  void set_trainer_stream(void* stream) override {
    // A shared device's trainer is in another process: its stream is
    // ordered through the StreamLink signals, which its libzerod handles.
    if (!shared_) trainer_ = static_cast<cudaStream_t>(stream);
  }

  void trainer_waits() override {
    current();
    std::lock_guard<std::mutex> lock(event_mu_);
    if (shared_) {
      signals_.record(kZerodDone, stream_);
      context_watch_->recorded();  // after the publish: ContextFailureWatch::recorded
      return;
    }
    checked(cudaEventRecord(copies_done_, stream_), "recording zerod's work");
    checked(cudaStreamWaitEvent(trainer_, copies_done_, 0), "making the trainer's stream wait");
  }

  void trainer_waits_for(uint64_t mark) override {
    // A shared device's trainer waits on the signals' page, which says
    // only how far zerod's stream has got: all of it.
    if (shared_) return trainer_waits();
    if (mark == 0) return;
    current();
    std::lock_guard<std::mutex> lock(marks_.mu);
    checked(cudaStreamWaitEvent(trainer_, marks_.event_for(mark), 0), "making the trainer's stream wait");
  }

  void wait_for_trainer() override {
    current();
    std::lock_guard<std::mutex> lock(event_mu_);
    if (shared_) {
      signals_.wait_on(kTrainerDone, stream_);
      return;
    }
    checked(cudaEventRecord(trainer_done_, trainer_), "recording the trainer's work");
    checked(cudaStreamWaitEvent(stream_, trainer_done_, 0), "waiting for the trainer's stream");
  }

  // The CPU's read and store of the signals' page: no GPU call.
  bool trainer_pending() const override { return shared_ && signals_.pending(kTrainerDone); }

  void release_trainer() const override {
    if (shared_) signals_.release(kTrainerDone);
  }

  void synchronize() override {
    current();
    checked(cudaStreamSynchronize(stream_), "waiting for zerod's stream");
  }

 private:
  struct Chunk {
    std::byte* base;
    uint64_t bytes;
    RangeHeap heap;
    std::unique_ptr<SharedDeviceChunk> shared;  // a shared device's: its memory
    int fd = -1;                                // and the handle it exports
  };

  // Adds a chunk of `bytes` (with mu_ held).
  void grow(uint64_t bytes, const std::string& what) {
    if (shared_) {
      auto sc = std::make_unique<SharedDeviceChunk>(SharedDeviceChunk::allocate(device_, bytes, "cuda device: " + what));
      const int fd = sc->export_fd();
      std::byte* base = static_cast<std::byte*>(sc->data());
      const uint64_t size = sc->size();
      chunks_.push_back(Chunk{base, size, RangeHeap(size), std::move(sc), fd});
      return;
    }
    void* base = nullptr;
    const cudaError_t e = cudaMalloc(&base, bytes);
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear it: the device stays usable
      fail(ZD_ERR_OUT_OF_MEMORY, "cuda device: " + what + ": cudaMalloc of " + format_bytes(bytes) + " failed (" +
                                     cuda_text(e) + "); lower budgets.device or move state to the host");
    }
    chunks_.push_back(Chunk{static_cast<std::byte*>(base), bytes, RangeHeap(bytes), nullptr, -1});
  }

  // One direction's copy stream. Its transfers complete in order, so each
  // ticket is a sequence number (the direction in the top bits) and a ring
  // of events stands for them: an event recorded again for a later
  // transfer still completes only after the earlier one, so waiting on it
  // is never too early, only possibly later than needed, once kRing
  // transfers have followed.
  static constexpr int kUp = 1, kDown = 2, kMark = 3;
  static constexpr int kDirShift = 62;
  static constexpr size_t kRing = 1024;
  struct Queue {
    cudaStream_t stream = nullptr;
    cudaEvent_t done[kRing] = {};
    uint64_t seq = 0;
    std::mutex mu;  // the stream's issue order, seq and the ring

    cudaEvent_t event_for(uint64_t ticket) const {
      return done[(ticket & ((uint64_t{1} << kDirShift) - 1)) % kRing];
    }
  };

  // The next transfer's ticket on `q` (its lock held): an event recorded
  // after what `q` holds now.
  uint64_t record(Queue& q, int dir) const {
    ++q.seq;
    checked(cudaEventRecord(q.done[q.seq % kRing], q.stream), "recording a transfer");
    return (static_cast<uint64_t>(dir) << kDirShift) | q.seq;
  }

  // check() for a call of this device's. First, on a shared device, an
  // error that says this process's context on the GPU has failed releases
  // kZerodDone (SharedSignals::release_if_context_failed): zerod's records
  // of it queued behind the failed kernel never run, and the trainer's
  // stream, waiting for one, would hold for good, and the trainer with it
  // (at its next synchronize, or its quiesce before zd_model_destroy),
  // though this daemon is alive.
  void checked(cudaError_t e, const std::string& what) const {
    if (e != cudaSuccess && shared_) signals_.release_if_context_failed(e);
    check(e, what);
  }

  // Checks a launch of cuda_kernels.h (`code` is its cudaError_t).
  void checked_launch(int code, const std::string& what) const {
    if (code != 0) checked(static_cast<cudaError_t>(code), what);
  }

  void current() const { checked(cudaSetDevice(device_), "selecting GPU " + std::to_string(device_)); }

  // A shared device's watch of its own context while its trainer's stream
  // may wait for zerod's latest record of kZerodDone: checked() releases
  // that record when a call of this device finds the context failed, but
  // a kernel that fails after the device's last call, with the trainer then
  // waiting on the GPU before its next zerod call, would hold the trainer
  // for good (docs/devices.md, "A process whose GPU context fails, alive").
  std::unique_ptr<ContextFailureWatch> watch_context() {
    return std::make_unique<ContextFailureWatch>(ContextFailureWatch::Hooks{
        [this] { return signals_.pending(kZerodDone); }, [this] { return query_context(); },
        [this](int code) { release_failed_context(code); }});
  }

  // On the watch's thread: zerod's stream's state, which never blocks, and
  // is the context's error once it has failed.
  int query_context() const {
    cudaError_t e = cudaSetDevice(device_);  // the runtime's current GPU is per thread
    if (e == cudaSuccess) e = cudaStreamQuery(stream_);
    if (e != cudaSuccess) cudaGetLastError();  // this thread's, and read here
    return static_cast<int>(e);
  }

  // On the watch's thread, once: what checked() does for a failed call,
  // said in the log, since no call of the trainer's is in progress to
  // carry it.
  void release_failed_context(int code) const {
    signals_.release_if_context_failed(code);
    log_warn("cuda device " + name_ + ": the zerod daemon's GPU context on GPU " + std::to_string(device_) +
             " failed (" + cuda_text(static_cast<cudaError_t>(code)) +
             ") with zerod's work for its trainer queued behind the failure, which will never run: the trainer's "
             "stream, which waits for it (kZerodDone), is released, and the trainer's next zerod call fails "
             "naming this error. CUDA_LAUNCH_BLOCKING=1 in the daemon's environment reports it at the kernel "
             "that failed; the daemon must be restarted to use GPU " +
             std::to_string(device_) + " again");
  }

  static const CudaDevice& of(const Device& d) {
    const auto* c = dynamic_cast<const CudaDevice*>(&d.unwrapped());
    if (!c) fail(ZD_ERR_INTERNAL, "cuda device: a peer that is not a cuda device");
    return *c;
  }

  bool page_locked(const void* p) const {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return a.type == cudaMemoryTypeHost;
  }

  MemoryLedger& ledger_;
  // The budget chosen here, shared by `ranks` ranks on this GPU.
  void set_default_budget(int ranks) {
    const uint64_t budget = default_budget_ / static_cast<uint64_t>(ranks);
    ledger_.set_budget(ZD_TIER_DEVICE, budget);
    description_ = gpu_description_ + "; device budget " + format_bytes(budget) + " (" +
                   std::to_string(static_cast<int>(kDefaultBudgetShare * 100)) + "% of its free memory" +
                   (ranks > 1 ? ", shared by the " + std::to_string(ranks) + " ranks on this GPU" : std::string()) +
                   "; budgets.device sets it)";
  }

  int device_;
  std::string name_;
  bool shared_;
  SharedSignals signals_;  // a shared device's StreamLink
  std::string description_;
  std::string gpu_description_;  // description_ without the budget
  uint64_t default_budget_ = 0;  // the budget chosen here (the job set none), for the whole GPU; 0: the job's
  uint64_t memory_total_ = 0;    // the GPU's memory in all
  std::string gpu_uuid_;         // its 16-byte UUID
  cudaStream_t stream_ = nullptr;
  cudaStream_t trainer_ = nullptr;  // the legacy default stream until the trainer names one
  cudaEvent_t copies_done_ = nullptr;
  cudaEvent_t trainer_done_ = nullptr;
  cudaEvent_t stream_mark_ = nullptr;  // zerod's work so far, for a copy stream to wait on (under event_mu_)
  Queue queues_[2];                    // uploads, downloads
  mutable Queue marks_;                // marks on zerod's own stream (its `stream` is stream_); peers wait on them
  double* stats_ = nullptr;  // kStatsBlocks partial sums, then the total
  mutable std::mutex mu_;    // the chunks and the registrations
  std::mutex event_mu_;
  std::mutex stats_mu_;
  std::vector<Chunk> chunks_;
  std::map<void*, uint64_t> registered_;
  std::unique_ptr<ContextFailureWatch> context_watch_;  // a shared device's; last: its thread uses the members above
};

}  // namespace

CudaAvailability cuda_probe() {
  CudaAvailability a;
  a.built = true;
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (e == cudaErrorNoDevice) {
      a.why = "this machine has no CUDA device";
    } else if (e == cudaErrorInsufficientDriver) {
      int runtime = 0;
      cudaRuntimeGetVersion(&runtime);
      a.why = "no NVIDIA driver for CUDA " + std::to_string(runtime / 1000) + "." + std::to_string(runtime % 1000 / 10) +
              " is loaded (no GPU here, or an older driver)";
    } else {
      a.why = "no CUDA device is usable by this process (" + cuda_text(e) + ")";
    }
    return a;
  }
  a.devices = n;
  if (n == 0) a.why = "this machine has no CUDA device";
  return a;
}

std::unique_ptr<Device> make_cuda_device(MemoryLedger& ledger, Workers& workers, int local_rank,
                                         const std::string& name, bool shared) {
  const CudaAvailability a = cuda_probe();
  if (a.devices == 0) fail(ZD_ERR_CONFIG, "device \"cuda\" cannot be opened: " + a.why);
  int device = 0;
  if (local_rank < 0)
    check(cudaGetDevice(&device), "reading the current GPU");
  else
    device = local_rank % a.devices;
  (void)workers;  // the GPU runs the update itself
  return std::make_unique<CudaDevice>(ledger, device, name, shared);
}

}  // namespace zerod
