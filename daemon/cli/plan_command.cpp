// `zerod plan job.lua --params 1.3e9`: what finalize would place on each
// tier for a model of that size, on every rank, against the job's budgets —
// computed by the engine's own layout and placement code (the job's
// placement() included) without allocating, so the plan is the real figure
// (job_plan.h).
//
//   zerod plan job.lua --params N [--layers L] [--nproc R] [--device D [--device-memory SIZE]]
//   zerod plan job.lua --model model.lua [--nproc R] [--device D [--device-memory SIZE]]
// model.lua returns a list of { name = "...", module = "...", shape = {..} }.
#include "commands.h"
#include "cli_args.h"
#include "job_plan.h"

#include "runtime/dtype.h"
#include "error.h"
#include "job_script.h"
#include "sandbox.h"
#include "size.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace zerod::cli {

namespace {

// The exit statuses, as the help text says. Every other zerod command
// exits 2 for a usage error and 1 for a job it refuses; here 1 is the
// answer "does not fit", so a job or model that cannot be planned is 3.
constexpr int kPlanFits = 0;
constexpr int kPlanDoesNotFit = 1;
constexpr int kPlanUsage = 2;
constexpr int kPlanCannotPlan = 3;

// On stdout when asked for (--help), else on stderr beside the error.
void usage(FILE* out = stderr) {
  std::fprintf(out,
               "usage: zerod plan <job.lua> (--params N [--layers L] | --model model.lua) [--nproc R]\n"
               "                  [--device cpu|cuda|auto|emulated] [--device-memory SIZE]\n"
               "  What finalize would place on each tier, on every rank (identical ranks together),\n"
               "  against the job's budgets.\n"
               "  --params N            a model of N parameters (1.3e9, 1.3B, 350M), in L equal layers (default 24)\n"
               "  --model FILE          a Lua file returning { { name=, module=, shape={...} }, ... }\n"
               "                        (instead of --params and --layers)\n"
               "  --nproc R             ranks the job runs on (default 1)\n"
               "  --device D            the device to plan for (default: the job's device); cuda plans for a\n"
               "                        GPU on a machine without one too\n"
               "  --device-memory SIZE  each rank's GPU's free memory (80GiB): the device budget a GPU takes\n"
               "                        when the job sets none (90%% of it)\n"
               "exit status: 0 fits the budgets, 1 does not fit, 2 usage error,\n"
               "             3 the job or model cannot be read or planned\n");
}

// t[name] without metamethods: a raw read cannot raise a Lua error, which
// here (outside any protected call) would abort the process.
void raw_field(lua_State* L, int table, const char* name) {
  table = lua_absindex(L, table);
  lua_pushstring(L, name);
  lua_rawget(L, table);
}

// A key of a model row, in words: 'dtype', [4], or its type.
std::string key_text(lua_State* L, int key) {
  if (lua_type(L, key) == LUA_TSTRING) return "'" + std::string(lua_tostring(L, key)) + "'";
  if (lua_isinteger(L, key)) return "[" + std::to_string(lua_tointeger(L, key)) + "]";
  return std::string("a ") + luaL_typename(L, key) + " key";
}

// Refuses a key of row #i (the table on top) other than name, module and
// shape: a misspelt or unsupported one (dtype = "f32") was silently
// ignored, and the plan was not of the model the user described.
void check_row_keys(lua_State* L, const std::string& path, int i) {
  const int row = lua_gettop(L);
  lua_pushnil(L);
  while (lua_next(L, row) != 0) {
    lua_pop(L, 1);  // the value; the key stays for lua_next
    const std::string key = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "";
    if (key != "name" && key != "module" && key != "shape") {
      raw_field(L, row, "name");
      const std::string which = lua_isstring(L, -1) ? " ('" + std::string(lua_tostring(L, -1)) + "')" : "";
      fail(ZD_ERR_CONFIG, path + ": tensor #" + std::to_string(i) + which + ": unknown key " + key_text(L, -2) +
                              "; a tensor has name, module and shape only");
    }
  }
}

std::vector<PlannedTensor> read_model(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail(ZD_ERR_IO, "cannot read the model description " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  scripting::Sandbox sb(scripting::SandboxLimits{});
  std::string err;
  if (!sb.load(ss.str(), "@" + path, &err) || !sb.call(0, 1, &err)) fail(ZD_ERR_CONFIG, err);
  lua_State* L = sb.L();
  if (!lua_istable(L, -1)) fail(ZD_ERR_CONFIG, path + ": must return a list of tensors");
  std::vector<PlannedTensor> out;
  const auto n = static_cast<int>(lua_rawlen(L, -1));
  // Finalize refuses a model without parameters; "0 parameters ... fits"
  // said otherwise.
  if (n == 0)
    fail(ZD_ERR_CONFIG, path + ": lists no tensors; it must return { { name=, module=, shape={...} }, ... }");
  for (int i = 1; i <= n; ++i) {
    lua_rawgeti(L, -1, i);
    if (!lua_istable(L, -1))
      fail(ZD_ERR_CONFIG, path + ": tensor #" + std::to_string(i) + " must be a table { name=, module=, shape={...} }, "
                              "got a " + luaL_typename(L, -1));
    check_row_keys(L, path, i);
    PlannedTensor t;
    raw_field(L, -1, "name");
    raw_field(L, -2, "module");
    if (!lua_isstring(L, -2) || !lua_isstring(L, -1))
      fail(ZD_ERR_CONFIG, path + ": tensor #" + std::to_string(i) + " needs a name and a module");
    t.name = lua_tostring(L, -2);
    t.module = lua_tostring(L, -1);
    lua_pop(L, 2);
    raw_field(L, -1, "shape");
    const auto dims = lua_istable(L, -1) ? static_cast<int>(lua_rawlen(L, -1)) : 0;
    for (int d = 1; d <= dims; ++d) {
      lua_rawgeti(L, -1, d);
      int isnum = 0;
      const lua_Integer extent = lua_tointegerx(L, -1, &isnum);
      if (!isnum || extent < 1)
        fail(ZD_ERR_CONFIG, path + ": tensor '" + t.name + "': shape[" + std::to_string(d) +
                                "] must be a positive whole number");
      t.shape.push_back(static_cast<int64_t>(extent));
      lua_pop(L, 1);
    }
    lua_pop(L, 2);
    if (t.shape.empty()) fail(ZD_ERR_CONFIG, path + ": tensor '" + t.name + "' needs a shape");
    out.push_back(t);
  }
  return out;
}

// A count as people write parameter counts: "1300000000", "1.3e9", "1.3B",
// "350M", "2.5k" (k/K, M, B/G, T). nullopt for anything else.
std::optional<double> parse_count(const char* v) {
  if (!v || !*v) return std::nullopt;
  char* end = nullptr;
  double x = std::strtod(v, &end);
  if (end == v) return std::nullopt;
  switch (*end) {
    case '\0': break;
    case 'k': case 'K': x *= 1e3; ++end; break;
    case 'M': x *= 1e6; ++end; break;
    case 'B': case 'G': x *= 1e9; ++end; break;
    case 'T': x *= 1e12; ++end; break;
    default: return std::nullopt;
  }
  if (*end != '\0' || !std::isfinite(x)) return std::nullopt;
  return x;
}

}  // namespace

int plan_command(int argc, char** argv) {
  std::string job, model_file;
  double params = 0;
  long layers = 24, nproc = 1;
  bool params_given = false, layers_given = false, nproc_given = false;
  PlanTarget target;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const auto bad = [&](const char* v, const char* what) {
      std::fprintf(stderr, "zerod plan: %s %s: %s\n", a.c_str(), v ? ("'" + std::string(v) + "'").c_str() : "needs a value",
                   what);
      return kPlanUsage;
    };
    if (a == "--params") {
      const char* v = next();
      const auto n = parse_count(v);
      if (!n || *n < 1) return bad(v, "a parameter count such as 1300000000, 1.3e9, 1.3B or 350M");
      params = *n;
      params_given = true;
    } else if (a == "--layers") {
      const char* v = next();
      const auto n = parse_whole(v);
      if (!n || *n < 1) return bad(v, "a layer count >= 1");
      layers = *n;
      layers_given = true;
    } else if (a == "--nproc") {
      const char* v = next();
      const auto n = parse_whole(v);
      if (!n || *n < 1 || *n > 4096) return bad(v, "a rank count from 1 to 4096");
      nproc = *n;
      nproc_given = true;
    } else if (a == "--model") {
      // A flag in its place is the next argument, not a file name.
      const char* v = next();
      if (!v || !*v || *v == '-') return bad(v, "a model description file (a Lua file)");
      model_file = v;
    } else if (a == "--device") {
      const char* v = next();
      const std::string d = v ? v : "";
      if (d != "cpu" && d != "cuda" && d != "auto" && d != "emulated")
        return bad(v, "the device to plan for: cpu, cuda, auto or emulated");
      target.device = d;
    } else if (a == "--device-memory") {
      const char* v = next();
      const auto n = v ? scripting::parse_size(v) : std::nullopt;
      if (!n || *n == 0) return bad(v, "a GPU's free memory, such as 80GiB or 141GB");
      target.device_memory = *n;
    } else if (a == "-h" || a == "--help") {
      usage(stdout);
      return 0;
    } else if (job.empty() && !a.empty() && a[0] != '-') {
      job = a;
    } else {
      std::fprintf(stderr, "zerod plan: unexpected argument '%s'\n", a.c_str());
      usage();
      return kPlanUsage;
    }
  }
  // --params and --layers describe a model of equal layers; a model
  // description names its tensors: one or the other, never both (the
  // count would be silently ignored).
  if (!model_file.empty() && (params_given || layers_given)) {
    std::fprintf(stderr, "zerod plan: --model %s describes the model tensor by tensor; %s%s%s describe%s another "
                         "model: give --model or --params, not both\n",
                 model_file.c_str(), params_given ? "--params" : "", params_given && layers_given ? " and " : "",
                 layers_given ? "--layers" : "", params_given && layers_given ? "" : "s");
    return kPlanUsage;
  }
  if (job.empty() || (!params_given && model_file.empty())) {
    // Why first: the usage alone left the user to find what was missing.
    if (job.empty())
      std::fprintf(stderr, "zerod plan: name the job script to plan\n");
    else
      std::fprintf(stderr, "zerod plan: which model? give --params N (a count such as 1.3B, in --layers equal "
                           "layers) or --model model.lua\n");
    usage();
    return kPlanUsage;
  }
  // Converted to int64 below, which a larger (or NaN) double would
  // overflow; every layer is a tensor held in memory.
  if (!(params <= 1e18) || layers > 1000000) {
    std::fprintf(stderr, "zerod plan: --params %g --layers %ld is more than zerod plans (at most 1e18 parameters "
                         "in 1e6 layers)\n", params, layers);
    return kPlanUsage;
  }
  if (model_file.empty() && params < static_cast<double>(layers)) {
    std::fprintf(stderr, "zerod plan: --params %g is fewer than one parameter for each of the %ld layers (a count "
                         "such as 1.3B or 1.3e9 means billions)\n", params, layers);
    return kPlanUsage;
  }
  try {
    scripting::ScriptSource src;
    src.path = job;
    // A DeepSpeed config's batch sizes may need the rank count; the default
    // of one rank is not the job's, so only a count given is passed.
    if (nproc_given) src.world_size = static_cast<int>(nproc);
    src.world_size_option = "--nproc R";
    auto script = scripting::JobScript::load(src);
    const std::string device = target.device.empty() ? script->config().device : target.device;
    if (target.device_memory != 0 && (device == "cpu" || device == "emulated")) {
      std::fprintf(stderr, "zerod plan: --device-memory is a GPU's memory, but the plan is for the %s device%s; add "
                           "--device cuda to plan for a GPU\n",
                   device.c_str(), target.device.empty() ? (" (" + job + ")").c_str() : "");
      return kPlanUsage;
    }
    const int world = static_cast<int>(nproc);
    std::vector<PlannedTensor> tensors;
    if (!model_file.empty()) {
      tensors = read_model(model_file);
    } else {
      const auto total = static_cast<int64_t>(params);
      for (long l = 0; l < layers; ++l) {
        const int64_t n = total / layers + (l == layers - 1 ? total % layers : 0);
        tensors.push_back({"layer" + std::to_string(l) + ".weight", "layer" + std::to_string(l), {n}});
      }
    }
    const JobPlan plan = plan_job(*script, world, tensors, target);
    const JobConfig& config = script->config();
    // The optimizer's state dtype only where it is not the fp32 default.
    const zd_dtype state = config.optimizer_state_dtype;
    const std::string state_text =
        state == ZD_DTYPE_F32 ? "" : std::string(" (state ") + precision_name(state) + ")";
    std::printf("%s: %llu parameters in %zu tensors, %d rank%s, ZeRO stage %d, %s%s, precision %s\n",
                job.c_str(), static_cast<unsigned long long>(plan.numel), tensors.size(), world,
                world == 1 ? "" : "s", config.zero_stage, config.optimizer.c_str(), state_text.c_str(),
                precision_name(config.precision));
    std::printf("device: %s\n", plan.device.c_str());
    for (const std::string& note : plan.device_notes) std::printf("  %s\n", note.c_str());
    // Ranks that need the same are printed once: a table per distinct need.
    for (const RankGroup& g : plan.groups) {
      const std::string table = Placement::table(g.plan, nullptr);
      std::printf("\n%s:\n%s", rank_list(g.ranks).c_str(), table.c_str());
    }
    if (!plan.worst_is_a_rank)
      std::printf("\nthe most any rank needs in each cell, which every rank's budgets must hold:\n%s",
                  Placement::table(plan.worst, nullptr).c_str());
    std::printf("\n%s\n", plan.fits ? "fits the budgets" : "does NOT fit the budgets (see <- over budget)");
    return plan.fits ? kPlanFits : kPlanDoesNotFit;
  } catch (const Error& e) {
    std::fprintf(stderr, "zerod plan: %s (%s)\n", e.what(), status_name(e.code()));
    return kPlanCannotPlan;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zerod plan: %s\n", e.what());
    return kPlanCannotPlan;
  }
}

}  // namespace zerod::cli
