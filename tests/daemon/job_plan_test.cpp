// What `zerod plan` works out (daemon/cli/job_plan.h), held to what
// finalize then holds: a plan for a GPU, made on a machine without one, is
// the emulated device's ledger after finalize, cell by cell, on every rank
// (the emulated device is what a GPU is to the layout: memory the host
// cannot address, blocks of 256 bytes). Before, such a plan could not be
// made (device = "cuda": "no NVIDIA driver"; "emulated": refused; "auto":
// the cpu device's figures, without the gradients' window on the device
// and the 48 MiB of page-locked staging buffers), and the device row
// rounded blocks to the cpu pool's 64 bytes.
#include "job_plan.h"

#include "device/emulated_device.h"
#include "error.h"
#include "job_script.h"
#include "model/model.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <stdlib.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace zerod::cli {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

std::unique_ptr<scripting::JobScript> job(const std::string& text) {
  scripting::ScriptSource src;
  src.text = text;
  src.name = "plan_case.lua";
  return scripting::JobScript::load(src);
}

// Sizes that are not multiples of 256 bytes (nor of the ranks), so that
// padding and the device's rounding show.
std::vector<PlannedTensor> odd_model() {
  return {{"embed.weight", "embed", {1000, 333}},
          {"block0.attn.weight", "block0", {777, 55}},
          {"block0.ln.bias", "block0", {4097}},
          {"block1.attn.weight", "block1", {513, 129}},
          {"head.weight", "head", {1001}}};
}

// The same job finalized on the emulated device (memory the host cannot
// address, as a daemon's ranks run it): every rank's ledger, [rank][tier][kind].
// A device budget where the plan was given a GPU's memory: the one the
// cuda device takes itself (kDefaultBudgetShare of its free memory).
std::vector<NeedTable> emulated_ledgers(scripting::JobScript& script, int world,
                                        const std::vector<PlannedTensor>& tensors, uint64_t device_memory) {
  JobConfig config = script.config();
  config.device = "emulated";
  DeviceFactory open = [device_memory](const std::string&, MemoryLedger& ledger, Workers& workers, int,
                                       const std::string& name) -> std::unique_ptr<Device> {
    if (device_memory != 0 && ledger.budget(ZD_TIER_DEVICE) == MemoryLedger::kNoBudget)
      ledger.set_budget(ZD_TIER_DEVICE, static_cast<uint64_t>(kDefaultBudgetShare * static_cast<double>(device_memory)));
    return std::make_unique<EmulatedDevice>(ledger, workers, /*exported=*/false, name);
  };
  Model model(config, script.make_plugins(world), &script, world, 0, -1, open);
  std::vector<std::thread> ranks;
  std::mutex mu;
  std::exception_ptr failed;
  for (int r = 0; r < world; ++r)
    ranks.emplace_back([&, r] {
      try {
        for (const PlannedTensor& t : tensors)
          model.register_param(r, t.name, t.module, config.precision, t.shape, nullptr, 0);
        model.finalize(r);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!failed) failed = std::current_exception();
      }
    });
  for (auto& t : ranks) t.join();
  if (failed) std::rethrow_exception(failed);
  std::vector<NeedTable> held(static_cast<size_t>(world), NeedTable(ZD_TIER_COUNT));
  for (int r = 0; r < world; ++r)
    for (int t = 0; t < ZD_TIER_COUNT; ++t)
      for (int k = 0; k < ZD_MEM_KIND_COUNT; ++k)
        held[static_cast<size_t>(r)][static_cast<size_t>(t)][static_cast<size_t>(k)] =
            model.ledger(r).current(static_cast<zd_tier>(t), static_cast<zd_mem_kind>(k));
  return held;
}

// Each rank's plan, from the groups the command prints.
std::vector<TierPlan> per_rank(const JobPlan& plan, int world) {
  std::vector<TierPlan> out(static_cast<size_t>(world));
  std::vector<int> seen(static_cast<size_t>(world), 0);
  for (const RankGroup& g : plan.groups)
    for (int r : g.ranks) {
      out[static_cast<size_t>(r)] = g.plan;
      ++seen[static_cast<size_t>(r)];
    }
  for (int r = 0; r < world; ++r) EXPECT_EQ(seen[static_cast<size_t>(r)], 1) << "rank " << r << " in one group";
  return out;
}

