#include "cuda_failure.h"

#include <utility>

namespace zerod {

bool cuda_context_failed_before(int code) {
  using namespace cuda_code;
  switch (code) {
    case kEccUncorrectable:
    case kContained:
    case kIllegalAddress:
    case kLaunchTimeout:
    case kAssert:
    case kHardwareStackError:
    case kIllegalInstruction:
    case kMisalignedAddress:
    case kInvalidAddressSpace:
    case kInvalidPc:
    case kLaunchFailed:
    case kTensorMemoryLeak:
      return true;
    default:
      return false;
  }
}

namespace {

zd_status status_of(int code) {
  if (code == cuda_code::kOutOfMemory) return ZD_ERR_OUT_OF_MEMORY;
  if (cuda_context_failed_before(code)) return ZD_ERR_IO;
  return ZD_ERR_INTERNAL;
}

}  // namespace

CudaFailure describe_cuda_failure(int code, const std::string& name, const std::string& text, const std::string& call,
                                  const std::string& doing) {
  std::string message = call.empty() ? doing : call + " (" + doing + ")";
  message += ": " + (name.empty() ? "CUDA error " + std::to_string(code) : name) + ": " + text;
  if (cuda_context_failed_before(code))
    message +=
        ". This process's GPU context had failed before this call: an earlier kernel failed on the GPU (most "
        "often the model's own, e.g. an index out of range), and every CUDA call since returns its error. "
        "CUDA_LAUNCH_BLOCKING=1 reports it at the kernel that failed; the process must be restarted to use the "
        "GPU again";
  return {status_of(code), std::move(message)};
}

}  // namespace zerod
