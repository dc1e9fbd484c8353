// `zerod serve --nproc N --job job.lua --socket PATH`: the daemon alone, for
// ranks started by other means (each sets ZEROD_ENDPOINT=unix:PATH,
// ZEROD_RANK and ZEROD_WORLD_SIZE). Runs until SIGINT or SIGTERM.
#include "commands.h"
#include "daemon_options.h"

#include "error.h"
#include "log.h"
#include "mpi_binding.h"
#include "node_layout.h"
#include "server.h"

#include <signal.h>

#include <cstdio>

namespace zerod::cli {

int serve_command(int argc, char** argv) {
  DaemonArgs args;
  int code = 0;
  if (!parse_daemon_args("serve", argc, argv, false, &args, &code)) return code;
  // Before any thread starts: each keeps the CPUs it started with.
  if (const std::string widened = release_mpi_binding(process_environment()); !widened.empty())
    log_info("zerod serve: " + widened);
  auto job = check_job("serve", args.job);
  if (!job) return 1;
  // The stop signals are taken by sigwait below; blocked first so that no
  // server thread receives them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  try {
    const NodeLayout node = detect_node_layout(args.node_rank, args.nnodes, process_environment());
    if (const std::string why = layout_problem(node, job->config().comm, args.job); !why.empty()) {
      std::fprintf(stderr, "zerod serve: %s\n", why.c_str());
      return 1;
    }
    const auto [world, first] = rank_span(node, args.nproc);
    server::ServerOptions so;
    so.socket_path = args.socket;
    so.world_size = world;
    so.first_rank = first;
    so.local_ranks = args.nproc;
    so.keep_state = job->config().keep_state_on_disconnect;
    so.trace_path = args.trace;
    server::Server server(so);
    server.start();
    // Declared after the server: it stops serving before the server goes.
    const auto metrics = start_metrics("serve", args, *job, server);
    std::printf("zerod serve: listening on %s for rank%s %d..%d of %d (job %s)\n"
                "  ranks connect with ZEROD_ENDPOINT=unix:%s ZEROD_RANK=<r> ZEROD_WORLD_SIZE=%d\n",
                server.socket_path().c_str(), args.nproc == 1 ? "" : "s", first, first + args.nproc - 1, world,
                args.job.c_str(), server.socket_path().c_str(), world);
    std::fflush(stdout);
    int sig = 0;
    sigwait(&stop, &sig);
    std::fprintf(stderr, "zerod serve: stopping (signal %d)\n", sig);
    server.stop();
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "zerod serve: %s (%s)\n", e.what(), status_name(e.code()));
    return 1;
  }
}

}  // namespace zerod::cli
