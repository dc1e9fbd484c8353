#include "cuda_shared.h"

#include "error.h"
#include "memory/arena.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <new>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace zerod {

namespace {

// The driver calls this file makes, looked up once.
struct Driver {
  decltype(&cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&cuMemCreate) create = nullptr;
  decltype(&cuMemExportToShareableHandle) export_handle = nullptr;
  decltype(&cuMemImportFromShareableHandle) import_handle = nullptr;
  decltype(&cuMemAddressReserve) reserve = nullptr;
  decltype(&cuMemAddressFree) address_free = nullptr;
  decltype(&cuMemMap) map = nullptr;
  decltype(&cuMemUnmap) unmap = nullptr;
  decltype(&cuMemSetAccess) set_access = nullptr;
  decltype(&cuMemRelease) release = nullptr;
  decltype(&cuGetErrorString) error_string = nullptr;
  decltype(&cuStreamWriteValue32) write_value = nullptr;
  decltype(&cuStreamWaitValue32) wait_value = nullptr;
  std::string missing;  // why it could not be loaded
};

template <typename F>
void load(F* fn, const char* name, std::string* missing) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found{};
  // The ABI of CUDA 12.0, which has every call used here.
  if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess || p == nullptr) {
    cudaGetLastError();
    if (missing->empty()) *missing = std::string("the CUDA driver has no ") + name;
    return;
  }
  *fn = reinterpret_cast<F>(p);
}

const Driver& driver() {
  static Driver d;
  static std::once_flag once;
  std::call_once(once, [] {
    load(&d.granularity, "cuMemGetAllocationGranularity", &d.missing);
    load(&d.create, "cuMemCreate", &d.missing);
    load(&d.export_handle, "cuMemExportToShareableHandle", &d.missing);
    load(&d.import_handle, "cuMemImportFromShareableHandle", &d.missing);
    load(&d.reserve, "cuMemAddressReserve", &d.missing);
    load(&d.address_free, "cuMemAddressFree", &d.missing);
    load(&d.map, "cuMemMap", &d.missing);
    load(&d.unmap, "cuMemUnmap", &d.missing);
    load(&d.set_access, "cuMemSetAccess", &d.missing);
    load(&d.release, "cuMemRelease", &d.missing);
    load(&d.error_string, "cuGetErrorString", &d.missing);
    load(&d.write_value, "cuStreamWriteValue32", &d.missing);
    load(&d.wait_value, "cuStreamWaitValue32", &d.missing);
  });
  if (!d.missing.empty()) fail(ZD_ERR_NOT_IMPLEMENTED, "shared GPU memory: " + d.missing);
  return d;
}

std::string text(CUresult r) {
  const char* s = nullptr;
  if (driver().error_string(r, &s) != CUDA_SUCCESS || !s) return "CUDA driver error " + std::to_string(r);
  return s;
}

void check(CUresult r, const std::string& what) {
  if (r == CUDA_SUCCESS) return;
  fail(r == CUDA_ERROR_OUT_OF_MEMORY ? ZD_ERR_OUT_OF_MEMORY : ZD_ERR_INTERNAL, "shared GPU memory: " + what + ": " + text(r));
}

