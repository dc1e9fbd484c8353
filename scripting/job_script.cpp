#include "job_script.h"
#include "ds_config.h"
#include "job_schema.h"
#include "lua_protect.h"
#include "script_file.h"
#include "size.h"

#include "runtime/dtype.h"
#include "error.h"
#include "compression/momentum_compression.h"
#include "observe/listen_address.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <fstream>
#include <sstream>
#include <tuple>
#include <utility>

namespace zerod::scripting {

std::string read_script_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ZD_ERR_IO, "cannot read the job script " + path + ": " + errno_text(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

namespace {

// A string key's default as the schema writes it ("\"local\"") without the quotes.
std::string unquoted(std::string_view text) {
  if (text.size() >= 2 && text.front() == '"' && text.back() == '"') text = text.substr(1, text.size() - 2);
  return std::string(text);
}

std::string dir_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash == 0 ? 1 : slash);
}

}  // namespace

JobScript::~JobScript() {
  if (!sandbox_) return;
  for (int ref : {lr_ref_, placement_ref_, warmup_ref_, sync_ref_})
    if (ref != LUA_NOREF) luaL_unref(sandbox_->L(), LUA_REGISTRYINDEX, ref);
}

std::unique_ptr<JobScript> JobScript::load(const ScriptSource& source) {
  std::unique_ptr<JobScript> js(new JobScript());
  std::string text;
  if (!source.path.empty()) {
    text = read_script_file(source.path);
    js->source_name_ = source.path;
  } else {
    text = source.text;
    js->source_name_ = source.name.empty() ? "job.lua" : source.name;
  }
  const std::string script_dir = !source.path.empty() ? dir_of(source.path) : !source.dir.empty() ? source.dir : ".";
  // A DeepSpeed config becomes the Lua job it describes; problems in it are
  // reported at the config's lines.
  std::vector<int> json_line;
  if (source.path.ends_with(".json") || looks_like_json(text)) {
    DsOptions opt;
    opt.world_size = source.world_size;
    opt.world_size_option = source.world_size_option;
    DsTranslation t = translate_deepspeed(text, js->source_name_, opt);
    text = std::move(t.lua);
    json_line = std::move(t.json_line);
  }

  SandboxLimits limits;
  limits.allow_io = source.allow_io;
  js->sandbox_ = std::make_unique<Sandbox>(limits);
  lua_State* L = js->sandbox_->L();
  std::string err;
  if (!js->sandbox_->load(text, "@" + js->source_name_, &err)) fail(ZD_ERR_CONFIG, err);
  if (!js->sandbox_->call(0, 1, &err)) fail(ZD_ERR_CONFIG, err);

  SourceMap map(text);
  if (!lua_istable(L, -1)) {
    const int line = map.return_line();
    fail(ZD_ERR_CONFIG, js->source_name_ + (line ? ":" + std::to_string(line) : std::string()) +
                            ": a job script must return a table of settings, it returned " +
                            (lua_isnone(L, -1) ? std::string("nothing") : luaL_typename(L, -1)));
  }
  ConfigReader r(L, lua_gettop(L), &map, js->source_name_);
  js->config_.source = js->source_name_;
  js->nodes_ = source.nodes;
  js->read_config(r, script_dir);
  r.finish();
  if (!json_line.empty()) r.remap_lines(json_line);
  lua_settop(L, 0);
  if (!r.issues().empty()) {
    const bool only_plugin = r.issues().size() == 1 && js->plugin_error_ != ZD_OK;
    fail(only_plugin ? js->plugin_error_ : ZD_ERR_CONFIG, r.report());
  }
  js->resolved_ = r.resolved();
  // A setting's line is the config's too (zerod check prints it); one the
  // translation wrote from no key of the config (DeepSpeed's default
  // gradient_clipping) is a default.
  if (!json_line.empty())
    for (ResolvedValue& v : js->resolved_)
      v.line = v.line > 0 && static_cast<size_t>(v.line) < json_line.size()
                   ? json_line[static_cast<size_t>(v.line)]
                   : 0;
  return js;
}

