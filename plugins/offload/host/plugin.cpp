// zd_tier_host.so: the "host" tier, host RAM on the rank's NUMA node. This
// file is the ABI glue: the descriptor, hyperparameter checks and the entry
// points; placement.h says how the node is chosen and memory bound there,
// page_lock.h when memory is page-locked.
//
// Threads: allocate() and release() may be called from any thread at once;
// create/destroy are not concurrent with anything else on the instance.
#include <zerod/kit/plugin_descriptor.h>
#include <zerod/zerod_plugin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "../common/text.h"
#include "page_lock.h"
#include "placement.h"

namespace {

namespace off = zerod::offload;

constexpr double kUnbounded = __builtin_huge_val();
constexpr const char* kName = "host";

constexpr zd_hparam_spec kSpecs[] = {
    {"numa_node", ZD_HPARAM_INTEGER, 1, {-1.0, 0, 0, 0}, -1.0, kUnbounded, 0,
     "NUMA node (hwloc logical index) holding the rank's host memory; -1 = the node nearest the rank's device "
     "(its PCI bus id: CUDA's device local_rank modulo the devices, or ZEROD_DEVICE_PCI_BUS_IDS), else "
     "local_rank modulo the number of nodes"},
    {"pin", ZD_HPARAM_BOOL, 1, {1.0, 0, 0, 0}, 0.0, 1.0, 0,
     "page-lock allocations (cudaHostRegister) when a GPU is present, for full-speed asynchronous copies"},
    {"huge_pages", ZD_HPARAM_BOOL, 1, {1.0, 0, 0, 0}, 0.0, 1.0, 0,
     "back allocations of 2 MiB or more with transparent huge pages (madvise), so the optimizer's streams over "
     "its state miss the TLB 512 times less; false keeps 4 KiB pages"},
};
constexpr size_t kSpecCount = sizeof(kSpecs) / sizeof(kSpecs[0]);

struct Instance {
  zd_host_services host{};
  bool has_host = false;
  std::unique_ptr<off::Placement> placement;
  std::unique_ptr<off::PageLock> page_lock;
};

void log(const Instance* inst, zd_log_level level, const std::string& message) {
  if (inst->has_host) off::log_message(&inst->host, level, kName, message);
}

zd_status create(const zd_host_services* host, const double* values, size_t value_count,
                 const zd_tier_config* config, void** out_instance, char* err, size_t err_size) noexcept {
  if (out_instance == nullptr || config == nullptr) {
    off::set_error(err, err_size, "host: %s is NULL", out_instance == nullptr ? "out_instance" : "config");
    return ZD_ERR_INVALID_ARGUMENT;
  }
  *out_instance = nullptr;
  if (value_count != kSpecCount || values == nullptr) {
    off::set_error(err, err_size, "host: expected %zu hyperparameter values, got %zu", kSpecCount,
                   values == nullptr ? size_t{0} : value_count);
    return ZD_ERR_INVALID_ARGUMENT;
  }
  const double numa_node = values[0];
  if (!(numa_node >= -1) || numa_node != std::floor(numa_node) || numa_node > 1e9) {
    off::set_error(err, err_size, "host: numa_node = %g: must be a node index >= 0, or -1 for automatic", numa_node);
    return ZD_ERR_CONFIG;
  }
  for (size_t i : {size_t{1}, size_t{2}}) {
    if (values[i] != 0.0 && values[i] != 1.0) {
      off::set_error(err, err_size, "host: %s = %g: must be a bool (0 or 1)", kSpecs[i].name, values[i]);
      return ZD_ERR_CONFIG;
    }
  }
  try {
    auto inst = std::make_unique<Instance>();
    if (host != nullptr) {
      std::memcpy(&inst->host, host, std::min<size_t>(host->struct_size, sizeof inst->host));
      inst->host.struct_size = std::min<uint32_t>(host->struct_size, sizeof inst->host);
      inst->has_host = true;
    }
    std::string error;
    // A device's bus id only matters when the node is not chosen.
    const std::string bus_id = numa_node < 0 ? off::rank_device_bus_id(config->local_rank) : std::string();
    inst->placement = off::Placement::open(config->local_rank, static_cast<int64_t>(numa_node), bus_id, &error);
    if (!inst->placement) {
      off::copy_error(err, err_size, error);
      return ZD_ERR_CONFIG;
    }
    inst->placement->set_huge_pages(values[2] != 0.0);
    inst->page_lock = std::make_unique<off::PageLock>(values[1] != 0.0);
    *out_instance = inst.release();
    return ZD_OK;
  } catch (const std::bad_alloc&) {
    off::set_error(err, err_size, "host: out of memory creating the tier");
    return ZD_ERR_OUT_OF_MEMORY;
  } catch (...) {
    off::set_error(err, err_size, "host: internal error creating the tier");
    return ZD_ERR_INTERNAL;
  }
}

void destroy(void* instance) noexcept { delete static_cast<Instance*>(instance); }

uint32_t capabilities(const void*) noexcept { return ZD_TIER_CAP_ADDRESSABLE; }

void describe(const void* instance, char* out, size_t out_size) noexcept {
  const auto* inst = static_cast<const Instance*>(instance);
  if (inst == nullptr) {
    off::set_error(out, out_size, "host: (no instance)");
    return;
  }
  try {
    const off::Placement& p = *inst->placement;
    const std::string cpus = p.cpu_list();
    off::set_error(out, out_size, "host: NUMA node %d of %d (%s%s), by %s, %s, %s, %s", p.node(), p.node_count(),
                   cpus.empty() ? "no cpus" : "cpus ", cpus.c_str(), p.reason().c_str(), p.binding().c_str(),
                   inst->page_lock->status().c_str(), p.huge_pages_status().c_str());
  } catch (...) {
    off::set_error(out, out_size, "host: NUMA node %d", inst->placement->node());
  }
}

// With cpus == NULL returns how many there are, so the caller can size its
// array; otherwise how many it wrote.
int32_t cpus(const void* instance, int32_t* out, int32_t capacity) noexcept {
  const auto* inst = static_cast<const Instance*>(instance);
  if (inst == nullptr) return 0;
  const auto& list = inst->placement->cpus();
  const auto total = static_cast<int32_t>(list.size());
  if (out == nullptr) return total;
  const int32_t n = std::min(total, std::max(capacity, 0));
  for (int32_t i = 0; i < n; ++i) out[i] = list[static_cast<size_t>(i)];
  return n;
}

void* allocate(void* instance, uint64_t bytes, char* err, size_t err_size) noexcept {
  auto* inst = static_cast<Instance*>(instance);
  if (inst == nullptr) {
    off::set_error(err, err_size, "host: allocate on a NULL instance");
    return nullptr;
  }
  try {
    std::string error, warning;
    void* p = inst->placement->allocate(bytes, &error, &warning);
    if (!warning.empty()) log(inst, ZD_LOG_WARN, warning);
    if (p == nullptr) {
      off::copy_error(err, err_size, error);
      return nullptr;
    }
    if (!inst->page_lock->lock(p, off::mapped_bytes(bytes), &error)) {
      inst->placement->release(p, bytes);
      off::set_error(err, err_size, "host: page-locking %s on NUMA node %d failed: %s; pin = false uses pageable memory",
                     off::format_bytes(bytes).c_str(), inst->placement->node(), error.c_str());
      return nullptr;
    }
    return p;
  } catch (...) {
    off::set_error(err, err_size, "host: cannot allocate %s on NUMA node %d: out of memory",
                   off::format_bytes(bytes).c_str(), inst->placement->node());
    return nullptr;
  }
}

void release(void* instance, void* ptr, uint64_t bytes) noexcept {
  auto* inst = static_cast<Instance*>(instance);
  if (inst == nullptr || ptr == nullptr) return;
  inst->page_lock->unlock(ptr);
  inst->placement->release(ptr, bytes);
}

const zd_tier_v1 kDescriptor = {
    ZD_DESCRIPTOR_HEAD(ZD_PLUGIN_TIER, zd_tier_v1, ZD_TIER_ABI_VERSION, 0, 2, kName,
                       "host RAM bound to the rank's NUMA node (hwloc), page-locked when a GPU is present",
                       kSpecs, kSpecCount),
    .create = create,
    .destroy = destroy,
    .capabilities = capabilities,
    .describe = describe,
    .cpus = cpus,
    .allocate = allocate,
    .release = release,
    .alignment = nullptr,
    .reserve = nullptr,
    .submit = nullptr,
    .wait = nullptr,
};

}  // namespace

ZD_PLUGIN_DESCRIPTORS(&kDescriptor.header)
