// When a daemon started by mpirun takes back the CPUs mpirun's default
// binding took from it (daemon/cli/mpi_binding.h), and when it keeps a binding.
#include "mpi_binding.h"

#include "runtime/thread_pool.h"

#include <gtest/gtest.h>

#include <sched.h>

#include <algorithm>
#include <thread>

namespace zerod::cli {
namespace {

using Env = std::map<std::string, std::string>;
const Env kMpirun{{"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "0"}};

TEST(MpiBinding, WidensMpirunsDefaultBinding) {
  EXPECT_TRUE(should_release_mpi_binding(kMpirun, {0}, {0, 1, 2, 3}));
  EXPECT_TRUE(should_release_mpi_binding(kMpirun, {0, 1}, {0, 1, 2, 3}));  // a socket of two
}

TEST(MpiBinding, KeepsABindingAskedFor) {
  Env env = kMpirun;
  env["OMPI_MCA_hwloc_base_binding_policy"] = "core";
  EXPECT_FALSE(should_release_mpi_binding(env, {0}, {0, 1, 2, 3}));
}

TEST(MpiBinding, LeavesEveryOtherLauncherAlone) {
  EXPECT_FALSE(should_release_mpi_binding(Env{}, {0}, {0, 1}));  // taskset, numactl, a shell
  EXPECT_FALSE(should_release_mpi_binding(Env{{"SLURM_PROCID", "0"}, {"SLURM_STEP_NUM_TASKS", "2"}}, {0}, {0, 1}));
  EXPECT_FALSE(should_release_mpi_binding(Env{{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}}, {0}, {0, 1}));
}

TEST(MpiBinding, NothingToDoWhenEveryCpuIsOurs) {
  EXPECT_FALSE(should_release_mpi_binding(kMpirun, {0, 1}, {0, 1}));
  EXPECT_FALSE(should_release_mpi_binding(kMpirun, {}, {0, 1}));  // unreadable: left alone
}

TEST(MpiBinding, CpuListsReadAndWritten) {
  EXPECT_EQ(parse_cpu_list("0-3,8,10-11\n"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parse_cpu_list("0"), (std::vector<int>{0}));
  EXPECT_TRUE(parse_cpu_list("0-x").empty());
  EXPECT_TRUE(parse_cpu_list("3-1").empty());
  EXPECT_TRUE(parse_cpu_list("").empty());
  EXPECT_EQ(format_cpu_list({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(format_cpu_list({5}), "5");
}

void bind_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  ASSERT_EQ(sched_setaffinity(0, sizeof set, &set), 0);
}

// The real call, on a thread of its own (the affinity is per thread), bound
// to one CPU as mpirun would bind the process.
TEST(MpiBinding, TheBoundThreadGetsEveryCpuBack) {
  const std::vector<int> all = affinity_cpus();
  if (all.size() < 2) GTEST_SKIP() << "this process may run on one CPU only, so no binding can be narrower";
  std::vector<int> widened, kept;
  std::string said, said_kept;
  std::thread([&] {
    bind_to(all.back());
    said = release_mpi_binding(kMpirun);
    widened = affinity_cpus();
    bind_to(all.back());
    Env asked = kMpirun;
    asked["OMPI_MCA_hwloc_base_binding_policy"] = "core";
    said_kept = release_mpi_binding(asked);
    kept = affinity_cpus();
  }).join();
  // Every CPU the process had, at least (all online ones the cpuset allows).
  for (int c : all) EXPECT_NE(std::find(widened.begin(), widened.end(), c), widened.end()) << "CPU " << c;
  EXPECT_NE(said.find("mpirun bound this process to CPUs " + std::to_string(all.back())), std::string::npos) << said;
  EXPECT_EQ(kept, std::vector<int>{all.back()});
  EXPECT_EQ(said_kept, "");
}

}  // namespace
}  // namespace zerod::cli
