// `zerod serve --nproc N --job job.lua --socket PATH`: the daemon alone, for
// ranks started by other means (each sets ZEROD_ENDPOINT=unix:PATH,
// ZEROD_RANK and ZEROD_WORLD_SIZE). Runs until SIGINT, SIGTERM or SIGHUP (one
// ignored at its start stays ignored: `nohup zerod serve` outlives its
// terminal); with --until-done (how the ranks of torchrun, mpirun, srun...
// start it on demand) also until its ranks are gone. Exits 0, or kEndNotSaved (74) when
// the job's final snapshot failed; `--jobs` logs that per job and goes on.
#include "commands.h"
#include "daemon_options.h"

#include "error.h"
#include "memory/ledger.h"
#include "log.h"
#include "metrics_text.h"
#include "mpi_binding.h"
#include "node_layout.h"
#include "server.h"
#include "transport/detail/serve_log_lines.h"

#include <signal.h>

#include <chrono>
#include <cstdio>

namespace zerod::cli {

namespace {

// A daemon the ranks of another launcher started (libzerod/src/node_daemon.h):
// it ends once every rank that came has left for a moment (a rank may
// connect again, a new zd_connect in the same process), when no rank comes
// at all, or on SIGINT, SIGTERM or SIGHUP. Nobody else would stop it.
int serve_until_done(server::Server& server, const sigset_t& stop) {
  using Clock = std::chrono::steady_clock;
  constexpr auto kFirstRankWithin = std::chrono::seconds(60);
  constexpr auto kGone = std::chrono::seconds(2);
  const auto started = Clock::now();
  Clock::time_point empty_since{};  // when no rank held a connection any more
  bool empty = false;
  const timespec tick{0, 100 * 1000 * 1000};
  while (true) {
    const int sig = sigtimedwait(&stop, nullptr, &tick);
    if (sig > 0) {
      std::fprintf(stderr, "zerod serve: stopping (signal %d)\n", sig);
      server.stop(sig);
      return 0;
    }
    const auto now = Clock::now();
    if (!server.any_rank_came() && now - started > kFirstRankWithin) {
      std::fprintf(stderr, "zerod serve: no rank came in %lld s; stopping\n",
                   static_cast<long long>(kFirstRankWithin.count()));
      server.stop();
      return 1;
    }
    if (!server.ranks_came_and_left()) {
      empty = false;
    } else if (!empty) {
      empty = true;
      empty_since = now;
    } else if (now - empty_since > kGone) {
      std::fprintf(stderr, "%s\n", serve_log::kStopping);
      break;
    }
  }
  server.stop();
  return 0;
}

// `zerod serve --jobs`: a long-running daemon (a user's, or a systemd
// service's) for whatever jobs its user's ranks bring, each with its own
// script, their state charged together against the node's host memory.
int serve_jobs(const DaemonArgs& args, const sigset_t& stop) {
  server::ServerOptions so;
  so.socket_path = args.socket;
  so.multi_job = true;
  so.host_memory = args.host_memory ? args.host_memory : server::default_node_capacity();
  so.trace_path = args.trace;
  server::Server server(so);
  server.start();
  std::unique_ptr<server::MetricsServer> metrics;
  if (!args.metrics.empty()) {
    metrics = std::make_unique<server::MetricsServer>(args.metrics, [&server] { return server::render_metrics(server); });
    std::fprintf(stderr, "zerod serve: metrics at %s\n", metrics->where().c_str());
  }
  std::printf("%s%s for several jobs; their model state may hold %s of host memory together\n"
              "%sZEROD_ENDPOINT=unix:%s and ZEROD_JOB=job.lua, started by torchrun, mpirun, srun\n"
              "  (told apart by their launcher's ids) or by hand (ZEROD_RANK, ZEROD_WORLD_SIZE, ZEROD_JOB_KEY)\n",
              serve_log::kListening, server.socket_path().c_str(), format_bytes(so.host_memory).c_str(),
              serve_log::kRanksConnect, server.socket_path().c_str());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop, &sig);
  std::fprintf(stderr, "zerod serve: stopping (signal %d)\n", sig);
  metrics.reset();
  server.stop(sig);
  return 0;
}

}  // namespace

