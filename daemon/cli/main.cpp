// The zerod executable: the node daemon, its launcher and supervisor, and
// the tools around it.
#include "commands.h"

#include <zerod/zerod.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

namespace {

void usage(FILE* out) {
  std::fprintf(out,
               "usage: zerod <command> [args]\n"
               "commands:\n"
               "  run --nproc N --job job.lua -- <trainer...>   start the daemon and N ranks\n"
               "  serve --nproc N --job job.lua --socket PATH   the daemon alone\n"
               "  join --node K --nnodes N ... -- <command>     one node's daemon of launched ranks\n"
               "  status [--socket PATH]                        what a running daemon holds\n"
               "  top [--socket PATH]                           a live view of a running daemon\n"
               "  plot trace.json [--out DIR]                   PNGs of a trace: memory, step time, loss\n"
               "  check <job.lua|ds_config.json>                check a job script or a DeepSpeed config\n"
               "  translate <ds_config.json>                    the Lua job a DeepSpeed config is\n"
               "  plan <job.lua> --params N                     what each tier would hold\n"
               "  ckpt info|export|reshard|import DIR ...       checkpoints on disk\n"
               "  version                                       the version and ABI version\n"
               "each command takes --help\n");
}

}  // namespace

static int dispatch(int argc, char** argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const std::string cmd = argv[1];
  if (cmd == "check") return zerod::cli::check_command(argc - 2, argv + 2);
  if (cmd == "translate") return zerod::cli::translate_command(argc - 2, argv + 2);
  if (cmd == "version" || cmd == "--version") {
    if (argc > 2 && (!std::strcmp(argv[2], "-h") || !std::strcmp(argv[2], "--help"))) {
      std::printf("usage: zerod version\n  prints zerod's version and the C ABI version it implements\n");
      return 0;
    }
    std::printf("zerod %s (C ABI %u.%u)\n", ZEROD_VERSION_STRING, ZD_ABI_VERSION_MAJOR,
                ZD_ABI_VERSION_MINOR);
    return 0;
  }
  if (cmd == "help" || cmd == "-h" || cmd == "--help") {
    usage(stdout);
    return 0;
  }
  if (cmd == "run") return zerod::cli::run_command(argc - 2, argv + 2);
  if (cmd == "serve") return zerod::cli::serve_command(argc - 2, argv + 2);
  if (cmd == "join") return zerod::cli::join_command(argc - 2, argv + 2);
  if (cmd == "status") return zerod::cli::status_command(argc - 2, argv + 2);
  if (cmd == "top") return zerod::cli::top_command(argc - 2, argv + 2);
  if (cmd == "plot") return zerod::cli::plot_command(argc - 2, argv + 2);
  if (cmd == "plan") return zerod::cli::plan_command(argc - 2, argv + 2);
  if (cmd == "ckpt") return zerod::cli::ckpt_command(argc - 2, argv + 2);
  std::fprintf(stderr, "zerod: unknown command '%s'\n", cmd.c_str());
  usage(stderr);
  return 2;
}

// A command's own errors are its to report; anything it let through (a
// manifest asking for more memory than there is: std::bad_alloc) still
// ends in one line and exit status 1, not std::terminate's abort.
int main(int argc, char** argv) {
  try {
    return dispatch(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zerod %s: %s\n", argc > 1 ? argv[1] : "", e.what());
    return 1;
  }
}
