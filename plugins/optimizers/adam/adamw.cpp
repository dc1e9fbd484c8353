// zd_optimizer_adamw.so: torch.optim.AdamW (decoupled weight decay), which is
// also what DeepSpeed's "Adam" type does by default.
#include "adam_family.h"

namespace {

namespace family = zerod::optim::adam_family;

// A test build (ZEROD_ADAMW_V1_ONLY, tests/fake_plugins) offers the v1
// descriptor alone, as adamw was built before optimizer ABI v4: the host runs
// it through its v1 adapter, with fp32 state only.
#ifdef ZEROD_ADAMW_V1_ONLY
constexpr const char* kName = "adamw_v1";
#else
constexpr const char* kName = "adamw";
#endif

constexpr auto kSpecs = family::make_specs(
    0.01,
    "decoupled decay: p -= lr*wd*p before the Adam step, as torch.optim.AdamW (and "
    "DeepSpeed's \"Adam\") does");

zd_status create(const zd_host_services* host, const double* values, size_t value_count, void** out_instance,
                 char* err, size_t err_size) noexcept {
  return family::create(true, kName, kSpecs.data(), kSpecs.size(), host, values, value_count, out_instance, err,
                        err_size);
}

constexpr zd_plugin_header kHeader = {
    .kind = ZD_PLUGIN_OPTIMIZER,
    .struct_size = 0,  // set per version by the family's descriptor_*()
    .abi_version = 0,
    .plugin_version = (0u << 16) | 2u,
    .name = kName,
    .description =
        "AdamW: Adam with decoupled weight decay (torch.optim.AdamW, DeepSpeed's default "
        "\"Adam\")"};

const zd_optimizer_v1 kDescriptorV1 = family::descriptor_v1(kHeader, kSpecs.data(), kSpecs.size(), create);
#ifdef ZEROD_ADAMW_V1_ONLY
const zd_plugin_header* const kDescriptors[] = {&kDescriptorV1.header, nullptr};
#else
const zd_optimizer_v4 kDescriptorV4 = family::descriptor_v4(kHeader, kSpecs.data(), kSpecs.size(), create);
const zd_plugin_header* const kDescriptors[] = {&kDescriptorV4.header, &kDescriptorV1.header, nullptr};
#endif

}  // namespace

extern "C" ZD_PLUGIN_EXPORT const zd_plugin_header* const* zd_plugin_descriptors(void) { return kDescriptors; }