struct GpuCase {
  const char* name;
  std::string job;
  int world;
  uint64_t device_memory;  // 0: none given
  uint64_t host_buffers;   // the page-locked staging buffers expected on every rank
};

TEST(JobPlan, ACudaPlanWithoutAGpuIsTheEmulatedLedgerCellByCell) {
  const std::vector<GpuCase> cases = {
      // Gradients accumulate on the host and leave the device through the
      // 32 MiB staging buffer; new working copies go up the 16 MiB ring;
      // with 2 micro-batches the window's gradients are on the device
      // (they fit a quarter of the budget 90% of 8 GiB gives).
      {"stage 2, optimizer on the host, 2 micro-batches, an 8 GiB GPU",
       "return { zero = { stage = 2 }, offload = { optimizer = 'host' }, gradient_accumulation_steps = 2 }", 2,
       8192 * kMiB, 48 * kMiB},
      {"stage 3, parameters and optimizer on the host",
       "return { zero = { stage = 3 }, offload = { params = 'host', optimizer = 'host' } }", 2, 0, 32 * kMiB},
      {"stage 1, everything on the device, 3 ranks", "return { zero = { stage = 1 } }", 3, 0, 0},
      // A placement policy: only the ranks whose shards hold block0 have
      // state on the host, so ranks differ.
      {"stage 2, block0's state placed on the host, 4 ranks",
       "return { zero = { stage = 2 }, placement = function(t)\n"
       "  if t.module == 'block0' and t.kind ~= 'params' then return 'host' end\nend }",
       4, 0, 48 * kMiB},
  };
  for (const GpuCase& c : cases) {
    SCOPED_TRACE(c.name);
    auto script = job(c.job);
    const std::vector<PlannedTensor> tensors = odd_model();
    const JobPlan plan = plan_job(*script, c.world, tensors, PlanTarget{"cuda", c.device_memory});
    EXPECT_EQ(plan.device.rfind("cuda", 0), 0u) << plan.device;
    const std::vector<TierPlan> planned = per_rank(plan, c.world);
    const std::vector<NeedTable> held = emulated_ledgers(*script, c.world, tensors, c.device_memory);
    bool some_host_buffers = false;
    for (int r = 0; r < c.world; ++r) {
      const TierPlan& p = planned[static_cast<size_t>(r)];
      for (int t = 0; t < ZD_TIER_COUNT; ++t)
        for (int k = 0; k < ZD_MEM_KIND_COUNT; ++k)
          EXPECT_EQ(p.need[static_cast<size_t>(t)][static_cast<size_t>(k)],
                    held[static_cast<size_t>(r)][static_cast<size_t>(t)][static_cast<size_t>(k)])
              << "rank " << r << ", " << tier_name(t) << " " << mem_kind_name(k);
      const uint64_t buffers = p.need[ZD_TIER_HOST][ZD_MEM_BUFFERS];
      EXPECT_TRUE(buffers == 0 || buffers == c.host_buffers) << "rank " << r << ": " << buffers;
      some_host_buffers = some_host_buffers || buffers == c.host_buffers;
    }
    EXPECT_TRUE(some_host_buffers) << "the staging buffers a GPU needs are in the plan";
    if (c.device_memory != 0) {
      EXPECT_EQ(planned[0].budget[ZD_TIER_DEVICE],
                static_cast<uint64_t>(kDefaultBudgetShare * static_cast<double>(c.device_memory)));
      const std::string notes = plan.device_notes.empty() ? "" : plan.device_notes.back();
      EXPECT_NE(notes.find("of --device-memory 8.00 GiB"), std::string::npos) << notes;
    }
  }
}

