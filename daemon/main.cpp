// The zerod executable. Today it checks job scripts; the daemon, launcher
// and status commands come with the daemon (see the README's status table).
#include "commands.h"

#include <zerod/zerod.h>

#include <cstdio>
#include <cstring>
#include <string>

namespace {

void usage(FILE* out) {
  std::fprintf(out,
               "usage: zerod <command> [args]\n"
               "commands:\n"
               "  check <job.lua>   check a job script and print every resolved setting\n"
               "  version           print the version and ABI version\n"
               "not built yet: run, serve, status (the node daemon)\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const std::string cmd = argv[1];
  if (cmd == "check") return zerod::cli::check_command(argc - 2, argv + 2);
  if (cmd == "version" || cmd == "--version") {
    std::printf("zerod %s (C ABI %u.%u)\n", ZEROD_VERSION_STRING, ZD_ABI_VERSION_MAJOR,
                ZD_ABI_VERSION_MINOR);
    return 0;
  }
  if (cmd == "help" || cmd == "-h" || cmd == "--help") {
    usage(stdout);
    return 0;
  }
  if (cmd == "run" || cmd == "serve" || cmd == "status") {
    std::fprintf(stderr, "zerod %s: the node daemon is not built yet; trainers run in embedded "
                         "mode (zd_connect(\"embedded:\"))\n", cmd.c_str());
    return 2;
  }
  std::fprintf(stderr, "zerod: unknown command '%s'\n", cmd.c_str());
  usage(stderr);
  return 2;
}
