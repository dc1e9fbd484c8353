#include "trainer_link.h"

#include "error.h"
#include "log.h"
#include "transport/process_exit.h"

#include <cstring>
#include <limits>

#if defined(ZEROD_HAVE_CUDA)
#include "device/cuda_shared.h"
#include "transport/shared_memory.h"

#include <cuda.h>
#include <cuda_runtime.h>
#endif

#if !defined(ZEROD_HAVE_CUDA)
namespace zerod {
class SharedSignals {};  // never made without CUDA
}  // namespace zerod
#endif

namespace zerod::abi {

namespace {

// A memfd from the daemon, which sizes it to its device budget: any size a
// file can have is allowed, but it must be sealed that long, so a mapping
// here can never fault.
constexpr uint64_t kMaxArenaBytes = static_cast<uint64_t>(std::numeric_limits<off_t>::max());

// How long the hangup watch waits for a daemon that closed this connection
// to exit before it releases the trainer's stream (a killed daemon exits
// within milliseconds; one in another pid namespace is taken for dead then).
[[maybe_unused]] constexpr int kDaemonExitMs = 10000;

[[noreturn, maybe_unused]] void no_cuda(const char* what) {
  fail(ZD_ERR_CONFIG, std::string(what) + ": the zerod daemon serves this rank on a GPU, but this libzerod was "
                                          "built without CUDA (nvcc was not found when it was configured); use a "
                                          "libzerod built with CUDA, or device = \"cpu\" in the job script");
}

}  // namespace

#if defined(ZEROD_HAVE_CUDA)
struct ImportedArena::Gpu {
  SharedDeviceChunk chunk;
};

namespace {

// Whether this thread has a CUDA context current (the driver's
// cuCtxGetCurrent, looked up through the runtime: libzerod links no
// libcuda). True where that cannot be told.
bool context_current() {
  using GetCurrent = CUresult (*)(CUcontext*);
  static const GetCurrent get = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &p, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return GetCurrent{nullptr};
    }
    return reinterpret_cast<GetCurrent>(p);
  }();
  CUcontext c = nullptr;
  return !get || (get(&c) == CUDA_SUCCESS && c != nullptr);
}

// Makes the rank's GPU current for its scope, then the trainer's own
// choice back. A record or wait on the default stream (NULL) is on the
// current GPU's, and the driver's stream calls need a context current: a
// zd_* call from a thread that never touched CUDA has none, and one with
// another GPU current would record on that GPU. A thread that had no
// context is left with the rank's GPU (restoring its nominal device 0
// would start a context there, on a GPU this process may not use).
// status(): whether the switch worked.
class OnRankGpu {
 public:
  explicit OnRankGpu(int device) {
    restore_ = cudaGetDevice(&before_) == cudaSuccess && before_ != device && context_current();
    status_ = cudaSetDevice(device);
  }
  ~OnRankGpu() {
    if (restore_ && cudaSetDevice(before_) != cudaSuccess) cudaGetLastError();
  }
  OnRankGpu(const OnRankGpu&) = delete;
  OnRankGpu& operator=(const OnRankGpu&) = delete;
  cudaError_t status() const { return status_; }
  // Throws, naming `what`, where the switch failed.
  void require(int device, const char* what) const {
    if (status_ == cudaSuccess) return;
    cudaGetLastError();  // not left for the trainer's next kernel to report
    fail(ZD_ERR_INTERNAL, std::string(what) + ": making the rank's GPU " + std::to_string(device) +
                              " current on this thread failed (" + cudaGetErrorName(status_) + ": " +
                              cudaGetErrorString(status_) + ")");
  }

 private:
  int before_ = -1;
  bool restore_ = false;
  cudaError_t status_ = cudaSuccess;
};

}  // namespace
#else
struct ImportedArena::Gpu {};
#endif

bool current_gpu(int* ordinal, std::string* uuid) {
#if defined(ZEROD_HAVE_CUDA)
  int device = -1;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  *ordinal = device;
  uuid->assign(prop.uuid.bytes, sizeof prop.uuid.bytes);
  return true;
#else
  (void)ordinal;
  (void)uuid;
  return false;
#endif
}

ImportedArena::ImportedArena(const PoolExport& e, const std::string& what) {
  if (e.device_type == ZD_DEVICE_CUDA) {
#if defined(ZEROD_HAVE_CUDA)
    gpu_ = std::make_unique<Gpu>(Gpu{SharedDeviceChunk::import(e.fd, e.size, e.device_id)});
    base_ = static_cast<std::byte*>(gpu_->chunk.data());
    size_ = gpu_->chunk.size();
    return;
#else
    no_cuda(what.c_str());
#endif
  }
  if (e.device_type != ZD_DEVICE_CPU && e.device_type != 0)
    fail(ZD_ERR_INTERNAL, what + ": the daemon sent a region of device type " + std::to_string(e.device_type) +
                              ", which this libzerod does not know");
  host_ = transport::SharedMapping(e.fd, e.size, kMaxArenaBytes, what, ZD_ERR_INTERNAL);
  base_ = host_.data();
  size_ = host_.size();
}

ImportedArena::ImportedArena() = default;
ImportedArena::~ImportedArena() = default;
ImportedArena::ImportedArena(ImportedArena&&) noexcept = default;
ImportedArena& ImportedArena::operator=(ImportedArena&&) noexcept = default;

