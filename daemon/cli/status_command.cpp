// `zerod status`: asks a running daemon for its models, ranks, per-rank and
// per-tier bytes and step figures, as an observer (not a rank).
#include "commands.h"
#include "cli_args.h"

#include "error.h"
#include "observer.h"
#include "status.h"

#include <cstdio>
#include <string>

namespace zerod::cli {

int status_command(int argc, char** argv) {
  std::string socket;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--socket" && i + 1 < argc) {
      socket = argv[++i];
    } else if (a == "-h" || a == "--help") {
      std::printf("usage: zerod status [--socket PATH]\n"
                  "  PATH defaults to ZEROD_ENDPOINT's (unix:PATH), as `zerod run` sets it\n");
      return 0;
    } else {
      std::fprintf(stderr, "zerod status: %s\n", unexpected_argument(a, {"--socket"}).c_str());
      return 2;
    }
  }
  socket = observed_socket(socket);
  if (socket.empty()) {
    std::fprintf(stderr, "zerod status: which daemon? give --socket PATH (zerod serve prints it)\n");
    return 2;
  }
  try {
    Observer o(socket);
    std::fputs(server::format_status(o.status()).c_str(), stdout);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "zerod status: %s (%s)\n", e.what(), status_name(e.code()));
    return 1;
  }
}

}  // namespace zerod::cli