void JobScript::read_config(ConfigReader& r, const std::string& script_dir) {
  JobConfig& c = config_;
  // The plugin path first: the optimizer plugin is looked up on it.
  for (std::string d : r.strings("plugin_path")) {
    if (d.empty() || d[0] != '/') d = script_dir + "/" + d;
    c.plugin_path.push_back(d);
  }

  c.device = r.choice(job_key("device"));
  const std::string precision = r.choice(job_key("precision"));
  c.precision = dtype_from_name(precision);
  const std::string accum = r.choice(job_key("grad_accum_dtype"));
  c.grad_accum_dtype = accum == "fp32" ? ZD_DTYPE_F32 : 0;
  c.gradient_accumulation_steps = r.integer(job_key("gradient_accumulation_steps"));
  c.gradient_clipping = r.number(job_key("gradient_clipping"));
  c.threads = static_cast<uint32_t>(r.integer(job_key("threads")));

  // fp16 loss scaling (DeepSpeed's keys and defaults).
  c.loss_scale.enabled = c.precision == ZD_DTYPE_F16;
  const bool fp16_given = r.present("fp16");
  if (fp16_given && c.precision != ZD_DTYPE_F16)
    r.issue("fp16", "loss-scaling settings are given but precision is \"" + precision +
                        "\"; set precision = \"fp16\" or remove them");
  if (r.enter("fp16")) {
    c.loss_scale.static_scale = r.number(job_key("fp16.loss_scale"));
    c.loss_scale.initial_scale_power = static_cast<int>(r.integer(job_key("fp16.initial_scale_power")));
    c.loss_scale.window = r.integer(job_key("fp16.loss_scale_window"));
    c.loss_scale.deepspeed_window = r.choice(job_key("fp16.window_rule")) == "deepspeed";
    c.loss_scale.hysteresis = static_cast<int>(r.integer(job_key("fp16.hysteresis")));
    c.loss_scale.consecutive_hysteresis = r.boolean(job_key("fp16.consecutive_hysteresis"));
    c.loss_scale.min_scale = r.number(job_key("fp16.min_loss_scale"));
    c.loss_scale.raise_error_at_min_scale = r.boolean(job_key("fp16.raise_error_at_min_scale"));
    r.leave();
  }

  // ZeRO: the stage names a partitioner plugin; the rest of the table is
  // that plugin's hyperparameters.
  {
    const bool given = r.enter("zero");
    std::string name = "stage0";
    bool named = false;
    if (given) {
      const bool stage_given = r.present("stage");
      const auto custom = r.string("partitioner", false);
      named = custom && !stage_given;
      if (custom && stage_given) r.issue("partitioner", "give zero.stage or zero.partitioner, not both");
      if (!named) {
        c.zero_stage = static_cast<int>(r.integer(job_key("zero.stage")));
        name = "stage" + std::to_string(c.zero_stage);
      }
      if (custom) name = *custom;
    } else {
      r.note("zero.stage", job_key("zero.stage").default_text(), false);
    }
    partitioner_ = read_plugin(r, ZD_PLUGIN_PARTITIONER, "zero", given ? "stage" : "", given, name,
                               &c.partitioner_values);
    c.partitioner = name;
    if (named) read_partitioner_stage(r);
    if (given) r.leave();
  }

  // Collectives: the backend names a comm plugin.
  {
    const bool given = r.enter("comm");
    // Unnamed, the backend that spans what the job spans: a job's script
    // need not change when its ranks move to several nodes.
    std::string name = nodes_ > 1 ? "mpi" : unquoted(job_key("comm.backend").def_text);
    bool named = false;
    if (given) {
      if (auto b = r.string("backend", false)) name = *b, named = true;
      c.comm_timeout_s = r.number(job_key("comm.timeout"));
    } else {
      r.note("comm.timeout", job_key("comm.timeout").default_text(), false);
    }
    if (!named)
      r.note("comm.backend",
             nodes_ > 1 ? "\"mpi\" (the job spans " + std::to_string(nodes_) + " daemons)"
                        : job_key("comm.backend").default_text(),
             false);
    comm_ = read_plugin(r, ZD_PLUGIN_COMM, "comm", "backend", given, name, &c.comm_values);
    c.comm = name;
    if (given) r.leave();
  }

  if (r.enter("daemon")) {
    c.keep_state_on_disconnect = r.boolean(job_key("daemon.keep_state"));
    r.leave();
  } else {
    r.note("daemon.keep_state", job_key("daemon.keep_state").default_text(), false);
  }

  if (r.enter("budgets")) {
    if (auto b = r.size("device")) c.device_budget = *b;
    if (auto b = r.size("host")) c.host_budget = *b;
    if (auto b = r.size("nvme")) c.nvme_budget = *b;
    r.leave();
  } else {
    for (const char* t : {"device", "host", "nvme"}) r.note(std::string("budgets.") + t, "none", false);
  }
  read_offload(r, script_dir);
  read_snapshot(r, script_dir);

  {
    const bool given = r.enter("optimizer");
    std::string name = unquoted(job_key("optimizer.type").def_text);
    if (given) {
      if (auto t = r.string("type", false)) name = *t;
      else r.note("type", job_key("optimizer.type").default_text(), false);
      // An engine key beside `type`; the rest of the table is the plugin's.
      c.optimizer_state_dtype = dtype_from_name(r.choice(job_key("optimizer.state_dtype")));
    } else {
      r.note("optimizer.type", job_key("optimizer.type").default_text(), false);
      r.note("optimizer.state_dtype", job_key("optimizer.state_dtype").default_text(), false);
    }
    optimizer_ = read_plugin(r, ZD_PLUGIN_OPTIMIZER, "optimizer", "type", given, name,
                             &c.optimizer_values);
    c.optimizer = name;
    if (given) r.leave();
  }
  // A compressing optimizer's schedules: Lua functions of the step, like lr.
  if (r.enter("compression")) {
    warmup_ref_ = r.function("warmup", &warmup_where_);
    sync_ref_ = r.function("sync", &sync_where_);
    c.compression_replay = r.boolean(job_key("compression.replay"));
    if ((warmup_ref_ != LUA_NOREF || sync_ref_ != LUA_NOREF) && optimizer_ &&
        optimizer_->header().abi_version < 3)
      r.issue("", "optimizer '" + c.optimizer + "' (plugin ABI version " +
                      std::to_string(optimizer_->header().abi_version) +
                      ") has a fixed schedule and takes no compression schedules; they need version 3");
    r.leave();
  } else {
    r.note("compression.warmup", "the optimizer's own schedule (no function)", false);
    r.note("compression.sync", "the optimizer's own schedule (no function)", false);
    r.note("compression.replay", "false", false);
  }
  // An optimizer that cannot run at the job's stage says why now.
  if (optimizer_ && partitioner_ && r.issues().empty()) {
    const auto opt = OptimizerInstance::create(optimizer_, c.optimizer_values);
    const auto part = PartitionerInstance::create(partitioner_, c.partitioner_values, 1);
    try {
      opt->check_partitions(part->partitions());
    } catch (const Error& e) {
      r.issue("zero", e.what());
    }
    if (c.compression_replay) {
      const std::string why = compression_replay_refusal(*opt, part->partitions(), c.precision);
      if (!why.empty()) r.issue("compression.replay", why);
    }
    // A plugin of ABI v3 or later takes schedules, but one that never
    // compresses has nothing to schedule: they would do nothing, silently.
    if (!opt->compresses() && opt->takes_schedules())
      for (auto [key, ref] : {std::pair{"compression.warmup", warmup_ref_}, std::pair{"compression.sync", sync_ref_}})
        if (ref != LUA_NOREF)
          r.issue(key, "optimizer '" + c.optimizer + "' never compresses; nothing to schedule");
    if (const std::string why = opt->state_dtype_refusal(c.optimizer_state_dtype); !why.empty())
      r.issue("optimizer.state_dtype", why);
  }
  read_observing(r);
  lr_ref_ = r.function("lr", &lr_where_, "describe");
  if (lr_ref_ == LUA_NOREF) r.note("lr", "the optimizer's lr (no schedule)", false);
  placement_ref_ = r.function("placement", &placement_where_);
  if (placement_ref_ == LUA_NOREF) r.note("placement", "the offload table's tiers (no function)", false);
}

