// `zerod check job.lua`: loads the job script exactly as a trainer would,
// reports every problem (file:line), or prints every resolved setting with
// where its value came from, and what the optimizer and schedule will do.
#include "commands.h"
#include "cli_args.h"

#include "config_reader.h"
#include "error.h"
#include "job_schema.h"
#include "job_script.h"
#include "runtime/plugin_host.h"

#include <zerod/zerod_plugin.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace zerod::cli {

namespace {

// On stdout when asked for (--help), else on stderr beside the error.
void usage(FILE* out = stderr) {
  std::fprintf(out,
               "usage: zerod check <job.lua | ds_config.json> [--allow-io] [--lr-steps N] [--world-size N]\n"
               "       zerod check --schema\n"
               "  Loads and checks a job script (or a DeepSpeed config); prints every resolved setting.\n"
               "  --allow-io      let the script use Lua's io library\n"
               "  --lr-steps N    print the learning rate for the first N steps (default 5)\n"
               "  --world-size N  the job's ranks (a DeepSpeed config's batch sizes may need them)\n"
               "  --schema        the job-script keys and the shipped plugins' hyperparameters (Markdown)\n");
}

std::string range_text(const zd_hparam_spec& s) {
  if (s.type == ZD_HPARAM_BOOL) return "boolean";
  const std::string word = s.type == ZD_HPARAM_INTEGER ? "integer" : "number";
  const bool top = std::isfinite(s.max) && s.max < 1e15;
  std::string lo = (s.flags & ZD_HPARAM_MIN_EXCLUSIVE) ? " > " : " ≥ ";
  std::string out = word + lo + scripting::format_number(s.min);
  if (top) out += (s.flags & ZD_HPARAM_MAX_EXCLUSIVE) ? ", < " : ", ≤ ";
  if (top) out += scripting::format_number(s.max);
  return s.count > 1 ? "list of " + std::to_string(s.count) + ", each " + out : out;
}

// The hyperparameters of the plugins zerod ships, from their own specs.
// The optional ones (built only where their library is: Open MPI, NCCL) are
// listed where this build has them; tests/docs_schema.sh holds the docs to
// the rows of the plugins a build has.
int print_plugin_schema() {
  static const struct {
    zd_plugin_kind kind;
    const char* table;
    const char* name;
    bool optional = false;
  } shipped[] = {{ZD_PLUGIN_OPTIMIZER, "optimizer", "adamw"}, {ZD_PLUGIN_OPTIMIZER, "optimizer", "adam"},
                 {ZD_PLUGIN_OPTIMIZER, "optimizer", "sgd"},   {ZD_PLUGIN_OPTIMIZER, "optimizer", "onebit_adam"},
                 {ZD_PLUGIN_OPTIMIZER, "optimizer", "zero_one_adam"},
                 {ZD_PLUGIN_OPTIMIZER, "optimizer", "onebit_lamb"},
                 {ZD_PLUGIN_PARTITIONER, "zero", "stage3"},   {ZD_PLUGIN_COMM, "comm", "local"},
                 {ZD_PLUGIN_COMM, "comm", "mpi", true},      {ZD_PLUGIN_COMM, "comm", "nccl", true},
                 {ZD_PLUGIN_TIER, "offload.host", "host"},    {ZD_PLUGIN_TIER, "offload.nvme", "nvme"}};
  std::printf("\n| plugin | key | type | default | meaning |\n|---|---|---|---|---|\n");
  for (const auto& p : shipped) {
    std::shared_ptr<Plugin> plugin;
    try {
      plugin = Plugin::load(p.kind, p.name, plugin_search_path({}));
    } catch (const Error& e) {
      if (p.optional && e.code() == ZD_ERR_NOT_FOUND) continue;  // not built here
      std::fprintf(stderr, "zerod check --schema: %s\n", e.what());
      return 1;
    }
    for (const zd_hparam_spec& s : plugin->hparams()) {
      std::string def;
      for (int32_t i = 0; i < s.count; ++i)
        def += (i ? ", " : "") + (s.type == ZD_HPARAM_BOOL ? std::string(s.defaults[i] != 0 ? "true" : "false")
                                                           : scripting::format_number(s.defaults[i]));
      if (s.count > 1) def = "{" + def + "}";
      std::printf("| `%s` (%s) | `%s.%s` | %s | `%s` | %s |\n", p.name, plugin_kind_name(p.kind), p.table, s.name,
                  range_text(s).c_str(), def.c_str(), s.help ? s.help : "");
    }
  }
  return 0;
}

}  // namespace

