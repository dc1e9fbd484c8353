// GPU memory and stream signals that cross processes, for the daemon on a GPU
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
// Order between the two processes' streams: SharedSignals, below.
//
// The driver's entry points are looked up through the runtime
// (cudaGetDriverEntryPointByVersion) rather than linked, so libzerod still
// loads where there is no driver.
//
// Built only with CUDA (ZEROD_HAVE_CUDA).
#pragma once

#include "signal_page.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

namespace zerod {

class SharedArena;  // memory/arena.h

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

// Order between a stream in one process and a stream in another, that
// either side can release when the other dies. The signals live in one page
// of host memory (signal_page.h) that both processes map and register with
// their GPU: per signal, a count of its records and a 32-bit word. record()
// has the stream write the record's number into the word when it gets there
// (cuStreamWriteValue32, after a memory barrier, so everything the stream
// did before is visible first) and then publishes the number; wait_on() has
// a stream wait until the word reaches the latest number published
// (cuStreamWaitValue32, which the GPU polls over the bus). A process killed
// with a record still queued never writes it; release(), once that process
// has exited, stores the latest number from the CPU and so ends every wait
// for it, and pending() reads the word from the CPU: neither goes through a
// stream, so neither can be held behind the wait it is about.
//
// A process alive whose GPU context has failed (a kernel of its faulted: a
// device-side assert, an illegal address) never runs its queued records
// either, and the other side's release waits for an exit that may never
// come (a trainer that catches the error and carries on, a daemon serving
// other jobs). So each process releases the signals it records itself,
// from the CPU, as soon as one of its CUDA calls says its context has
// failed: record() and wait_on() do, and release_if_context_failed() is
// for its other calls, and for the daemon's watch of its context while
// its record is pending, which finds a failure no call of the daemon's
// would (context_failure_watch.h). The context is the process's on that
// GPU, not one page's: every page of the process on it is released, so
// that a rank whose own calls stopped (its model broken by another's
// error) does not keep its trainer waiting. A record another thread of
// the process has queued when the release comes, and publishes only after
// it, would be missed by it (the release stops at the number published
// before): so the release first marks the context failed, and record()
// looks at that mark after it publishes and then releases its own number
// (signal_publish).
//
// Why not interprocess CUDA events: a wait on a cudaEventInterprocess record
// that its process never ran holds for good, and a later record of the same
// event does not end it (device.CudaShared.* on an H200, 2026-11-27: still
// held 10 s after the later record). Why not words in GPU memory (what
// replaced the events first, never run on a GPU): only a stream could write
// or read them, and that stream could share a hardware queue with the wait.
class SharedSignals {
 public:
  SharedSignals() = default;
  // The daemon's: a zeroed page (a sealed memfd), registered with GPU
  // `device`. `what` names it in errors.
  static SharedSignals create(int device, const std::string& what);
  // The trainer's: maps and registers with GPU `device` the page another
  // process created, `page_fd`, which the caller has checked is a memfd of
  // kSignalPageBytes sealed against resizing (transport::check_sealed_memfd;
  // the engine does not reach the transport). The fd is not closed here.
  static SharedSignals import(int page_fd, int device);
  ~SharedSignals();
  SharedSignals(SharedSignals&& o) noexcept;
  SharedSignals& operator=(SharedSignals&& o) noexcept;
  SharedSignals(const SharedSignals&) = delete;
  SharedSignals& operator=(const SharedSignals&) = delete;

  explicit operator bool() const { return page_ != nullptr; }
  // For sending: the page's fd (owned here; -1 for an imported one).
  int page_fd() const;

  // `stream` is a cudaStream_t (nullptr: the legacy default stream). A
  // failure that says this process's GPU context has failed releases first
  // (release_if_context_failed).
  void record(SignalId s, void* stream) const;
  void wait_on(SignalId s, void* stream) const;
  // Stores the latest number of `s` now (signal_release). Only once the
  // process that records `s` can no longer run work on the GPU (it has
  // exited, or its context has failed: release_if_context_failed):
  // its queued records never run then, and nothing else would.
  // "Exited" (transport::release_when_gone: its pidfd readable, or a
  // zombie) assumes the dead process's CUDA context went with it; a forked
  // child still holding its /dev/nvidia* files could keep that context, and
  // the queued record, alive, and this store would then race it.
  void release(SignalId s) const;
  // Whether the latest record of `s` has not written its number yet.
  bool pending(SignalId s) const;
  // Where `cuda_error`, which a CUDA call of this process on this page's GPU
  // returned, says the process's context there has failed
  // (cuda_context_failed_before): releases, on every page this process has
  // on that GPU, the signal it records there (kZerodDone on a page it
  // created, the daemon's; kTrainerDone on one it imported, the
  // trainer's), ending the other processes' waits for records that will
  // never run (signal_release_if_context_failed), and returns true. Any
  // other error (cudaSuccess included): nothing, false. Safe from any
  // thread and more than once: a store from the CPU that never moves a
  // word back.
  bool release_if_context_failed(int cuda_error) const;

 private:
  // The word's address on the GPU (the page's mapping there).
  unsigned long long device_word(SignalId s) const;

  std::unique_ptr<SharedArena> arena_;  // a created page (an imported one is only mapped)
  SignalPage* page_ = nullptr;          // the page, mapped here
  unsigned long long device_page_ = 0;  // CUdeviceptr: the page as the GPU addresses it
  int device_ = -1;                     // the GPU it is registered with (for errors)
  std::unique_ptr<std::mutex> record_mu_;  // a number is published in the order its writes are queued
  // That this process's context on the GPU has failed (any thread's
  // release_if_context_failed sets it): record() looks at it after each
  // publish. Owned by the process's list of pages, which outlives this.
  const std::atomic<bool>* context_failed_ = nullptr;
};

}  // namespace zerod
