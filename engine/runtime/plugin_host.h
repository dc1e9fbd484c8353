// Loading plugins: finding the shared object for (kind, name) on the search
// path, dlopen, choosing the newest descriptor version the host understands,
// and refusing anything else with a message that says what was expected.
// Then, per kind, a configured instance: optimizer, comm, partitioner.
#pragma once

#include <zerod/zerod_plugin.h>

#include <memory>
#include <span>
#include <string>
#include <vector>

namespace zerod {

namespace observe {
class CollectiveBoard;
}

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

// The names of the plugins of a kind found on the search path.
std::vector<std::string> available_plugins(zd_plugin_kind kind,
                                           const std::vector<std::string>& search_path);

// The host services table every plugin gets: logging goes to the engine log.
const zd_host_services* host_services();

// Every version-1 descriptor begins with this: the header and the
// hyperparameter specs the host checks a job script's table against.
struct PluginPrefix {
  zd_plugin_header header;
  const zd_hparam_spec* hparams;
  uint32_t hparam_count;
  uint32_t reserved;
};

// A plugin descriptor of one kind, loaded and checked, not yet configured.
class Plugin : public std::enable_shared_from_this<Plugin> {
 public:
  // Finds, opens and checks the plugin. The descriptor must be at least
  // min_size bytes (the size of the version the host reads).
  static std::shared_ptr<Plugin> load(zd_plugin_kind kind, const std::string& name,
                                      const std::vector<std::string>& search_path);
  static std::shared_ptr<Plugin> load_file(zd_plugin_kind kind, const std::string& path,
                                           const std::string& expected_name);

  zd_plugin_kind kind() const { return prefix_->header.kind; }
  const std::string& name() const { return name_; }
  const std::string& path() const { return library_->path(); }
  const zd_plugin_header& header() const { return prefix_->header; }
  std::span<const zd_hparam_spec> hparams() const;
  // Index of a hyperparameter's first value in the flattened value array, or -1.
  int value_index(const std::string& hparam) const;
  size_t value_count() const;
  std::vector<double> default_values() const;

  template <typename Descriptor>
  const Descriptor& descriptor() const {
    return *reinterpret_cast<const Descriptor*>(prefix_);
  }

 private:
  Plugin(std::shared_ptr<PluginLibrary> lib, const PluginPrefix* prefix, std::string name);
  std::shared_ptr<PluginLibrary> library_;
  const PluginPrefix* prefix_;
  std::string name_;
};

namespace plugin_detail {
// Shared by the instance factories: the value count a plugin's specs give,
// and a create() refusal as zerod::Error with the plugin's message.
void check_value_count(const Plugin& p, const std::vector<double>& values);
[[noreturn]] void refused(const Plugin& p, zd_status st, const char* err);
}  // namespace plugin_detail

// A configured plugin instance: owns the plugin's instance pointer and keeps
// the .so loaded while it lives.
class PluginInstance {
 public:
  PluginInstance(std::shared_ptr<const Plugin> plugin, void* instance, void (*destroy)(void*),
                 std::vector<double> values);
  virtual ~PluginInstance();
  PluginInstance(const PluginInstance&) = delete;
  PluginInstance& operator=(const PluginInstance&) = delete;

  const Plugin& plugin() const { return *plugin_; }
  const std::vector<double>& values() const { return values_; }
  // The value of a hyperparameter (its first element), or `fallback`.
  double value(const std::string& hparam, double fallback) const;

 protected:
  void* raw() const { return instance_; }