// The first case planned for the cpu device instead: no staging buffers and
// no window on the device, so the GPU's plan is not the cpu's in disguise.
TEST(JobPlan, TheCpuPlanOfTheSameJobDiffers) {
  auto script = job("return { zero = { stage = 2 }, offload = { optimizer = 'host' }, gradient_accumulation_steps = 2 }");
  const JobPlan cpu = plan_job(*script, 2, odd_model(), PlanTarget{"cpu", 0});
  const JobPlan gpu = plan_job(*script, 2, odd_model(), PlanTarget{"cuda", 8192 * kMiB});
  EXPECT_EQ(cpu.device.rfind("cpu device", 0), 0u) << cpu.device;
  EXPECT_EQ(cpu.groups.front().plan.need[ZD_TIER_HOST][ZD_MEM_BUFFERS], 0u);
  EXPECT_EQ(gpu.groups.front().plan.need[ZD_TIER_HOST][ZD_MEM_BUFFERS], 48 * kMiB);
  EXPECT_EQ(cpu.groups.front().plan.need[ZD_TIER_DEVICE][ZD_MEM_GRADS], 0u) << "no window on the cpu device";
  EXPECT_GT(gpu.groups.front().plan.need[ZD_TIER_DEVICE][ZD_MEM_GRADS], 0u) << "the window on the GPU";
}

// Ranks whose shards hold different tensors need different amounts; the
// plan judges by the most any rank needs in each cell, as finalize does
// (it once looked at the first and last ranks only, and said a job fits
// that finalize refused on rank 1).
TEST(JobPlan, EveryRankCountsAndIdenticalRanksAreGrouped) {
  // Four equal layers on four ranks: rank 1's shard is layer1, whose
  // master and moments (32 MiB) the policy puts in 8 MiB of host memory.
  std::vector<PlannedTensor> layers;
  for (int l = 0; l < 4; ++l)
    layers.push_back({"layer" + std::to_string(l) + ".weight", "layer" + std::to_string(l), {2048, 1024}});
  auto script = job(
      "return { zero = { stage = 2 }, budgets = { host = '8MiB' }, placement = function(t)\n"
      "  if t.module == 'layer1' and t.kind ~= 'params' then return 'host' end\nend }");
  const JobPlan plan = plan_job(*script, 4, layers, PlanTarget{"cpu", 0});
  EXPECT_FALSE(plan.fits);
  ASSERT_EQ(plan.groups.size(), 2u);
  EXPECT_EQ(rank_list(plan.groups[0].ranks), "ranks 0, 2-3");
  EXPECT_EQ(rank_list(plan.groups[1].ranks), "rank 1");
  bool fits = true;
  Placement::table(plan.groups[0].plan, &fits);
  EXPECT_TRUE(fits) << "the first and last ranks fit";
  Placement::table(plan.groups[1].plan, &fits);
  EXPECT_FALSE(fits) << "rank 1 does not";
  EXPECT_EQ(plan.groups[1].plan.need[ZD_TIER_HOST][ZD_MEM_OPTIMIZER], 16 * kMiB);
  // The most in each cell: rank 1's host row, the others' device row.
  EXPECT_FALSE(plan.worst_is_a_rank);
  EXPECT_EQ(plan.worst.need[ZD_TIER_HOST][ZD_MEM_MASTER], 8 * kMiB);
  EXPECT_EQ(plan.worst.need[ZD_TIER_DEVICE][ZD_MEM_MASTER], 8 * kMiB);
  // A job whose every rank fits.
  auto roomy = job("return { zero = { stage = 2 }, budgets = { host = '1GiB' } }");
  const JobPlan fitting = plan_job(*roomy, 4, layers, PlanTarget{"cpu", 0});
  EXPECT_TRUE(fitting.fits);
  ASSERT_EQ(fitting.groups.size(), 1u);
  EXPECT_EQ(rank_list(fitting.groups[0].ranks), "ranks 0-3");
  EXPECT_TRUE(fitting.worst_is_a_rank);
}

TEST(JobPlan, ADeviceMemoryIsForAGpuOnly) {
  auto script = job("return { zero = { stage = 2 } }");
  try {
    plan_job(*script, 1, odd_model(), PlanTarget{"cpu", 8192 * kMiB});
    FAIL() << "--device-memory with the cpu device";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ZD_ERR_CONFIG);
    EXPECT_NE(std::string(e.what()).find("--device-memory is a GPU's memory"), std::string::npos) << e.what();
  }
}

