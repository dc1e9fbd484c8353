#include "daemon_options.h"

#include "error.h"
#include "launcher/own_environment.h"
#include "log.h"
#include "metrics_text.h"
#include "model_host.h"
#include "observe/listen_address.h"
#include "observe/tracer.h"
#include "size.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace zerod::cli {

namespace {

// Linux queues a blocked signal even when its disposition is SIG_IGN, and
// sigwait then returns it: an ignored signal must be left out of the set.
bool ignored_now(int sig) {
  struct sigaction now {};
  return ::sigaction(sig, nullptr, &now) == 0 && !(now.sa_flags & SA_SIGINFO) && now.sa_handler == SIG_IGN;
}

// On stdout when asked for (--help), else on stderr beside the error.
void usage(const char* cmd, bool want_command, FILE* out = stderr) {
  std::fprintf(out,
               "usage: zerod %s --nproc N --job job.lua [--socket PATH] [--nnodes K --node-rank k]%s\n"
               "  --nproc N       the number of ranks (trainer processes) on this node\n"
               "  --nnodes K, --node-rank k\n"
               "                  one daemon per node: this is node k of K (default: from mpirun's or\n"
               "                  srun's environment, else one node); ranks are numbered node-major\n"
               "  --job FILE      the job script; checked before anything starts%s\n"
               "  --socket PATH   where the daemon listens (default: a private directory)\n"
               "  --trace FILE    record a timeline (Chrome trace JSON) of the job's trace.steps into FILE\n"
               "  --metrics ADDR  serve Prometheus metrics on ADDR (host:port or a unix socket path),\n"
               "                  instead of the job's metrics.listen\n%s",
               cmd, want_command ? " [--no-prefix] -- <trainer command...>" : "",
               want_command ? ", and passed to the ranks as ZEROD_JOB" : "",
               want_command ? "  --no-prefix     do not prefix the ranks' output lines with [rank N]\n"
                              "  --restarts N    restart a daemon that dies, and the ranks, up to N times (default 3\n"
                              "                  when the job takes snapshots every N steps: they resume from this\n"
                              "                  run's newest; else 0)\n"
                              "exit status: 0; the first failed rank's; 74 when every rank finished but the job's\n"
                              "  final snapshot failed (its end was NOT saved), or its daemon died as they ended;\n"
                              "  1 or 2 for zerod's own errors\n"
                            : "  --until-done    end once every rank that came has left (or none came in 60 s):\n"
                              "                  how ranks of another launcher start their node's daemon\n"
                              "  --resume-snapshots STEPS\n"
                              "                  resume only from these snapshot steps (5,10 or none), whatever\n"
                              "                  the job's snapshot.resume says: how zerod run restarts a daemon\n"
                              "                  that died\n");
  if (!want_command)
    std::fprintf(out,
                 "   or: zerod serve --jobs [--host-memory SIZE] [--socket PATH] [--metrics ADDR]\n"
                 "  --jobs          serve several jobs of this user at once, each brought by its ranks (their\n"
                 "                  ZEROD_JOB, told apart by their launcher's ids or ZEROD_JOB_KEY); runs until\n"
                 "                  SIGINT, SIGTERM or SIGHUP\n"
                 "  --host-memory SIZE\n"
                 "                  the host memory all jobs' model state may hold together, e.g. 48GiB\n"
                 "                  (default: 90%% of the node's RAM); a model is admitted whole: one whose\n"
                 "                  ranks' state would not fit together is refused on every rank at\n"
                 "                  zd_model_finalize, naming the jobs that hold it\n"
                 "exit status: 0; with --job, 74 when the job's final snapshot failed (its end was NOT saved);\n"
                 "  1 or 2 for zerod's own errors\n");
}

}  // namespace