 private:
  std::shared_ptr<const Plugin> plugin_;
  void* instance_;
  void (*destroy_)(void*);
  std::vector<double> values_;
};

// An optimizer through the current table (zd_optimizer_v4): a plugin of an
// older ABI version is lifted to it by that version's adapter
// (optimizer_v1_adapter.cpp, optimizer_v2_adapter.cpp,
// optimizer_v3_adapter.cpp), so nothing in the engine asks which version a
// plugin is.
class OptimizerInstance : public PluginInstance {
 public:
  // Throws ZD_ERR_CONFIG (or the plugin's status) with the plugin's message.
  static std::unique_ptr<OptimizerInstance> create(const std::shared_ptr<const Plugin>& plugin,
                                                   const std::vector<double>& values);
  ~OptimizerInstance() override;
  uint32_t state_slots() const;
  std::string state_name(uint32_t slot) const;
  // Throws on a non-OK status from the plugin.
  void update(zd_isa isa, const zd_optimizer_update& u) const;
  // Whether the plugin has CUDA kernels, and the update on a CUDA stream
  // (every pointer of u in device memory).
  bool has_cuda() const;
  void update_cuda(const zd_optimizer_update& u, void* stream) const;
  // Whether the plugin keeps its state slots in `dtype` (zd_optimizer_v4;
  // an older plugin: fp32 alone).
  bool supports_state_dtype(zd_dtype dtype) const;
  // Why this configuration cannot keep its state in `dtype` (the job's
  // optimizer.state_dtype; the text does not name the key), or "" when it
  // can: a plugin that does not
  // support it, a compressing optimizer (its exchange, kept averages and
  // replay read and write the state as fp32). One without state slots (sgd
  // without momentum) has nothing to keep and is accepted.
  std::string state_dtype_refusal(zd_dtype dtype) const;

  // --- planned steps (zd_optimizer_v3) ---
  // Whether any step may exchange (a compressing optimizer: 1-bit Adam, 0/1
  // Adam, 1-bit LAMB); false for plain ones, whose every plan is "averaged
  // gradients, one pass".
  bool compresses() const { return compresses_; }
  // The plan of update `step` (1-based); warmup and sync are the job's
  // schedules' answers, -1 where it has none. Checked: a valid op list.
  zd_optimizer_plan plan(int64_t step, int warmup, int sync) const;
  void prepare(zd_isa isa, const zd_optimizer_update& u) const;
  uint32_t average_slot() const;
  uint32_t tensor_scalars() const { return tensor_scalars_; }
  uint32_t tensor_stats() const { return tensor_stats_; }
  zd_stat_op stat_op(uint32_t stat) const;
  void tensor_step(const zd_tensor_step& s) const;
  // Throws ZD_ERR_CONFIG with the plugin's reason when it cannot run with
  // these ZD_PARTITION_* bits.
  void check_partitions(uint32_t partitions) const;
  // Whether the plugin takes the job's compression schedules (ABI v3).
  bool takes_schedules() const { return plugin().header().abi_version >= 3; }

  // The plan of a plain step: averaged gradients, one pass with them.
  static zd_optimizer_plan plain_plan();
  static bool is_plain(const zd_optimizer_plan& p);

 private:
  using PluginInstance::PluginInstance;
  void bind();
  uint32_t state_slots_raw(const zd_optimizer_v2& d) const;
  zd_optimizer_v4 table_{};  // the plugin's own, or an adapter's
  const void* callee_ = nullptr;  // what table_'s functions get: the plugin's instance or the adapter's
  std::shared_ptr<void> adapted_;  // the adapter's instance, when there is one
  bool compresses_ = false;
  uint32_t tensor_scalars_ = 0, tensor_stats_ = 0;
};

class PartitionerInstance : public PluginInstance {
 public:
  static std::unique_ptr<PartitionerInstance> create(const std::shared_ptr<const Plugin>& plugin,
                                                     const std::vector<double>& values,
                                                     int world_size);
  uint32_t partitions() const;
  uint64_t shard_stride(uint64_t numel, uint64_t align) const;
  uint64_t persistence_threshold() const;
  uint64_t bucket_elements() const;
  uint64_t max_live_elements() const;
  uint64_t prefetch_elements() const;

