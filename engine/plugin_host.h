// Loading plugins: finding the shared object for (kind, name) on the search
// path, dlopen, choosing the newest descriptor version the host understands,
// and refusing anything else with a message that says what was expected.
#pragma once

#include <zerod/zerod_plugin.h>

#include <memory>
#include <span>
#include <string>
#include <vector>

namespace zerod {

const char* plugin_kind_name(zd_plugin_kind kind);  // "optimizer", ...

// The directories searched, in order: the job script's plugin_path (already
// made absolute by the caller), $ZEROD_PLUGIN_PATH (colon-separated), then
// the plugin folder beside the binary holding this code (build or install
// tree), then the install prefix's plugin folder.
std::vector<std::string> plugin_search_path(const std::vector<std::string>& job_dirs);

// A dlopen'ed plugin file. Closed when the last reference goes.
class PluginLibrary {
 public:
  static std::shared_ptr<PluginLibrary> open(const std::string& path);
  ~PluginLibrary();
  PluginLibrary(const PluginLibrary&) = delete;
  PluginLibrary& operator=(const PluginLibrary&) = delete;

  const std::string& path() const { return path_; }
  std::vector<const zd_plugin_header*> descriptors() const;

  // The descriptor of `kind` with the highest abi_version <= max_version;
  // throws ZD_ERR_VERSION ("expected X, got Y") if the plugin offers that
  // kind only in versions the host does not know, ZD_ERR_PLUGIN if none.
  const zd_plugin_header* select(zd_plugin_kind kind, uint32_t max_version) const;

 private:
  PluginLibrary(std::string path, void* handle, zd_plugin_entry_fn entry);
  std::string path_;
  void* handle_;
  zd_plugin_entry_fn entry_;
};

// The file name a plugin of (kind, name) has: zd_<kind>_<name>.so
std::string plugin_file_name(zd_plugin_kind kind, const std::string& name);

// Finds zd_<kind>_<name>.so on the search path; throws ZD_ERR_NOT_FOUND
// listing the directories searched.
std::string find_plugin_file(zd_plugin_kind kind, const std::string& name,
                             const std::vector<std::string>& search_path);

// The host services table every plugin gets: logging goes to the engine log.
const zd_host_services* host_services();

class OptimizerInstance;

// An optimizer plugin, loaded and checked, not yet configured.
class OptimizerPlugin : public std::enable_shared_from_this<OptimizerPlugin> {
 public:
  static std::shared_ptr<OptimizerPlugin> load(const std::string& name,
                                               const std::vector<std::string>& search_path);
  // For tests: a plugin from an explicit file.
  static std::shared_ptr<OptimizerPlugin> load_file(const std::string& path,
                                                    const std::string& expected_name);

  const std::string& name() const { return name_; }
  const std::string& path() const { return library_->path(); }
  const zd_optimizer_v1& descriptor() const { return *desc_; }
  std::span<const zd_hparam_spec> hparams() const;
  // Index of a hyperparameter's first value in the flattened value array, or -1.
  int value_index(const std::string& hparam) const;
  size_t value_count() const;
  std::vector<double> default_values() const;

  // Creates an instance; throws ZD_ERR_PLUGIN with the plugin's message.
  std::unique_ptr<OptimizerInstance> create(const std::vector<double>& values) const;

 private:
  OptimizerPlugin(std::shared_ptr<PluginLibrary> lib, const zd_optimizer_v1* desc, std::string name);
  std::shared_ptr<PluginLibrary> library_;
  const zd_optimizer_v1* desc_;
  std::string name_;
  friend class OptimizerInstance;
};

class OptimizerInstance {
 public:
  OptimizerInstance(std::shared_ptr<const OptimizerPlugin> plugin, void* instance,
                    std::vector<double> values);
  ~OptimizerInstance();
  OptimizerInstance(const OptimizerInstance&) = delete;
  OptimizerInstance& operator=(const OptimizerInstance&) = delete;

  const OptimizerPlugin& plugin() const { return *plugin_; }
  const std::vector<double>& values() const { return values_; }
  uint32_t state_slots() const;
  std::string state_name(uint32_t slot) const;
  // Throws on a non-OK status from the plugin.
  void update(zd_isa isa, const zd_optimizer_update& u) const;

 private:
  std::shared_ptr<const OptimizerPlugin> plugin_;
  void* instance_;
  std::vector<double> values_;
};

}  // namespace zerod
