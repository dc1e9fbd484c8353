// `zerod run --nproc N --job job.lua -- <trainer…>`: the daemon and the
// launcher in one process, like torchrun. The job is checked first; then
// the daemon listens on a private socket, N ranks start with ZEROD_ENDPOINT,
// ZEROD_RANK, ZEROD_LOCAL_RANK, ZEROD_WORLD_SIZE and ZEROD_JOB set, and their
// output comes back prefixed with their rank. The first rank to fail is
// named with how it failed; the others are stopped and zerod exits non-zero.
// When every rank finished but the job's final snapshot failed (its end
// was not saved), zerod exits with kEndNotSaved (74), saying so.
#include "commands.h"
#include "daemon_options.h"

#include "error.h"
#include "launcher/launcher.h"
#include "launcher/signal_forwarder.h"
#include "launcher/watchdog.h"
#include "log.h"
#include "mpi_binding.h"
#include "node_layout.h"
#include "server.h"
#include "supervised_run.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>

namespace zerod::cli {

namespace {

std::unique_ptr<launch::Watchdog> start_watchdog() {
  std::unique_ptr<launch::Watchdog> w;
  try {
    w = std::make_unique<launch::Watchdog>();
  } catch (const Error& e) {
    log_warn(std::string("zerod run: ") + e.what() +
             "; if zerod dies, what its ranks started and its socket's directory are left behind");
  }
  return w;
}

// At the end of a normal run: the run's files in its socket's directory
// (the gloo store of bindings/python/zerod/_gloo.py), and the private
// directory itself with whatever the ranks left in it. Declared before the
// server, so that it runs after the server has closed its socket.
struct RunFiles {
  std::string dir;
  std::string prefix;
  bool private_dir = false;
  ~RunFiles() {
    if (dir.empty()) return;
    launch::remove_entries(dir, prefix);
    if (private_dir) {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  }
};

}  // namespace

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
  RankSpan span;
  try {
    node = detect_node_layout(args.node_rank, args.nnodes, process_environment());
    span = rank_span(node, args.nproc);
  } catch (const Error& e) {
    std::fprintf(stderr, "zerod run: %s (%s)\n", e.what(), status_name(e.code()));
    return 1;
  }
  // With the job's rank count: a DeepSpeed config's accumulation steps may
  // follow from it (train_batch_size / micro-batch / ranks, as DeepSpeed
  // derives them), and one that does not fit it is refused here.
  auto job = check_job("run", args.job, node.nodes, span.world);
  if (!job) return 1;
  try {
    if (const std::string why = layout_problem(node, job->config().comm, args.job); !why.empty()) {
      std::fprintf(stderr, "zerod run: %s\n", why.c_str());
      return 1;
    }
    // A restart resumes from a snapshot the run took during training: with
    // none (no `snapshot` table, or every = 0: only at a clean end) it
    // would start the job over.
    const SnapshotConfig& snapshot = job->config().snapshot;
    const bool snapshots = !snapshot.path.empty() && snapshot.every > 0;
    if (args.restarts > 0 && !snapshots) {
      if (snapshot.path.empty())
        std::fprintf(stderr, "zerod run: --restarts needs a job that takes snapshots (a `snapshot` table in %s): a "
                             "restarted daemon would start the job from scratch\n",
                     args.job.c_str());
      else
        std::fprintf(stderr, "zerod run: --restarts needs a job that takes snapshots during training: %s has "
                             "snapshot.every = 0 (a snapshot only at a clean end), so a restarted daemon would start "
                             "the job from scratch; set snapshot.every = N\n",
                     args.job.c_str());
      return 2;
    }
    if (!snapshot.path.empty() && !snapshots && node.nodes == 1)
      std::fprintf(stderr, "zerod run: %s takes a snapshot only at a clean end (snapshot.every = 0): the daemon "
                           "runs in this process and is not restarted if it dies, since a restart could resume "
                           "nothing of this run (snapshot.every = N makes it restartable)\n",
                   args.job.c_str());
    if (args.restarts > 0 && node.nodes > 1) {
      std::fprintf(stderr, "zerod run: --restarts restarts the daemon of a job on one node; this is node %d of %d "
                           "(%s), and a daemon of a job across nodes cannot rejoin the others' MPI job: run the "
                           "launcher again instead (it resumes from the newest snapshot, docs/multinode.md)\n",
                   node.node, node.nodes, node.source.c_str());
      return 2;
    }
    // A job that takes snapshots during training survives its daemon: the
    // daemon runs in a process of its own, restarted when it dies. Across
    // nodes the launcher restarts the whole job instead (docs/multinode.md,
    // "A node that dies").
    // From here zerod starts processes and makes files: what it would clean
    // up on its way out, the watchdog cleans up if zerod dies (watchdog.h).
    const std::unique_ptr<launch::Watchdog> watchdog = start_watchdog();
    const std::string run_id = launch::new_run_id();
    if (snapshots && node.nodes == 1)
      return run_supervised(args, snapshot, args.restarts < 0 ? 3 : args.restarts, watchdog.get(), run_id);
    const auto [world, first] = span;
    server::ServerOptions so;
    so.socket_path = args.socket;
    so.world_size = world;
    so.first_rank = first;
    so.local_ranks = args.nproc;
    so.keep_state = job->config().keep_state_on_disconnect;
    so.trace_path = args.trace;
    RunFiles run_files;
    server::Server server(so);
    run_files.dir = std::filesystem::path(server.socket_path()).parent_path().string();
    run_files.prefix = launch::run_file_prefix(run_id);
    run_files.private_dir = args.socket.empty();
    if (watchdog) {
      if (run_files.private_dir)
        watchdog->remove_directory_on_death(run_files.dir);
      else
        watchdog->remove_entries_on_death(run_files.dir, run_files.prefix);
    }
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
    // Names the files the ranks keep for this run beside the socket (the
    // gloo store), which zerod removes at the end, or its watchdog if zerod dies.
    lo.env["ZEROD_RUN_ID"] = run_id;
    lo.watchdog = watchdog.get();
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
    server.stop();  // the models still there end in it, with their final snapshots
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // The daemon is in this process: a final snapshot that failed (the
    // last rank's zd_model_destroy, or the stop) is in the job's record.
    return report_lost_ends("run", server.lost_ends(),
                            report_ranks(result, args.nproc, secs, node.nodes > 1 ? node.node : -1));
  } catch (const Error& e) {
    std::fprintf(stderr, "zerod run: %s (%s)\n", e.what(), status_name(e.code()));
    return 1;
  }
}

}  // namespace zerod::cli
