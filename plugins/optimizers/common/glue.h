// What every optimizer plugin shares between the plugin ABI (zerod_plugin.h)
// and the kernels: spec building and checking, error text, host logging,
// reading a zd_optimizer_update, ISA resolution, and the exception guard.
#ifndef ZEROD_OPTIM_GLUE_H
#define ZEROD_OPTIM_GLUE_H

#include <zerod/kit/plugin_descriptor.h>
#include <zerod/kit/text.h>
#include <zerod/optim/kernels.h>
#include <zerod/zerod_plugin.h>

#include <memory>
#include <new>

#include <cstddef>
#include <cstdint>

namespace zerod::optim::glue {

constexpr double kUnbounded = __builtin_huge_val();

constexpr zd_hparam_spec number_spec(const char* name, double def, double min, double max, uint32_t flags,
                                     const char* help) {
  return {name, ZD_HPARAM_NUMBER, 1, {def, 0, 0, 0}, min, max, flags, help};
}

constexpr zd_hparam_spec pair_spec(const char* name, double def0, double def1, double min, double max,
                                   uint32_t flags, const char* help) {
  return {name, ZD_HPARAM_NUMBER, 2, {def0, def1, 0, 0}, min, max, flags, help};
}

constexpr zd_hparam_spec integer_spec(const char* name, double def, double min, double max, const char* help) {
  return {name, ZD_HPARAM_INTEGER, 1, {def, 0, 0, 0}, min, max, 0, help};
}

constexpr zd_hparam_spec bool_spec(const char* name, bool def, const char* help) {
  return {name, ZD_HPARAM_BOOL, 1, {def ? 1.0 : 0.0, 0, 0, 0}, 0.0, 1.0, 0, help};
}

// The number of doubles a spec list takes.
size_t value_count(const zd_hparam_spec* specs, uint32_t count);

// Writes a formatted message into err (truncated, always terminated): the
// kit's (zerod/kit/text.h).
using zerod::set_error;

// Checks resolved values against their specs (the host does this too; a
// plugin does not rely on it). ZD_ERR_INVALID_ARGUMENT for a wrong count or
// NULL values, ZD_ERR_CONFIG with the hyperparameter named for a bad value.
zd_status check_values(const zd_hparam_spec* specs, uint32_t count, const double* values,
                       size_t value_count, char* err, size_t err_size);

// The part of zd_host_services a plugin instance keeps.
struct Host {
  void* host = nullptr;
  void (*log)(void* host, zd_log_level level, const char* plugin, const char* message) = nullptr;
};

// Copies what the table holds; a NULL or short table gives no logging.
Host copy_host(const zd_host_services* services);

void log(const Host& host, zd_log_level level, const char* plugin, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));

// Which arrays a call reads besides its state slots: 1-bit Adam's momentum()
// has no master, and its compression-phase update() no gradient.
struct Needs {
  bool master = true;
  bool grad = true;
};

// Reads and checks an update for `slots` state arrays into r.
// ZD_ERR_INVALID_ARGUMENT for a NULL or short struct, a dtype the kernels do
// not know (the gradient's only when it is needed), a missing array, step <
// 1, a negative or non-finite lr, or a non-finite grad_scale.
zd_status read_update(const zd_optimizer_update* u, uint32_t slots, Range* r, Needs needs = {});

// ZD_ISA_AUTO becomes the best supported ISA; an ISA this CPU or build lacks
// (or an unknown value) is ZD_ERR_NOT_IMPLEMENTED.
zd_status resolve_isa(zd_isa isa, Isa* out);

// zd_optimizer_v1::supports_isa for every optimizer built on the kernels.
int32_t supports_isa(zd_isa isa) noexcept;

// The same two for the optimizers whose own vector loops stop at AVX2 (0/1
// Adam, 1-bit LAMB: bound by memory and by sqrt/divide, not by vector
// width). They have no AVX-512 kernel, so ZD_ISA_AVX512 is
// ZD_ERR_NOT_IMPLEMENTED as any missing kernel is, and `zerod check` names
// the AVX2 loops that run; ZD_ISA_AUTO on an AVX-512 host becomes AVX2.
zd_status resolve_isa_up_to_avx2(zd_isa isa, Isa* out);
int32_t supports_isa_up_to_avx2(zd_isa isa) noexcept;

// The state dtype an update's arrays hold (zd_optimizer_update.state_dtype,
// optimizer ABI v4): 0 or ZD_DTYPE_F32 is f32, ZD_DTYPE_BF16 bf16; anything
// else is ZD_ERR_INVALID_ARGUMENT. A plugin's functions of an older
// descriptor version do not call this (the field was reserved there).
zd_status read_state_dtype(const zd_optimizer_update* u, Dtype* out);

// What a plain optimizer (one averaged pass per step, nothing exchanged, no
// per-tensor values, any ZeRO stage) answers in the v3/v4 table.
namespace plain {
zd_status plan(const void* instance, int64_t step, int32_t warmup, int32_t sync, zd_optimizer_plan* out) noexcept;
uint32_t none(const void* instance) noexcept;
zd_stat_op sum(const void* instance, uint32_t stat) noexcept;
zd_status any_partitions(const void* instance, uint32_t partitions, char* err, size_t err_size) noexcept;
int32_t never(const void* instance) noexcept;
}  // namespace plain

// Runs f and turns any exception into ZD_ERR_INTERNAL: nothing may unwind
// through the C ABI.
template <typename F>
zd_status guarded(F&& f) noexcept {
  try {
    return f();
  } catch (...) {
    return ZD_ERR_INTERNAL;
  }
}

// No checks beyond the specs' own (for create_instance).
inline zd_status no_more_checks(const double*) { return ZD_OK; }

// The frame of every optimizer's create(): out_instance checked, the values
// checked against the specs, then by `check(values)` (rules between values;
// it calls set_error and returns the status), an Instance allocated and set
// by `fill(instance, values)`, and handed out. Nothing is handed out, and
// nothing leaks, when a step fails or throws (ZD_ERR_INTERNAL).
template <class Instance, class Check, class Fill>
zd_status create_instance(const zd_hparam_spec* specs, uint32_t spec_count, const double* values, size_t value_count,
                          void** out_instance, char* err, size_t err_size, Check&& check, Fill&& fill) noexcept {
  return guarded([&]() -> zd_status {
    if (out_instance == nullptr) {
      set_error(err, err_size, "out_instance is NULL");
      return ZD_ERR_INVALID_ARGUMENT;
    }
    *out_instance = nullptr;
    zd_status st = check_values(specs, spec_count, values, value_count, err, err_size);
    if (st == ZD_OK) st = check(values);
    if (st != ZD_OK) return st;
    std::unique_ptr<Instance> inst(new (std::nothrow) Instance{});
    if (!inst) {
      set_error(err, err_size, "out of memory");
      return ZD_ERR_OUT_OF_MEMORY;
    }
    fill(*inst, values);
    *out_instance = inst.release();
    return ZD_OK;
  });
}

}  // namespace zerod::optim::glue

#endif  // ZEROD_OPTIM_GLUE_H
