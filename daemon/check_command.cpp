// `zerod check job.lua`: loads the job script exactly as a trainer would,
// reports every problem (file:line), or prints every resolved setting with
// where its value came from, and what the optimizer and schedule will do.
#include "commands.h"

#include "config_reader.h"
#include "error.h"
#include "job_script.h"

#include <zerod/zerod_plugin.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace zerod::cli {

namespace {

void usage() {
  std::fprintf(stderr,
               "usage: zerod check <job.lua> [--allow-io] [--lr-steps N]\n"
               "  Loads and checks a job script; prints every resolved setting.\n"
               "  --allow-io     let the script use Lua's io library\n"
               "  --lr-steps N   print the learning rate for the first N steps (default 5)\n");
}

}  // namespace

int check_command(int argc, char** argv) {
  scripting::ScriptSource src;
  long lr_steps = 5;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--allow-io") {
      src.allow_io = true;
    } else if (a == "--lr-steps" && i + 1 < argc) {
      lr_steps = std::strtol(argv[++i], nullptr, 10);
    } else if (a == "-h" || a == "--help") {
      usage();
      return 0;
    } else if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr, "zerod check: unknown option %s\n", a.c_str());
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
  const Plugin& plugin = job->optimizer_plugin();
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

  if (lr_steps > 0) {
    std::printf("\nlearning rate (step: lr):\n");
    try {
      const int lr_at = plugin.value_index("lr");
      for (long s = 0; s < lr_steps; ++s) {
        auto lr = job->lr(s);
        const double v = lr ? *lr : (lr_at >= 0 ? job->config().optimizer_values[lr_at] : 0.0);
        std::printf("  %ld: %.6g\n", s, v);
      }
    } catch (const Error& e) {
      std::fprintf(stderr, "%s\n", e.what());
      return 1;
    }
  }
  return 0;
}

}  // namespace zerod::cli