std::shared_ptr<Plugin> JobScript::read_plugin(ConfigReader& r, zd_plugin_kind kind,
                                               const std::string& table, const std::string& name_key,
                                               bool given, const std::string& name,
                                               std::vector<double>* values) {
  const auto search = plugin_search_path(config_.plugin_path);
  const std::string kind_name = plugin_kind_name(kind);
  std::shared_ptr<Plugin> plugin;
  try {
    plugin = Plugin::load(kind, name, search);
  } catch (const Error& e) {
    std::string msg = e.what();
    if (e.code() == ZD_ERR_NOT_FOUND) {
      std::string list;
      for (const auto& n : available_plugins(kind, search)) list += (list.empty() ? "" : ", ") + n;
      msg = "no " + kind_name + " plugin named '" + name + "'" +
            (list.empty() ? " (no " + kind_name + " plugins were found; is ZEROD_PLUGIN_PATH right?)"
                          : " (available: " + list + ")");
      plugin_error_ = ZD_ERR_CONFIG;
    } else if (plugin_error_ == ZD_OK) {
      plugin_error_ = e.code();
    }
    if (given) {
      r.issue(name_key, msg);
      r.accept_all();
    } else {
      r.issue(table, msg);
    }
    return nullptr;
  }
  values->clear();
  for (const zd_hparam_spec& s : plugin->hparams()) {
    std::vector<double> defs(s.defaults, s.defaults + s.count);
    NumberRange range;
    range.min = s.min;
    range.max = s.max;
    range.min_exclusive = s.flags & ZD_HPARAM_MIN_EXCLUSIVE;
    range.max_exclusive = s.flags & ZD_HPARAM_MAX_EXCLUSIVE;
    range.integer = s.type == ZD_HPARAM_INTEGER;
    std::vector<double> v;
    if (given) {
      v = r.numbers(s.name, s.count, defs, range, s.type == ZD_HPARAM_BOOL);
    } else {
      v = defs;
      std::string text;
      for (size_t i = 0; i < v.size(); ++i)
        text += (i ? ", " : "") + (s.type == ZD_HPARAM_BOOL ? std::string(v[i] != 0 ? "true" : "false")
                                                            : format_number(v[i]));
      r.note(table + "." + s.name, s.count > 1 ? "{" + text + "}" : text, false);
    }
    values->insert(values->end(), v.begin(), v.end());
  }
  if (r.issues().empty()) {
    // The plugin accepts the values once now, so a refused combination is
    // reported here with the script's line rather than when training starts.
    try {
      switch (kind) {
        case ZD_PLUGIN_TIER: break;  // a tier needs a rank's paths; it is checked at finalize
        case ZD_PLUGIN_OPTIMIZER: OptimizerInstance::create(plugin, *values); break;
        case ZD_PLUGIN_PARTITIONER: PartitionerInstance::create(plugin, *values, 1); break;
        // A comm plugin of ABI v2 may span nodes (MPI): an instance takes the
        // whole job's rank layout and is a collective of its own, so it is
        // made only with the model.
        case ZD_PLUGIN_COMM:
          if (plugin->header().abi_version < 2) CommInstance::create(plugin, *values, 1);
          break;
        default: break;
      }
    } catch (const Error& e) {  // a refused hyperparameter: a config error
      r.issue(given ? "" : table, e.what());
    }
  }
  return plugin;
}

