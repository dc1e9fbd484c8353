// PageLock for builds without CUDA: nothing is ever page-locked.
#include "page_lock.h"

namespace zerod::offload {

PageLock::PageLock(bool pin)
    : status_(pin ? "not page-locked: built without CUDA" : "not page-locked: pin = false") {}

bool PageLock::lock(void*, uint64_t, std::string*) const { return true; }

void PageLock::unlock(void*) const {}

}  // namespace zerod::offload

namespace zerod::offload {

// Built without a device runtime: no rank has a device zerod can name.
std::string runtime_device_bus_id(int32_t) { return ""; }

}  // namespace zerod::offload
