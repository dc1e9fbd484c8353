#include "launcher_env.h"

#include <cstdlib>
#include <string>

namespace zerod::abi {

namespace {

// The variable's value as a count, or 0 when unset or not a number.
long count(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return 0;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return *end == 0 && n > 0 ? n : 0;
}

std::string value(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "?";
}

}  // namespace

std::string several_ranks_launcher() {
  struct Launcher {
    const char* who;
    const char* size;
    const char* rank;
  };
  // The step's task count for srun: an sbatch script's own environment has
  // SLURM_NTASKS for the whole allocation but runs one process.
  static const Launcher launchers[] = {
      {"torchrun (or another torch.distributed launcher: Lightning's, accelerate launch)", "WORLD_SIZE", "RANK"},
      {"mpirun (Open MPI)", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"},
      {"srun (Slurm)", "SLURM_STEP_NUM_TASKS", "SLURM_PROCID"},
      {"an MPI launcher (PMI)", "PMI_SIZE", "PMI_RANK"},
  };
  for (const Launcher& l : launchers) {
    const long n = count(l.size);
    if (n > 1)
      return std::string(l.who) + " started it as rank " + value(l.rank) + " of " + std::to_string(n) + " (" +
             l.rank + "=" + value(l.rank) + ", " + l.size + "=" + std::to_string(n) + ")";
  }
  return "";
}

}  // namespace zerod::abi
