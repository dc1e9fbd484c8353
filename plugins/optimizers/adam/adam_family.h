// The instance, entry points and hyperparameter specs that the adam and
// adamw plugins share; they differ only in the weight-decay rule (and its
// default), which each plugin fixes in its own create().
#ifndef ZEROD_OPTIM_ADAM_FAMILY_H
#define ZEROD_OPTIM_ADAM_FAMILY_H

#include <array>

#include "glue.h"

namespace zerod::optim::adam_family {

// Spec order, which is also the order of the values create() receives:
// lr, betas[0], betas[1], eps, weight_decay, bias_correction.
constexpr std::array<zd_hparam_spec, 5> make_specs(double weight_decay_default, const char* weight_decay_help) {
  return {{
      glue::number_spec("lr", 1e-3, 0.0, glue::kUnbounded, ZD_HPARAM_MIN_EXCLUSIVE,
                        "learning rate; the job script's schedule may override it per step"),
      glue::pair_spec("betas", 0.9, 0.999, 0.0, 1.0, ZD_HPARAM_MAX_EXCLUSIVE,
                      "decay rates of the first and second moment estimates"),
      glue::number_spec("eps", 1e-8, 0.0, glue::kUnbounded, ZD_HPARAM_MIN_EXCLUSIVE,
                        "added to the bias-corrected sqrt(v) for numerical stability"),
      glue::number_spec("weight_decay", weight_decay_default, 0.0, glue::kUnbounded, 0, weight_decay_help),
      glue::bool_spec("bias_correction", true, "divide the moments by 1 - beta^step (as torch does)"),
  }};
}

// The plugin's create() forwards here with its decoupling rule.
zd_status create(bool decoupled, const char* plugin, const zd_hparam_spec* specs, uint32_t spec_count,
                 const zd_host_services* host, const double* values, size_t value_count, void** out_instance,
                 char* err, size_t err_size) noexcept;
void destroy(void* instance) noexcept;
uint32_t state_slots(const void* instance) noexcept;
const char* state_name(const void* instance, uint32_t slot) noexcept;
// Optimizer ABI v4: m and v in u->state_dtype (fp32 or bf16).
zd_status update(const void* instance, zd_isa isa, const zd_optimizer_update* u) noexcept;
// Optimizer ABI v1, for hosts before v4: fp32 state (state_dtype was a
// reserved field there, not read).
zd_status update_v1(const void* instance, zd_isa isa, const zd_optimizer_update* u) noexcept;
int32_t supports_state_dtype(const void* instance, zd_dtype dtype) noexcept;
#if defined(ZEROD_HAVE_CUDA)
zd_status update_cuda(const void* instance, const zd_optimizer_update* u, void* stream) noexcept;
zd_status update_cuda_v1(const void* instance, const zd_optimizer_update* u, void* stream) noexcept;
#endif

// The descriptors a plugin of the family lists: v4 (bf16 state), then v1 for
// hosts that know no v4 (every plan of the family is plain, so v2 and v3
// would add nothing an older host could use).
constexpr zd_optimizer_v4 descriptor_v4(zd_plugin_header header, const zd_hparam_spec* specs, uint32_t spec_count,
                                        decltype(zd_optimizer_v4::create) create) {
  header.struct_size = sizeof(zd_optimizer_v4);
  header.abi_version = 4;
  return zd_optimizer_v4{
      .header = header,
      .hparams = specs,
      .hparam_count = spec_count,
      .reserved = 0,
      .create = create,
      .destroy = destroy,
      .state_slots = state_slots,
      .state_name = state_name,
      .supports_isa = glue::supports_isa,
      .update = update,
#if defined(ZEROD_HAVE_CUDA)
      .update_cuda = update_cuda,
#else
      .update_cuda = nullptr,
#endif
      .plan = glue::plain::plan,
      .prepare = nullptr,
      .average_slot = glue::plain::none,
      .tensor_scalars = glue::plain::none,
      .tensor_stats = glue::plain::none,
      .stat_op = glue::plain::sum,
      .tensor_step = nullptr,
      .check_partitions = glue::plain::any_partitions,
      .compresses = glue::plain::never,
      .supports_state_dtype = supports_state_dtype,
  };
}

constexpr zd_optimizer_v1 descriptor_v1(zd_plugin_header header, const zd_hparam_spec* specs, uint32_t spec_count,
                                        decltype(zd_optimizer_v1::create) create) {
  header.struct_size = sizeof(zd_optimizer_v1);
  header.abi_version = 1;
  return zd_optimizer_v1{
      .header = header,
      .hparams = specs,
      .hparam_count = spec_count,
      .reserved = 0,
      .create = create,
      .destroy = destroy,
      .state_slots = state_slots,
      .state_name = state_name,
      .supports_isa = glue::supports_isa,
      .update = update_v1,
#if defined(ZEROD_HAVE_CUDA)
      .update_cuda = update_cuda_v1,
#else
      .update_cuda = nullptr,
#endif
  };
}

}  // namespace zerod::optim::adam_family

#endif  // ZEROD_OPTIM_ADAM_FAMILY_H
