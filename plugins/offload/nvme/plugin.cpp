// zd_tier_nvme.so: the "nvme" tier, a rank's store striped over files on
// fast local disks, read and written with O_DIRECT through libaio. This file
// is the ABI glue: the descriptor, hyperparameter checks and the entry
// points. store_file.h checks a path and opens the store file in it,
// store.h lays the store out and reserves space, aio_queue.h moves bytes.
//
// Threads: reserve(), submit() and wait() may be called from any threads at
// once (aio_queue.h says how waits share the reaping); create and destroy
// are not concurrent with anything else on the instance, and destroy waits
// for the transfers in flight.
#include <zerod/kit/plugin_descriptor.h>
#include <zerod/zerod_plugin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include <unistd.h>

#include "../common/text.h"
#include "aio_queue.h"
#include "store.h"
#include "store_file.h"

namespace {

namespace off = zerod::offload;

constexpr const char* kName = "nvme";
constexpr double kMiB = 1024.0 * 1024.0;

// Defaults as DeepSpeed's aio config (block_size 1 MiB, queue_depth 8):
// on this class of machine 1 MiB blocks with 8 in flight reach the disk's
// sequential rate (deepspeed-internals.md §2.3).
constexpr zd_hparam_spec kSpecs[] = {
    {"block_size", ZD_HPARAM_INTEGER, 1, {kMiB, 0, 0, 0}, 4096.0, 1024.0 * kMiB, 0,
     "bytes of one I/O: a power of two, a multiple of the paths' alignment (4096 or the device's block size)"},
    {"queue_depth", ZD_HPARAM_INTEGER, 1, {8.0, 0, 0, 0}, 1.0, 4096.0, 0, "I/Os in flight per rank"},
    {"stripe_size", ZD_HPARAM_INTEGER, 1, {kMiB, 0, 0, 0}, 4096.0, 1024.0 * 1024.0 * kMiB, 0,
     "bytes stored on one path before the next path takes over: a power of two, a multiple of the alignment"},
};
constexpr size_t kSpecCount = sizeof(kSpecs) / sizeof(kSpecs[0]);

struct Instance {
  zd_host_services host{};
  bool has_host = false;
  int32_t rank = 0;
  uint64_t block = 0;
  uint32_t depth = 0;
  std::unique_ptr<off::Store> store;
  std::unique_ptr<off::AioQueue> queue;  // destroyed first: it waits on the store's fds
  ~Instance() { queue.reset(); }
};

void log(const Instance* inst, zd_log_level level, const std::string& message) {
  if (inst->has_host) off::log_message(&inst->host, level, kName, message);
}

bool is_power_of_two(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

// The hyperparameters as the host resolved them; the host checks the spec
// ranges too, but a plugin does not rely on that.
bool check_values(const double* v, char* err, size_t err_size) {
  for (size_t i = 0; i < kSpecCount; ++i) {
    if (!(v[i] >= kSpecs[i].min && v[i] <= kSpecs[i].max) || v[i] != std::floor(v[i])) {
      off::set_error(err, err_size, "nvme: %s = %g: must be a whole number in [%.0f, %.0f]", kSpecs[i].name, v[i],
                     kSpecs[i].min, kSpecs[i].max);
      return false;
    }
  }
  for (size_t i : {size_t{0}, size_t{2}}) {
    if (!is_power_of_two(static_cast<uint64_t>(v[i]))) {
      off::set_error(err, err_size, "nvme: %s = %.0f: must be a power of two", kSpecs[i].name, v[i]);
      return false;
    }
  }
  return true;
}

zd_status create(const zd_host_services* host, const double* values, size_t value_count,
                 const zd_tier_config* config, void** out_instance, char* err, size_t err_size) noexcept {
  if (out_instance == nullptr || config == nullptr) {
    off::set_error(err, err_size, "nvme: %s is NULL", out_instance == nullptr ? "out_instance" : "config");
    return ZD_ERR_INVALID_ARGUMENT;
  }
  *out_instance = nullptr;
  if (value_count != kSpecCount || values == nullptr) {
    off::set_error(err, err_size, "nvme: expected %zu hyperparameter values, got %zu", kSpecCount,
                   values == nullptr ? size_t{0} : value_count);
    return ZD_ERR_INVALID_ARGUMENT;
  }
  if (!check_values(values, err, err_size)) return ZD_ERR_CONFIG;
  if (config->path_count < 1 || config->paths == nullptr) {
    off::set_error(err, err_size, "nvme: no paths: the tier needs at least one directory to keep its store in");
    return ZD_ERR_CONFIG;
  }
  try {
    auto inst = std::make_unique<Instance>();
    if (host != nullptr) {
      std::memcpy(&inst->host, host, std::min<size_t>(host->struct_size, sizeof inst->host));
      inst->host.struct_size = std::min<uint32_t>(host->struct_size, sizeof inst->host);
      inst->has_host = true;
    }
    inst->rank = config->rank;
    inst->block = static_cast<uint64_t>(values[0]);
    inst->depth = static_cast<uint32_t>(values[1]);
    const auto stripe = static_cast<uint64_t>(values[2]);

    std::vector<off::StoreFile> files;
    uint64_t alignment = 4096;
    std::string error;
    for (int32_t i = 0; i < config->path_count; ++i) {
      const char* path = config->paths[i];
      if (path == nullptr || *path == '\0') {
        for (auto& f : files) ::close(f.fd);
        off::set_error(err, err_size, "nvme: path %d is empty", i);
        return ZD_ERR_CONFIG;
      }
      off::StoreFile f;
      if (!off::open_store_file(path, config->rank, &f, &error)) {
        for (auto& g : files) ::close(g.fd);
        off::copy_error(err, err_size, error);
        return ZD_ERR_IO;
      }
      alignment = std::max(alignment, f.dio_align);
      files.push_back(std::move(f));
    }
    inst->store = std::make_unique<off::Store>(std::move(files), stripe, alignment, config->rank);
    for (size_t i : {size_t{0}, size_t{2}}) {
      if (static_cast<uint64_t>(values[i]) % alignment != 0) {
        off::set_error(err, err_size, "nvme: %s = %.0f: must be a multiple of the paths' alignment, %llu bytes",
                       kSpecs[i].name, values[i], static_cast<unsigned long long>(alignment));
        return ZD_ERR_CONFIG;
      }
    }
    inst->queue = off::AioQueue::open(*inst->store, inst->block, inst->depth, &error);
    if (!inst->queue) {
      off::copy_error(err, err_size, error);
      return ZD_ERR_IO;
    }
    *out_instance = inst.release();
    return ZD_OK;
  } catch (const std::bad_alloc&) {
    off::set_error(err, err_size, "nvme: out of memory creating the tier");
    return ZD_ERR_OUT_OF_MEMORY;
  } catch (...) {
    off::set_error(err, err_size, "nvme: internal error creating the tier");
    return ZD_ERR_INTERNAL;
  }
}

void destroy(void* instance) noexcept { delete static_cast<Instance*>(instance); }

uint32_t capabilities(const void*) noexcept { return ZD_TIER_CAP_BLOCK; }

void describe(const void* instance, char* out, size_t out_size) noexcept {
  const auto* inst = static_cast<const Instance*>(instance);
  if (inst == nullptr) {
    off::set_error(out, out_size, "nvme: (no instance)");
    return;
  }
  try {
    const off::Store& s = *inst->store;
    std::string paths;
    for (uint32_t p = 0; p < s.path_count(); ++p) {
      paths += off::format("%s%s (%s%s)", p ? ", " : "", s.file(p).dir.c_str(), s.file(p).fs.c_str(),
                           s.file(p).tmpfile ? "" : ", named and unlinked");
    }
    off::set_error(out, out_size,
                   "nvme: %u path%s: %s; stripe %s, block %s, queue depth %u, alignment %llu, libaio O_DIRECT; %s "
                   "reserved",
                   s.path_count(), s.path_count() == 1 ? "" : "s", paths.c_str(), off::format_bytes(s.stripe()).c_str(),
                   off::format_bytes(inst->block).c_str(), inst->depth,
                   static_cast<unsigned long long>(s.alignment()), off::format_bytes(s.size()).c_str());
  } catch (...) {
    off::set_error(out, out_size, "nvme");
  }
}

// Storage has no CPUs of its own to prefer.
int32_t cpus(const void*, int32_t*, int32_t) noexcept { return 0; }

uint64_t alignment(const void* instance) noexcept {
  const auto* inst = static_cast<const Instance*>(instance);
  return inst == nullptr ? 4096 : inst->store->alignment();
}

zd_status reserve(void* instance, uint64_t bytes, const char* what, uint64_t* offset, char* err,
                  size_t err_size) noexcept {
  auto* inst = static_cast<Instance*>(instance);
  if (inst == nullptr || offset == nullptr) {
    off::set_error(err, err_size, "nvme: reserve: %s is NULL", inst == nullptr ? "instance" : "offset");
    return ZD_ERR_INVALID_ARGUMENT;
  }
  try {
    std::string report, error;
    if (!inst->store->reserve(bytes, what, offset, &report, &error)) {
      off::copy_error(err, err_size, error);
      return ZD_ERR_IO;
    }
    log(inst, ZD_LOG_INFO, report);
    return ZD_OK;
  } catch (...) {
    off::set_error(err, err_size, "nvme: reserve: out of memory");
    return ZD_ERR_OUT_OF_MEMORY;
  }
}

zd_status submit(void* instance, const zd_tier_io* ios, uint32_t count, uint64_t* ticket, char* err,
                 size_t err_size) noexcept {
  auto* inst = static_cast<Instance*>(instance);
  if (inst == nullptr) {
    off::set_error(err, err_size, "nvme: submit: instance is NULL");
    return ZD_ERR_INVALID_ARGUMENT;
  }
  try {
    std::string error;
    const zd_status st = inst->queue->submit(ios, count, ticket, &error);
    if (st != ZD_OK) off::copy_error(err, err_size, error);
    return st;
  } catch (...) {
    off::set_error(err, err_size, "nvme: submit: out of memory");
    return ZD_ERR_OUT_OF_MEMORY;
  }
}

zd_status wait(void* instance, uint64_t ticket, char* err, size_t err_size) noexcept {
  auto* inst = static_cast<Instance*>(instance);
  if (inst == nullptr) {
    off::set_error(err, err_size, "nvme: wait: instance is NULL");
    return ZD_ERR_INVALID_ARGUMENT;
  }
  try {
    std::string error;
    const zd_status st = inst->queue->wait(ticket, &error);
    if (st != ZD_OK) off::copy_error(err, err_size, error);
    return st;
  } catch (...) {
    off::set_error(err, err_size, "nvme: wait: internal error");
    return ZD_ERR_INTERNAL;
  }
}

const zd_tier_v1 kDescriptor = {
    ZD_DESCRIPTOR_HEAD(ZD_PLUGIN_TIER, zd_tier_v1, ZD_TIER_ABI_VERSION, 0, 1, kName,
                       "a store striped over files on local disks, O_DIRECT through libaio",
                       kSpecs, kSpecCount),
    .create = create,
    .destroy = destroy,
    .capabilities = capabilities,
    .describe = describe,
    .cpus = cpus,
    .allocate = nullptr,
    .release = nullptr,
    .alignment = alignment,
    .reserve = reserve,
    .submit = submit,
    .wait = wait,
};

}  // namespace

ZD_PLUGIN_DESCRIPTORS(&kDescriptor.header)
