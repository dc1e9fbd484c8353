// An optimizer plugin as the engine reaches it, for the plugin tests:
// dlopen'ed from ZEROD_TEST_PLUGIN_DIR, its descriptors found by kind and
// ABI version, and what it logs through the host services kept.
#pragma once

#include <dlfcn.h>
#include <zerod/zerod_plugin.h>

#include <string>
#include <utility>
#include <vector>

#ifndef ZEROD_TEST_PLUGIN_DIR
#error "ZEROD_TEST_PLUGIN_DIR must name the folder holding zd_optimizer_*.so"
#endif

namespace zerod::optim::test {

// What the plugin logged through the host services.
struct PluginLog {
  std::vector<std::pair<zd_log_level, std::string>> lines;
  static void sink(void* host, zd_log_level level, const char*, const char* message) {
    static_cast<PluginLog*>(host)->lines.emplace_back(level, message);
  }
};

// dlopen of ZEROD_TEST_PLUGIN_DIR/<file>; nullptr if it fails (dlerror() says why).
inline void* open_plugin(const std::string& file) {
  return dlopen((std::string(ZEROD_TEST_PLUGIN_DIR) + "/" + file).c_str(), RTLD_NOW | RTLD_LOCAL);
}

// The plugin's descriptor headers, in its entry's order.
inline std::vector<const zd_plugin_header*> plugin_headers(void* handle) {
  std::vector<const zd_plugin_header*> out;
  auto entry = reinterpret_cast<zd_plugin_entry_fn>(dlsym(handle, ZD_PLUGIN_ENTRY_SYMBOL));
  if (entry == nullptr) return out;
  for (const zd_plugin_header* const* h = entry(); *h != nullptr; ++h) out.push_back(*h);
  return out;
}

}  // namespace zerod::optim::test
