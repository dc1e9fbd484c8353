// zd_partitioner_stage<N>.so: ZeRO stage N as a partitioner plugin. One
// source, built once per stage with ZEROD_STAGE set. The stage says what is
// split across ranks; the knobs say how the engine schedules it:
//   stage 0: nothing (data parallel; every rank keeps everything)
//   stage 1: + optimizer state and fp32 master
//   stage 2: + gradients, reduced in buckets during backward
//   stage 3: + parameters, gathered per module and released after
// Shards are equal: ceil(numel / world_size) rounded up to the alignment the
// engine asks for, the last rank's tail zero padding (DeepSpeed's layout).
#include <zerod/kit/text.h>
#include <zerod/kit/plugin_descriptor.h>
#include <zerod/zerod_plugin.h>

#include <cmath>
#include <new>

#ifndef ZEROD_STAGE
#error "build with ZEROD_STAGE=0..3"
#endif

namespace {

using zerod::set_error;

// Names and defaults follow DeepSpeed's zero_optimization keys (counts of
// elements), without the stage3_ prefixes.
#if ZEROD_STAGE >= 2
constexpr double kUnbounded = __builtin_huge_val();

constexpr zd_hparam_spec elements(const char* name, double def, const char* help) {
  return {name, ZD_HPARAM_INTEGER, 1, {def, 0, 0, 0}, 0.0, kUnbounded, 0, help};
}

constexpr zd_hparam_spec kSpecs[] = {
    elements("reduce_bucket_size", 5e7,
             "gradients are reduced in buckets of about this many elements"),
#if ZEROD_STAGE == 3
    elements("param_persistence_threshold", 1e5,
             "parameters of at most this many elements stay gathered"),
    elements("max_live_parameters", 1e9,
             "prefetching never holds more gathered elements than this"),
    elements("prefetch_bucket_size", 5e7,
             "elements gathered ahead of the module being begun (0 = no prefetch)"),
#endif
};
constexpr uint32_t kSpecCount = sizeof(kSpecs) / sizeof(kSpecs[0]);
#else
constexpr const zd_hparam_spec* kSpecs = nullptr;
constexpr uint32_t kSpecCount = 0;
#endif

struct Instance {
  int world = 1;
  double bucket = 5e7, persistence = 0, max_live = 0, prefetch = 0;
};

zd_status create(const zd_host_services*, const double* values, size_t count, int32_t world,
                 void** out, char* err, size_t err_size) noexcept {
  if (!out || count != kSpecCount || (count && !values)) {
    set_error(err, err_size, "expected %u hyperparameter values, got %zu", kSpecCount, count);
    return ZD_ERR_INVALID_ARGUMENT;
  }
  if (world < 1) {
    set_error(err, err_size, "world size must be at least 1, got %d", world);
    return ZD_ERR_INVALID_ARGUMENT;
  }
  for (size_t i = 0; i < count; ++i) {
    if (!(values[i] >= 0) || values[i] != std::floor(values[i])) {
      set_error(err, err_size, "%s must be a whole number >= 0, got %g", kSpecs[i].name, values[i]);
      return ZD_ERR_CONFIG;
    }
  }
  auto* inst = new (std::nothrow) Instance{};
  if (!inst) return ZD_ERR_OUT_OF_MEMORY;
  inst->world = world;
#if ZEROD_STAGE >= 2
  inst->bucket = values[0];
  if (inst->bucket < 1) {
    delete inst;
    set_error(err, err_size, "reduce_bucket_size must be at least 1 element");
    return ZD_ERR_CONFIG;
  }
#endif
#if ZEROD_STAGE == 3
  inst->persistence = values[1];
  inst->max_live = values[2];
  inst->prefetch = values[3];
#endif
  *out = inst;
  return ZD_OK;
}

void destroy(void* inst) noexcept { delete static_cast<Instance*>(inst); }

uint32_t partitions(const void*) noexcept {
  uint32_t p = 0;
  if (ZEROD_STAGE >= 1) p |= ZD_PARTITION_OPTIMIZER;
  if (ZEROD_STAGE >= 2) p |= ZD_PARTITION_GRADS;
  if (ZEROD_STAGE >= 3) p |= ZD_PARTITION_PARAMS;
  return p;
}

uint64_t shard_stride(const void* inst, uint64_t numel, uint64_t align) noexcept {
  const auto world = static_cast<uint64_t>(static_cast<const Instance*>(inst)->world);
  if (align == 0) align = 1;
  const uint64_t per_rank = (numel + world - 1) / world;
  return (per_rank + align - 1) / align * align;
}

uint64_t as_count(double v) { return v >= 1.8e19 ? UINT64_MAX : static_cast<uint64_t>(v); }

uint64_t persistence_threshold(const void* i) noexcept {
  return as_count(static_cast<const Instance*>(i)->persistence);
}
uint64_t bucket_elements(const void* i) noexcept { return as_count(static_cast<const Instance*>(i)->bucket); }
uint64_t max_live_elements(const void* i) noexcept {
  return as_count(static_cast<const Instance*>(i)->max_live);
}
uint64_t prefetch_elements(const void* i) noexcept {
  return as_count(static_cast<const Instance*>(i)->prefetch);
}

#define ZD_STR2(x) #x
#define ZD_STR(x) ZD_STR2(x)

#if ZEROD_STAGE == 0
constexpr const char* kDescription = "ZeRO stage 0: nothing partitioned (data parallel)";
#elif ZEROD_STAGE == 1
constexpr const char* kDescription = "ZeRO stage 1: optimizer state and master partitioned";
#elif ZEROD_STAGE == 2
constexpr const char* kDescription = "ZeRO stage 2: optimizer state, master and gradients partitioned";
#else
constexpr const char* kDescription = "ZeRO stage 3: optimizer state, master, gradients and parameters partitioned";
#endif

const zd_partitioner_v1 kDescriptor = {
    ZD_DESCRIPTOR_HEAD(ZD_PLUGIN_PARTITIONER, zd_partitioner_v1, ZD_PARTITIONER_ABI_VERSION, 0, 1,
                       "stage" ZD_STR(ZEROD_STAGE), kDescription, kSpecs, kSpecCount),
    .create = create,
    .destroy = destroy,
    .partitions = partitions,
    .shard_stride = shard_stride,
    .persistence_threshold = persistence_threshold,
    .bucket_elements = bucket_elements,
    .max_live_elements = max_live_elements,
    .prefetch_elements = prefetch_elements,
};

}  // namespace

ZD_PLUGIN_DESCRIPTORS(&kDescriptor.header)
