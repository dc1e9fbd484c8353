// GPU memory and events that cross processes, for the daemon on a GPU
// (DESIGN.md §9): the daemon allocates a rank's device pool and passes it to
// the trainer once, as it passes memfd arenas on the CPU.
//
// Memory: CUDA virtual memory management allocations whose shareable handle
// is a POSIX file descriptor (cuMemCreate with
// CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR). The fd travels over the unix
// socket with SCM_RIGHTS like any other; whoever holds it maps the memory
// (cuMemImportFromShareableHandle, cuMemAddressReserve, cuMemMap,
// cuMemSetAccess). Unlike cudaIpcGetMemHandle this needs no ptrace rights
// or pidfd_getfd, so it works between processes of a container, and the
// fd is the only capability: a process that was not given it cannot map
// the memory. The memory lives until every process has unmapped it and
// closed its handle, so a trainer that dies leaves the daemon's copy intact.
//
// Events: cudaEventInterprocess events; their 64-byte handle travels as
// plain bytes.
//
// The driver's entry points are looked up through the runtime
// (cudaGetDriverEntryPointByVersion) rather than linked, so libzerod still
// loads where there is no driver.
//
// Built only with CUDA (ZEROD_HAVE_CUDA).
#pragma once

#include <cstdint>
#include <string>

namespace zerod {

// The size allocations on `device` are rounded up to (the driver's
// recommended granularity for shareable allocations).
uint64_t cuda_shared_granularity(int device);

class SharedDeviceChunk {
 public:
  SharedDeviceChunk() = default;
  // At least `bytes` on GPU `device` (rounded up to the granularity),
  // mapped read-write in this process. Throws ZD_ERR_OUT_OF_MEMORY when the
  // GPU refuses, naming `what`.
  static SharedDeviceChunk allocate(int device, uint64_t bytes, const std::string& what);
  // Maps a chunk another process exported: `fd` is its handle (not closed
  // here), `bytes` its size as the exporter reported it.
  static SharedDeviceChunk import(int fd, uint64_t bytes, int device);

  ~SharedDeviceChunk();
  SharedDeviceChunk(SharedDeviceChunk&& o) noexcept;
  SharedDeviceChunk& operator=(SharedDeviceChunk&& o) noexcept;
  SharedDeviceChunk(const SharedDeviceChunk&) = delete;
  SharedDeviceChunk& operator=(const SharedDeviceChunk&) = delete;

  // A new file descriptor for the allocation, owned by the caller (close it
  // once sent).
  int export_fd() const;
  void* data() const { return reinterpret_cast<void*>(ptr_); }
  uint64_t size() const { return bytes_; }
  int device() const { return device_; }
  explicit operator bool() const { return handle_ != 0; }

 private:
  void reset() noexcept;

  unsigned long long handle_ = 0;  // CUmemGenericAllocationHandle
  unsigned long long ptr_ = 0;     // CUdeviceptr
  uint64_t bytes_ = 0;
  int device_ = -1;
};

// An event one process records and another waits on.
struct SharedEventHandle {
  unsigned char bytes[64];
};

class SharedEvent {
 public:
  SharedEvent() = default;
  // A new interprocess event on the current GPU.
  static SharedEvent create();
  // Opens an event another process created.
  static SharedEvent open(const SharedEventHandle& h);
  ~SharedEvent();
  SharedEvent(SharedEvent&& o) noexcept;
  SharedEvent& operator=(SharedEvent&& o) noexcept;
  SharedEvent(const SharedEvent&) = delete;
  SharedEvent& operator=(const SharedEvent&) = delete;

  SharedEventHandle handle() const;
  void* get() const { return event_; }  // a cudaEvent_t
  // Records it on `stream` (a cudaStream_t), and makes `stream` wait for its
  // latest record.
  void record(void* stream) const;
  void wait_on(void* stream) const;
  // Records it on a new stream that holds nothing else, so the record runs
  // at once. For a peer that died with a record still queued behind its
  // work, which then never runs (call it only once that peer can no longer
  // run work on the GPU): CUDA documents a wait as one for the record it
  // was queued after, but a later record of the same event ends it too
  // (an event counts its records; a wait is for the count to reach its
  // record's), here or in another process. That is the driver's behaviour,
  // not the API's promise, and for an importer whose exporter has died
  // the API calls any use undefined: device.CudaShared.AWaitOnARecordAKilled*
  // check both on the driver at hand.
  void record_now() const;
  // The host waits for its latest record.
  void synchronize() const;
  // Whether its latest record, made here or in another process, has not run
  // yet (any other answer, an error included, is false).
  bool pending() const;

 private:
  void* event_ = nullptr;
};

}  // namespace zerod