namespace {

// The ZeRO stage whose ZD_PARTITION_* bits these are; nullopt for bits no
// stage has.
std::optional<int> stage_of(uint32_t partitions) {
  constexpr uint32_t kStageBits[] = {0, ZD_PARTITION_OPTIMIZER, ZD_PARTITION_OPTIMIZER | ZD_PARTITION_GRADS,
                                     ZD_PARTITION_OPTIMIZER | ZD_PARTITION_GRADS | ZD_PARTITION_PARAMS};
  for (int stage = 0; stage <= 3; ++stage)
    if (partitions == kStageBits[stage]) return stage;
  return std::nullopt;
}

}  // namespace

// zero = { partitioner = "stage3" } is stage 3 to everything that reads the
// stage (offload.params, checkpoint manifests, status, zerod plan): it is
// what the partitioner partitions.
void JobScript::read_partitioner_stage(ConfigReader& r) {
  if (!partitioner_) return;  // read_plugin said why
  uint32_t partitions = 0;
  try {
    partitions = PartitionerInstance::create(partitioner_, config_.partitioner_values, 1)->partitions();
  } catch (const Error&) {
    return;  // refused values: read_plugin reported them, or another issue fails the load
  }
  const std::optional<int> stage = stage_of(partitions);
  if (!stage) {
    // The engine refuses it when it makes the model (Model's constructor); said here with the line.
    r.issue("partitioner", "partitioner '" + config_.partitioner +
                               "' partitions parameters or gradients without what comes before them (optimizer "
                               "state, then gradients); zerod cannot run that");
    return;
  }
  config_.zero_stage = *stage;
  r.note("stage", std::to_string(*stage), true);
}

