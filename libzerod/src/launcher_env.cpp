#include "launcher_env.h"

#include <unistd.h>

#include <cstdlib>
#include <string>
#include <string_view>

namespace zerod::abi {

namespace {

// The variable's value as a count (>= 0), or -1 when unset or not a number.
long number(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return -1;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return *end == 0 && n >= 0 && n < (1L << 24) ? n : -1;
}

std::string value(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// An id set to "" names nothing: `ZEROD_JOB_KEY=` (a script's
// `export ZEROD_JOB_KEY=$UNSET_VAR`) was a job key that every such launch
// on the node shared.
bool named(const char* name) { return !value(name).empty(); }

struct Launcher {
  const char* who;
  const char* size;
  const char* rank;
  const char* local_rank;
  const char* local_size;
  const char* node;  // this node's index among the job's nodes, if the launcher says
  // What tells one launch from another on this node, joined.
  const char* keys[4];
  // A variable that only this launcher sets, for one that shares another's
  // size variable (nullptr: the size variable says it).
  const char* only_with = nullptr;
};

// In the order they are believed: zerod's own names first (Python's
// integrations set them from Lightning's or Accelerate's view of the job);
// torchrun's RANK/WORLD_SIZE may also be set under mpirun by a user's
// script, so Open MPI's come before the generic PMI ones. srun's step task
// count, not SLURM_NTASKS: an sbatch script's own environment has the whole
// allocation's count but runs one process. DeepSpeed's own launcher
// (`deepspeed train.py`, deepspeed.launcher.launch) sets torchrun's RANK,
// WORLD_SIZE and LOCAL_RANK but says the node's ranks in LOCAL_SIZE and the
// node in CROSS_RANK, which torchrun never sets: read as torchrun's, its
// ranks were refused for not saying how many run on the node.
constexpr Launcher kLaunchers[] = {
    {"zerod's rank variables", "ZEROD_WORLD_SIZE", "ZEROD_RANK", "ZEROD_LOCAL_RANK", "ZEROD_LOCAL_WORLD_SIZE",
     "ZEROD_NODE_RANK", {"ZEROD_JOB_KEY", "MASTER_ADDR", "MASTER_PORT", nullptr}},
    {"mpirun (Open MPI)", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE", nullptr, {"ZEROD_JOB_KEY", "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", nullptr}},
    {"DeepSpeed's launcher (deepspeed)", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK",
     {"ZEROD_JOB_KEY", "MASTER_ADDR", "MASTER_PORT", nullptr}, "CROSS_RANK"},
    {"torchrun (or another torch.distributed launcher: Lightning's, accelerate launch)", "WORLD_SIZE", "RANK",
     "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
     {"ZEROD_JOB_KEY", "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT"}},
    {"srun (Slurm)", "SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "SLURM_LOCALID", nullptr, "SLURM_NODEID",
     {"ZEROD_JOB_KEY", "SLURM_JOB_ID", "SLURM_STEP_ID", nullptr}},
    {"an MPI launcher (PMI)", "PMI_SIZE", "PMI_RANK", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", nullptr,
     {"ZEROD_JOB_KEY", "PMI_JOBID", nullptr, nullptr}},
};

// Slurm's tasks on this node: SLURM_STEP_TASKS_PER_NODE reads "2(x3),1" for
// the step's nodes in order; SLURM_NODEID picks this node's count.
long slurm_local_tasks() {
  const std::string spec = value("SLURM_STEP_TASKS_PER_NODE");
  const long node = number("SLURM_NODEID");
  if (spec.empty() || node < 0) return 0;
  long at = 0;
  size_t i = 0;
  while (i < spec.size()) {
    char* end = nullptr;
    const long n = std::strtol(spec.c_str() + i, &end, 10);
    i = static_cast<size_t>(end - spec.c_str());
    long times = 1;
    if (i < spec.size() && spec.compare(i, 2, "(x") == 0) {
      times = std::strtol(spec.c_str() + i + 2, &end, 10);
      i = static_cast<size_t>(end - spec.c_str()) + 1;  // past ')'
    }
    if (node < at + times) return n;
    at += times;
    if (i < spec.size() && spec[i] == ',') ++i;
    else break;
  }
  return 0;
}

// torchrun restarts its workers with a new count: a new daemon each time,
// and under `zerod serve --jobs` another job (Server::join).
std::string torchrun_restart() {
  return std::getenv("TORCHELASTIC_RESTART_COUNT") ? "restart=" + value("TORCHELASTIC_RESTART_COUNT") + ";" : "";
}

// Ranks of another size are another job.
std::string world_of(const LauncherRanks& r) {
  return "world=" + std::to_string(r.world) + "/" + std::to_string(r.local_world) + ";";
}

// The launcher's ids, "NAME=value;" each, ZEROD_JOB_KEY among them or not.
std::string ids_of(const Launcher& l, bool with_job_key) {
  std::string ids;
  for (const char* k : l.keys)
    if (k && named(k) && (with_job_key || std::string_view(k) != "ZEROD_JOB_KEY"))
      ids += std::string(k) + "=" + value(k) + ";";
  return ids;
}

std::string launch_key(const Launcher& l, const LauncherRanks& r) {
  const std::string ids = ids_of(l, true);
  std::string key = ids + torchrun_restart() + world_of(r);
  // No launcher id at all: the processes of one launch usually share a
  // parent (torchrun's agent, mpirun's, slurmstepd), though not when
  // each rank runs through a wrapper script of its own.
  if (ids.empty()) key += "parent=" + std::to_string(::getppid()) + ";";
  return key;
}

// ZEROD_JOB_KEY alone, without the launcher's ids: those change at every
// launch (Open MPI's PMIx namespace, Slurm's step, PMI's job id, the
// parent process), so with them a relaunch under mpirun or srun was another
// job to `zerod serve --jobs` and never got back what daemon.keep_state kept
// for it. torchrun's restart count stays: its restart is another job.
std::string hello_job_key(const Launcher& l, const LauncherRanks& r) {
  if (!named("ZEROD_JOB_KEY")) return launch_key(l, r);
  return "ZEROD_JOB_KEY=" + value("ZEROD_JOB_KEY") + ";" + torchrun_restart() + world_of(r);
}

// What the hello key leaves out: the launcher's ids alone, so that the
// daemon tells two launches running at once under one ZEROD_JOB_KEY apart
// (Server::join). Not the parent process: ranks of one launch that each
// run through a wrapper script have different parents, and would be
// refused as another launch.
std::string launch_id(const Launcher& l) { return ids_of(l, false); }

}  // namespace

std::optional<LauncherRanks> launcher_ranks() {
  for (const Launcher& l : kLaunchers) {
    const long n = number(l.size);
    if (n <= 1 || (l.only_with && !named(l.only_with))) continue;
    LauncherRanks r;
    r.launcher = l.who;
    r.world = static_cast<int>(n);
    r.rank = static_cast<int>(number(l.rank));
    const long local = number(l.local_rank);
    long local_world = l.local_size ? number(l.local_size) : slurm_local_tasks();
    r.local_rank = local >= 0 ? static_cast<int>(local) : r.rank;
    r.local_world = local_world > 0 ? static_cast<int>(local_world) : 0;
    const long node = number("ZEROD_NODE_RANK") >= 0 ? number("ZEROD_NODE_RANK") : (l.node ? number(l.node) : -1);
    r.node = node >= 0 ? static_cast<int>(node) : -1;
    r.where = std::string(l.rank) + "=" + value(l.rank) + ", " + l.size + "=" + std::to_string(n);
    if (local >= 0) r.where += std::string(", ") + l.local_rank + "=" + std::to_string(local);
    if (l.local_size && local_world > 0) r.where += std::string(", ") + l.local_size + "=" + std::to_string(local_world);
    r.job_key = launch_key(l, r);
    r.hello_job_key = hello_job_key(l, r);
    r.launch_id = launch_id(l);
    return r;
  }
  return std::nullopt;
}

}  // namespace zerod::abi
