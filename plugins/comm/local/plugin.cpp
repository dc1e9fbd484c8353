// zd_comm_local.so: the "local" comm plugin, collectives among the ranks one
// daemon serves. This file is the ABI glue: the descriptor, hyperparameter
// checks, and the entry points that turn arguments into a Call for the
// Communicator (communicator.h says how a collective runs and fails).
#include <zerod/zerod_plugin.h>

#include <array>
#include <cmath>
#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <new>

#include "communicator.h"

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

void set_error(char* err, size_t err_size, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
void set_error(char* err, size_t err_size, const char* fmt, ...) {
  if (err == nullptr || err_size == 0) return;
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(err, err_size, fmt, ap);
  va_end(ap);
}

void log_info(const zd_host_services* host, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void log_info(const zd_host_services* host, const char* fmt, ...) {
  const size_t need = offsetof(zd_host_services, log) + sizeof(host->log);
  if (host == nullptr || host->struct_size < need || host->log == nullptr) return;
  char message[256];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(message, sizeof message, fmt, ap);
  va_end(ap);
  host->log(host->host, ZD_LOG_INFO, "local", message);
}

zd_status create(const zd_host_services* host, const double* values, size_t value_count, int32_t world_size,
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
  log_info(host, "%d ranks, spin %g us, %s kernels", world_size, spin_us, comm::kernel_isa());
  return ZD_OK;
}

void destroy(void* instance) noexcept { delete static_cast<comm::Communicator*>(instance); }

zd_status run(void* instance, const zd_comm_call* call, const comm::Call& c) noexcept {
  if (instance == nullptr) return ZD_ERR_INVALID_ARGUMENT;
  return static_cast<comm::Communicator*>(instance)->run(call, c);
}

zd_status all_reduce(void* instance, const zd_comm_call* call, void* buf, uint64_t count, zd_comm_dtype dtype,
                     zd_reduce_op op) noexcept {
  comm::Call c;
  c.coll = comm::Coll::all_reduce;
  c.count = count;
  c.dtype = dtype;
  c.op = op;
  c.send = buf;
  c.recv = buf;
  return run(instance, call, c);
}

zd_status reduce_scatter(void* instance, const zd_comm_call* call, const void* send, void* recv,
                         uint64_t recv_count, zd_comm_dtype dtype, zd_reduce_op op) noexcept {
  comm::Call c;
  c.coll = comm::Coll::reduce_scatter;
  c.count = recv_count;
  c.dtype = dtype;
  c.op = op;
  c.send = send;
  c.recv = recv;
  return run(instance, call, c);
}

zd_status all_gather(void* instance, const zd_comm_call* call, const void* send, void* recv, uint64_t send_count,
                     zd_comm_dtype dtype) noexcept {
  comm::Call c;
  c.coll = comm::Coll::all_gather;
  c.count = send_count;
  c.dtype = dtype;
  c.send = send;
  c.recv = recv;
  return run(instance, call, c);
}

zd_status broadcast(void* instance, const zd_comm_call* call, void* buf, uint64_t count, zd_comm_dtype dtype,
                    int32_t root) noexcept {
  comm::Call c;
  c.coll = comm::Coll::broadcast;
  c.count = count;
  c.dtype = dtype;
  c.root = root;
  c.send = buf;
  c.recv = buf;
  return run(instance, call, c);
}

zd_status barrier(void* instance, const zd_comm_call* call) noexcept {
  comm::Call c;
  c.coll = comm::Coll::barrier;
  return run(instance, call, c);
}

void abort_all(void* instance, zd_status status, const char* reason) noexcept {
  if (instance != nullptr) static_cast<comm::Communicator*>(instance)->abort(status, reason);
}

const char* last_error(const void* instance, int32_t rank) noexcept {
  return instance != nullptr ? static_cast<const comm::Communicator*>(instance)->last_error(rank) : "";
}

uint64_t bytes_sent(const void* instance, int32_t rank) noexcept {
  return instance != nullptr ? static_cast<const comm::Communicator*>(instance)->bytes_sent(rank) : 0;
}

const zd_comm_v1 kDescriptor = {
    .header = {.kind = ZD_PLUGIN_COMM,
               .struct_size = sizeof(zd_comm_v1),
               .abi_version = ZD_COMM_ABI_VERSION,
               .plugin_version = (0u << 16) | 1u,
               .name = "local",
               .description = "collectives among the ranks of one daemon, run by the rank threads over shared memory"},
    .hparams = kSpecs.data(),
    .hparam_count = kSpecs.size(),
    .reserved = 0,
    .create = create,
    .destroy = destroy,
    .all_reduce = all_reduce,
    .reduce_scatter = reduce_scatter,
    .all_gather = all_gather,
    .broadcast = broadcast,
    .barrier = barrier,
    .abort = abort_all,
    .last_error = last_error,
    .bytes_sent = bytes_sent,
};

const zd_plugin_header* const kDescriptors[] = {&kDescriptor.header, nullptr};

}  // namespace

extern "C" ZD_PLUGIN_EXPORT const zd_plugin_header* const* zd_plugin_descriptors(void) { return kDescriptors; }
