// Options shared by `zerod run` and `zerod serve`, and the job check both do
// before anything starts.
#pragma once

#include "job_script.h"
#include "launcher/launcher.h"
#include "metrics_server.h"
#include "server.h"

#include <signal.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace zerod::cli {

struct DaemonArgs {
  int nproc = 1;            // ranks on this node
  int node_rank = -1;       // --node-rank (-1: from the launcher's environment)
  int nnodes = -1;          // --nnodes
  std::string job;          // path of the job script
  std::string socket;       // "" = a private directory
  bool prefix = true;
  int restarts = -1;        // run: restarts of a dead daemon (-1: 3 when the job takes snapshots, else 0)
  std::string trace;        // --trace FILE (absolute): every model records its trace there
  std::string metrics;      // --metrics ADDR: overrides the job's metrics.listen
  std::vector<std::string> command;  // after "--" (run)
  bool until_done = false;           // serve: end when the ranks are gone (a daemon started on demand)
  bool jobs = false;                 // serve --jobs: several jobs, each brought by its ranks
  uint64_t host_memory = 0;          // serve --host-memory: what the jobs' state may hold together (0: default)
  // serve --resume-snapshots STEPS: how `zerod run` restarts a daemon that
  // died (supervised_run.cpp): the steps of the snapshots its run wrote,
  // the only ones the job resumes from, whatever snapshot.resume says.
  std::optional<std::vector<int64_t>> resume_snapshots;
};

// Parses argv; on a mistake prints it with the usage and returns false
// (*exit_code set).
bool parse_daemon_args(const char* cmd, int argc, char** argv, bool want_command, DaemonArgs* out,
                       int* exit_code);

// Says how the ranks ended, as `zerod run` does: the first to fail and how,
// then the others that failed; or that all finished, with the time (`node`
// names this node when there are several, -1 otherwise). Returns the exit
// status for zerod run.
int report_ranks(const launch::LaunchResult& result, int nproc, double seconds, int node = -1);
// The exit status of `zerod run` and of a `zerod serve` of one job when a
// model's final snapshot failed, so that the run's final state was not
// saved, though every rank exited 0 (sysexits.h's EX_IOERR). A job of
// snapshot.every = 0 has nothing else of its run on disk then.
constexpr int kEndNotSaved = 74;
// Once the server has stopped: when `lost` (Server::lost_ends) names any
// model, says on stderr that the job's final state was NOT saved, and
// returns kEndNotSaved in place of a `code` of 0; else returns `code`.
int report_lost_ends(const char* cmd, const std::vector<std::string>& lost, int code);
// Starts the metrics endpoint when the job (or --metrics) asks for one, and
// says where it is on stderr; null when none is asked for. Throws Error.
std::unique_ptr<server::MetricsServer> start_metrics(const char* cmd, const DaemonArgs& args,
                                                     const scripting::JobScript& job, server::Server& server);

// Loads and checks the job script the way the ranks will, so a bad script is
// reported (file:line) before any rank starts; nullptr after printing why.
// `nodes`: the daemons the job spans (a job naming no comm.backend then gets
// "mpi", ScriptSource::nodes); `world_size`: the job's ranks, which a
// DeepSpeed config's batch sizes may need (0: unknown, ScriptSource::world_size).
std::unique_ptr<scripting::JobScript> check_job(const char* cmd, const std::string& path, int nodes = 1,
                                                int world_size = 0);

// What a daemon's process sets for itself before any thread starts, and its
// ranks do not inherit (launcher/own_environment.h): 32 hardware queues per
// GPU for its streams (CUDA_DEVICE_MAX_CONNECTIONS), whatever the user set;
// the ranks get the user's value. `cmd` names the command in the log.
void set_daemon_environment(const char* cmd);

// The signals that stop `zerod serve` and `zerod join`, blocked in the
// calling thread (call it before any thread starts, so that all inherit the
// mask) for sigwait: SIGTERM always; SIGINT and SIGHUP unless they are
// ignored now. Those stay ignored: nohup's SIGHUP, and the SIGINT of a job
// that a non-interactive shell put in the background (POSIX).
sigset_t block_stop_signals();

}  // namespace zerod::cli
