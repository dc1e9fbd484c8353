// The tier plugins as the engine sees them: dlopen'ed from the plugin
// folder, reached only through zd_plugin_descriptors and the descriptor.
#ifndef ZEROD_TESTS_OFFLOAD_TIER_PLUGIN_H
#define ZEROD_TESTS_OFFLOAD_TIER_PLUGIN_H

#include <dlfcn.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <zerod/zerod_plugin.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#ifndef ZEROD_TEST_PLUGIN_DIR
#error "ZEROD_TEST_PLUGIN_DIR must name the folder holding zd_tier_*.so"
#endif

namespace zerod::offload::test {

class TierPlugin {
 public:
  explicit TierPlugin(const std::string& name) {
    const std::string path = std::string(ZEROD_TEST_PLUGIN_DIR) + "/zd_tier_" + name + ".so";
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
    for (const zd_plugin_header* const* h = entry(); h != nullptr && *h != nullptr; ++h) {
      if ((*h)->kind == ZD_PLUGIN_TIER && (*h)->abi_version == ZD_TIER_ABI_VERSION) {
        desc_ = reinterpret_cast<const zd_tier_v1*>(*h);
      }
    }
    if (desc_ == nullptr) error_ = "no tier v1 descriptor in " + path;
  }
  ~TierPlugin() {
    if (handle_ != nullptr) dlclose(handle_);
  }
  TierPlugin(const TierPlugin&) = delete;
  TierPlugin& operator=(const TierPlugin&) = delete;

  const zd_tier_v1* desc() const { return desc_; }
  const std::string& error() const { return error_; }

  // The spec defaults, flattened as create() takes them.
  std::vector<double> defaults() const {
    std::vector<double> v;
    for (uint32_t i = 0; i < desc_->hparam_count; ++i) {
      for (int32_t j = 0; j < desc_->hparams[i].count; ++j) v.push_back(desc_->hparams[i].defaults[j]);
    }
    return v;
  }
  size_t offset_of(const char* name) const {
    size_t k = 0;
    for (uint32_t i = 0; i < desc_->hparam_count; ++i) {
      if (std::strcmp(desc_->hparams[i].name, name) == 0) return k;
      k += static_cast<size_t>(desc_->hparams[i].count);
    }
    ADD_FAILURE() << "no hyperparameter " << name;
    return 0;
  }

 private:
  void* handle_ = nullptr;
  const zd_tier_v1* desc_ = nullptr;
  std::string error_;
};

// One instance, destroyed with the object.
class Tier {
 public:
  Tier(const TierPlugin& plugin, const std::vector<double>& values, const zd_tier_config& config,
       const zd_host_services* host = nullptr)
      : d_(plugin.desc()) {
    char buf[1024] = "";
    status_ = d_->create(host, values.data(), values.size(), &config, &inst_, buf, sizeof buf);
    error_ = buf;
  }
  ~Tier() {
    if (inst_ != nullptr) d_->destroy(inst_);
  }
  Tier(const Tier&) = delete;
  Tier& operator=(const Tier&) = delete;

  zd_status status() const { return status_; }
  const std::string& error() const { return error_; }
  void* get() const { return inst_; }
  const zd_tier_v1* desc() const { return d_; }

  std::string describe() const {
    char buf[1024] = "";
    d_->describe(inst_, buf, sizeof buf);
    return buf;
  }
  std::vector<int32_t> cpus() const {
    std::vector<int32_t> v(4096);
    v.resize(static_cast<size_t>(d_->cpus(inst_, v.data(), static_cast<int32_t>(v.size()))));
    return v;
  }
  // Destroys now (a test of what destroy does).
  void reset() {
    if (inst_ != nullptr) d_->destroy(inst_);
    inst_ = nullptr;
  }

 private:
  const zd_tier_v1* d_;
  void* inst_ = nullptr;
  zd_status status_ = ZD_ERR_INTERNAL;
  std::string error_;
};

// A host services table that keeps what the plugin logs.
class LogCapture {
 public:
  LogCapture() {
    services_.struct_size = sizeof services_;
    services_.abi_version = ZD_ABI_VERSION;
    services_.host = this;
    services_.log = [](void* host, zd_log_level, const char* plugin, const char* message) {
      static_cast<LogCapture*>(host)->lines_.push_back(std::string(plugin) + ": " + message);
    };
  }
  const zd_host_services* services() const { return &services_; }
  const std::vector<std::string>& lines() const { return lines_; }

 private:
  zd_host_services services_{};
  std::vector<std::string> lines_;
};

inline zd_tier_config make_config(int32_t rank, int32_t local_rank, const std::vector<const char*>& paths = {}) {
  zd_tier_config c{};
  c.struct_size = sizeof c;
  c.rank = rank;
  c.world_size = 8;
  c.local_rank = local_rank;
  c.paths = paths.empty() ? nullptr : paths.data();
  c.path_count = static_cast<int32_t>(paths.size());
  return c;
}

// Page-aligned memory for O_DIRECT transfers.
struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<unsigned char, FreeDeleter>;
inline AlignedBuffer aligned_buffer(size_t bytes, size_t align = 4096) {
  void* p = nullptr;
  if (posix_memalign(&p, align, bytes) != 0) return nullptr;
  std::memset(p, 0, bytes);
  return AlignedBuffer(static_cast<unsigned char*>(p));
}

}  // namespace zerod::offload::test

#endif  // ZEROD_TESTS_OFFLOAD_TIER_PLUGIN_H
