// `zerod translate ds_config.json`: prints the Lua job script a DeepSpeed
// config translates to (what `zerod check` and `zerod run --job` load for a
// .json job), or every problem with it, naming the key and why.
#include "commands.h"
#include "cli_args.h"

#include "ds_config.h"
#include "error.h"
#include "script_file.h"

#include <cstdio>
#include <cstdlib>
#include <string>

namespace zerod::cli {

namespace {

// On stdout when asked for (--help), else on stderr beside the error.
void usage(FILE* out = stderr) {
  std::fprintf(out,
               "usage: zerod translate <ds_config.json> [--world-size N]\n"
               "       zerod translate --keys\n"
               "  Prints the zerod job script (Lua) a DeepSpeed JSON config translates to.\n"
               "  --world-size N  the job's ranks, for DeepSpeed's batch-size rule\n"
               "  --keys          the DeepSpeed keys zerod translates, ignores or refuses (Markdown)\n");
}

}  // namespace

int translate_command(int argc, char** argv) {
  std::string path;
  scripting::DsOptions opt;
  opt.world_size_option = "--world-size N";
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--keys") {
      std::fputs(scripting::deepspeed_keys_markdown().c_str(), stdout);
      return 0;
    }
    if (a == "--world-size" && i + 1 < argc) {
      char* end = nullptr;
      const long n = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || n < 1 || n > 1 << 20) {
        std::fprintf(stderr, "zerod translate: --world-size takes a rank count >= 1, got '%s'\n", argv[i]);
        return 2;
      }
      opt.world_size = static_cast<int>(n);
    } else if (a == "-h" || a == "--help") {
      usage(stdout);
      return 0;
    } else if ((!a.empty() && a[0] == '-') || !path.empty()) {
      std::fprintf(stderr, "zerod translate: %s\n", unexpected_argument(a, {"--world-size"}).c_str());
      usage();
      return 2;
    } else {
      path = a;
    }
  }
  if (path.empty()) {
    usage();
    return 2;
  }
  try {
    std::fputs(scripting::translate_deepspeed(scripting::read_script_file(path), path, opt).lua.c_str(), stdout);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\nzerod translate: %s is not a DeepSpeed config zerod can run (%s)\n", e.what(),
                 path.c_str(), status_name(e.code()));
    return 1;
  }
  return 0;
}

}  // namespace zerod::cli
