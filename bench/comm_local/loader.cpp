#include "loader.h"

#include <dlfcn.h>

namespace zerod::bench {

LocalComm::LocalComm(const std::string& plugin_dir, int world, double spin_us) {
  const std::string path = plugin_dir + "/zd_comm_local.so";
  handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle_ == nullptr) {
    error_ = dlerror();
    return;
  }
  auto entry = reinterpret_cast<zd_plugin_entry_fn>(dlsym(handle_, ZD_PLUGIN_ENTRY_SYMBOL));
  if (entry == nullptr) {
    error_ = "no " ZD_PLUGIN_ENTRY_SYMBOL " in " + path;
    return;
  }
  const zd_comm_v2* d = nullptr;
  for (const zd_plugin_header* const* h = entry(); *h != nullptr; ++h) {
    if ((*h)->kind == ZD_PLUGIN_COMM && (*h)->abi_version == 2) {
      d = reinterpret_cast<const zd_comm_v2*>(*h);
    }
  }
  if (d == nullptr) {
    error_ = "no comm v2 descriptor in " + path;
    return;
  }
  char err[256] = "";
  const double values[] = {spin_us};
  const zd_comm_config cfg{sizeof(zd_comm_config), world, 0, world};
  if (d->create(nullptr, values, 1, &cfg, &inst_, err, sizeof err) != ZD_OK) {
    error_ = err;
    return;
  }
  desc_ = d;
}

LocalComm::~LocalComm() {
  if (desc_ != nullptr) desc_->destroy(inst_);
  if (handle_ != nullptr) dlclose(handle_);
}

}  // namespace zerod::bench