bool parse_daemon_args(const char* cmd, int argc, char** argv, bool want_command, DaemonArgs* out,
                       int* exit_code) {
  *exit_code = 2;
  bool nproc_given = false;  // --jobs refuses it: nproc keeps its default of 1 either way
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* name) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "zerod %s: %s needs a value\n", cmd, name);
        return nullptr;
      }
      return argv[++i];
    };
    if (a == "--") {
      if (!want_command) {
        // Dropped, the command left the daemon waiting forever for ranks nobody started.
        std::fprintf(stderr, "zerod %s takes no trainer command (after --): zerod run starts trainers; zerod %s "
                     "waits for ranks started another way (torchrun, mpirun, ...)\n", cmd, cmd);
        usage(cmd, want_command);
        return false;
      }
      for (int j = i + 1; j < argc; ++j) out->command.push_back(argv[j]);
      break;
    } else if (a == "--nproc" || a == "-n") {
      const char* v = value("--nproc");
      if (!v) return false;
      char* end = nullptr;
      const long n = std::strtol(v, &end, 10);
      if (*end || n < 1 || n > 4096) {
        std::fprintf(stderr, "zerod %s: --nproc must be a number from 1 to 4096, got '%s'\n", cmd, v);
        return false;
      }
      out->nproc = static_cast<int>(n);
      nproc_given = true;
    } else if (a == "--nnodes" || a == "--node-rank") {
      const char* v = value(a.c_str());
      if (!v) return false;
      char* end = nullptr;
      const long n = std::strtol(v, &end, 10);
      if (*end || n < (a == "--nnodes" ? 1 : 0) || n > 1 << 20) {
        std::fprintf(stderr, "zerod %s: %s must be a number, got '%s'\n", cmd, a.c_str(), v);
        return false;
      }
      (a == "--nnodes" ? out->nnodes : out->node_rank) = static_cast<int>(n);
    } else if (a == "--job") {
      const char* v = value("--job");
      if (!v) return false;
      out->job = v;
    } else if (a == "--socket") {
      const char* v = value("--socket");
      if (!v) return false;
      out->socket = v;
    } else if (a == "--restarts" && want_command) {
      const char* v = value("--restarts");
      if (!v) return false;
      char* end = nullptr;
      const long n = std::strtol(v, &end, 10);
      if (*end || n < 0 || n > 1000) {
        std::fprintf(stderr, "zerod %s: --restarts must be a number from 0 to 1000, got '%s'\n", cmd, v);
        return false;
      }
      out->restarts = static_cast<int>(n);
    } else if (a == "--trace") {
      const char* v = value("--trace");
      if (!v) return false;
      out->trace = v;
      if (out->trace.empty()) {
        std::fprintf(stderr, "zerod %s: --trace needs a file name\n", cmd);
        return false;
      }
      if (out->trace[0] != '/') {
        // The daemon writes it; relative to where the user ran this.
        char cwd[4096];
        if (getcwd(cwd, sizeof cwd)) out->trace = std::string(cwd) + "/" + out->trace;
      }
      // Found now, not after the run, when the trace would be lost.
      if (const std::string why = observe::trace_path_problem(out->trace); !why.empty()) {
        std::fprintf(stderr, "zerod %s: --trace %s: %s\n", cmd, out->trace.c_str(), why.c_str());
        return false;
      }
    } else if (a == "--metrics") {
      const char* v = value("--metrics");
      if (!v) return false;
      std::string why;
      if (!observe::parse_listen_address(v, &why)) {
        std::fprintf(stderr, "zerod %s: --metrics %s: %s\n", cmd, v, why.c_str());
        return false;
      }
      out->metrics = v;
    } else if (a == "--no-prefix" && want_command) {
      out->prefix = false;
    } else if (a == "--until-done" && !want_command) {
      out->until_done = true;
    } else if (a == "--resume-snapshots" && !want_command) {
      const char* v = value("--resume-snapshots");
      if (!v) return false;
      std::vector<int64_t> steps;
      bool ok = true;
      if (std::strcmp(v, "none") != 0) {
        for (const char* p = v; ok;) {
          char* end = nullptr;
          errno = 0;
          const long long n = std::strtoll(p, &end, 10);
          ok = end != p && errno == 0 && n >= 0 && (*end == ',' || *end == '\0');
          if (ok) steps.push_back(n);
          if (!ok || *end == '\0') break;
          p = end + 1;
        }
      }
      if (!ok) {
        std::fprintf(stderr, "zerod %s: --resume-snapshots takes snapshot steps such as 5,10, or none; got '%s'\n",
                     cmd, v);
        return false;
      }
      out->resume_snapshots = std::move(steps);
    } else if (a == "--jobs" && !want_command) {
      out->jobs = true;
    } else if (a == "--host-memory" && !want_command) {
      const char* v = value("--host-memory");
      if (!v) return false;
      const auto bytes = scripting::parse_size(v);
      if (!bytes || *bytes == 0) {
        std::fprintf(stderr, "zerod %s: --host-memory takes a size such as 48GiB or 512MiB, got '%s'\n", cmd, v);
        return false;
      }
      out->host_memory = *bytes;
    } else if (a == "-h" || a == "--help") {
      usage(cmd, want_command, stdout);
      *exit_code = 0;
      return false;
    } else {
      std::fprintf(stderr, "zerod %s: unexpected argument '%s'\n", cmd, a.c_str());
      usage(cmd, want_command);
      return false;
    }
  }
  if (out->jobs) {
    // Each job's ranks bring its script; a daemon-wide one would be a job of its own.
    const char* clash = !out->job.empty() ? "--job" : nproc_given ? "--nproc" : out->until_done ? "--until-done"
                        : out->nnodes > 1 || out->node_rank > 0 ? "--nnodes/--node-rank"
                        : out->resume_snapshots ? "--resume-snapshots" : nullptr;
    if (clash) {
      std::fprintf(stderr, "zerod %s: --jobs serves whatever jobs the ranks bring (each rank's ZEROD_JOB), on this "
                   "node; it takes no %s\n", cmd, clash);
      usage(cmd, want_command);
      return false;
    }
    return true;
  }
  if (out->host_memory) {
    std::fprintf(stderr, "zerod %s: --host-memory goes with --jobs (one job's ranks are bounded by its own "
                 "budgets: budgets = { host = ... } in its script)\n", cmd);
    usage(cmd, want_command);
    return false;
  }
  if (out->job.empty()) {
    std::fprintf(stderr, "zerod %s: --job job.lua is required\n", cmd);
    usage(cmd, want_command);
    return false;
  }
  if (want_command && out->command.empty()) {
    std::fprintf(stderr, "zerod %s: no trainer command; give it after --\n", cmd);
    usage(cmd, want_command);
    return false;
  }
  char resolved[4096];
  if (realpath(out->job.c_str(), resolved)) out->job = resolved;  // the ranks may chdir
  return true;
}

