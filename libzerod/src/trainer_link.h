// Daemon mode, the trainer's side of its rank's device: the pool regions
// the daemon exported (mapped here once, as their fds arrive), and, on a
// GPU, the order between the trainer's stream and the daemon's
// (engine/device/device.h StreamLink, device/cuda_shared.h SharedSignals):
// before every call to the daemon the trainer's stream records kTrainerDone
// (so whatever the trainer wrote is ready when the daemon's reduction waits
// for it), and after a begin call it waits for kZerodDone (so it computes
// with parameters only once the daemon's gathers and copies are done). No
// host round trip beyond the call itself.
#pragma once

#include "device/device.h"
#include "transport/hangup_watch.h"
#include "transport/shared_memory.h"

#include <cstdint>
#include <memory>
#include <string>

namespace zerod {
class SharedSignals;  // device/cuda_shared.h
}  // namespace zerod

namespace zerod::abi {

// The GPU this thread has current (CUDA's numbering in this process) and
// its 16-byte UUID; false where this libzerod has no CUDA or no GPU is
// usable. A trainer asking for device "cuda" names it to its daemon.
bool current_gpu(int* ordinal, std::string* uuid);

// One exported region, mapped in this process.
class ImportedArena {
 public:
  ImportedArena();
  // Maps `fd` (not closed here) as the exporter described it.
  ImportedArena(const PoolExport& e, const std::string& what);
  ~ImportedArena();
  ImportedArena(ImportedArena&&) noexcept;
  ImportedArena& operator=(ImportedArena&&) noexcept;

  std::byte* data() const { return base_; }
  uint64_t size() const { return size_; }

 private:
  transport::SharedMapping host_;  // a memfd
  struct Gpu;
  std::unique_ptr<Gpu> gpu_;       // a CUDA allocation
  std::byte* base_ = nullptr;
  uint64_t size_ = 0;
};

class TrainerLink {
 public:
  // From the daemon's answer to zd_model_create: the rank's device and,
  // on a GPU, the StreamLink handles. Throws a clear error where this
  // libzerod cannot reach the device (built without CUDA). On a GPU,
  // `watch` (the daemon's socket, which must outlive this) releases the
  // trainer's stream from its wait for kZerodDone if the daemon dies with
  // that record unrun: once process `daemon_pid` has exited
  // (transport/hangup_watch.h, process_exit.h).
  TrainerLink(int32_t device_type, int32_t device_id, const StreamLink& link, transport::HangupWatch* watch,
              pid_t daemon_pid);
  ~TrainerLink();
  TrainerLink(const TrainerLink&) = delete;
  TrainerLink& operator=(const TrainerLink&) = delete;

  int32_t device_type() const { return device_type_; }
  int32_t device_id() const { return device_id_; }
  // zd_model_set_stream: the trainer's stream (a cudaStream_t; NULL: the
  // default stream). On the cpu device only NULL.
  void set_stream(void* stream);
  // Around each call to the daemon. Where a CUDA call here says this
  // process's GPU context has failed, kTrainerDone is released from the CPU
  // first (SharedSignals::release_if_context_failed), before the error
  // goes to the trainer: the daemon's stream never waits for a record of
  // this stream's that will not run.
  void before_call();
  void after_begin();
  // At the model's end, before the daemon is told: waits until the
  // trainer's stream has done what it holds (kernels reading views, the
  // last record of kTrainerDone) and unmaps this side's stream signals.
  // Unmapping the pool is not ordered on any stream. Best effort: an error
  // (a broken context) leaves the rest of the teardown to go on; a failed
  // context first releases kTrainerDone, so that the daemon's end of the
  // model, which synchronizes its stream, does not wait for a record of
  // this stream's behind the failed kernel, and this process for it. The
  // hangup watch stays on until the stream is done: a daemon that dies
  // meanwhile, its record of kZerodDone unrun, does not leave this waiting
  // forever.
  void quiesce() noexcept;

 private:
  void unwatch() noexcept;

  int32_t device_type_;
  int32_t device_id_;
  void* stream_ = nullptr;
  std::unique_ptr<SharedSignals> signals_;  // on a GPU
  transport::HangupWatch* watch_ = nullptr;
  int watch_id_ = -1;
  pid_t daemon_pid_ = 0;
};

}  // namespace zerod::abi