int check_command(int argc, char** argv) {
  scripting::ScriptSource src;
  src.world_size_option = "--world-size N";
  long lr_steps = 5;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--allow-io") {
      src.allow_io = true;
    } else if (a == "--lr-steps" && i + 1 < argc) {
      const auto v = parse_whole(argv[++i]);
      if (!v || *v < 0 || *v > 1000000) {
        std::fprintf(stderr, "zerod check: --lr-steps '%s': a step count from 0 to 1000000\n", argv[i]);
        return 2;
      }
      lr_steps = *v;
    } else if (a == "--world-size" && i + 1 < argc) {
      const auto v = parse_whole(argv[++i]);
      if (!v || *v < 1 || *v > (1L << 20)) {
        std::fprintf(stderr, "zerod check: --world-size '%s': a rank count from 1 to 1048576\n", argv[i]);
        return 2;
      }
      src.world_size = static_cast<int>(*v);
    } else if (a == "--schema") {
      std::fputs(scripting::job_schema_markdown().c_str(), stdout);
      return print_plugin_schema();
    } else if (a == "-h" || a == "--help") {
      usage(stdout);
      return 0;
    } else if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr, "zerod check: %s\n", unexpected_argument(a, {"--lr-steps", "--world-size"}).c_str());
      usage();
      return 2;
    } else if (src.path.empty()) {
      src.path = a;
    } else {
      std::fprintf(stderr, "zerod check: one job script at a time (got %s and %s)\n",
                   src.path.c_str(), a.c_str());
      return 2;
    }
  }
  if (src.path.empty()) {
    usage();
    return 2;
  }
  std::unique_ptr<scripting::JobScript> job;
  try {
    job = scripting::JobScript::load(src);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\nzerod check: %s is not a valid job script (%s)\n", e.what(),
                 src.path.c_str(), status_name(e.code()));
    return 1;
  }

  // The schedule runs before anything is printed: a script whose lr fails
  // at some step is not "ok" (it was said ok, then failed).
  std::vector<double> lrs;
  const Plugin& plugin = job->optimizer_plugin();
  try {
    const int lr_at = plugin.value_index("lr");
    for (long s = 0; s < lr_steps; ++s) {
      auto lr = job->lr(s);
      lrs.push_back(lr ? *lr : (lr_at >= 0 ? job->config().optimizer_values[lr_at] : 0.0));
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\nzerod check: %s is not a valid job script: its learning rate fails at step %zu (%s)\n",
                 e.what(), src.path.c_str(), lrs.size(), status_name(e.code()));
    return 1;
  }

  std::printf("%s: ok\n\nresolved settings:\n", src.path.c_str());
  size_t width = 0;
  for (const auto& v : job->resolved()) width = std::max(width, v.key.size());
  for (const auto& v : job->resolved()) {
    const std::string where =
        v.line ? job->source_name() + ":" + std::to_string(v.line) : std::string("default");
    std::printf("  %-*s = %-36s  (%s)\n", static_cast<int>(width), v.key.c_str(), v.value.c_str(),
                where.c_str());
  }

  std::printf("\nplugins:\n");
  for (const Plugin* p : {&job->optimizer_plugin(), &job->partitioner_plugin(), &job->comm_plugin()}) {
    const zd_plugin_header& h = p->header();
    std::printf("  %-11s %s %u.%u (plugin ABI %u) from %s\n              %s\n", plugin_kind_name(h.kind),
                h.name, h.plugin_version >> 16, h.plugin_version & 0xffffu, h.abi_version,
                p->path().c_str(), h.description ? h.description : "");
  }
  const auto& opt = plugin.descriptor<zd_optimizer_v1>();
  static const struct {
    zd_isa isa;
    const char* name;
  } isas[] = {{ZD_ISA_AVX512, "avx512"}, {ZD_ISA_AVX2, "avx2"}, {ZD_ISA_SCALAR, "scalar"}};
  for (const auto& i : isas) {
    if (opt.supports_isa(i.isa)) {
      std::printf("  optimizer CPU kernel: %s\n", i.name);
      break;
    }
  }
  std::printf("  optimizer CUDA kernel: %s\n", opt.update_cuda ? "built" : "not built");

  if (!lrs.empty()) {
    std::printf("\nlearning rate (step: lr):\n");
    // The shortest text that reads back as the same double: what a test
    // compares with another schedule's values is the value itself.
    for (size_t s = 0; s < lrs.size(); ++s) std::printf("  %zu: %s\n", s, scripting::format_number(lrs[s]).c_str());
  }
  return 0;
}

}  // namespace zerod::cli
