// What libzerod makes of another launcher's variables (libzerod/src/
// launcher_env.h, which libzerod does not export: built into this test):
// the key that names the launch's own daemon, and the one a rank's hello
// names its job by to a daemon serving several (`zerod serve --jobs`).
#include "abi_fixture.h"
#include "launcher_env.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

using namespace zerod_test;

namespace {

// Every variable a launcher sets, unset for the test; then the test's own.
class LauncherEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name :
         {"ZEROD_WORLD_SIZE", "ZEROD_RANK", "ZEROD_LOCAL_RANK", "ZEROD_LOCAL_WORLD_SIZE", "ZEROD_NODE_RANK",
          "ZEROD_JOB_KEY", "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
          "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid",
          "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "TORCHELASTIC_RUN_ID",
          "TORCHELASTIC_RESTART_COUNT", "SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID",
          "SLURM_STEP_TASKS_PER_NODE", "SLURM_JOB_ID", "SLURM_STEP_ID", "PMI_SIZE", "PMI_RANK", "MPI_LOCALRANKID",
          "MPI_LOCALNRANKS", "PMI_JOBID"})
      set(name, nullptr);
  }
  void set(const char* name, const char* value) { env_.push_back(std::make_unique<ScopedEnv>(name, value)); }
  void set(const std::vector<std::pair<const char*, const char*>>& vars) {
    for (const auto& [name, value] : vars) set(name, value);
  }
  zerod::abi::LauncherRanks ranks() {
    const auto r = zerod::abi::launcher_ranks();
    if (!r) throw std::runtime_error("the environment says one process");
    return *r;
  }

 private:
  std::vector<std::unique_ptr<ScopedEnv>> env_;
};

const std::vector<std::pair<const char*, const char*>> kMpirun = {
    {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
    {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"PMIX_NAMESPACE", "prterun-a@1"}, {"OMPI_MCA_ess_base_jobid", "42"}};

}  // namespace

// mpirun's ranks given ZEROD_JOB_KEY name their job by it alone: the next
// mpirun (another PMIx namespace and job id) names the same job, and gets
// back the model daemon.keep_state kept for it. Each launch still has a
// daemon of its own when the ranks start one.
TEST_F(LauncherEnv, AJobKeyNamesTheJobWithoutTheLaunchersIds) {
  set(kMpirun);
  set("ZEROD_JOB_KEY", "trainer");
  const zerod::abi::LauncherRanks first = ranks();
  EXPECT_EQ(first.hello_job_key, "ZEROD_JOB_KEY=trainer;world=2/2;");
  EXPECT_NE(first.job_key.find("PMIX_NAMESPACE=prterun-a@1;"), std::string::npos) << first.job_key;
  set({{"PMIX_NAMESPACE", "prterun-b@1"}, {"OMPI_MCA_ess_base_jobid", "43"}});
  const zerod::abi::LauncherRanks relaunch = ranks();
  EXPECT_EQ(relaunch.hello_job_key, first.hello_job_key);
  EXPECT_NE(relaunch.job_key, first.job_key);
}

