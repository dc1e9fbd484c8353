#include "plugin_host.h"

#include "error.h"
#include "log.h"

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <sstream>

#ifndef ZEROD_INSTALL_PLUGIN_DIR
#define ZEROD_INSTALL_PLUGIN_DIR ""
#endif
#ifndef ZEROD_LIBDIR_NAME
#define ZEROD_LIBDIR_NAME "lib"
#endif

namespace zerod {

const char* plugin_kind_name(zd_plugin_kind kind) {
  switch (kind) {
    case ZD_PLUGIN_OPTIMIZER: return "optimizer";
    case ZD_PLUGIN_PARTITIONER: return "partitioner";
    case ZD_PLUGIN_TIER: return "tier";
    case ZD_PLUGIN_COMM: return "comm";
    default: return "unknown";
  }
}

namespace {

bool is_dir(const std::string& p) {
  struct stat st{};
  return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool is_file(const std::string& p) {
  struct stat st{};
  return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string dir_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// The folder of the binary (libzerod.so, zerod, a test) this code is in.
std::string own_binary_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&own_binary_dir), &info) && info.dli_fname) {
    char resolved[4096];
    if (realpath(info.dli_fname, resolved)) return dir_of(resolved);
    return dir_of(info.dli_fname);
  }
  return ".";
}

void host_log(void*, zd_log_level level, const char* plugin, const char* message) {
  log_message(level, std::string("plugin ") + (plugin ? plugin : "?") + ": " +
                         (message ? message : ""));
}

const zd_host_services kHostServices = {sizeof(zd_host_services), ZD_ABI_VERSION, nullptr,
                                        &host_log};

std::string version_text(uint32_t v) { return std::to_string(v); }

}  // namespace

std::vector<std::string> plugin_search_path(const std::vector<std::string>& job_dirs) {
  std::vector<std::string> dirs(job_dirs.begin(), job_dirs.end());
  if (const char* env = std::getenv("ZEROD_PLUGIN_PATH")) {
    std::stringstream ss(env);
    std::string d;
    while (std::getline(ss, d, ':'))
      if (!d.empty()) dirs.push_back(d);
  }
  const std::string here = own_binary_dir();
  for (const std::string& d : {here + "/zerod/plugins",
                               here + "/../" ZEROD_LIBDIR_NAME "/zerod/plugins",
                               std::string(ZEROD_INSTALL_PLUGIN_DIR)}) {
    if (!d.empty() && is_dir(d)) dirs.push_back(d);
  }
  return dirs;
}

std::string plugin_file_name(zd_plugin_kind kind, const std::string& name) {
  return std::string("zd_") + plugin_kind_name(kind) + "_" + name + ".so";
}

