// The cuda device: a rank's device tier in the HBM of one NVIDIA GPU.
// Built only with CUDA (ZEROD_HAVE_CUDA); select.cpp is its only caller.
#pragma once

#include "device.h"
#include "select.h"
#include "runtime/workers.h"

#include <memory>
#include <string>

namespace zerod {

// What this process sees: the GPUs, or why there are none.
CudaAvailability cuda_probe();

// Opens the GPU `local_rank` modulo the GPUs seen (-1: the calling thread's
// current GPU, as an in-process trainer has it). Without a device budget in
// the job, the budget becomes kDefaultBudgetShare (select.h) of the GPU's free memory.
// shared: a daemon's device, whose pool and stream order a trainer in
// another process shares (exports(), stream_link()).
std::unique_ptr<Device> make_cuda_device(MemoryLedger& ledger, Workers& workers, int local_rank,
                                         const std::string& name, bool shared = false);

}  // namespace zerod
