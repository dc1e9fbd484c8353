#include "cuda_failure.h"

#include <atomic>
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

std::atomic<int> the_daemons_pid{0};  // name_cuda_failures_as_the_daemons

// Why every call fails now, after the error's name and text.
std::string context_failed_before(int pid) {
  if (pid == 0)
    return ". This process's GPU context had failed before this call: an earlier kernel failed on the GPU (most "
           "often the model's own, e.g. an index out of range), and every CUDA call since returns its error. "
           "CUDA_LAUNCH_BLOCKING=1 reports it at the kernel that failed; the process must be restarted to use the "
           "GPU again";
  return ". The zerod daemon's GPU context had failed before this call (the daemon's, pid " + std::to_string(pid) +
         ", not the trainer's): a kernel the daemon ran failed on the GPU (zerod's own or an optimizer plugin's; a "
         "trainer's kernels run in its own context), and every CUDA call of the daemon since returns its error. "
         "CUDA_LAUNCH_BLOCKING=1 in the daemon's environment reports it at the kernel that failed; the daemon must "
         "be restarted to use the GPU again";
}

}  // namespace

void name_cuda_failures_as_the_daemons(int pid) { the_daemons_pid.store(pid, std::memory_order_relaxed); }

int cuda_failures_daemon_pid() { return the_daemons_pid.load(std::memory_order_relaxed); }

CudaFailure describe_cuda_failure(int code, const std::string& name, const std::string& text, const std::string& call,
                                  const std::string& doing, int daemon_pid) {
  std::string message = call.empty() ? doing : call + " (" + doing + ")";
  message += ": " + (name.empty() ? "CUDA error " + std::to_string(code) : name) + ": " + text;
  if (cuda_context_failed_before(code)) message += context_failed_before(daemon_pid);
  return {status_of(code), std::move(message)};
}

}  // namespace zerod