namespace {

zd_tier tier_from(const std::string& name) {
  return name == "host" ? ZD_TIER_HOST : name == "nvme" ? ZD_TIER_NVME : ZD_TIER_DEVICE;
}

}  // namespace

// offload = { optimizer = "host", params = "device", ratio = 1, nvme_path = ...,
//             host = { <host tier hparams> }, nvme = { <nvme tier hparams> },
//             buffer_count = 4, tile_size = "4MiB", overlap = true, accumulate = "auto" }
void JobScript::read_offload(ConfigReader& r, const std::string& script_dir) {
  OffloadConfig& o = config_.offload;
  const bool given = r.enter("offload");
  // The tier plugins are loaded when the job may use them: checked now,
  // instantiated per rank at finalize. `placement` is a key of the job table.
  const bool may_offload = given || r.present("placement");
  // With no table its keys are read from an empty one, so that zerod check
  // lists their defaults as it lists the budgets' (docs/offload.md).
  if (!given) r.enter_absent("offload");
  o.optimizer = tier_from(r.choice(job_key("offload.optimizer")));
  o.params = tier_from(r.choice(job_key("offload.params")));
  o.ratio = r.number(job_key("offload.ratio"));
  for (std::string d : r.strings("nvme_path")) {
    if (d.empty() || d[0] != '/') d = script_dir + "/" + d;
    o.nvme_paths.push_back(d);
  }
  o.buffer_count = static_cast<int>(r.integer(job_key("offload.buffer_count")));
  o.overlap = r.boolean(job_key("offload.overlap"));
  const std::string acc = r.choice(job_key("offload.accumulate"));
  o.accumulate = acc == "device" ? OffloadConfig::Accumulate::Device
                 : acc == "host" ? OffloadConfig::Accumulate::Host
                                 : OffloadConfig::Accumulate::Auto;
  const uint64_t default_tile_bytes = parse_size(std::string(job_key("offload.tile_size").def_text)).value();
  const auto tile = r.size("tile_size", std::to_string(default_tile_bytes));
  const uint64_t tile_bytes = tile ? *tile : default_tile_bytes;
  // Whole granules of 2048 elements (8 KiB of fp32), so transfers stay aligned.
  o.nvme_tile_elems = std::max<uint64_t>(2048, tile_bytes / 4 / 2048 * 2048);
  if (o.params != ZD_TIER_DEVICE && config_.zero_stage != 3)
    r.issue("params", "parameters can leave the device tier only at ZeRO stage 3 (zero = { stage = 3 }); "
                      "trainers compute with the working copies in place below it");
  if ((o.optimizer == ZD_TIER_NVME || o.params == ZD_TIER_NVME) && o.nvme_paths.empty())
    r.issue("nvme_path", "is required when state is placed on nvme: the directories to keep it in");
  for (auto [name, target, values] : {std::tuple{"host", &host_tier_, &o.host_values},
                                      std::tuple{"nvme", &nvme_tier_, &o.nvme_values}}) {
    const bool table = given && r.enter(name);
    if (may_offload) *target = read_plugin(r, ZD_PLUGIN_TIER, name, "", table, name, values);
    if (table) r.leave();
  }
  r.leave();
}

