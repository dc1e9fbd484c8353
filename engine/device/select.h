// Choosing and opening a rank's device: the job script's `device` ("cpu",
// "cuda" or "auto"), what this build and machine offer, and the clear error
// when a job asks for a GPU that is not there.
#pragma once

#include "device.h"
#include "runtime/workers.h"

#include <functional>
#include <memory>
#include <string>

namespace zerod {

// What this libzerod can run on: whether it was built with the cuda device,
// how many GPUs this process sees, and if none, why (for messages).
struct CudaAvailability {
  bool built = false;
  int devices = 0;
  std::string why;
};
CudaAvailability cuda_availability();

// The share of a GPU's free memory (when the model is created) that the
// device tier may use when the job sets no budget: the rest is the
// trainer's (activations, its own workspace) and CUDA's. The cuda device
// applies it; `zerod plan --device-memory` plans with it.
constexpr double kDefaultBudgetShare = 0.9;

// "cpu" or "cuda" for a job script's choice; "auto" becomes "cuda" where
// this process sees a GPU, else "cpu". "emulated" (device memory the engine
// cannot address, on the CPU: a daemon's ranks only, for tests of the GPU
// paths without a GPU) stays itself. Throws ZD_ERR_CONFIG, naming the job
// script (`source`), for "cuda" where there is none, and for a name it does
// not know.
std::string resolve_device(const std::string& request, const std::string& source);

// How a Model opens each rank's device: open_device, unless a caller (a
// test's emulated device) provides another.
using DeviceFactory = std::function<std::unique_ptr<Device>(const std::string& kind, MemoryLedger& ledger,
                                                            Workers& workers, int local_rank, const std::string& name)>;

// Opens the device (already resolved) for one rank; the pool charges the
// rank's ledger. local_rank picks the GPU (local_rank modulo the GPUs seen;
// in-process trainers use the GPU current on the calling thread when
// local_rank is -1). `name` labels the pool (memfd names, messages).
std::unique_ptr<Device> open_device(const std::string& kind, MemoryLedger& ledger, Workers& workers, int local_rank,
                                    const std::string& name);
// The same for a daemon's rank, whose trainer is another process: its pool
// can be exported and its stream order shared (Device::exports,
// stream_link). The cpu device's pool is shared memory already.
std::unique_ptr<Device> open_shared_device(const std::string& kind, MemoryLedger& ledger, Workers& workers,
                                           int local_rank, const std::string& name);

}  // namespace zerod