// A job's snapshot.path is created and locked when its Model is built: a
// plan made while the job runs (which holds the lock) waited comm.timeout,
// then failed with "snapshot.path ... is in use", and a plan of a job not
// yet started made its folder. The trace's folder likewise. A plan writes
// nothing.
TEST(JobPlan, AJobWithSnapshotsIsPlannedWithoutTouchingItsPath) {
  std::string scratch = ::testing::TempDir() + "job_plan_XXXXXX";
  ASSERT_NE(::mkdtemp(scratch.data()), nullptr);
  const std::string held = scratch + "/held", fresh = scratch + "/fresh", traces = scratch + "/traces";
  // The running job's lock on its path.
  std::filesystem::create_directories(held);
  const int lock = ::open((held + "/.zerod.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(lock, 0);
  ASSERT_EQ(::flock(lock, LOCK_EX | LOCK_NB), 0);
  const auto start = std::chrono::steady_clock::now();
  auto running = job("return { snapshot = { path = '" + held + "', every = 5 }, comm = { timeout = 5 } }");
  EXPECT_NO_THROW(plan_job(*running, 2, odd_model(), PlanTarget{"cpu", 0}));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0)
      << "the plan waited for the running job's lock";
  auto unstarted = job("return { snapshot = { path = '" + fresh + "' }, trace = { path = '" + traces +
                       "/plan.json' }, metrics = { listen = '127.0.0.1:9400' } }");
  EXPECT_NO_THROW(plan_job(*unstarted, 2, odd_model(), PlanTarget{"cpu", 0}));
  EXPECT_FALSE(std::filesystem::exists(fresh)) << "the plan made the snapshot folder";
  EXPECT_FALSE(std::filesystem::exists(traces)) << "the plan made the trace's folder";
  ::close(lock);
  std::filesystem::remove_all(scratch);
}

// The plan runs no collectives: a job on the nccl backend is planned on a
// machine without a GPU (docs/offload.md), where creating its comm plugin
// refused ("the nccl backend runs collectives on GPUs, but this daemon sees
// none"). Skipped in a build without the nccl plugin.
TEST(JobPlan, ANcclJobIsPlannedWithoutAGpu) {
  std::unique_ptr<scripting::JobScript> script;
  try {
    script = job("return { device = 'cuda', zero = { stage = 2 }, comm = { backend = 'nccl' } }");
  } catch (const Error& e) {
    GTEST_SKIP() << "no nccl comm plugin in this build: " << e.what();
  }
  const JobPlan plan = plan_job(*script, 2, odd_model(), PlanTarget{"", 8192 * kMiB});
  EXPECT_EQ(plan.device, "cuda");
  EXPECT_TRUE(plan.fits);
}

// Each cell of 922337203685480000 fp32 parameters with Adam's state fits in
// 64 bits; the device row's total (20 bytes a parameter) did not, wrapped
// to 5.58 MiB, and the plan said it fits 80 GiB.
TEST(JobPlan, ATotalPast64BitsDoesNotFit) {
  auto script = job("return { precision = 'fp32', optimizer = { type = 'adamw' }, budgets = { device = '80GiB' } }");
  const int64_t total = 922337203685480000;
  const int64_t layers = 10000;
  std::vector<PlannedTensor> tensors;
  for (int64_t l = 0; l < layers; ++l)
    tensors.push_back({"layer" + std::to_string(l) + ".weight", "layer" + std::to_string(l), {total / layers}});
  const JobPlan plan = plan_job(*script, 1, tensors, PlanTarget{"cpu", 0});
  EXPECT_FALSE(plan.fits);
  const std::string table = Placement::table(plan.worst, nullptr);
  EXPECT_NE(table.find("over 2^64 B"), std::string::npos) << table;
  EXPECT_NE(table.find("<- over budget"), std::string::npos) << table;
}

TEST(JobPlan, RankListsAreRanges) {
  EXPECT_EQ(rank_list({3}), "rank 3");
  EXPECT_EQ(rank_list({0, 1, 2}), "ranks 0-2");
  EXPECT_EQ(rank_list({0, 2, 3, 5}), "ranks 0, 2-3, 5");
}

}  // namespace
}  // namespace zerod::cli
