// `zerod plan job.lua --params 1.3e9`: what finalize would place on each
// tier for a model of that size, per rank, against the job's budgets —
// computed by the engine's own layout and placement code (the job's
// placement() included) without allocating, so the plan is the real figure.
//
//   zerod plan job.lua --params N [--layers L] [--nproc R]
//   zerod plan job.lua --model model.lua [--nproc R]
// model.lua returns a list of { name = "...", module = "...", shape = {..} }.
#include "commands.h"
#include "cli_args.h"

#include "runtime/dtype.h"
#include "error.h"
#include "job_script.h"
#include "model/model.h"
#include "sandbox.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace zerod::cli {

namespace {

struct Tensor {
  std::string name, module;
  std::vector<int64_t> shape;
};

// On stdout when asked for (--help), else on stderr beside the error.
void usage(FILE* out = stderr) {
  std::fprintf(out,
               "usage: zerod plan <job.lua> (--params N [--layers L] | --model model.lua) [--nproc R]\n"
               "  --params N      a model of N parameters (1.3e9, 1.3B, 350M), in L equal layers (default 24)\n"
               "  --model FILE    a Lua file returning { { name=, module=, shape={...} }, ... }\n"
               "  --nproc R       ranks the job runs on (default 1)\n");
}

// t[name] without metamethods: a raw read cannot raise a Lua error, which
// here (outside any protected call) would abort the process.
void raw_field(lua_State* L, int table, const char* name) {
  table = lua_absindex(L, table);
  lua_pushstring(L, name);
  lua_rawget(L, table);
}

std::vector<Tensor> read_model(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail(ZD_ERR_IO, "cannot read the model description " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  scripting::Sandbox sb(scripting::SandboxLimits{});
  std::string err;
  if (!sb.load(ss.str(), "@" + path, &err) || !sb.call(0, 1, &err)) fail(ZD_ERR_CONFIG, err);
  lua_State* L = sb.L();
  if (!lua_istable(L, -1)) fail(ZD_ERR_CONFIG, path + ": must return a list of tensors");
  std::vector<Tensor> out;
  const auto n = static_cast<int>(lua_rawlen(L, -1));
  for (int i = 1; i <= n; ++i) {
    lua_rawgeti(L, -1, i);
    if (!lua_istable(L, -1))
      fail(ZD_ERR_CONFIG, path + ": tensor #" + std::to_string(i) + " must be a table { name=, module=, shape={...} }, "
                              "got a " + luaL_typename(L, -1));
    Tensor t;
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
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const auto bad = [&](const char* v, const char* what) {
      std::fprintf(stderr, "zerod plan: %s %s: %s\n", a.c_str(), v ? ("'" + std::string(v) + "'").c_str() : "needs a value",
                   what);
      return 2;
    };
    if (a == "--params") {
      const char* v = next();
      const auto n = parse_count(v);
      if (!n || *n < 1) return bad(v, "a parameter count such as 1300000000, 1.3e9, 1.3B or 350M");
      params = *n;
    } else if (a == "--layers") {
      const char* v = next();
      const auto n = parse_whole(v);
      if (!n || *n < 1) return bad(v, "a layer count >= 1");
      layers = *n;
    } else if (a == "--nproc") {
      const char* v = next();
      const auto n = parse_whole(v);
      if (!n || *n < 1 || *n > 4096) return bad(v, "a rank count from 1 to 4096");
      nproc = *n;
    } else if (a == "--model") {
      const char* v = next();
      model_file = v ? v : "";
    } else if (a == "-h" || a == "--help") {
      usage(stdout);
      return 0;
    } else if (job.empty() && !a.empty() && a[0] != '-') {
      job = a;
    } else {
      std::fprintf(stderr, "zerod plan: unexpected argument '%s'\n", a.c_str());
      usage();
      return 2;
    }
  }
  if (job.empty() || (params < 1 && model_file.empty()) || layers < 1 || nproc < 1 || nproc > 4096) {
    usage();
    return 2;
  }
  // Converted to int64 below, which a larger (or NaN) double would
  // overflow; every layer is a tensor held in memory.
  if (!(params <= 1e18) || layers > 1000000) {
    std::fprintf(stderr, "zerod plan: --params %g --layers %ld is more than zerod plans (at most 1e18 parameters "
                         "in 1e6 layers)\n", params, layers);
    return 2;
  }
  if (model_file.empty() && params < static_cast<double>(layers)) {
    std::fprintf(stderr, "zerod plan: --params %g is fewer than one parameter for each of the %ld layers (a count "
                         "such as 1.3B or 1.3e9 means billions)\n", params, layers);
    return 2;
  }
  try {
    scripting::ScriptSource src;
    src.path = job;
    auto script = scripting::JobScript::load(src);
    const int world = static_cast<int>(nproc);
    Model model(script->config(), script->make_plugins(world), script.get(), world);
    std::vector<Tensor> tensors;
    if (!model_file.empty()) {
      tensors = read_model(model_file);
    } else {
      const auto total = static_cast<int64_t>(params);
      for (long l = 0; l < layers; ++l) {
        const int64_t n = total / layers + (l == layers - 1 ? total % layers : 0);
        tensors.push_back({"layer" + std::to_string(l) + ".weight", "layer" + std::to_string(l), {n}});
      }
    }
    uint64_t numel = 0;
    for (const Tensor& t : tensors) {
      model.register_param(0, t.name, t.module, script->config().precision, t.shape, nullptr, 0);
      numel += model.registry().params().back().numel;
    }
    // The optimizer's state dtype only where it is not the fp32 default.
    const zd_dtype state = script->config().optimizer_state_dtype;
    const std::string state_text =
        state == ZD_DTYPE_F32 ? "" : std::string(" (state ") + precision_name(state) + ")";
    std::printf("%s: %llu parameters in %zu tensors, %d rank%s, ZeRO stage %d, %s%s, precision %s\n",
                job.c_str(), static_cast<unsigned long long>(numel), tensors.size(), world,
                world == 1 ? "" : "s", script->config().zero_stage, script->config().optimizer.c_str(),
                state_text.c_str(), precision_name(script->config().precision));
    bool all_fit = true;
    for (int r = 0; r < world; ++r) {
      if (r > 0 && r < world - 1) continue;  // ranks between the first and last hold the same
      bool fits = true;
      const std::string table = model.plan_table(model.plan(r), &fits);
      all_fit = all_fit && fits;
      std::printf("\nrank %d%s:\n%s", r, world > 2 && r == 0 ? " (and every rank but the last)" : "",
                  table.c_str());
    }
    std::printf("\n%s\n", all_fit ? "fits the budgets" : "does NOT fit the budgets (see <- over budget)");
    return all_fit ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "zerod plan: %s (%s)\n", e.what(), status_name(e.code()));
    return 1;
  }
}

}  // namespace zerod::cli
