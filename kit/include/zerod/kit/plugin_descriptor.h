// What every plugin descriptor repeats, as two macros: the opening fields
// of a descriptor (its zd_plugin_header, then the hyperparameter specs) and
// the exported entry point with its NULL-terminated list. They expand where
// zerod/zerod_plugin.h is included; this header includes nothing, so the kit
// stays dependency-free (ARCHITECTURE.md §13).
//
//   const zd_comm_v2 kV2 = {
//       ZD_DESCRIPTOR_HEAD(ZD_PLUGIN_COMM, zd_comm_v2, 2, 0, 2, "local", kDescription, kSpecs.data(), kSpecs.size()),
//       .create = create_v2,
//       ...
//   };
//   ZD_PLUGIN_DESCRIPTORS(&kV2.header, &kV1.header)   // at namespace scope, newest first
#ifndef ZEROD_KIT_PLUGIN_DESCRIPTOR_H
#define ZEROD_KIT_PLUGIN_DESCRIPTOR_H

// Designated initializers for header, hparams, hparam_count and reserved:
// the descriptor's struct (its size goes into the header), its ABI version,
// the plugin's own version as major.minor, its name, a one-line
// description, and its hyperparameter specs.
#define ZD_DESCRIPTOR_HEAD(kind_, Descriptor_, abi_version_, major_, minor_, name_, description_, specs_, \
                           spec_count_)                                                                    \
  .header = {.kind = (kind_),                                                                              \
             .struct_size = sizeof(Descriptor_),                                                           \
             .abi_version = (abi_version_),                                                                \
             .plugin_version = (static_cast<uint32_t>(major_) << 16) | static_cast<uint32_t>(minor_),      \
             .name = (name_),                                                                              \
             .description = (description_)},                                                               \
  .hparams = (specs_), .hparam_count = static_cast<uint32_t>(spec_count_), .reserved = 0

// zd_plugin_descriptors(), returning the given descriptor headers (newest
// version first: the host takes the newest it understands) and NULL.
#define ZD_PLUGIN_DESCRIPTORS(...)                                                                     \
  extern "C" ZD_PLUGIN_EXPORT const zd_plugin_header* const* zd_plugin_descriptors(void) {             \
    static const zd_plugin_header* const descriptors[] = {__VA_ARGS__, nullptr};                       \
    return descriptors;                                                                                \
  }

#endif  // ZEROD_KIT_PLUGIN_DESCRIPTOR_H
