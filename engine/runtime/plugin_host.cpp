#include "runtime/plugin_host.h"

#include "comm/comm_adapters.h"
#include "observe/collective_board.h"

#include "error.h"
#include "memory/ledger.h"
#include "log.h"

#include <dirent.h>
#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>  // program_invocation_name (GNU)
#include <cstdlib>
#include <cstring>
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
  if (!dladdr(reinterpret_cast<void*>(&own_binary_dir), &info) || !info.dli_fname) return ".";
  char resolved[4096];
  // Where this code is linked into the program itself (the zerod command),
  // glibc names it by argv[0]: "zerod" when the shell found it on PATH,
  // which realpath would take for a file in the working directory. The
  // kernel knows the program's own file.
  if (program_invocation_name && std::strcmp(info.dli_fname, program_invocation_name) == 0) {
    const ssize_t n = readlink("/proc/self/exe", resolved, sizeof resolved - 1);
    if (n > 0) {
      resolved[n] = '\0';
      return dir_of(resolved);
    }
  }
  if (realpath(info.dli_fname, resolved)) return dir_of(resolved);
  return dir_of(info.dli_fname);
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

namespace {

// The descriptor size the host reads for each kind and version.
size_t descriptor_size(zd_plugin_kind kind, uint32_t version) {
  switch (kind) {
    case ZD_PLUGIN_OPTIMIZER:
      return version >= 4   ? sizeof(zd_optimizer_v4)
             : version == 3 ? sizeof(zd_optimizer_v3)
             : version == 2 ? sizeof(zd_optimizer_v2)
                            : sizeof(zd_optimizer_v1);
    case ZD_PLUGIN_COMM:
      return version >= 3 ? sizeof(zd_comm_v3) : version == 2 ? sizeof(zd_comm_v2) : sizeof(zd_comm_v1);
    case ZD_PLUGIN_PARTITIONER: return sizeof(zd_partitioner_v1);
    case ZD_PLUGIN_TIER: return sizeof(zd_tier_v1);
    default: return sizeof(PluginPrefix);
  }
}

uint32_t host_version(zd_plugin_kind kind) {
  switch (kind) {
    case ZD_PLUGIN_OPTIMIZER: return ZD_OPTIMIZER_ABI_VERSION;
    case ZD_PLUGIN_COMM: return ZD_COMM_ABI_VERSION;
    case ZD_PLUGIN_PARTITIONER: return ZD_PARTITIONER_ABI_VERSION;
    case ZD_PLUGIN_TIER: return ZD_TIER_ABI_VERSION;
    default: return 0;
  }
}

// Whether every function the host calls is there.
bool complete(zd_plugin_kind kind, const PluginPrefix* p) {
  const uint32_t version = p->header.abi_version;
  switch (kind) {
    case ZD_PLUGIN_OPTIMIZER: {
      const auto* d = reinterpret_cast<const zd_optimizer_v1*>(p);
      const bool v1 = d->create && d->destroy && d->state_slots && d->state_name && d->supports_isa &&
                      d->update;
      if (version < 2) return v1;
      if (version == 2) {
        // momentum_slot and momentum are checked when compression_start() says they are used
        return v1 && reinterpret_cast<const zd_optimizer_v2*>(p)->compression_start;
      }
      // prepare and tensor_step are checked when the instance says it uses them
      const auto* d3 = reinterpret_cast<const zd_optimizer_v3*>(p);
      const bool v3 = v1 && d3->plan && d3->average_slot && d3->tensor_scalars && d3->tensor_stats &&
                      d3->stat_op && d3->check_partitions && d3->compresses;
      if (version == 3) return v3;
      return v3 && reinterpret_cast<const zd_optimizer_v4*>(p)->supports_state_dtype;
    }
    case ZD_PLUGIN_COMM: {
      if (version >= 2) {
        const auto* d = reinterpret_cast<const zd_comm_v2*>(p);
        const bool v2 = d->create && d->destroy && d->all_reduce && d->reduce_scatter && d->all_gather &&
                        d->broadcast && d->barrier && d->abort && d->last_error && d->all_to_all &&
                        d->compressed_all_reduce && d->figures;
        return version == 2 ? v2 : v2 && reinterpret_cast<const zd_comm_v3*>(p)->memory;
      }
      const auto* d = reinterpret_cast<const zd_comm_v1*>(p);
      return d->create && d->destroy && d->all_reduce && d->reduce_scatter && d->all_gather &&
             d->broadcast && d->barrier && d->abort && d->last_error && d->bytes_sent;
    }
    case ZD_PLUGIN_PARTITIONER: {
      const auto* d = reinterpret_cast<const zd_partitioner_v1*>(p);
      return d->create && d->destroy && d->partitions && d->shard_stride &&
             d->persistence_threshold && d->bucket_elements && d->max_live_elements &&
             d->prefetch_elements;
    }
    case ZD_PLUGIN_TIER: {
      const auto* d = reinterpret_cast<const zd_tier_v1*>(p);
      if (!d->create || !d->destroy || !d->capabilities || !d->describe || !d->cpus) return false;
      return true;  // allocate/release or the block functions: checked by capability at create
    }
    default: return false;
  }
}

// The text of a plugin's refusal, or its status name.
std::string refusal(const char* err, zd_status st) {
  return err[0] ? std::string(err) : std::string(status_name(st));
}

}  // namespace

