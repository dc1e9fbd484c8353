// zd_comm_local.so: the "local" comm plugin, collectives among the ranks one
// daemon serves. This file is the ABI glue: the descriptors (plugin ABI v2,
// and v1 for older hosts), create() and its checks; glue.h turns the
// arguments of each entry point into a Call for the Communicator
// (communicator.h and rendezvous.h say how a collective runs and fails).
#include <zerod/kit/plugin_descriptor.h>
#include <zerod/zerod_plugin.h>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <new>

#include "communicator.h"
#include "glue.h"
#include "plugin_text.h"

namespace {

namespace comm = zerod::comm;

// A daemon serves the ranks of one node; the bound only keeps a typo from
// asking for gigabytes of per-rank state.
constexpr int kMaxWorld = 4096;

constexpr std::array<zd_hparam_spec, 1> kSpecs = {{
    {"spin_us", ZD_HPARAM_NUMBER, 1, {50.0, 0, 0, 0}, 0.0, 1e6, 0,
     "microseconds a rank spins waiting for the others before it sleeps; spinning saves the wake-up "
     "(several microseconds) on every collective, 0 sleeps at once (for ranks that outnumber cores)"},
}};

using comm::set_error;

// Checks what both create()s share and makes the instance.
zd_status make(const zd_host_services* host, const double* values, size_t value_count, int32_t world_size,
               void** out_instance, char* err, size_t err_size) noexcept {
  if (out_instance == nullptr) {
    set_error(err, err_size, "out_instance is NULL");
    return ZD_ERR_INVALID_ARGUMENT;
  }
  *out_instance = nullptr;
  if (value_count != kSpecs.size() || values == nullptr) {
    set_error(err, err_size, "expected %zu hyperparameter values, got %zu", kSpecs.size(),
              values == nullptr ? size_t{0} : value_count);
    return ZD_ERR_INVALID_ARGUMENT;
  }
  if (world_size < 1 || world_size > kMaxWorld) {
    set_error(err, err_size, "world_size = %d: must be 1..%d", world_size, kMaxWorld);
    return ZD_ERR_INVALID_ARGUMENT;
  }
  // The host checks the spec too; a plugin does not rely on it.
  const double spin_us = values[0];
  if (!std::isfinite(spin_us) || spin_us < kSpecs[0].min || spin_us > kSpecs[0].max) {
    set_error(err, err_size, "spin_us = %g: must be a number in [%g, %g]", spin_us, kSpecs[0].min, kSpecs[0].max);
    return ZD_ERR_CONFIG;
  }
  try {
    *out_instance = new comm::Communicator(world_size, spin_us);
  } catch (const std::bad_alloc&) {
    set_error(err, err_size, "out of memory for %d ranks", world_size);
    return ZD_ERR_OUT_OF_MEMORY;
  } catch (...) {
    set_error(err, err_size, "internal error creating the communicator");
    return ZD_ERR_INTERNAL;
  }
  comm::log_info(host, "local", "%d ranks, spin %g us, %s kernels", world_size, spin_us, comm::kernel_isa());
  return ZD_OK;
}

zd_status create_v1(const zd_host_services* host, const double* values, size_t value_count, int32_t world_size,
                    void** out_instance, char* err, size_t err_size) noexcept {
  return make(host, values, value_count, world_size, out_instance, err, err_size);
}

// One daemon only: a rank layout that spans daemons is for another backend.
zd_status create_v2(const zd_host_services* host, const double* values, size_t value_count,
                    const zd_comm_config* config, void** out_instance, char* err, size_t err_size) noexcept {
  if (out_instance != nullptr) *out_instance = nullptr;
  if (config == nullptr || config->struct_size < sizeof(zd_comm_config)) {
    set_error(err, err_size, "config is %s", config == nullptr ? "NULL" : "shorter than zd_comm_config");
    return ZD_ERR_INVALID_ARGUMENT;
  }
  const int32_t world = config->world_size;
  const int32_t first = config->first_local_rank;
  const int32_t ranks = config->local_ranks;
  if (world >= 1 && (ranks < 1 || first < 0 || first > world - ranks)) {
    set_error(err, err_size, "first_local_rank = %d, local_ranks = %d: not a block of ranks in 0..%d", first, ranks,
              world - 1);
    return ZD_ERR_INVALID_ARGUMENT;
  }
  if (world >= 1 && ranks < world) {
    set_error(err, err_size,
              "the local comm plugin runs the collectives of one daemon's ranks, but this daemon serves %d of the "
              "job's %d ranks (ranks %d-%d); for a job across daemons (nodes) use comm = { backend = \"mpi\" }",
              ranks, world, first, first + ranks - 1);
    return ZD_ERR_CONFIG;
  }
  return make(host, values, value_count, world, out_instance, err, err_size);
}

using Glue = comm::Glue<comm::Communicator>;

constexpr const char* kDescription =
    "collectives among the ranks of one daemon, run by the rank threads over shared memory";

const zd_comm_v2 kDescriptorV2 = {
    ZD_DESCRIPTOR_HEAD(ZD_PLUGIN_COMM, zd_comm_v2, 2, 0, 2, "local",
                       kDescription,
                       kSpecs.data(), kSpecs.size()),
    .create = create_v2,
    ZD_COMM_GLUE_V2_FUNCTIONS(Glue),
};

// For hosts that know only version 1 (listed after v2: the host takes the
// newest it understands). Built with ZEROD_COMM_LOCAL_V1_ONLY, the plugin
// offers this descriptor alone, named local_v1, as a plugin built before v2
// would (tests/fake_plugins: the engine runs it through its v1 adapter).
#if defined(ZEROD_COMM_LOCAL_V1_ONLY)
constexpr const char* kNameV1 = "local_v1";
#else
constexpr const char* kNameV1 = "local";
#endif
const zd_comm_v1 kDescriptorV1 = {
    ZD_DESCRIPTOR_HEAD(ZD_PLUGIN_COMM, zd_comm_v1, 1, 0, 2, kNameV1,
                       kDescription,
                       kSpecs.data(), kSpecs.size()),
    .create = create_v1,
    .destroy = Glue::destroy,
    .all_reduce = Glue::all_reduce,
    .reduce_scatter = Glue::reduce_scatter,
    .all_gather = Glue::all_gather,
    .broadcast = Glue::broadcast,
    .barrier = Glue::barrier,
    .abort = Glue::abort,
    .last_error = Glue::last_error,
    .bytes_sent = Glue::bytes_sent,
};

}  // namespace

#if defined(ZEROD_COMM_LOCAL_V1_ONLY)
ZD_PLUGIN_DESCRIPTORS(&kDescriptorV1.header)
#else
ZD_PLUGIN_DESCRIPTORS(&kDescriptorV2.header, &kDescriptorV1.header)
#endif
