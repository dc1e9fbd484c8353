#include "cuda_shared.h"

#include "cuda_failure.h"
#include "error.h"
#include "memory/arena.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <sys/mman.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <map>
#include <new>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace zerod {

namespace {

// cuda_failure.h's codes, which CI tests without CUDA's headers, are the
// driver's and the runtime's.
constexpr bool same_code(int ours, CUresult driver, cudaError_t runtime) {
  return ours == static_cast<int>(driver) && ours == static_cast<int>(runtime);
}
static_assert(same_code(cuda_code::kOutOfMemory, CUDA_ERROR_OUT_OF_MEMORY, cudaErrorMemoryAllocation));
static_assert(same_code(cuda_code::kEccUncorrectable, CUDA_ERROR_ECC_UNCORRECTABLE, cudaErrorECCUncorrectable));
static_assert(same_code(cuda_code::kIllegalAddress, CUDA_ERROR_ILLEGAL_ADDRESS, cudaErrorIllegalAddress));
static_assert(same_code(cuda_code::kLaunchTimeout, CUDA_ERROR_LAUNCH_TIMEOUT, cudaErrorLaunchTimeout));
static_assert(same_code(cuda_code::kAssert, CUDA_ERROR_ASSERT, cudaErrorAssert));
static_assert(same_code(cuda_code::kHardwareStackError, CUDA_ERROR_HARDWARE_STACK_ERROR, cudaErrorHardwareStackError));
static_assert(same_code(cuda_code::kIllegalInstruction, CUDA_ERROR_ILLEGAL_INSTRUCTION, cudaErrorIllegalInstruction));
static_assert(same_code(cuda_code::kMisalignedAddress, CUDA_ERROR_MISALIGNED_ADDRESS, cudaErrorMisalignedAddress));
static_assert(same_code(cuda_code::kInvalidAddressSpace, CUDA_ERROR_INVALID_ADDRESS_SPACE,
                        cudaErrorInvalidAddressSpace));
static_assert(same_code(cuda_code::kInvalidPc, CUDA_ERROR_INVALID_PC, cudaErrorInvalidPc));
static_assert(same_code(cuda_code::kLaunchFailed, CUDA_ERROR_LAUNCH_FAILED, cudaErrorLaunchFailure));
static_assert(same_code(cuda_code::kNotReady, CUDA_ERROR_NOT_READY, cudaErrorNotReady));
#if CUDA_VERSION >= 13000  // both in 13.0's headers; 12.0's lack them
static_assert(same_code(cuda_code::kContained, CUDA_ERROR_CONTAINED, cudaErrorContained));
static_assert(same_code(cuda_code::kTensorMemoryLeak, CUDA_ERROR_TENSOR_MEMORY_LEAK, cudaErrorTensorMemoryLeak));
#endif

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
  decltype(&cuGetErrorName) error_name = nullptr;
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
    load(&d.error_name, "cuGetErrorName", &d.missing);
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

std::string name(CUresult r) {
  const char* s = nullptr;
  if (driver().error_name(r, &s) != CUDA_SUCCESS || !s) return "";
  return s;
}

// Checks driver call `call`, made while `doing` (which names the GPU).
void check(CUresult r, const char* call, const std::string& doing) {
  if (r == CUDA_SUCCESS) return;
  const CudaFailure f = describe_cuda_failure(r, name(r), text(r), call, doing);
  fail(f.status, "shared GPU memory: " + f.message);
}

// Checks runtime call `call`, made while `doing` (which names the GPU).
void check_rt(cudaError_t e, const char* call, const std::string& doing) {
  if (e == cudaSuccess) return;
  // The error is this call's, reported here: cleared from the runtime's
  // last error, which torch would otherwise raise later from an unrelated
  // kernel launch. (A context an earlier kernel broke keeps its error
  // whatever is cleared: describe_cuda_failure says so.)
  cudaGetLastError();
  const CudaFailure f = describe_cuda_failure(e, cudaGetErrorName(e), cudaGetErrorString(e), call, doing);
  fail(f.status, "shared GPU memory: " + f.message);
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
  check_rt(cudaSetDevice(device), "cudaSetDevice", "selecting GPU " + std::to_string(device));
  check_rt(cudaFree(nullptr), "cudaFree", "starting CUDA on GPU " + std::to_string(device));
}

// Reserves an address range for `bytes`, maps `handle` (memory of GPU
// `device`) there and makes it readable and writable from `devices`.
CUdeviceptr map_here(CUmemGenericAllocationHandle handle, uint64_t bytes, int device, const std::vector<int>& devices) {
  const Driver& d = driver();
  const std::string chunk = "a chunk of " + std::to_string(bytes) + " bytes of GPU " + std::to_string(device);
  CUdeviceptr ptr = 0;
  check(d.reserve(&ptr, bytes, 0, 0, 0), "cuMemAddressReserve", "reserving address space for " + chunk);
  if (CUresult r = d.map(ptr, bytes, 0, handle, 0); r != CUDA_SUCCESS) {
    d.address_free(ptr, bytes);
    check(r, "cuMemMap", "mapping " + chunk);
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
    check(r, "cuMemSetAccess", "granting access to " + chunk);
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
  check(driver().granularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED), "cuMemGetAllocationGranularity",
        "reading GPU " + std::to_string(device) + "'s allocation granularity");
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
    check(r, "cuMemCreate", "allocating " + what + " on GPU " + std::to_string(device));
  }
  SharedDeviceChunk c;
  c.handle_ = h;
  c.bytes_ = size;
  c.device_ = device;
  c.ptr_ = map_here(h, size, device, with_peers(device));  // on failure c's destructor releases h
  return c;
}

