// How zerod reports a CUDA call that failed, the driver's (CUresult) or the
// runtime's (cudaError_t): a status and a message naming the call, what
// zerod was doing with it, and the error's name and text. Plain C++, built
// with or without CUDA, so that CI tests it without a GPU (device_test);
// cuda_shared.cpp and cuda_device.cpp throw what it returns.
//
// Why it matters: once a kernel fails on the device (a device-side assert,
// such as nn.Embedding's index out of range, or an illegal address), the
// process's CUDA context is unusable and every later CUDA call returns that
// error, zerod's included. Reported as ZD_ERR_INTERNAL ("a bug in zerod")
// it would blame zerod for the model's kernel.
#pragma once

#include <zerod/zerod.h>

#include <string>

namespace zerod {

// Error codes, equal in cuda.h (CUDA_ERROR_*) and driver_types.h
// (cudaError*): cuda_shared.cpp checks them against both headers.
namespace cuda_code {
constexpr int kOutOfMemory = 2;             // CUDA_ERROR_OUT_OF_MEMORY, cudaErrorMemoryAllocation
constexpr int kEccUncorrectable = 214;      // CUDA_ERROR_ECC_UNCORRECTABLE
constexpr int kContained = 226;             // CUDA_ERROR_CONTAINED (newer than CUDA 12.0)
constexpr int kIllegalAddress = 700;        // CUDA_ERROR_ILLEGAL_ADDRESS
constexpr int kLaunchTimeout = 702;         // CUDA_ERROR_LAUNCH_TIMEOUT
constexpr int kAssert = 710;                // CUDA_ERROR_ASSERT: a device-side assert
constexpr int kHardwareStackError = 714;    // CUDA_ERROR_HARDWARE_STACK_ERROR
constexpr int kIllegalInstruction = 715;    // CUDA_ERROR_ILLEGAL_INSTRUCTION
constexpr int kMisalignedAddress = 716;     // CUDA_ERROR_MISALIGNED_ADDRESS
constexpr int kInvalidAddressSpace = 717;   // CUDA_ERROR_INVALID_ADDRESS_SPACE
constexpr int kInvalidPc = 718;             // CUDA_ERROR_INVALID_PC
constexpr int kLaunchFailed = 719;          // CUDA_ERROR_LAUNCH_FAILED, cudaErrorLaunchFailure
constexpr int kTensorMemoryLeak = 721;      // CUDA_ERROR_TENSOR_MEMORY_LEAK (newer than CUDA 12.0)
constexpr int kNotReady = 600;              // CUDA_ERROR_NOT_READY: a query's "not yet", no error
}  // namespace cuda_code

// Whether `code` is one of the errors a failed kernel leaves in its
// context for good (cuda.h: "any further CUDA work will return the same
// error"): a call that returns it did not cause it.
bool cuda_context_failed_before(int code);

struct CudaFailure {
  zd_status status;
  std::string message;
};

// Marks this process as the zerod daemon (its pid) whose GPU errors go to
// trainers in other processes: the cuda device calls it when it opens a
// shared device, which only a daemon does. From then on a failed context is
// named as the daemon's: "this process's", read in a trainer, would send
// its user looking for a fault of the trainer's and restarting the wrong
// process.
void name_cuda_failures_as_the_daemons(int pid);
// That pid; 0 in a process that never opened a shared device.
int cuda_failures_daemon_pid();

// `code`, `name` and `text` are the error's (cuGetErrorName and
// cuGetErrorString, or the runtime's); `call` the CUDA function that
// returned it ("" where the caller does not name it); `doing` what zerod
// was doing, naming the GPU. The status: ZD_ERR_OUT_OF_MEMORY for memory,
// ZD_ERR_IO (a device error) for a context an earlier kernel broke, whose
// message says so, naming the zerod daemon's context where `daemon_pid`
// is not 0 (name_cuda_failures_as_the_daemons); ZD_ERR_INTERNAL for the
// rest, which zerod's own use of CUDA would have caused.
CudaFailure describe_cuda_failure(int code, const std::string& name, const std::string& text, const std::string& call,
                                  const std::string& doing, int daemon_pid = cuda_failures_daemon_pid());

}  // namespace zerod