TrainerLink::TrainerLink(int32_t device_type, int32_t device_id, const StreamLink& link,
                         transport::HangupWatch* watch, pid_t daemon_pid)
    : device_type_(device_type ? device_type : ZD_DEVICE_CPU), device_id_(device_id), daemon_pid_(daemon_pid) {
  if (device_type_ != ZD_DEVICE_CUDA) return;
#if defined(ZEROD_HAVE_CUDA)
  if (link.page_fd < 0)
    fail(ZD_ERR_VERSION, "the zerod daemon serves this rank on a GPU but sent no page of stream signals: it is "
                         "older than this libzerod (its GPU ranks used interprocess events, then for a few hours "
                         "of 2026-11-27 signals in GPU memory); run a daemon and a libzerod of the same release");
  if (cudaSetDevice(device_id_) != cudaSuccess) {
    cudaGetLastError();
    fail(ZD_ERR_CONFIG, "the zerod daemon serves this rank on GPU " + std::to_string(device_id_) +
                            ", which this process cannot use (CUDA_VISIBLE_DEVICES?)");
  }
  transport::check_sealed_memfd(link.page_fd, kSignalPageBytes, kSignalPageBytes,
                                "the daemon's page of stream signals", ZD_ERR_INTERNAL);
  signals_ = std::make_unique<SharedSignals>(SharedSignals::import(link.page_fd, device_id_));
  if (watch) {
    // On the watch's thread; the release and the read are the CPU's (no
    // GPU call). A daemon that only closed this connection runs its record
    // still: released only once its process is gone (bounded: this holds
    // the watch, which quiesce waits for).
    watch_ = watch;
    watch_id_ = watch->add([this] {
      const SharedSignals& s = *signals_;
      const std::string who = "the zerod daemon (pid " + std::to_string(daemon_pid_) + ") is gone: ";
      try {
        const std::string did = transport::release_when_gone(
            daemon_pid_, kDaemonExitMs, kDaemonExitMs, [&s] { return s.pending(kZerodDone); },
            [&s] { s.release(kZerodDone); });
        if (!did.empty()) log_warn(who + did);
      } catch (const std::exception& e) {
        log_warn(who + "releasing this process's GPU stream from its wait failed: " + e.what());
      }
    });
  }
#else
  (void)link;
  (void)watch;
  (void)daemon_pid_;
  no_cuda("zd_model_create");
#endif
}

TrainerLink::~TrainerLink() { unwatch(); }

void TrainerLink::unwatch() noexcept {
  if (!watch_) return;
  watch_->remove(watch_id_);  // its callback uses the signals
  watch_ = nullptr;
}

void TrainerLink::set_stream(void* stream) {
  if (device_type_ != ZD_DEVICE_CUDA) {
    if (stream)
      fail(ZD_ERR_INVALID_ARGUMENT,
           "zd_model_set_stream: this job computes on the cpu device, which has no streams; pass NULL, or set "
           "device = \"cuda\" in the job script to train on a GPU");
    return;
  }
#if defined(ZEROD_HAVE_CUDA)
  if (signals_ && stream != stream_) {
    // A signal's word takes its records' numbers in the order they run:
    // the new stream's records go after the old one's (else an older
    // number could land last and hold a wait for the newer one), and
    // quiesce, which waits for the new stream, covers both.
    const OnRankGpu on(device_id_);
    cudaEvent_t old_done = nullptr;
    cudaError_t e = on.status();
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&old_done, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(old_done, static_cast<cudaStream_t>(stream_));
    if (e == cudaSuccess) e = cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), old_done, 0);
    if (old_done) cudaEventDestroy(old_done);
    if (e != cudaSuccess) {
      cudaGetLastError();
      fail(ZD_ERR_INVALID_ARGUMENT, std::string("zd_model_set_stream: ordering the new stream after the old one: ") +
                                        cudaGetErrorString(e));
    }
  }
#endif
  stream_ = stream;
}

void TrainerLink::before_call() {
#if defined(ZEROD_HAVE_CUDA)
  if (!signals_) return;
  // On the rank's GPU whatever this thread had current (OnRankGpu).
  const OnRankGpu on(device_id_);
  // A context that failed (a kernel of the trainer's faulted) may show here
  // first, or in the record below (which then releases itself): the
  // daemon's stream, which waits for this stream's records, is released
  // before the error reaches the trainer. Else it would wait for good for a
  // record behind the failed kernel (this process lives: the daemon's
  // hangup watch never releases it), and so would the daemon's next
  // synchronize (at zd_model_destroy the latest), and this process for its
  // reply.
  signals_->release_if_context_failed(on.status());
  on.require(device_id_, "recording the trainer's stream before a zerod call");
  signals_->record(kTrainerDone, stream_);
#endif
}

void TrainerLink::quiesce() noexcept {
#if defined(ZEROD_HAVE_CUDA)
  if (!signals_) return;
  const OnRankGpu on(device_id_);
  const cudaError_t synced =
      on.status() != cudaSuccess ? on.status() : cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
  const bool done = synced == cudaSuccess;
  if (!done) cudaGetLastError();
  // Before zd_model_destroy goes to the daemon: its end synchronizes its
  // stream, which may wait for a record of this one behind the failed
  // kernel (before_call says why that would hold for good).
  signals_->release_if_context_failed(synced);
  unwatch();  // after the stream: its callback uses the signals
  if (!done) {
    // The stream may still hold a record or a wait on the page (the trainer
    // destroyed it, or the GPU failed): unregistering the page under it
    // would fault. Its 4 KiB stay registered and mapped for the process.
    (void)signals_.release();
    return;
  }
  signals_.reset();
#endif
}

void TrainerLink::after_begin() {
#if defined(ZEROD_HAVE_CUDA)
  if (!signals_) return;
  const OnRankGpu on(device_id_);
  signals_->release_if_context_failed(on.status());  // as in before_call
  on.require(device_id_, "making the trainer's stream wait for the daemon's copies");
  signals_->wait_on(kZerodDone, stream_);
#endif
}

}  // namespace zerod::abi