void JobScript::read_snapshot(ConfigReader& r, const std::string& script_dir) {
  SnapshotConfig& s = config_.snapshot;
  if (!r.enter("snapshot")) {
    r.note("snapshot", "none (the trainer's own checkpoints only)", false);
    return;
  }
  if (auto p = r.string("path", true)) {
    // Empty, it would turn the snapshots off (SnapshotConfig::enabled).
    if (p->empty()) r.issue("path", "is empty; name the directory the snapshots are kept in");
    s.path = *p;
    if (!s.path.empty() && s.path[0] != '/') s.path = script_dir + "/" + s.path;
  }
  s.every = r.integer(job_key("snapshot.every"));
  s.keep = static_cast<int>(r.integer(job_key("snapshot.keep")));
  s.resume = r.boolean(job_key("snapshot.resume"));
  r.leave();
}

// trace = { path = "trace.json", steps = {2, 6}, events_per_thread = 65536 }
// metrics = { listen = "127.0.0.1:9400" }            (docs/observability.md)
void JobScript::read_observing(ConfigReader& r) {
  TraceConfig& t = config_.trace;
  if (r.enter("trace")) {
    if (auto p = r.string("path", true)) {
      if (p->empty()) r.issue("path", "is empty; name the file the trace is written to");
      t.path = *p;
    }
    NumberRange step;
    step.min = 1;
    step.max = 1e15;
    step.integer = true;
    const auto steps = r.numbers("steps", 2, {2, 6}, step, false);
    t.from_step = static_cast<int64_t>(steps[0]);
    t.to_step = static_cast<int64_t>(steps[1]);
    if (t.from_step > t.to_step)
      r.issue("steps", "must be {from, to} with from <= to, got {" + std::to_string(t.from_step) + ", " +
                           std::to_string(t.to_step) + "}");
    t.events_per_thread = static_cast<uint64_t>(r.integer("events_per_thread", 65536, 1024, int64_t{1} << 26));
    r.leave();
  } else {
    r.note("trace", "off", false);
  }
  if (r.enter("metrics")) {
    if (auto l = r.string("listen", true)) {
      std::string why;
      if (!observe::parse_listen_address(*l, &why)) r.issue("listen", "\"" + *l + "\": " + why);
      config_.metrics.listen = *l;
    }
    r.leave();
  } else {
    r.note("metrics", "off", false);
  }
}

ModelPlugins JobScript::make_plugins(int world_size, int first_local_rank, int local_ranks,
                                     std::unique_ptr<CommInstance> comm) const {
  ModelPlugins p;
  p.optimizer = OptimizerInstance::create(optimizer_, config_.optimizer_values);
  p.partitioner = PartitionerInstance::create(partitioner_, config_.partitioner_values, world_size);
  p.comm = comm ? std::move(comm) : make_comm(world_size, first_local_rank, local_ranks);
  p.host_tier = host_tier_;
  p.nvme_tier = nvme_tier_;
  return p;
}

std::unique_ptr<CommInstance> JobScript::make_comm(int world_size, int first_local_rank, int local_ranks) const {
  return CommInstance::create(comm_, config_.comm_values, world_size, first_local_rank, local_ranks);
}