std::string find_plugin_file(zd_plugin_kind kind, const std::string& name,
                             const std::vector<std::string>& search_path) {
  for (char c : name) {
    if (!(isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'))
      fail(ZD_ERR_INVALID_ARGUMENT, std::string(plugin_kind_name(kind)) + " plugin name '" +
                                        name + "' may hold only letters, digits, '_' and '-'");
  }
  const std::string file = plugin_file_name(kind, name);
  std::string searched;
  for (const auto& d : search_path) {
    const std::string p = d + "/" + file;
    if (is_file(p)) return p;
    searched += "\n  " + d;
  }
  fail(ZD_ERR_NOT_FOUND, std::string("no ") + plugin_kind_name(kind) + " plugin named '" + name +
                             "': " + file + " is not in any plugin folder searched:" +
                             (searched.empty() ? std::string("\n  (none)") : searched) +
                             "\n(add a folder with plugin_path in the job script or ZEROD_PLUGIN_PATH)");
}

const zd_host_services* host_services() { return &kHostServices; }

// ---------------------------------------------------------------------------

PluginLibrary::PluginLibrary(std::string path, void* handle, zd_plugin_entry_fn entry)
    : path_(std::move(path)), handle_(handle), entry_(entry) {}

PluginLibrary::~PluginLibrary() {
  if (handle_) dlclose(handle_);
}

std::shared_ptr<PluginLibrary> PluginLibrary::open(const std::string& path) {
  dlerror();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* err = dlerror();
    fail(ZD_ERR_PLUGIN, "cannot load plugin " + path + ": " + (err ? err : "unknown dlopen error"));
  }
  void* sym = dlsym(handle, ZD_PLUGIN_ENTRY_SYMBOL);
  if (!sym) {
    dlclose(handle);
    fail(ZD_ERR_PLUGIN, "plugin " + path + " is not a zerod plugin: it exports no " +
                            ZD_PLUGIN_ENTRY_SYMBOL + "()");
  }
  auto entry = reinterpret_cast<zd_plugin_entry_fn>(sym);
  return std::shared_ptr<PluginLibrary>(new PluginLibrary(path, handle, entry));
}

std::vector<const zd_plugin_header*> PluginLibrary::descriptors() const {
  std::vector<const zd_plugin_header*> out;
  const zd_plugin_header* const* list = entry_();
  for (size_t i = 0; list && list[i] && i < 64; ++i) out.push_back(list[i]);
  return out;
}

const zd_plugin_header* PluginLibrary::select(zd_plugin_kind kind, uint32_t max_version) const {
  const zd_plugin_header* best = nullptr;
  uint32_t newest_unknown = 0;
  for (const zd_plugin_header* h : descriptors()) {
    if (h->kind != kind) continue;
    if (h->abi_version > max_version) {
      if (h->abi_version > newest_unknown) newest_unknown = h->abi_version;
      continue;
    }
    if (!best || h->abi_version > best->abi_version) best = h;
  }
  if (best) return best;
  if (newest_unknown)
    fail(ZD_ERR_VERSION, "plugin " + path_ + ": " + plugin_kind_name(kind) +
                             " plugin ABI version expected " + version_text(max_version) +
                             " (or older), got " + version_text(newest_unknown) +
                             "; rebuild the plugin against this zerod or upgrade zerod");
  fail(ZD_ERR_PLUGIN, "plugin " + path_ + " offers no " + plugin_kind_name(kind) + " descriptor");
}

// ---------------------------------------------------------------------------

OptimizerPlugin::OptimizerPlugin(std::shared_ptr<PluginLibrary> lib, const zd_optimizer_v1* desc,
                                 std::string name)
    : library_(std::move(lib)), desc_(desc), name_(std::move(name)) {}

std::shared_ptr<OptimizerPlugin> OptimizerPlugin::load(const std::string& name,
                                                       const std::vector<std::string>& search_path) {
  return load_file(find_plugin_file(ZD_PLUGIN_OPTIMIZER, name, search_path), name);
}

std::shared_ptr<OptimizerPlugin> OptimizerPlugin::load_file(const std::string& path,
                                                            const std::string& expected_name) {
  auto lib = PluginLibrary::open(path);
  const zd_plugin_header* h = lib->select(ZD_PLUGIN_OPTIMIZER, ZD_OPTIMIZER_ABI_VERSION);
  if (h->struct_size < sizeof(zd_optimizer_v1))
    fail(ZD_ERR_VERSION, "plugin " + path + ": optimizer descriptor version 1 expected " +
                             std::to_string(sizeof(zd_optimizer_v1)) + " bytes, got " +
                             std::to_string(h->struct_size));
  const auto* d = reinterpret_cast<const zd_optimizer_v1*>(h);
  const std::string name = h->name ? h->name : "";
  if (!expected_name.empty() && name != expected_name)
    fail(ZD_ERR_PLUGIN, "plugin " + path + " describes optimizer '" + name + "', not '" +
                            expected_name + "'");
  if (!d->create || !d->destroy || !d->state_slots || !d->update || !d->supports_isa ||
      !d->state_name || (d->hparam_count && !d->hparams))
    fail(ZD_ERR_PLUGIN, "plugin " + path + ": optimizer descriptor '" + name +
                            "' leaves a required function empty");
  for (uint32_t i = 0; i < d->hparam_count; ++i) {
    const auto& s = d->hparams[i];
    if (!s.name || s.count < 1 || s.count > ZD_HPARAM_MAX_COUNT)
      fail(ZD_ERR_PLUGIN, "plugin " + path + ": hyperparameter #" + std::to_string(i) +
                              " has no name or a count outside 1.." +
                              std::to_string(ZD_HPARAM_MAX_COUNT));
  }
  return std::shared_ptr<OptimizerPlugin>(new OptimizerPlugin(std::move(lib), d, name));
}

std::span<const zd_hparam_spec> OptimizerPlugin::hparams() const {
  return {desc_->hparams, desc_->hparam_count};
}

int OptimizerPlugin::value_index(const std::string& hparam) const {
  int at = 0;
  for (const auto& s : hparams()) {
    if (hparam == s.name) return at;
    at += s.count;
  }
  return -1;
}

size_t OptimizerPlugin::value_count() const {
  size_t n = 0;
  for (const auto& s : hparams()) n += static_cast<size_t>(s.count);
  return n;
}

std::vector<double> OptimizerPlugin::default_values() const {
  std::vector<double> v;
  for (const auto& s : hparams())
    for (int i = 0; i < s.count; ++i) v.push_back(s.defaults[i]);
  return v;
}

std::unique_ptr<OptimizerInstance> OptimizerPlugin::create(const std::vector<double>& values) const {
  if (values.size() != value_count())
    fail(ZD_ERR_INTERNAL, "optimizer '" + name_ + "' expects " + std::to_string(value_count()) +
                              " hyperparameter values, got " + std::to_string(values.size()));
  char err[512] = {0};
  void* inst = nullptr;
  const zd_status st = desc_->create(host_services(), values.data(), values.size(), &inst, err,
                                     sizeof err);
  if (st != ZD_OK || !inst) {
    err[sizeof err - 1] = 0;
    fail(st == ZD_OK ? ZD_ERR_PLUGIN : st,
         "optimizer '" + name_ + "' refused its configuration: " +
             (err[0] ? err : status_name(st)));
  }
  return std::make_unique<OptimizerInstance>(shared_from_this(), inst, values);
}

OptimizerInstance::OptimizerInstance(std::shared_ptr<const OptimizerPlugin> plugin, void* instance,
                                     std::vector<double> values)
    : plugin_(std::move(plugin)), instance_(instance), values_(std::move(values)) {}

OptimizerInstance::~OptimizerInstance() { plugin_->desc_->destroy(instance_); }

uint32_t OptimizerInstance::state_slots() const {
  return plugin_->desc_->state_slots(instance_);
}

std::string OptimizerInstance::state_name(uint32_t slot) const {
  const char* n = plugin_->desc_->state_name(instance_, slot);
  return n ? n : "state" + std::to_string(slot);
}

void OptimizerInstance::update(zd_isa isa, const zd_optimizer_update& u) const {
  const zd_status st = plugin_->desc_->update(instance_, isa, &u);
  if (st != ZD_OK)
    fail(st, "optimizer '" + plugin_->name() + "' update failed: " + status_name(st));
}

}  // namespace zerod