void check_rt(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return;
  fail(ZD_ERR_INTERNAL, "shared GPU memory: " + what + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

CUmemAllocationProp props(int device) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = device;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return p;
}

// The runtime's context on the device is current (the driver calls need one).
void use_device(int device) {
  check_rt(cudaSetDevice(device), "selecting GPU " + std::to_string(device));
  check_rt(cudaFree(nullptr), "starting CUDA on GPU " + std::to_string(device));
}

// Reserves an address range for `bytes`, maps `handle` there and makes it
// readable and writable from `devices`.
CUdeviceptr map_here(CUmemGenericAllocationHandle handle, uint64_t bytes, const std::vector<int>& devices) {
  const Driver& d = driver();
  CUdeviceptr ptr = 0;
  check(d.reserve(&ptr, bytes, 0, 0, 0), "reserving " + std::to_string(bytes) + " bytes of address space");
  if (CUresult r = d.map(ptr, bytes, 0, handle, 0); r != CUDA_SUCCESS) {
    d.address_free(ptr, bytes);
    check(r, "mapping");
  }
  std::vector<CUmemAccessDesc> access(devices.size());
  for (size_t i = 0; i < devices.size(); ++i) {
    access[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access[i].location.id = devices[i];
    access[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  if (CUresult r = d.set_access(ptr, bytes, access.data(), access.size()); r != CUDA_SUCCESS) {
    d.unmap(ptr, bytes);
    d.address_free(ptr, bytes);
    check(r, "granting access");
  }
  return ptr;
}

// `device` and every GPU that can reach its memory. A daemon whose ranks
// are on several GPUs maps all their pools in its one process, and its
// collectives copy and add between them on the GPUs (Device::copy_peer,
// sum_peers); memory of the virtual memory API is reachable only from the
// devices its mapping grants, whatever peer access the runtime enabled.
std::vector<int> with_peers(int device) {
  std::vector<int> out{device};
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return out;
  }
  for (int other = 0; other < count; ++other) {
    int can = 0;
    if (other == device) continue;
    if (cudaDeviceCanAccessPeer(&can, other, device) != cudaSuccess) {
      cudaGetLastError();
      continue;
    }
    if (can) out.push_back(other);
  }
  return out;
}

}  // namespace

uint64_t cuda_shared_granularity(int device) {
  use_device(device);
  const CUmemAllocationProp p = props(device);
  size_t g = 0;
  check(driver().granularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED), "reading the allocation granularity");
  return g;
}

SharedDeviceChunk SharedDeviceChunk::allocate(int device, uint64_t bytes, const std::string& what) {
  const uint64_t g = cuda_shared_granularity(device);
  const uint64_t size = (std::max<uint64_t>(bytes, 1) + g - 1) / g * g;
  const Driver& d = driver();
  const CUmemAllocationProp p = props(device);
  CUmemGenericAllocationHandle h = 0;
  if (CUresult r = d.create(&h, size, &p, 0); r != CUDA_SUCCESS) {
    if (r == CUDA_ERROR_OUT_OF_MEMORY)
      fail(ZD_ERR_OUT_OF_MEMORY, what + ": GPU " + std::to_string(device) + " has no " + std::to_string(size) +
                                     " bytes left for shared memory (" + text(r) + ")");
    check(r, what);
  }
  SharedDeviceChunk c;
  c.handle_ = h;
  c.bytes_ = size;
  c.device_ = device;
  c.ptr_ = map_here(h, size, with_peers(device));  // on failure c's destructor releases h
  return c;
}

SharedDeviceChunk SharedDeviceChunk::import(int fd, uint64_t bytes, int device) {
  use_device(device);
  const Driver& d = driver();
  CUmemGenericAllocationHandle h = 0;
  check(d.import_handle(&h, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
        "importing a chunk of " + std::to_string(bytes) + " bytes");
  SharedDeviceChunk c;
  c.handle_ = h;
  c.bytes_ = bytes;
  c.device_ = device;
  c.ptr_ = map_here(h, bytes, {device});
  return c;
}

int SharedDeviceChunk::export_fd() const {
  int fd = -1;
  check(driver().export_handle(&fd, handle_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), "exporting a chunk");
  return fd;
}

void SharedDeviceChunk::reset() noexcept {
  if (!handle_) return;
  const Driver& d = driver();
  if (ptr_) {
    d.unmap(ptr_, bytes_);
    d.address_free(ptr_, bytes_);
  }
  d.release(handle_);
  handle_ = 0;
  ptr_ = 0;
  bytes_ = 0;
}

SharedDeviceChunk::~SharedDeviceChunk() { reset(); }

SharedDeviceChunk::SharedDeviceChunk(SharedDeviceChunk&& o) noexcept
    : handle_(std::exchange(o.handle_, 0)), ptr_(std::exchange(o.ptr_, 0)), bytes_(std::exchange(o.bytes_, 0)),
      device_(o.device_) {}

SharedDeviceChunk& SharedDeviceChunk::operator=(SharedDeviceChunk&& o) noexcept {
  if (this != &o) {
    reset();
    handle_ = std::exchange(o.handle_, 0);
    ptr_ = std::exchange(o.ptr_, 0);
    bytes_ = std::exchange(o.bytes_, 0);
    device_ = o.device_;
  }
  return *this;
}

namespace {

CUdeviceptr address(const void* p) { return static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(p)); }

SignalCounts* map_counts(int fd, const std::string& what) {
  void* p = mmap(nullptr, kSignalPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) fail(ZD_ERR_OUT_OF_MEMORY, what + ": mapping its page: " + errno_text(errno));
  return static_cast<SignalCounts*>(p);
}

// A stream that holds nothing else, for a write or read that must not wait
// behind a stream that may never move again. Non-blocking: the legacy
// default stream (a trainer's, perhaps the one that waits) does not order it.
class IdleStream {
 public:
  IdleStream() { check_rt(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "creating a stream"); }
  ~IdleStream() { cudaStreamDestroy(s_); }
  IdleStream(const IdleStream&) = delete;
  IdleStream& operator=(const IdleStream&) = delete;
  cudaStream_t get() const { return s_; }
  // Whether what it holds ran within `ms`. Bounded: a stream shares one of
  // the GPU's hardware queues with others (CUDA_DEVICE_MAX_CONNECTIONS, 8
  // by default), and one queued behind the very wait it is meant to end
  // would never run.
  bool finished_within(int ms) const {
    for (int waited = 0;; ++waited) {
      const cudaError_t e = cudaStreamQuery(s_);
      if (e == cudaSuccess) return true;
      if (e != cudaErrorNotReady) check_rt(e, "a stream of its own");
      if (waited >= ms) return false;
      usleep(1000);
    }
  }

 private:
  cudaStream_t s_ = nullptr;
};

constexpr int kIdleStreamMs = 10000;

}  // namespace

void SharedSignals::make_readback() {
  // Page-locked, and made now: a copy into pageable memory returns only once
  // done, and an allocation of page-locked memory later could wait for the
  // very stream a release is for.
  void* p = nullptr;
  check_rt(cudaMallocHost(&p, sizeof(uint32_t)), "allocating a stream signal's read-back word");
  readback_ = static_cast<uint32_t*>(p);
}

SharedSignals SharedSignals::create(int device, const std::string& what) {
  SharedSignals s;
  s.memory_ = SharedDeviceChunk::allocate(device, kSignalCount * sizeof(uint32_t), what);
  {
    const IdleStream idle;
    check_rt(cudaMemsetAsync(s.memory_.data(), 0, kSignalCount * sizeof(uint32_t), idle.get()), "zeroing " + what);
    check_rt(cudaStreamSynchronize(idle.get()), "zeroing " + what);
  }
  s.memory_fd_ = s.memory_.export_fd();
  s.make_readback();
  s.page_ = std::make_unique<SharedArena>(0, kSignalPageBytes, "zerod-stream-signals");  // zero-filled, sealed
  s.counts_ = new (s.page_->base()) SignalCounts{};
  s.record_mu_ = std::make_unique<std::mutex>();
  return s;
}

SharedSignals SharedSignals::import(int memory_fd, uint64_t memory_bytes, int counts_fd, int device) {
  const std::string what = "the daemon's stream signals";
  if (memory_bytes < kSignalCount * sizeof(uint32_t))
    fail(ZD_ERR_INTERNAL, what + ": " + std::to_string(memory_bytes) + " bytes of GPU memory, too few");
  SharedSignals s;
  s.memory_ = SharedDeviceChunk::import(memory_fd, memory_bytes, device);
  s.counts_ = map_counts(counts_fd, what);
  s.make_readback();
  s.record_mu_ = std::make_unique<std::mutex>();
  return s;
}

int SharedSignals::counts_fd() const { return page_ ? page_->fd() : -1; }

void SharedSignals::record(SignalId id, void* stream) const {
  std::lock_guard<std::mutex> lock(*record_mu_);
  const uint64_t n = counts_->issued[id].load(std::memory_order_relaxed) + 1;
  // The default flags put a memory barrier before the write: what the
  // stream wrote before is visible to whoever the word releases.
  check(driver().write_value(static_cast<CUstream>(stream), address(word(id)), static_cast<uint32_t>(n),
                             CU_STREAM_WRITE_VALUE_DEFAULT),
        "recording a stream signal");
  // Published once queued: a number the other side reads is always on its way.
  counts_->issued[id].store(n, std::memory_order_release);
}

void SharedSignals::wait_on(SignalId id, void* stream) const {
  const uint64_t n = counts_->issued[id].load(std::memory_order_acquire);
  if (n == 0) return;  // never recorded: nothing to wait for
  check(driver().wait_value(static_cast<CUstream>(stream), address(word(id)), static_cast<uint32_t>(n),
                            CU_STREAM_WAIT_VALUE_GEQ),
        "waiting for a stream signal");
}

void SharedSignals::release(SignalId id) const {
  const uint64_t n = counts_->issued[id].load(std::memory_order_acquire);
  const IdleStream idle;
  check(driver().write_value(idle.get(), address(word(id)), static_cast<uint32_t>(n), CU_STREAM_WRITE_VALUE_DEFAULT),
        "releasing a stream signal");
  if (!idle.finished_within(kIdleStreamMs))
    fail(ZD_ERR_TIMEOUT, "releasing a stream signal: the write did not run within " +
                             std::to_string(kIdleStreamMs / 1000) +
                             " s; its stream may share a hardware queue with the stream that waits "
                             "(CUDA_DEVICE_MAX_CONNECTIONS=32 in this process's environment makes that unlikely)");
}

bool SharedSignals::pending(SignalId id) const {
  const uint64_t n = counts_->issued[id].load(std::memory_order_acquire);
  if (n == 0) return false;
  std::lock_guard<std::mutex> lock(*record_mu_);
  if (readback_stuck_) return true;  // an earlier read never landed: as below
  try {
    const IdleStream idle;
    if (cudaMemcpyAsync(readback_, word(id), sizeof *readback_, cudaMemcpyDeviceToHost, idle.get()) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    // Not read in time (its queue behind a wait, as in release): taken for
    // pending, so the caller goes on to the release, which says why it
    // cannot. The copy may still land: the buffer is left to it.
    if (!idle.finished_within(kIdleStreamMs)) {
      readback_stuck_ = true;
      return true;
    }
  } catch (const std::exception&) {
    return false;
  }
  return signal_behind(*readback_, n);
}

SharedSignals::~SharedSignals() {
  if (readback_ && !readback_stuck_) cudaFreeHost(readback_);
  if (counts_ && !page_) munmap(counts_, kSignalPageBytes);  // an imported page; a created one is page_'s
  if (memory_fd_ >= 0) ::close(memory_fd_);
}

SharedSignals::SharedSignals(SharedSignals&& o) noexcept
    : memory_(std::move(o.memory_)), memory_fd_(std::exchange(o.memory_fd_, -1)),
      page_(std::move(o.page_)), counts_(std::exchange(o.counts_, nullptr)),
      readback_(std::exchange(o.readback_, nullptr)),
      readback_stuck_(o.readback_stuck_), record_mu_(std::move(o.record_mu_)) {}

SharedSignals& SharedSignals::operator=(SharedSignals&& o) noexcept {
  if (this != &o) {
    SharedSignals gone(std::move(*this));  // what this held goes at the end of the scope
    memory_ = std::move(o.memory_);
    memory_fd_ = std::exchange(o.memory_fd_, -1);
    page_ = std::move(o.page_);
    counts_ = std::exchange(o.counts_, nullptr);
    readback_ = std::exchange(o.readback_, nullptr);
    readback_stuck_ = o.readback_stuck_;
    record_mu_ = std::move(o.record_mu_);
  }
  return *this;
}

}  // namespace zerod
