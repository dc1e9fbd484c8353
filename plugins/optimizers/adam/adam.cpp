// zd_optimizer_adam.so and zd_optimizer_adamw.so, from this one source built
// twice (ZEROD_ADAMW=0 or 1), as the stage partitioners are: the two differ
// only in the weight-decay rule, its default and their texts; everything
// else is adam_family.*.
//   adam:  torch.optim.Adam, whose weight decay is an L2 term added to the
//          gradient. DeepSpeed's "Adam" type means AdamW unless told
//          otherwise; zerod follows PyTorch's names instead, and says so in
//          the help.
//   adamw: torch.optim.AdamW (decoupled weight decay), which is also what
//          DeepSpeed's "Adam" type does by default.
#include "adam_family.h"

#ifndef ZEROD_ADAMW
#error "build with ZEROD_ADAMW=0 (adam) or 1 (adamw)"
#endif

namespace {

namespace family = zerod::optim::adam_family;

// What tells the two apart: the name, the decay rule, its default and the texts.
struct Variant {
  const char* name;
  bool decoupled;
  double weight_decay;
  const char* weight_decay_help;
  const char* description;
};

// A test build (ZEROD_ADAMW_V1_ONLY, tests/fake_plugins) offers adamw's v1
// descriptor alone, named adamw_v1, as adamw was built before optimizer ABI
// v4: the host runs it through its v1 adapter, with fp32 state only.
#ifdef ZEROD_ADAMW_V1_ONLY
constexpr const char* kAdamwName = "adamw_v1";
#else
constexpr const char* kAdamwName = "adamw";
#endif

constexpr Variant kAdam = {"adam", false, 0.0,
                           "L2 penalty: wd*p is added to the gradient, as torch.optim.Adam does. DeepSpeed's "
                           "\"Adam\" type decays decoupled by default; for that use the adamw optimizer",
                           "Adam with L2 weight decay (torch.optim.Adam); for decoupled decay, DeepSpeed's "
                           "default \"Adam\", use adamw"};
constexpr Variant kAdamw = {kAdamwName, true, 0.01,
                            "decoupled decay: p -= lr*wd*p before the Adam step, as torch.optim.AdamW (and "
                            "DeepSpeed's \"Adam\") does",
                            "AdamW: Adam with decoupled weight decay (torch.optim.AdamW, DeepSpeed's default "
                            "\"Adam\")"};
constexpr Variant kThis = ZEROD_ADAMW ? kAdamw : kAdam;

constexpr const char* kName = kThis.name;
constexpr auto kSpecs = family::make_specs(kThis.weight_decay, kThis.weight_decay_help);

zd_status create(const zd_host_services* host, const double* values, size_t value_count, void** out_instance,
                 char* err, size_t err_size) noexcept {
  return family::create(kThis.decoupled, kName, kSpecs.data(), kSpecs.size(), host, values, value_count, out_instance,
                        err, err_size);
}

constexpr zd_plugin_header kHeader = {
    .kind = ZD_PLUGIN_OPTIMIZER,
    .struct_size = 0,  // set per version by the family's descriptor_*()
    .abi_version = 0,
    .plugin_version = (0u << 16) | 2u,
    .name = kName,
    .description = kThis.description};

const zd_optimizer_v1 kDescriptorV1 = family::descriptor_v1(kHeader, kSpecs.data(), kSpecs.size(), create);
#ifndef ZEROD_ADAMW_V1_ONLY
const zd_optimizer_v4 kDescriptorV4 = family::descriptor_v4(kHeader, kSpecs.data(), kSpecs.size(), create);
#endif

}  // namespace

#ifdef ZEROD_ADAMW_V1_ONLY
ZD_PLUGIN_DESCRIPTORS(&kDescriptorV1.header)
#else
ZD_PLUGIN_DESCRIPTORS(&kDescriptorV4.header, &kDescriptorV1.header)
#endif