std::optional<zd_tier> JobScript::placement(const TensorInfo& t) {
  if (placement_ref_ == LUA_NOREF) return std::nullopt;
  std::lock_guard<std::mutex> lock(lua_mu_);
  lua_State* L = sandbox_->L();
  lua_rawgeti(L, LUA_REGISTRYINDEX, placement_ref_);
  // The argument table is made in the script's capped state: protected, so
  // a state at its memory cap is an error, not an abort (lua_protect.h).
  std::string err;
  if (protected_call(L, 0, 1, [&t](lua_State* S) {
        lua_createtable(S, 0, 5);
        lua_pushstring(S, t.name.c_str());
        lua_setfield(S, -2, "name");
        lua_pushstring(S, t.kind.c_str());
        lua_setfield(S, -2, "kind");
        lua_pushstring(S, t.module.c_str());
        lua_setfield(S, -2, "module");
        lua_pushinteger(S, static_cast<lua_Integer>(t.numel));
        lua_setfield(S, -2, "numel");
        lua_pushinteger(S, static_cast<lua_Integer>(t.bytes));
        lua_setfield(S, -2, "bytes");
        return 1;
      }, &err) != LUA_OK) {
    lua_pop(L, 1);  // the function
    fail(ZD_ERR_CONFIG, "the job's placement() failed for " + t.kind + " of '" + t.name + "': " + err);
  }
  if (!sandbox_->call(1, 1, &err))
    fail(ZD_ERR_CONFIG, "the job's placement() failed for " + t.kind + " of '" + t.name + "': " + err);
  const int type = lua_type(L, -1);
  std::string tier = type == LUA_TSTRING ? lua_tostring(L, -1) : "";
  lua_pop(L, 1);
  if (type == LUA_TNIL) return std::nullopt;
  if (tier != "device" && tier != "host" && tier != "nvme")
    fail(ZD_ERR_CONFIG, placement_where_ + ": placement() returned " +
                            (type == LUA_TSTRING ? "\"" + tier + "\"" : std::string("a ") + lua_typename(L, type)) +
                            " for " + t.kind + " of '" + t.name +
                            "'; it must return \"device\", \"host\", \"nvme\" or nil");
  return tier_from(tier);
}

std::optional<double> JobScript::lr(int64_t step) {
  if (lr_ref_ == LUA_NOREF) return std::nullopt;
  std::lock_guard<std::mutex> lock(lua_mu_);
  lua_State* L = sandbox_->L();
  lua_rawgeti(L, LUA_REGISTRYINDEX, lr_ref_);
  lua_pushinteger(L, step);
  std::string err;
  if (!sandbox_->call(1, 1, &err))
    fail(ZD_ERR_CONFIG, "the job's lr(" + std::to_string(step) + ") failed: " + err);
  if (lua_type(L, -1) != LUA_TNUMBER) {
    const std::string got = luaL_typename(L, -1);
    lua_pop(L, 1);
    fail(ZD_ERR_CONFIG, lr_where_ + ": lr(" + std::to_string(step) + ") returned a " + got +
                            "; it must return a number");
  }
  const double v = lua_tonumber(L, -1);
  lua_pop(L, 1);
  if (!std::isfinite(v) || v < 0)
    fail(ZD_ERR_CONFIG, lr_where_ + ": lr(" + std::to_string(step) + ") returned " +
                            format_number(v) + "; a learning rate must be finite and >= 0");
  return v;
}

std::optional<bool> JobScript::schedule(int ref, const std::string& where, const char* name, int64_t step) {
  if (ref == LUA_NOREF) return std::nullopt;
  std::lock_guard<std::mutex> lock(lua_mu_);
  lua_State* L = sandbox_->L();
  lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
  lua_pushinteger(L, step);
  std::string err;
  if (!sandbox_->call(1, 1, &err))
    fail(ZD_ERR_CONFIG, std::string("the job's compression.") + name + "(" + std::to_string(step) + ") failed: " + err);
  if (lua_type(L, -1) != LUA_TBOOLEAN) {
    const std::string got = luaL_typename(L, -1);
    lua_pop(L, 1);
    fail(ZD_ERR_CONFIG, where + ": compression." + name + "(" + std::to_string(step) + ") returned a " + got +
                            "; it must return true or false");
  }
  const bool v = lua_toboolean(L, -1) != 0;
  lua_pop(L, 1);
  return v;
}

std::optional<bool> JobScript::warmup(int64_t step) { return schedule(warmup_ref_, warmup_where_, "warmup", step); }
std::optional<bool> JobScript::sync(int64_t step) { return schedule(sync_ref_, sync_where_, "sync", step); }

}  // namespace zerod::scripting