SharedDeviceChunk SharedDeviceChunk::import(int fd, uint64_t bytes, int device) {
  use_device(device);
  const Driver& d = driver();
  CUmemGenericAllocationHandle h = 0;
  check(d.import_handle(&h, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
        "cuMemImportFromShareableHandle",
        "importing a chunk of " + std::to_string(bytes) + " bytes for GPU " + std::to_string(device));
  SharedDeviceChunk c;
  c.handle_ = h;
  c.bytes_ = bytes;
  c.device_ = device;
  c.ptr_ = map_here(h, bytes, device, {device});
  return c;
}

int SharedDeviceChunk::export_fd() const {
  int fd = -1;
  check(driver().export_handle(&fd, handle_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
        "cuMemExportToShareableHandle",
        "exporting a chunk of " + std::to_string(bytes_) + " bytes of GPU " + std::to_string(device_));
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

SignalPage* map_page(int fd, const std::string& what) {
  void* p = mmap(nullptr, kSignalPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) fail(ZD_ERR_OUT_OF_MEMORY, what + ": mapping its page: " + errno_text(errno));
  return static_cast<SignalPage*>(p);
}

// Registers the page with GPU `device` (page-locked, mapped into the GPU's
// address space, for every context: portable) and returns its address
// there. Registering memory another process mapped too is what NCCL's
// shared-memory transport does with its own pages.
unsigned long long register_page(SignalPage* page, int device, const std::string& what) {
  use_device(device);
  check_rt(cudaHostRegister(page, kSignalPageBytes, cudaHostRegisterMapped | cudaHostRegisterPortable),
           "cudaHostRegister", "registering " + what + " with GPU " + std::to_string(device));
  void* on_gpu = nullptr;
  const cudaError_t e = cudaHostGetDevicePointer(&on_gpu, page, 0);
  if (e != cudaSuccess) {
    cudaHostUnregister(page);
    check_rt(e, "cudaHostGetDevicePointer",
             "finding " + what + " in GPU " + std::to_string(device) + "'s address space");
  }
  return static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(on_gpu));
}

// For errors: which signal, as the reader of a message knows it.
std::string signal_name(SignalId id) {
  switch (id) {
    case kZerodDone:
      return "the signal that zerod's work is done (kZerodDone)";
    case kTrainerDone:
      return "the signal that the trainer's work is done (kTrainerDone)";
    default:
      return "stream signal " + std::to_string(static_cast<int>(id));
  }
}

// The signal pages this process has mapped, by GPU: a context that failed
// is the process's on that GPU, so none of the records it queued there, on
// any page, will run. Pages, not SharedSignals, which move: a page stays
// where it is mapped until ~SharedSignals. Never destroyed (a device freed
// during static destruction still leaves it).
class LivePages {
 public:
  // Returns the word that the context on `gpu` has failed, which record()
  // reads after each publish (signal_publish): it lives as long as this.
  const std::atomic<bool>& add(SignalPage* page, int gpu, SignalId mine) {
    std::lock_guard<std::mutex> lock(mu_);
    pages_.push_back({page, gpu, mine});
    return context_failed_locked(gpu);
  }
  void remove(const SignalPage* page) {
    std::lock_guard<std::mutex> lock(mu_);
    std::erase_if(pages_, [page](const Entry& e) { return e.page == page; });
  }
  // Every page on `gpu` releases the signal this process records there,
  // after marking the context failed: a record another thread has queued
  // but not yet published is left to that thread. Not under any page's
  // record lock, which record() holds when it calls this.
  void release_on(int gpu, int cuda_error) {
    std::lock_guard<std::mutex> lock(mu_);
    std::atomic<bool>& failed = context_failed_locked(gpu);
    for (const Entry& e : pages_)
      if (e.gpu == gpu) signal_release_if_context_failed(*e.page, e.mine, cuda_error, failed);
  }

 private:
  struct Entry {
    SignalPage* page;
    int gpu;
    SignalId mine;  // the signal this process records on it
  };

  std::atomic<bool>& context_failed_locked(int gpu) { return context_failed_.try_emplace(gpu, false).first->second; }

  std::mutex mu_;
  std::vector<Entry> pages_;
  // By GPU, set once for good (a failed context stays failed). A map's
  // entries never move: record() holds their addresses without mu_.
  std::map<int, std::atomic<bool>> context_failed_;
};

LivePages& live_pages() {
  static LivePages* pages = new LivePages;
  return *pages;
}

}  // namespace

SharedSignals SharedSignals::create(int device, const std::string& what) {
  SharedSignals s;
  s.arena_ = std::make_unique<SharedArena>(0, kSignalPageBytes, "zerod-stream-signals");  // zero-filled, sealed
  s.page_ = new (s.arena_->base()) SignalPage{};
  s.device_page_ = register_page(s.page_, device, what);
  s.device_ = device;
  s.record_mu_ = std::make_unique<std::mutex>();
  s.context_failed_ = &live_pages().add(s.page_, device, kZerodDone);  // the daemon's page: it records kZerodDone
  return s;
}

SharedSignals SharedSignals::import(int page_fd, int device) {
  const std::string what = "the daemon's stream signals";
  SharedSignals s;
  s.page_ = map_page(page_fd, what);
  s.device_page_ = register_page(s.page_, device, what);  // on failure s's destructor unmaps the page
  s.device_ = device;
  s.record_mu_ = std::make_unique<std::mutex>();
  s.context_failed_ = &live_pages().add(s.page_, device, kTrainerDone);  // the trainer's: it records kTrainerDone
  return s;
}

int SharedSignals::page_fd() const { return arena_ ? arena_->fd() : -1; }

unsigned long long SharedSignals::device_word(SignalId id) const {
  return device_page_ + offsetof(SignalPage, word) + static_cast<unsigned>(id) * sizeof(uint32_t);
}

void SharedSignals::record(SignalId id, void* stream) const {
  std::lock_guard<std::mutex> lock(*record_mu_);
  const uint64_t n = page_->issued[id].load(std::memory_order_relaxed) + 1;
  // The default flags put a memory barrier before the write: what the
  // stream wrote before is visible to whoever the word releases.
  const CUresult r = driver().write_value(static_cast<CUstream>(stream), device_word(id), static_cast<uint32_t>(n),
                                          CU_STREAM_WRITE_VALUE_DEFAULT);
  // Not published: the failed record is not waited for, but the last one
  // was, and may sit behind the kernel that failed the context.
  release_if_context_failed(r);
  check(r, "cuStreamWriteValue32", "recording " + signal_name(id) + " on a stream of GPU " + std::to_string(device_));
  // Published once queued: a number the other side reads is always on its
  // way, or released here if another thread saw the context fail since the
  // write was queued (its release stopped at n - 1).
  signal_publish(*page_, id, n, *context_failed_);
}

void SharedSignals::wait_on(SignalId id, void* stream) const {
  const uint64_t n = page_->issued[id].load(std::memory_order_acquire);
  if (n == 0) return;  // never recorded: nothing to wait for
  const CUresult r = driver().wait_value(static_cast<CUstream>(stream), device_word(id), static_cast<uint32_t>(n),
                                         CU_STREAM_WAIT_VALUE_GEQ);
  release_if_context_failed(r);
  check(r, "cuStreamWaitValue32",
        "queuing a wait for " + signal_name(id) + " on a stream of GPU " + std::to_string(device_));
}

void SharedSignals::release(SignalId id) const { signal_release(*page_, id); }

bool SharedSignals::pending(SignalId id) const { return signal_pending(*page_, id); }

bool SharedSignals::release_if_context_failed(int cuda_error) const {
  if (!page_ || !cuda_context_failed_before(cuda_error)) return false;
  live_pages().release_on(device_, cuda_error);
  return true;
}

SharedSignals::~SharedSignals() {
  if (!page_) return;
  live_pages().remove(page_);  // before the page goes: a release on another thread may be writing it
  // Nothing queued may use it any more: the trainer's side quiesces its
  // stream first, the daemon's device synchronizes before it goes. An
  // error is cleared only where this call made it: one the trainer's own
  // code has yet to see stays for it.
  if (device_page_ && cudaHostUnregister(page_) != cudaSuccess) cudaGetLastError();
  if (!arena_) munmap(page_, kSignalPageBytes);  // an imported page; a created one is arena_'s
}

SharedSignals::SharedSignals(SharedSignals&& o) noexcept
    : arena_(std::move(o.arena_)), page_(std::exchange(o.page_, nullptr)),
      device_page_(std::exchange(o.device_page_, 0)), device_(std::exchange(o.device_, -1)),
      record_mu_(std::move(o.record_mu_)), context_failed_(std::exchange(o.context_failed_, nullptr)) {}

SharedSignals& SharedSignals::operator=(SharedSignals&& o) noexcept {
  if (this != &o) {
    SharedSignals gone(std::move(*this));  // what this held goes at the end of the scope
    arena_ = std::move(o.arena_);
    page_ = std::exchange(o.page_, nullptr);
    device_page_ = std::exchange(o.device_page_, 0);
    device_ = std::exchange(o.device_, -1);
    record_mu_ = std::move(o.record_mu_);
    context_failed_ = std::exchange(o.context_failed_, nullptr);
  }
  return *this;
}

}  // namespace zerod
