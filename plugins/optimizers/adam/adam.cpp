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

constexpr zd_plugin_header kHeader = {
    .kind = ZD_PLUGIN_OPTIMIZER,
    .struct_size = 0,  // set per version by the family's descriptor_*()
    .abi_version = 0,
    .plugin_version = (0u << 16) | 2u,
    .name = "adam",
    .description =
        "Adam with L2 weight decay (torch.optim.Adam); for decoupled decay, DeepSpeed's "
        "default \"Adam\", use adamw"};

const zd_optimizer_v4 kDescriptorV4 = family::descriptor_v4(kHeader, kSpecs.data(), kSpecs.size(), create);
const zd_optimizer_v1 kDescriptorV1 = family::descriptor_v1(kHeader, kSpecs.data(), kSpecs.size(), create);

const zd_plugin_header* const kDescriptors[] = {&kDescriptorV4.header, &kDescriptorV1.header, nullptr};

}  // namespace

extern "C" ZD_PLUGIN_EXPORT const zd_plugin_header* const* zd_plugin_descriptors(void) { return kDescriptors; }
