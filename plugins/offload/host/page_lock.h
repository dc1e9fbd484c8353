// Page-locking host allocations for the GPU (cudaHostRegister), so copies to
// and from the device run at full speed and asynchronously. Only when the
// job asks for it (pin), the plugin was built with CUDA and a GPU is there.
// Two implementations, picked at build time: page_lock_cuda.cpp (linked to
// the static CUDA runtime, so the .so loads where there is no libcudart)
// and page_lock_none.cpp.
#ifndef ZEROD_PLUGINS_OFFLOAD_HOST_PAGE_LOCK_H
#define ZEROD_PLUGINS_OFFLOAD_HOST_PAGE_LOCK_H

#include <cstdint>
#include <string>

namespace zerod::offload {

class PageLock {
 public:
  // Probes for a GPU when pin is set (the first CUDA call: tens of ms).
  explicit PageLock(bool pin);

  bool enabled() const { return enabled_; }
  // "page-locked", or "not page-locked: <why>".
  const std::string& status() const { return status_; }

  // Registers [ptr, ptr + bytes); false with *error on failure.
  bool lock(void* ptr, uint64_t bytes, std::string* error) const;
  void unlock(void* ptr) const;

 private:
  bool enabled_ = false;
  std::string status_;
};

// The PCI bus id of the device the rank with this local rank uses
// (local_rank modulo the devices, as torchrun-style launchers assign them),
// "" when there is none. ZEROD_DEVICE_PCI_BUS_IDS, a comma-separated list by
// local rank, overrides it: for devices zerod does not query itself, and for
// tests of machines that are not this one.
std::string rank_device_bus_id(int32_t local_rank);

}  // namespace zerod::offload

#endif  // ZEROD_PLUGINS_OFFLOAD_HOST_PAGE_LOCK_H
