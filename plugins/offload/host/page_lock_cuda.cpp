// PageLock with the CUDA runtime.
#include <cuda_runtime_api.h>

#include "../common/text.h"
#include "page_lock.h"

namespace zerod::offload {

PageLock::PageLock(bool pin) {
  if (!pin) {
    status_ = "not page-locked: pin = false";
    return;
  }
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc == cudaErrorNoDevice || (rc == cudaSuccess && count == 0)) {
    status_ = "not page-locked: no GPU";
  } else if (rc == cudaErrorInsufficientDriver) {
    // A CPU machine with the toolkit installed but no driver.
    status_ = "not page-locked: no GPU (no CUDA driver)";
  } else if (rc != cudaSuccess) {
    status_ = format("not page-locked: no GPU (%s)", cudaGetErrorName(rc));
  } else {
    enabled_ = true;
    status_ = "page-locked";
  }
}

bool PageLock::lock(void* ptr, uint64_t bytes, std::string* error) const {
  if (!enabled_) return true;
  // Portable: every CUDA context of the process sees the memory as locked.
  const cudaError_t rc = cudaHostRegister(ptr, bytes, cudaHostRegisterPortable);
  if (rc != cudaSuccess) {
    *error = format("cudaHostRegister: %s (%s)", cudaGetErrorString(rc), cudaGetErrorName(rc));
    return false;
  }
  return true;
}

void PageLock::unlock(void* ptr) const {
  if (enabled_) cudaHostUnregister(ptr);
}

}  // namespace zerod::offload

namespace zerod::offload {

std::string runtime_device_bus_id(int32_t local_rank) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count <= 0) return "";
  char id[64] = "";
  if (cudaDeviceGetPCIBusId(id, sizeof id, (local_rank < 0 ? 0 : local_rank) % count) != cudaSuccess) return "";
  return id;
}

}  // namespace zerod::offload