std::vector<std::string> available_plugins(zd_plugin_kind kind,
                                           const std::vector<std::string>& search_path) {
  const std::string prefix = std::string("zd_") + plugin_kind_name(kind) + "_";
  std::vector<std::string> names;
  for (const auto& d : search_path) {
    DIR* dir = opendir(d.c_str());
    if (!dir) continue;
    while (dirent* e = readdir(dir)) {
      const std::string f = e->d_name;
      if (f.rfind(prefix, 0) == 0 && f.size() > prefix.size() + 3 && f.substr(f.size() - 3) == ".so")
        names.push_back(f.substr(prefix.size(), f.size() - prefix.size() - 3));
    }
    closedir(dir);
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

// ---------------------------------------------------------------------------

Plugin::Plugin(std::shared_ptr<PluginLibrary> lib, const PluginPrefix* prefix, std::string name)
    : library_(std::move(lib)), prefix_(prefix), name_(std::move(name)) {}

std::shared_ptr<Plugin> Plugin::load(zd_plugin_kind kind, const std::string& name,
                                     const std::vector<std::string>& search_path) {
  return load_file(kind, find_plugin_file(kind, name, search_path), name);
}

std::shared_ptr<Plugin> Plugin::load_file(zd_plugin_kind kind, const std::string& path,
                                          const std::string& expected_name) {
  auto lib = PluginLibrary::open(path);
  const zd_plugin_header* h = lib->select(kind, host_version(kind));
  const std::string what = std::string(plugin_kind_name(kind));
  if (h->struct_size < descriptor_size(kind, h->abi_version))
    fail(ZD_ERR_VERSION, "plugin " + path + ": " + what + " descriptor version " +
                             std::to_string(h->abi_version) + " expected " +
                             std::to_string(descriptor_size(kind, h->abi_version)) + " bytes, got " +
                             std::to_string(h->struct_size));
  const auto* p = reinterpret_cast<const PluginPrefix*>(h);
  const std::string name = h->name ? h->name : "";
  if (!expected_name.empty() && name != expected_name)
    fail(ZD_ERR_PLUGIN, "plugin " + path + " describes " + what + " '" + name + "', not '" +
                            expected_name + "'");
  if (!complete(kind, p) || (p->hparam_count && !p->hparams))
    fail(ZD_ERR_PLUGIN, "plugin " + path + ": " + what + " descriptor '" + name +
                            "' leaves a required function empty");
  for (uint32_t i = 0; i < p->hparam_count; ++i) {
    const auto& s = p->hparams[i];
    if (!s.name || s.count < 1 || s.count > ZD_HPARAM_MAX_COUNT)
      fail(ZD_ERR_PLUGIN, "plugin " + path + ": hyperparameter #" + std::to_string(i) +
                              " has no name or a count outside 1.." +
                              std::to_string(ZD_HPARAM_MAX_COUNT));
  }
  return std::shared_ptr<Plugin>(new Plugin(std::move(lib), p, name));
}

std::span<const zd_hparam_spec> Plugin::hparams() const {
  return {prefix_->hparams, prefix_->hparam_count};
}

int Plugin::value_index(const std::string& hparam) const {
  int at = 0;
  for (const auto& s : hparams()) {
    if (hparam == s.name) return at;
    at += s.count;
  }
  return -1;
}

size_t Plugin::value_count() const {
  size_t n = 0;
  for (const auto& s : hparams()) n += static_cast<size_t>(s.count);
  return n;
}

std::vector<double> Plugin::default_values() const {
  std::vector<double> v;
  for (const auto& s : hparams())
    for (int i = 0; i < s.count; ++i) v.push_back(s.defaults[i]);
  return v;
}

// ---------------------------------------------------------------------------

PluginInstance::PluginInstance(std::shared_ptr<const Plugin> plugin, void* instance,
                               void (*destroy)(void*), std::vector<double> values)
    : plugin_(std::move(plugin)), instance_(instance), destroy_(destroy), values_(std::move(values)) {}

PluginInstance::~PluginInstance() { destroy_(instance_); }

double PluginInstance::value(const std::string& hparam, double fallback) const {
  const int at = plugin_->value_index(hparam);
  return at >= 0 ? values_.at(static_cast<size_t>(at)) : fallback;
}

namespace plugin_detail {

void check_value_count(const Plugin& p, const std::vector<double>& values) {
  if (values.size() != p.value_count())
    fail(ZD_ERR_INTERNAL, std::string(plugin_kind_name(p.kind())) + " '" + p.name() + "' expects " +
                              std::to_string(p.value_count()) + " hyperparameter values, got " +
                              std::to_string(values.size()));
}

[[noreturn]] void refused(const Plugin& p, zd_status st, const char* err) {
  fail(st == ZD_OK ? ZD_ERR_PLUGIN : st, std::string(plugin_kind_name(p.kind())) + " '" +
                                             p.name() + "' refused its configuration: " +
                                             refusal(err, st));
}

}  // namespace plugin_detail

using plugin_detail::check_value_count;
using plugin_detail::refused;

std::unique_ptr<PartitionerInstance> PartitionerInstance::create(
    const std::shared_ptr<const Plugin>& plugin, const std::vector<double>& values, int world_size) {
  check_value_count(*plugin, values);
  const auto& d = plugin->descriptor<zd_partitioner_v1>();
  char err[512] = {0};
  void* inst = nullptr;
  const zd_status st =
      d.create(host_services(), values.data(), values.size(), world_size, &inst, err, sizeof err);
  err[sizeof err - 1] = 0;
  if (st != ZD_OK || !inst) refused(*plugin, st, err);
  return std::unique_ptr<PartitionerInstance>(new PartitionerInstance(plugin, inst, d.destroy, values));
}

uint32_t PartitionerInstance::partitions() const { return d().partitions(raw()); }
uint64_t PartitionerInstance::shard_stride(uint64_t numel, uint64_t align) const {
  return d().shard_stride(raw(), numel, align);
}
uint64_t PartitionerInstance::persistence_threshold() const { return d().persistence_threshold(raw()); }
uint64_t PartitionerInstance::bucket_elements() const { return d().bucket_elements(raw()); }
uint64_t PartitionerInstance::max_live_elements() const { return d().max_live_elements(raw()); }
uint64_t PartitionerInstance::prefetch_elements() const { return d().prefetch_elements(raw()); }

std::unique_ptr<CommInstance> CommInstance::create(const std::shared_ptr<const Plugin>& plugin,
                                                   const std::vector<double>& values, int world_size,
                                                   int first_local_rank, int local_ranks) {
  check_value_count(*plugin, values);
  if (local_ranks < 0) local_ranks = world_size;
  const zd_comm_config cfg{sizeof(zd_comm_config), world_size, first_local_rank, local_ranks};
  // The one place that asks the version: a plugin of an older version is
  // lifted to the current table here, once, by its version's adapter
  // (comm_adapters.h); every call after uses table_.
  const uint32_t version = plugin->header().abi_version;
  const bool v1 = version < 2;
  const zd_comm_v3 table = v1              ? lift_comm_v1(plugin->descriptor<zd_comm_v1>())
                           : version == 2  ? lift_comm_v2(plugin->descriptor<zd_comm_v2>())
                                           : plugin->descriptor<zd_comm_v3>();
  char err[512] = {0};
  void* inst = nullptr;
  const zd_status st =
      v1 ? create_comm_v1(plugin->descriptor<zd_comm_v1>(), plugin->name(), host_services(), values.data(),
                          values.size(), cfg, &inst, err, sizeof err)
         : table.create(host_services(), values.data(), values.size(), &cfg, &inst, err, sizeof err);
  err[sizeof err - 1] = 0;
  if (st != ZD_OK || !inst) refused(*plugin, st, err);
  std::unique_ptr<CommInstance> c(new CommInstance(plugin, inst, table.destroy, values));
  c->table_ = table;
  c->callee_ = inst;
  if (v1) {
    c->adapted_ = std::make_shared<AdaptedComm>(AdaptedComm{&plugin->descriptor<zd_comm_v1>(), inst});
    c->callee_ = c->adapted_.get();
  }
  return c;
}

void CommInstance::check(zd_status st, const zd_comm_call& c) const {
  if (st == ZD_OK) return;
  const char* msg = table_.last_error(callee_, c.rank);
  fail(st, msg && *msg ? std::string(msg)
                       : std::string(c.what ? c.what : "collective") + " failed: " + status_name(st));
}

template <typename Fn>
void CommInstance::observed(const zd_comm_call& c, const char* op, uint64_t bytes, Fn&& fn) const {
  if (!board_) {
    check(fn(), c);
    return;
  }
  const observe::CollectiveBoard::Arrival a = board_->arrive(c.rank);
  const zd_status st = fn();
  if (st == ZD_OK) board_->complete(c.rank, a, op, c.tag, bytes);
  check(st, c);
}

namespace {

uint64_t comm_bytes(uint64_t count, zd_comm_dtype dt) {
  switch (dt) {
    case ZD_COMM_F64: return count * 8;
    case ZD_COMM_F32: return count * 4;
    case ZD_COMM_BF16: case ZD_COMM_F16: return count * 2;
    default: return count;
  }
}

}  // namespace

void CommInstance::all_reduce(const zd_comm_call& c, void* buf, uint64_t count, zd_comm_dtype dt,
                              zd_reduce_op op) const {
  observed(c, "all_reduce", comm_bytes(count, dt), [&] { return table_.all_reduce(callee_, &c, buf, count, dt, op); });
}
void CommInstance::reduce_scatter(const zd_comm_call& c, const void* send, void* recv,
                                  uint64_t recv_count, zd_comm_dtype dt, zd_reduce_op op) const {
  observed(c, "reduce_scatter", comm_bytes(recv_count, dt),
           [&] { return table_.reduce_scatter(callee_, &c, send, recv, recv_count, dt, op); });
}
void CommInstance::all_gather(const zd_comm_call& c, const void* send, void* recv,
                              uint64_t send_count, zd_comm_dtype dt) const {
  observed(c, "all_gather", comm_bytes(send_count, dt),
           [&] { return table_.all_gather(callee_, &c, send, recv, send_count, dt); });
}
void CommInstance::broadcast(const zd_comm_call& c, void* buf, uint64_t count, zd_comm_dtype dt,
                             int32_t root) const {
  observed(c, "broadcast", comm_bytes(count, dt), [&] { return table_.broadcast(callee_, &c, buf, count, dt, root); });
}
void CommInstance::barrier(const zd_comm_call& c) const {
  observed(c, "barrier", 0, [&] { return table_.barrier(callee_, &c); });
}
void CommInstance::abort(zd_status status, const std::string& reason) const {
  table_.abort(callee_, status, reason.c_str());
}

void CommInstance::compressed_all_reduce(const zd_comm_call& c, float* buf, uint64_t count, float* worker_error,
                                         float* server_error) const {
  if (!has_compression())
    fail(ZD_ERR_NOT_IMPLEMENTED, "comm plugin '" + plugin().name() + "' (plugin ABI version " +
                                     std::to_string(plugin().header().abi_version) +
                                     ") has no compressed all-reduce");
  observed(c, "compressed all_reduce", count * 4,
           [&] { return table_.compressed_all_reduce(callee_, &c, buf, count, worker_error, server_error); });
}

bool CommInstance::has_compression() const { return table_.compressed_all_reduce != nullptr; }

zd_comm_memory CommInstance::memory() const { return table_.memory(callee_) | ZD_COMM_MEMORY_HOST; }

zd_comm_figures CommInstance::figures(int32_t rank) const {
  zd_comm_figures f = ZD_COMM_FIGURES_INIT;
  table_.figures(callee_, rank, &f);
  f.struct_size = sizeof f;
  return f;
}

uint64_t CommInstance::bytes_sent(int32_t rank) const { return figures(rank).bytes_sent; }

std::unique_ptr<TierInstance> TierInstance::create(const std::shared_ptr<const Plugin>& plugin,
                                                   const std::vector<double>& values,
                                                   const zd_tier_config& config) {
  check_value_count(*plugin, values);
  const auto& d = plugin->descriptor<zd_tier_v1>();
  char err[1024] = {0};
  void* inst = nullptr;
  const zd_status st =
      d.create(host_services(), values.data(), values.size(), &config, &inst, err, sizeof err);
  err[sizeof err - 1] = 0;
  if (st != ZD_OK || !inst)
    fail(st == ZD_OK ? ZD_ERR_PLUGIN : st,
         std::string("tier '") + plugin->name() + "' for rank " + std::to_string(config.rank) +
             ": " + refusal(err, st));
  auto t = std::unique_ptr<TierInstance>(new TierInstance(plugin, inst, d.destroy, values));
  const uint32_t caps = d.capabilities(inst);
  const bool ok = (!(caps & ZD_TIER_CAP_ADDRESSABLE) || (d.allocate && d.release)) &&
                  (!(caps & ZD_TIER_CAP_BLOCK) || (d.alignment && d.reserve && d.submit && d.wait));
  if (!ok || !(caps & (ZD_TIER_CAP_ADDRESSABLE | ZD_TIER_CAP_BLOCK)))
    fail(ZD_ERR_PLUGIN, "tier plugin '" + plugin->name() + "' (" + plugin->path() +
                            ") lacks the functions its capabilities need");
  return t;
}

uint32_t TierInstance::capabilities() const { return d().capabilities(raw()); }

std::string TierInstance::describe() const {
  char buf[512] = {0};
  d().describe(raw(), buf, sizeof buf);
  buf[sizeof buf - 1] = 0;
  return buf;
}

std::vector<int> TierInstance::cpus() const {
  std::vector<int32_t> v(4096);
  const int32_t n = d().cpus(raw(), v.data(), static_cast<int32_t>(v.size()));
  return std::vector<int>(v.begin(), v.begin() + std::max(0, std::min<int32_t>(n, 4096)));
}

void* TierInstance::allocate(uint64_t bytes, const std::string& what) const {
  char err[512] = {0};
  void* p = d().allocate(raw(), bytes, err, sizeof err);
  err[sizeof err - 1] = 0;
  if (!p)
    fail(ZD_ERR_OUT_OF_MEMORY, "the " + plugin().name() + " tier cannot hold " + what + " (" +
                                   format_bytes(bytes) + "): " + (err[0] ? err : "allocation failed"));
  return p;
}

void TierInstance::release(void* ptr, uint64_t bytes) const {
  if (ptr) d().release(raw(), ptr, bytes);
}

uint64_t TierInstance::alignment() const { return d().alignment(raw()); }

uint64_t TierInstance::reserve(uint64_t bytes, const std::string& what) const {
  char err[1024] = {0};
  uint64_t off = 0;
  const zd_status st = d().reserve(raw(), bytes, what.c_str(), &off, err, sizeof err);
  err[sizeof err - 1] = 0;
  if (st != ZD_OK) fail(st, err[0] ? err : "reserving " + format_bytes(bytes) + " for " + what + " failed");
  return off;
}

uint64_t TierInstance::submit(const zd_tier_io* ios, uint32_t count) const {
  char err[1024] = {0};
  uint64_t ticket = 0;
  const zd_status st = d().submit(raw(), ios, count, &ticket, err, sizeof err);
  err[sizeof err - 1] = 0;
  if (st != ZD_OK) fail(st, err[0] ? err : std::string("submitting I/O failed"));
  return ticket;
}

void TierInstance::wait(uint64_t ticket) const {
  char err[1024] = {0};
  const zd_status st = d().wait(raw(), ticket, err, sizeof err);
  err[sizeof err - 1] = 0;
  if (st != ZD_OK) fail(st, err[0] ? err : std::string("I/O failed"));
}

}  // namespace zerod
