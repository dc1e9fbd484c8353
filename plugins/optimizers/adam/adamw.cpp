// zd_optimizer_adamw.so: torch.optim.AdamW (decoupled weight decay), which is
// also what DeepSpeed's "Adam" type does by default.
#include "adam_family.h"

namespace {

namespace family = zerod::optim::adam_family;

constexpr auto kSpecs = family::make_specs(
    0.01,
    "decoupled decay: p -= lr*wd*p before the Adam step, as torch.optim.AdamW (and "
    "DeepSpeed's \"Adam\") does");

zd_status create(const zd_host_services* host, const double* values, size_t value_count, void** out_instance,
                 char* err, size_t err_size) noexcept {
  return family::create(true, "adamw", kSpecs.data(), kSpecs.size(), host, values, value_count, out_instance, err,
                        err_size);
}

const zd_optimizer_v1 kDescriptor = {
    .header = {.kind = ZD_PLUGIN_OPTIMIZER,
               .struct_size = sizeof(zd_optimizer_v1),
               .abi_version = 1,
               .plugin_version = (0u << 16) | 1u,
               .name = "adamw",
               .description =
                   "AdamW: Adam with decoupled weight decay (torch.optim.AdamW, DeepSpeed's default "
                   "\"Adam\")"},
    .hparams = kSpecs.data(),
    .hparam_count = kSpecs.size(),
    .reserved = 0,
    .create = create,
    .destroy = family::destroy,
    .state_slots = family::state_slots,
    .state_name = family::state_name,
    .supports_isa = zerod::optim::glue::supports_isa,
    .update = family::update,
#if defined(ZEROD_HAVE_CUDA)
    .update_cuda = family::update_cuda,
#else
    .update_cuda = nullptr,
#endif
};

const zd_plugin_header* const kDescriptors[] = {&kDescriptor.header, nullptr};

}  // namespace

extern "C" ZD_PLUGIN_EXPORT const zd_plugin_header* const* zd_plugin_descriptors(void) { return kDescriptors; }