TEST_F(LauncherEnv, AJobKeyUnderSrunLeavesTheStepOut) {
  set({{"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}, {"SLURM_NODEID", "0"},
       {"SLURM_STEP_TASKS_PER_NODE", "2"}, {"SLURM_JOB_ID", "7"}, {"SLURM_STEP_ID", "3"}, {"ZEROD_JOB_KEY", "7"}});
  EXPECT_EQ(ranks().hello_job_key, "ZEROD_JOB_KEY=7;world=2/2;");
}

// torchrun's restart is another job, ZEROD_JOB_KEY or not (under torchrun a
// job resumes from its snapshots).
TEST_F(LauncherEnv, AJobKeyUnderTorchrunKeepsTheRestartCount) {
  set({{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "2"},
       {"TORCHELASTIC_RUN_ID", "abc"}, {"TORCHELASTIC_RESTART_COUNT", "1"}, {"MASTER_ADDR", "127.0.0.1"},
       {"MASTER_PORT", "29500"}, {"ZEROD_JOB_KEY", "t"}});
  EXPECT_EQ(ranks().hello_job_key, "ZEROD_JOB_KEY=t;restart=1;world=2/2;");
}

// Without ZEROD_JOB_KEY the hello names the launch: the daemon keeps nothing
// for it (Server::join), as no relaunch can name it again.
TEST_F(LauncherEnv, WithoutAJobKeyTheHelloNamesTheLaunch) {
  set(kMpirun);
  const zerod::abi::LauncherRanks mpirun = ranks();
  EXPECT_EQ(mpirun.hello_job_key, "PMIX_NAMESPACE=prterun-a@1;OMPI_MCA_ess_base_jobid=42;world=2/2;");
  EXPECT_EQ(mpirun.hello_job_key, mpirun.job_key);
}

TEST_F(LauncherEnv, RanksStartedByHandWithoutAnIdAreKeyedByTheirParent) {
  set({{"ZEROD_WORLD_SIZE", "2"}, {"ZEROD_RANK", "1"}, {"ZEROD_LOCAL_WORLD_SIZE", "2"}});
  const std::string parent = "world=2/2;parent=" + std::to_string(::getppid()) + ";";
  EXPECT_EQ(ranks().hello_job_key, parent);
  set("ZEROD_JOB_KEY", "by-hand");
  EXPECT_EQ(ranks().hello_job_key, "ZEROD_JOB_KEY=by-hand;world=2/2;");
}

// ZEROD_JOB_KEY set to "" (a script's `export ZEROD_JOB_KEY=$UNSET`) names
// no job: the ranks are keyed by their launch, as without it. Before, every
// such launch on the node was one job "ZEROD_JOB_KEY=;world=2/2;".
TEST_F(LauncherEnv, AnEmptyJobKeyIsUnset) {
  set(kMpirun);
  set("ZEROD_JOB_KEY", "");
  const zerod::abi::LauncherRanks r = ranks();
  EXPECT_EQ(r.hello_job_key, "PMIX_NAMESPACE=prterun-a@1;OMPI_MCA_ess_base_jobid=42;world=2/2;");
  EXPECT_EQ(r.job_key, r.hello_job_key);
}

// Beside ZEROD_JOB_KEY the hello says which launch the rank is of (the
// launcher's ids), so that the daemon refuses a second launch running at
// once under the same key (Server::join); a launcher that gives no id
// says none (ranks of one launch with wrapper scripts of their own have
// different parents).
TEST_F(LauncherEnv, TheHelloSaysWhichLaunchWithoutTheJobKey) {
  set(kMpirun);
  set("ZEROD_JOB_KEY", "trainer");
  EXPECT_EQ(ranks().launch_id, "PMIX_NAMESPACE=prterun-a@1;OMPI_MCA_ess_base_jobid=42;");
  set({{"PMIX_NAMESPACE", "prterun-b@1"}, {"OMPI_MCA_ess_base_jobid", "43"}});
  EXPECT_EQ(ranks().launch_id, "PMIX_NAMESPACE=prterun-b@1;OMPI_MCA_ess_base_jobid=43;");
}

TEST_F(LauncherEnv, RanksStartedByHandWithoutAnIdSayNoLaunch) {
  set({{"ZEROD_WORLD_SIZE", "2"}, {"ZEROD_RANK", "1"}, {"ZEROD_LOCAL_WORLD_SIZE", "2"}, {"ZEROD_JOB_KEY", "k"}});
  EXPECT_EQ(ranks().launch_id, "");
}

// DeepSpeed's own launcher (`deepspeed train.py`, deepspeed.launcher.launch)
// sets torchrun's RANK, WORLD_SIZE and LOCAL_RANK, the node's ranks as
// LOCAL_SIZE and the node as CROSS_RANK, never LOCAL_WORLD_SIZE or
// GROUP_RANK: read as torchrun's, its ranks were refused for not saying how
// many run on the node.
TEST_F(LauncherEnv, DeepSpeedsLauncherSaysTheNodesRanksInLocalSize) {
  set({{"WORLD_SIZE", "4"}, {"RANK", "3"}, {"LOCAL_RANK", "1"}, {"LOCAL_SIZE", "2"}, {"CROSS_RANK", "1"},
       {"CROSS_SIZE", "2"}, {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}});
  const zerod::abi::LauncherRanks r = ranks();
  EXPECT_EQ(r.launcher, "DeepSpeed's launcher (deepspeed)");
  EXPECT_EQ(r.world, 4);
  EXPECT_EQ(r.rank, 3);
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.local_world, 2);
  EXPECT_EQ(r.node, 1);
  EXPECT_EQ(r.where, "RANK=3, WORLD_SIZE=4, LOCAL_RANK=1, LOCAL_SIZE=2");
}

// torchrun's ranks (no CROSS_RANK) are still torchrun's, LOCAL_SIZE or not.
TEST_F(LauncherEnv, TorchrunsRanksAreNotTakenForDeepSpeeds) {
  set({{"WORLD_SIZE", "2"}, {"RANK", "1"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}, {"GROUP_RANK", "0"},
       {"LOCAL_SIZE", "2"}, {"CROSS_RANK", nullptr}, {"CROSS_SIZE", nullptr}});
  const zerod::abi::LauncherRanks r = ranks();
  EXPECT_EQ(r.launcher.rfind("torchrun", 0), 0u) << r.launcher;
  EXPECT_EQ(r.local_world, 2);
  EXPECT_EQ(r.node, 0);
}
