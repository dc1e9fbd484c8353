// zd_optimizer_adam.so: torch.optim.Adam, whose weight decay is an L2 term
// added to the gradient. DeepSpeed's "Adam" type means AdamW unless told
// otherwise; zerod follows PyTorch's names instead, and says so in the help.
#include "adam_family.h"

namespace {

namespace family = zerod::optim::adam_family;

constexpr auto kSpecs = family::make_specs(
    0.0,
    "L2 penalty: wd*p is added to the gradient, as torch.optim.Adam does. DeepSpeed's "
    "\"Adam\" type decays decoupled by default; for that use the adamw optimizer");

zd_status create(const zd_host_services* host, const double* values, size_t value_count, void** out_instance,
                 char* err, size_t err_size) noexcept {
  return family::create(false, "adam", kSpecs.data(), kSpecs.size(), host, values, value_count, out_instance, err,
                        err_size);
}

const zd_optimizer_v1 kDescriptor = {
    .header = {.kind = ZD_PLUGIN_OPTIMIZER,
               .struct_size = sizeof(zd_optimizer_v1),
               .abi_version = 1,
               .plugin_version = (0u << 16) | 1u,
               .name = "adam",
               .description =
                   "Adam with L2 weight decay (torch.optim.Adam); for decoupled decay, DeepSpeed's "
                   "default \"Adam\", use adamw"},
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
