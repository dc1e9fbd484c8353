// `zerod run --nproc N --job job.lua -- <trainer…>`: the daemon and the
// launcher in one process, like torchrun. The job is checked first; then
// the daemon listens on a private socket, N ranks start with ZEROD_ENDPOINT,
// ZEROD_RANK, ZEROD_LOCAL_RANK, ZEROD_WORLD_SIZE and ZEROD_JOB set, and their
// output comes back prefixed with their rank. The first rank to fail is
// named with how it failed; the others are stopped and zerod exits non-zero.
#include "commands.h"
#include "daemon_options.h"

#include "error.h"
#include "launcher/launcher.h"
#include "launcher/signal_forwarder.h"
#include "log.h"
#include "mpi_binding.h"
#include "node_layout.h"
#include "server.h"
#include "supervised_run.h"

#include <chrono>
#include <cstdio>

namespace zerod::cli {

int run_command(int argc, char** argv) {
  DaemonArgs args;
  int code = 0;
  if (!parse_daemon_args("run", argc, argv, true, &args, &code)) return code;
  // Before any thread starts: each keeps the CPUs it started with, and
  // setenv is not safe beside another thread's getenv.
  set_daemon_environment("run");
  if (const std::string widened = release_mpi_binding(process_environment()); !widened.empty())
    log_info("zerod run: " + widened);
  // Where this daemon stands first: a job of several nodes that names no
  // comm backend spans them with "mpi".
  NodeLayout node;
  try {
    node = detect_node_layout(args.node_rank, args.nnodes, process_environment());
  } catch (const Error& e) {
    std::fprintf(stderr, "zerod run: %s (%s)\n", e.what(), status_name(e.code()));
    return 1;
  }
  auto job = check_job("run", args.job, node.nodes);
  if (!job) return 1;
  try {
    if (const std::string why = layout_problem(node, job->config().comm, args.job); !why.empty()) {
      std::fprintf(stderr, "zerod run: %s\n", why.c_str());
      return 1;
    }
    const bool snapshots = !job->config().snapshot.path.empty();
    if (args.restarts > 0 && !snapshots) {
      std::fprintf(stderr, "zerod run: --restarts needs a job that takes snapshots (a `snapshot` table in %s): a "
                           "restarted daemon would start the job from scratch\n",
                   args.job.c_str());
      return 2;
    }
    if (args.restarts > 0 && node.nodes > 1) {
      std::fprintf(stderr, "zerod run: --restarts restarts the daemon of a job on one node; this is node %d of %d "
                           "(%s), and a daemon of a job across nodes cannot rejoin the others' MPI job: run the "
                           "launcher again instead (it resumes from the newest snapshot, docs/multinode.md)\n",
                   node.node, node.nodes, node.source.c_str());
      return 2;
    }
    // A job that takes snapshots survives its daemon: the daemon runs in a
    // process of its own, restarted when it dies. Across nodes the launcher
    // restarts the whole job instead (docs/multinode.md, "A node that dies").
    if (snapshots && node.nodes == 1) return run_supervised(args, args.restarts < 0 ? 3 : args.restarts);
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
    const auto metrics = start_metrics("run", args, *job, server);
    if (node.nodes > 1)
      log_info("zerod run: node " + std::to_string(node.node) + " of " + std::to_string(node.nodes) + " (" +
               node.source + "): serving ranks " + std::to_string(first) + ".." +
               std::to_string(first + args.nproc - 1) + " of " + std::to_string(world) + " on " +
               server.socket_path());
    else
      // Said at any log level, as the supervised run says it: `zerod status`
      // and `zerod top` from outside the job need this socket (README).
      std::fprintf(stderr, "zerod run: serving %d ranks on %s\n", args.nproc, server.socket_path().c_str());

    launch::LaunchOptions lo;
    lo.nproc = args.nproc;
    lo.first_rank = first;
    lo.world_size = world;
    lo.argv = args.command;
    lo.prefix_output = args.prefix;
    lo.peer_exit_seconds = 2;  // survivors report the lost peer before they are stopped
    lo.env["ZEROD_ENDPOINT"] = "unix:" + server.socket_path();
    lo.env["ZEROD_JOB"] = args.job;
    lo.on_exit = [&server](const launch::RankExit& e) {
      // A rank gone while still in the job: the others' collectives fail
      // with "peer lost" naming it, instead of waiting for it forever.
      server.rank_exited(e.rank, e.describe());
    };
    const auto t0 = std::chrono::steady_clock::now();
    launch::Launcher launcher(lo);
    launch::SignalForwarder forwarder(launcher, [](int received, int sent) {
      std::fprintf(stderr, "zerod run: got signal %d, sent %s to every rank\n", received,
                   launch::signal_description(sent).c_str());
    });
    launcher.start();
    const launch::LaunchResult result = launcher.wait();
    server.stop();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return report_ranks(result, args.nproc, secs, node.nodes > 1 ? node.node : -1);
  } catch (const Error& e) {
    std::fprintf(stderr, "zerod run: %s (%s)\n", e.what(), status_name(e.code()));
    return 1;
  }
}

}  // namespace zerod::cli