 private:
  using PluginInstance::PluginInstance;
  const zd_partitioner_v1& d() const { return plugin().descriptor<zd_partitioner_v1>(); }
};

// Collectives through a comm plugin, through the current table
// (zd_comm_v3): a plugin of version 1 or 2 is lifted to it by its version's
// adapter (comm_v1_adapter.cpp, comm_v2_adapter.cpp) when the instance is
// made. Each call throws zerod::Error with the plugin's
// status and last_error() message when it fails.
class CommInstance : public PluginInstance {
 public:
  // This daemon serves ranks [first_local_rank, first_local_rank +
  // local_ranks) of world_size (-1: all of them). A plugin of ABI v1 serves
  // one daemon only.
  static std::unique_ptr<CommInstance> create(const std::shared_ptr<const Plugin>& plugin,
                                              const std::vector<double>& values, int world_size,
                                              int first_local_rank = 0, int local_ranks = -1);
  void all_reduce(const zd_comm_call& c, void* buf, uint64_t count, zd_comm_dtype dt,
                  zd_reduce_op op) const;
  void reduce_scatter(const zd_comm_call& c, const void* send, void* recv, uint64_t recv_count,
                      zd_comm_dtype dt, zd_reduce_op op) const;
  void all_gather(const zd_comm_call& c, const void* send, void* recv, uint64_t send_count,
                  zd_comm_dtype dt) const;
  void broadcast(const zd_comm_call& c, void* buf, uint64_t count, zd_comm_dtype dt,
                 int32_t root) const;
  void barrier(const zd_comm_call& c) const;
  void abort(zd_status status, const std::string& reason) const;
  uint64_t bytes_sent(int32_t rank) const;
  zd_comm_figures figures(int32_t rank) const;
  // Plugin ABI v2 only (ZD_ERR_NOT_IMPLEMENTED otherwise).
  bool has_compression() const;
  // ZD_COMM_MEMORY_* bits: where the collectives may find their buffers
  // (device_comm.h hands the pool's to a plugin that takes its device's).
  zd_comm_memory memory() const;
  void compressed_all_reduce(const zd_comm_call& c, float* buf, uint64_t count, float* worker_error,
                             float* server_error) const;
  // Every collective notes its arrival and completion there (who it waited
  // for; the timeline). Before the first collective; null: none.
  void observe_with(observe::CollectiveBoard* board) { board_ = board; }

 private:
  using PluginInstance::PluginInstance;
  // Runs one collective of c.rank between its arrival and completion notes.
  template <typename Fn>
  void observed(const zd_comm_call& c, const char* op, uint64_t bytes, Fn&& fn) const;
  observe::CollectiveBoard* board_ = nullptr;
  zd_comm_v3 table_{};             // the plugin's own, or an adapter's lift of an older one
  void* callee_ = nullptr;         // what table_'s functions get: the plugin's instance or the adapter's
  std::shared_ptr<void> adapted_;  // the adapter's instance, when there is one
  void check(zd_status st, const zd_comm_call& c) const;
};

// A tier (host RAM, NVMe) for one rank. Each call throws zerod::Error with
// the plugin's message when it fails.
class TierInstance : public PluginInstance {
 public:
  static std::unique_ptr<TierInstance> create(const std::shared_ptr<const Plugin>& plugin,
                                              const std::vector<double>& values,
                                              const zd_tier_config& config);
  uint32_t capabilities() const;
  bool addressable() const { return (capabilities() & ZD_TIER_CAP_ADDRESSABLE) != 0; }
  std::string describe() const;
  std::vector<int> cpus() const;
  void* allocate(uint64_t bytes, const std::string& what) const;
  void release(void* ptr, uint64_t bytes) const;
  uint64_t alignment() const;
  uint64_t reserve(uint64_t bytes, const std::string& what) const;
  uint64_t submit(const zd_tier_io* ios, uint32_t count) const;
  void wait(uint64_t ticket) const;

 private:
  using PluginInstance::PluginInstance;
  const zd_tier_v1& d() const { return plugin().descriptor<zd_tier_v1>(); }
};

}  // namespace zerod