int serve_command(int argc, char** argv) {
  DaemonArgs args;
  int code = 0;
  if (!parse_daemon_args("serve", argc, argv, false, &args, &code)) return code;
  set_daemon_environment("serve");  // before any thread starts
  // The stop signals are taken by sigwait: blocked (block_stop_signals)
  // before the server starts its threads, so that none of them receives
  // them. SIGHUP is one: a closed terminal, or `zerod join` passing on its
  // own (join_command.cpp), stops the daemon as SIGTERM does; by its default
  // action it died with 129, leaving its socket and cutting off a
  // snapshot's commit.
  if (args.jobs) {
    const sigset_t stop = block_stop_signals();
    try {
      return serve_jobs(args, stop);
    } catch (const Error& e) {
      std::fprintf(stderr, "zerod serve: %s (%s)\n", e.what(), status_name(e.code()));
      return 1;
    }
  }
  // Before any thread starts: each keeps the CPUs it started with.
  if (const std::string widened = release_mpi_binding(process_environment()); !widened.empty())
    log_info("zerod serve: " + widened);
  // Where this daemon stands first: a job of several nodes that names no
  // comm backend spans them with "mpi".
  NodeLayout node;
  RankSpan span;
  try {
    node = detect_node_layout(args.node_rank, args.nnodes, process_environment());
    span = rank_span(node, args.nproc);
  } catch (const Error& e) {
    std::fprintf(stderr, "zerod serve: %s (%s)\n", e.what(), status_name(e.code()));
    return 1;
  }
  // With the job's rank count: a DeepSpeed config's accumulation steps may
  // follow from it (train_batch_size / micro-batch / ranks, as DeepSpeed
  // derives them), and one that does not fit it is refused here.
  auto job = check_job("serve", args.job, node.nodes, span.world);
  if (!job) return 1;
  const sigset_t stop = block_stop_signals();
  try {
    if (const std::string why = layout_problem(node, job->config().comm, args.job); !why.empty()) {
      std::fprintf(stderr, "zerod serve: %s\n", why.c_str());
      return 1;
    }
    const auto [world, first] = span;
    server::ServerOptions so;
    so.socket_path = args.socket;
    so.world_size = world;
    so.first_rank = first;
    so.local_ranks = args.nproc;
    so.keep_state = job->config().keep_state_on_disconnect;
    so.trace_path = args.trace;
    if (args.resume_snapshots) {
      // What `zerod run` tells a daemon it restarts on one node; across
      // nodes the launcher restarts the whole job (docs/multinode.md).
      const std::string& path = job->config().snapshot.path;
      if (path.empty() || node.nodes > 1) {
        std::fprintf(stderr, "zerod serve: --resume-snapshots is for the restarted daemon of a job on one node that "
                             "takes snapshots (a `snapshot` table in %s)\n",
                     args.job.c_str());
        return 2;
      }
      so.snapshot_restart = server::SnapshotRestart{path, *args.resume_snapshots};
    }
    server::Server server(so);
    server.start();
    // Declared after the server: it stops serving before the server goes.
    const auto metrics = start_metrics("serve", args, *job, server);
    std::printf("%s%s for rank%s %d..%d of %d (job %s)\n"
                "%sZEROD_ENDPOINT=unix:%s ZEROD_RANK=<r> ZEROD_WORLD_SIZE=%d\n",
                serve_log::kListening, server.socket_path().c_str(), args.nproc == 1 ? "" : "s", first,
                first + args.nproc - 1, world, args.job.c_str(), serve_log::kRanksConnect,
                server.socket_path().c_str(), world);
    std::fflush(stdout);
    // A job whose final snapshot failed ends with kEndNotSaved: how
    // `zerod run` learns it of the daemon it supervises.
    if (!args.until_done) {
      int sig = 0;
      sigwait(&stop, &sig);
      std::fprintf(stderr, "zerod serve: stopping (signal %d)\n", sig);
      server.stop(sig);
      return report_lost_ends("serve", server.lost_ends(), 0);
    }
    const int served = serve_until_done(server, stop);  // stops the server
    return report_lost_ends("serve", server.lost_ends(), served);
  } catch (const Error& e) {
    std::fprintf(stderr, "zerod serve: %s (%s)\n", e.what(), status_name(e.code()));
    return 1;
  }
}

}  // namespace zerod::cli
