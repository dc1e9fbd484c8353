#include "host_memory.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace zerod::bench {

namespace {
[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "bench_cpu_adam: %s\n", what.c_str());
  std::exit(1);
}
}  // namespace

HostMemory::HostMemory(const std::string& plugin_dir, bool huge_pages) {
  const std::string path = plugin_dir + "/zd_tier_host.so";
  handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle_ == nullptr) die("cannot load " + path + ": " + dlerror());
  auto entry = reinterpret_cast<zd_plugin_entry_fn>(dlsym(handle_, ZD_PLUGIN_ENTRY_SYMBOL));
  for (const zd_plugin_header* const* h = entry ? entry() : nullptr; h && *h; ++h) {
    if ((*h)->kind == ZD_PLUGIN_TIER && (*h)->abi_version == ZD_TIER_ABI_VERSION)
      desc_ = reinterpret_cast<const zd_tier_v1*>(*h);
  }
  if (desc_ == nullptr) die(path + " has no tier descriptor of this ABI version");
  // The defaults (the engine's, for a job that sets nothing), huge_pages aside.
  std::vector<double> values;
  bool found = false;
  for (uint32_t i = 0; i < desc_->hparam_count; ++i) {
    const zd_hparam_spec& s = desc_->hparams[i];
    const bool knob = std::strcmp(s.name, "huge_pages") == 0;
    found = found || knob;
    for (int32_t j = 0; j < s.count; ++j) values.push_back(knob ? (huge_pages ? 1.0 : 0.0) : s.defaults[j]);
  }
  if (!found) die(path + " has no huge_pages hyperparameter");
  zd_tier_config config{};
  config.struct_size = sizeof config;
  config.world_size = 1;
  char err[512] = "";
  if (desc_->create(nullptr, values.data(), values.size(), &config, &inst_, err, sizeof err) != ZD_OK)
    die(std::string("host tier: ") + err);
}

HostMemory::~HostMemory() {
  if (inst_ != nullptr) desc_->destroy(inst_);
  if (handle_ != nullptr) dlclose(handle_);
}

void* HostMemory::allocate(uint64_t bytes) {
  char err[512] = "";
  void* p = desc_->allocate(inst_, bytes, err, sizeof err);
  if (p == nullptr) die(err);
  return p;
}

void HostMemory::release(void* p, uint64_t bytes) { desc_->release(inst_, p, bytes); }

std::string HostMemory::describe() const {
  char line[512] = "";
  desc_->describe(inst_, line, sizeof line);
  return line;
}

}  // namespace zerod::bench
