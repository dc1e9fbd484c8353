// A loaded, checked job script: the resolved JobConfig, the optimizer it
// names (loaded and configured), and the script's hooks, kept alive in their
// sandbox for the engine to call (lr(step) once per applied step).
#pragma once

#include "config_reader.h"
#include "sandbox.h"

#include "model/job_config.h"
#include "model/model.h"
#include "runtime/plugin_host.h"

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace zerod::scripting {

struct ScriptSource {
  std::string path;   // read from this file, or
  std::string text;   // use this text
  std::string name;   // the name errors use for text ("job.lua" if empty)
  // For text: the folder its relative paths (snapshot.path, offload
  // nvme_path, plugin_path) resolve against; "" = the working directory.
  // A daemon sets the trainer's (CreateModel.script_dir).
  std::string dir;
  bool allow_io = false;
  // A DeepSpeed JSON config (a path ending in .json, or text that is a JSON
  // object) is translated first (ds_config.h); its batch sizes may need the
  // job's rank count, when known; world_size_option says how the user
  // gives it where it is not (DsOptions).
  int world_size = 0;
  std::string world_size_option;
  // The daemons (nodes) the job spans, when known: a job of several that
  // names no comm.backend gets "mpi" (the one shipped backend that spans
  // daemons) instead of "local".
  int nodes = 1;
};

class JobScript final : public JobPolicy {
 public:
  // Loads and checks the script. Throws zerod::Error: ZD_ERR_IO when the file
  // cannot be read, ZD_ERR_CONFIG with every problem found (one per line,
  // each with file:line) otherwise.
  static std::unique_ptr<JobScript> load(const ScriptSource& source);
  ~JobScript() override;

  const JobConfig& config() const { return config_; }
  const std::string& source_name() const { return source_name_; }
  const Plugin& optimizer_plugin() const { return *optimizer_; }
  const Plugin& partitioner_plugin() const { return *partitioner_; }
  const Plugin& comm_plugin() const { return *comm_; }
  // The job's plugins, configured for a job of world_size ranks.
  // This daemon serves ranks [first_local_rank, first_local_rank +
  // local_ranks) of world_size (-1: all). comm, when given, stands in for
  // the job's comm plugin, which is then not created: `zerod plan` runs no
  // collectives and must not need what the job's backend needs (nccl: a GPU).
  ModelPlugins make_plugins(int world_size, int first_local_rank = 0, int local_ranks = -1,
                            std::unique_ptr<CommInstance> comm = nullptr) const;
  // A fresh comm instance alone (a restart replaces only the comm).
  std::unique_ptr<CommInstance> make_comm(int world_size, int first_local_rank = 0, int local_ranks = -1) const;
  // Every setting with its resolved value and where it came from.
  const std::vector<ResolvedValue>& resolved() const { return resolved_; }
  bool has_lr_schedule() const { return lr_ref_ != LUA_NOREF; }

  // JobPolicy. Throws ZD_ERR_CONFIG naming file:line when the hook fails.
  std::optional<double> lr(int64_t step) override;
  std::optional<zd_tier> placement(const TensorInfo& t) override;
  // compression.warmup(step) and compression.sync(step): true or false.
  std::optional<bool> warmup(int64_t step) override;
  std::optional<bool> sync(int64_t step) override;

 private:
  JobScript() = default;
  void read_config(ConfigReader& r, const std::string& script_dir);
  // zero.stage from what a partitioner named by zero.partitioner partitions.
  void read_partitioner_stage(ConfigReader& r);
  void read_offload(ConfigReader& r, const std::string& script_dir);
  void read_snapshot(ConfigReader& r, const std::string& script_dir);
  void read_observing(ConfigReader& r);
  // Reads the table the reader is in (or the defaults when !given) for a
  // plugin of `kind` named `name`: loads it, checks its hyperparameters
  // against its specs, and has it accept them once. name_key is the key
  // that named it, where errors about the plugin itself point.
  std::shared_ptr<Plugin> read_plugin(ConfigReader& r, zd_plugin_kind kind, const std::string& table,
                                      const std::string& name_key, bool given,
                                      const std::string& name, std::vector<double>* values);

  std::unique_ptr<Sandbox> sandbox_;
  std::mutex lua_mu_;  // the sandbox is called from every rank's thread
  std::string source_name_;
  JobConfig config_;
  std::shared_ptr<Plugin> optimizer_, partitioner_, comm_;
  int nodes_ = 1;  // ScriptSource::nodes
  std::shared_ptr<Plugin> host_tier_, nvme_tier_;  // when the job may offload
  std::vector<ResolvedValue> resolved_;
  // The status of a failed plugin load, reported as the load's status when
  // it is the script's only problem (ZD_ERR_VERSION says more than CONFIG).
  zd_status plugin_error_ = ZD_OK;
  int lr_ref_ = LUA_NOREF;
  std::string lr_where_;
  int placement_ref_ = LUA_NOREF;
  std::string placement_where_;
  int warmup_ref_ = LUA_NOREF, sync_ref_ = LUA_NOREF;
  std::string warmup_where_, sync_where_;
  std::optional<bool> schedule(int ref, const std::string& where, const char* name, int64_t step);
};

}  // namespace zerod::scripting