int report_ranks(const launch::LaunchResult& result, int nproc, double seconds, int node) {
  if (result.first_failure) {
    std::fprintf(stderr, "zerod run: %s, the first rank to fail (exit status %d)\n",
                 result.first_failure->describe().c_str(), result.exit_code);
    for (const auto& e : result.exits)
      if (e.rank != result.first_failure->rank && !e.ok())
        std::fprintf(stderr, "zerod run:   then %s\n", e.describe().c_str());
    return result.exit_code ? result.exit_code : 1;
  }
  if (node >= 0)
    std::fprintf(stderr, "zerod run: node %d: all %d ranks finished in %.1f s\n", node, nproc, seconds);
  else
    std::fprintf(stderr, "zerod run: all %d ranks finished in %.1f s\n", nproc, seconds);
  return 0;
}

int report_lost_ends(const char* cmd, const std::vector<std::string>& lost, int code) {
  if (lost.empty()) return code;
  std::string models;  // "model 0 (job.lua)": each is "model 0 (job.lua): <the engine's error>"
  for (const std::string& what : lost) {
    const size_t named = what.find("): ");
    models += (models.empty() ? "" : ", ") + (named == std::string::npos ? what : what.substr(0, named + 1));
  }
  const std::string status = code == 0 ? "; exit status " + std::to_string(kEndNotSaved) : "";
  // Last on stderr, where a user reading the end of the output looks: the
  // engine's error above is one line among the ranks' output.
  std::fprintf(stderr, "zerod %s: the job's final snapshot failed: the run's final state was NOT saved (%s; the "
               "error above says why, which snapshot is the newest kept, and what to do)%s\n", cmd, models.c_str(),
               status.c_str());
  return code == 0 ? kEndNotSaved : code;
}

std::unique_ptr<server::MetricsServer> start_metrics(const char* cmd, const DaemonArgs& args,
                                                     const scripting::JobScript& job, server::Server& server) {
  const std::string listen = args.metrics.empty() ? job.config().metrics.listen : args.metrics;
  if (listen.empty()) return nullptr;
  auto ms = std::make_unique<server::MetricsServer>(listen, [&server] { return server::render_metrics(server); });
  std::fprintf(stderr, "zerod %s: metrics at %s\n", cmd, ms->where().c_str());
  return ms;
}

std::unique_ptr<scripting::JobScript> check_job(const char* cmd, const std::string& path, int nodes, int world_size) {
  try {
    scripting::ScriptSource src;
    src.path = path;
    src.nodes = nodes;
    src.world_size = world_size;
    auto job = scripting::JobScript::load(src);
    server::daemon_config(job->config(), path);  // a device the daemon cannot serve
    return job;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\nzerod %s: %s is not a valid job script (%s); nothing was started\n",
                 e.what(), cmd, path.c_str(), status_name(e.code()));
    return nullptr;
  }
}

void set_daemon_environment(const char* cmd) {
  // The most CUDA takes: each stream of the daemon's ranks on one GPU (the
  // rank's own, its copy queues, the comm plugin's) gets a queue of its own
  // as long as there are no more than this, so a stream waiting for a
  // trainer holds no other.
  const std::string users = launch::set_for_this_process_only("CUDA_DEVICE_MAX_CONNECTIONS", "32");
  if (!users.empty() && users != "32")
    log_info(std::string("zerod ") + cmd + ": CUDA_DEVICE_MAX_CONNECTIONS=" + users +
             " reaches the ranks; the daemon's own process uses 32 (its streams wait on its trainers')");
}

sigset_t block_stop_signals() {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  for (const int sig : {SIGINT, SIGHUP})
    if (!ignored_now(sig)) sigaddset(&stop, sig);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  return stop;
}

}  // namespace zerod::cli
