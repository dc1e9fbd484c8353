// The engine on a device the host cannot address trains as it does on the
// cpu device: the same model, gradients and steps end with the same
// parameters, at stage 0 with everything on the device, and at stage 3 with
// the optimizer on the host and with parameters and optimizer on NVMe; the
// device bytes stay within the live window. Two such devices:
//  - "opaque", emulated on the CPU (opaque_device.h): any host access to its
//    memory crashes, and it runs the CPU kernels, so the parameters must be
//    bit-identical to the cpu device's. Runs everywhere.
//  - "cuda", where this process sees a GPU (within the GPU's rounding);
//    reported skipped, with the reason, elsewhere.
#include "zero_fixture.h"

#include "device/select.h"
#include "runtime/dtype.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <thread>

using namespace zerod_test;

namespace {

struct Case {
  const char* name;
  int stage;
  zd_tier params, optimizer;
  zd_dtype precision;
  int world = 1;
  double ratio = 1.0;  // offload.ratio: whole tensors, the last ones, off the device
};

// The trainer's side, on every rank: reads the working copy through the
// device, writes a gradient that depends on it and on the rank.
std::vector<std::vector<float>> train(JobOptions o, int world, const std::vector<int64_t>& sizes, int steps,
                                      uint64_t* device_peak, uint64_t* peer_ops = nullptr,
                                      uint64_t* device_optimizer_peak = nullptr) {
  auto model = make_model(o, world);
  std::vector<std::vector<float>> out(sizes.size());
  run_ranks(world, [&](int rank) {
    Device& d = const_cast<Device&>(model->device(rank));
    const std::vector<zd_param_id> ids = register_sine_modules(*model, rank, sizes, o.precision);
    for (int s = 0; s < steps; ++s) {
      std::vector<std::vector<float>> w = forward_reading(*model, d, rank, ids);
      for (size_t m = ids.size(); m-- > 0;) {
        model->backward_begin(rank, static_cast<zd_module_id>(m));
        const ViewInfo g = model->grad_view(rank, ids[m]);
        std::vector<float> grad(w[m].size());
        for (size_t j = 0; j < grad.size(); ++j) grad[j] = w[m][j] - std::cos(static_cast<float>(j + s + rank));
        write_view(d, g, grad);
        model->backward_end(rank, static_cast<zd_module_id>(m));
      }
      model->step(rank);
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      std::vector<float> v(static_cast<size_t>(model->registry().param(ids[i]).numel));
      model->read_param(rank, ids[i], ZD_DTYPE_F32, v.data(), v.size() * 4);
      if (rank == 0) out[i] = std::move(v);
    }
  });
  if (device_peak) *device_peak = model->ledger(0).peak(ZD_TIER_DEVICE, ZD_MEM_ALL);
  if (device_optimizer_peak) *device_optimizer_peak = model->ledger(0).peak(ZD_TIER_DEVICE, ZD_MEM_OPTIMIZER);
  if (peer_ops)
    if (const auto* od = dynamic_cast<const OpaqueDevice*>(&model->device(0).unwrapped())) *peer_ops = od->peer_ops();
  return out;
}

class OnDevice : public ::testing::TestWithParam<std::tuple<std::string, Case>> {};

TEST_P(OnDevice, TrainsAsTheCpuDeviceDoes) {
  const auto& [device, c] = GetParam();
  if (device == "cuda") {
    const CudaAvailability a = cuda_availability();
    if (a.devices == 0) GTEST_SKIP() << "the cuda device cannot be tested here: " << a.why;
  }
  const std::string dir = std::filesystem::temp_directory_path() / ("zerod-cuda-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  JobOptions o;
  o.stage = c.stage;
  o.precision = c.precision;
  o.optimizer_hparams = {{"lr", 1e-2}, {"weight_decay", 0.01}};
  if (c.stage == 3)
    o.zero_hparams = {{"param_persistence_threshold", 0}, {"max_live_parameters", 1 << 17},
                      {"prefetch_bucket_size", 1 << 16}, {"reduce_bucket_size", 1 << 16}};
  o.offload.params = c.params;
  o.offload.optimizer = c.optimizer;
  o.offload.ratio = c.ratio;
  o.offload.nvme_paths = {dir};
  o.offload.nvme_tile_elems = 1 << 16;
  const std::vector<int64_t> sizes = {70000, 5000, 1 << 16, 333};
  const auto cpu = train(o, c.world, sizes, 5, nullptr);
  o.device = device;
  uint64_t peak = 0, peer_ops = 0;
  const auto got = train(o, c.world, sizes, 5, &peak, &peer_ops);
  std::filesystem::remove_all(dir);
  ASSERT_EQ(cpu.size(), got.size());
  if (device == "opaque") {
    EXPECT_TRUE(got == cpu) << c.name << ": the same kernels on the same values";
    // Several ranks in one process read each other's pools on the device
    // (the PeerBoard), never through host memory.
    if (c.world > 1) {
      EXPECT_GT(peer_ops, 0u) << c.name << ": the collectives ran between the devices";
    }
  } else {
    // The optimizer rounds alike on both; the gradient norm is summed in
    // another order on the GPU, and bf16 working copies round from masters
    // that may differ in the last bit.
    const double tol = c.precision == ZD_DTYPE_F32 ? 1e-5 : 1e-2;
    for (size_t i = 0; i < cpu.size(); ++i)
      for (size_t j = 0; j < cpu[i].size(); ++j)
        ASSERT_NEAR(got[i][j], cpu[i][j], tol * (1 + std::fabs(cpu[i][j]))) << c.name << " param " << i << "[" << j << "]";
  }
  if (c.stage == 3 && c.params != ZD_TIER_DEVICE) {
    // The live window (as offload_test.cpp's LiveWindow): gathered modules
    // and the one begun beyond them, a bucket's buffers, the bucket sent and
    // received; nothing of the state itself.
    const uint64_t largest = 70000, max_live = 1 << 17, bucket = 1 << 16;
    const uint64_t bound = (max_live + largest + 3 * (bucket + largest)) * dtype_size(c.precision);
    EXPECT_LE(peak, bound) << "the device holds the live window";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Placements, OnDevice,
    ::testing::Combine(::testing::Values("opaque", "cuda"), ::testing::Values(Case{"stage0_device_f32", 0, ZD_TIER_DEVICE, ZD_TIER_DEVICE, ZD_DTYPE_F32},
                      Case{"stage0_device_bf16", 0, ZD_TIER_DEVICE, ZD_TIER_DEVICE, ZD_DTYPE_BF16},
                      Case{"stage3_device_f32", 3, ZD_TIER_DEVICE, ZD_TIER_DEVICE, ZD_DTYPE_F32},
                      Case{"stage3_optimizer_host_bf16", 3, ZD_TIER_DEVICE, ZD_TIER_HOST, ZD_DTYPE_BF16},
                      Case{"stage3_params_host_optimizer_host_f32", 3, ZD_TIER_HOST, ZD_TIER_HOST, ZD_DTYPE_F32},
                      Case{"stage3_params_nvme_optimizer_nvme_bf16", 3, ZD_TIER_NVME, ZD_TIER_NVME, ZD_DTYPE_BF16},
                      // Several ranks: collectives go through host memory.
                      Case{"stage0_device_f32_2ranks", 0, ZD_TIER_DEVICE, ZD_TIER_DEVICE, ZD_DTYPE_F32, 2},
                      Case{"stage1_optimizer_host_bf16_2ranks", 1, ZD_TIER_DEVICE, ZD_TIER_HOST, ZD_DTYPE_BF16, 2},
                      Case{"stage2_device_f32_2ranks", 2, ZD_TIER_DEVICE, ZD_TIER_DEVICE, ZD_DTYPE_F32, 2},
                      Case{"stage3_params_host_optimizer_host_bf16_2ranks", 3, ZD_TIER_HOST, ZD_TIER_HOST,
                           ZD_DTYPE_BF16, 2},
                      // Part of the optimizer on the device, part on the host
                      // (offload.ratio: whole tensors on these devices).
                      Case{"stage0_optimizer_host_ratio_f32", 0, ZD_TIER_DEVICE, ZD_TIER_HOST, ZD_DTYPE_F32, 1, 0.5},
                      Case{"stage3_optimizer_host_ratio_bf16", 3, ZD_TIER_DEVICE, ZD_TIER_HOST, ZD_DTYPE_BF16, 1, 0.5},
                      Case{"stage3_optimizer_nvme_ratio_f32", 3, ZD_TIER_DEVICE, ZD_TIER_NVME, ZD_DTYPE_F32, 1, 0.3},
                      Case{"stage2_optimizer_host_ratio_bf16_2ranks", 2, ZD_TIER_DEVICE, ZD_TIER_HOST, ZD_DTYPE_BF16,
                           2, 0.5})),
    [](const ::testing::TestParamInfo<std::tuple<std::string, Case>>& p) {
      return std::get<0>(p.param) + "_" + std::get<1>(p.param).name;
    });

// offload.ratio on a device the host cannot address moves whole tensors,
// the last ones registered, until at least the ratio's share of the
// elements is off the device (Placement::apply_ratio_by_tensor): here
// 333 + 65536 + 5000 of 140869 elements reach half; the first tensor's
// master and state stay on the device, in a group of their own. The cpu
// device cuts inside the group instead (the first elements leave).
TEST(OpaqueDeviceRatio, MovesWholeTensorsTheLastOnesFirst) {
  for (const char* device : {"opaque", "cpu"}) {
    SCOPED_TRACE(device);
    JobOptions o;
    o.device = device;
    o.offload.optimizer = ZD_TIER_HOST;
    o.offload.ratio = 0.5;
    auto model = make_model(o, 1);
    const std::vector<int64_t> sizes = {70000, 5000, 1 << 16, 333};
    for (size_t i = 0; i < sizes.size(); ++i)
      model->register_param(0, "w" + std::to_string(i), "m" + std::to_string(i), ZD_DTYPE_F32, {sizes[i]}, nullptr,
                            0);
    model->finalize(0);
    const uint64_t device_master = model->ledger(0).current(ZD_TIER_DEVICE, ZD_MEM_MASTER);
    const uint64_t host_master = model->ledger(0).current(ZD_TIER_HOST, ZD_MEM_MASTER);
    if (std::string(device) == "opaque") {
      // The first tensor's 70000 fp32 masters, rounded up to the device's
      // block; the other three's on the host (each 64-byte aligned).
      EXPECT_GE(device_master, 70000u * 4);
      EXPECT_LT(device_master, 70000u * 4 + (1u << 16));
      EXPECT_GE(host_master, (5000u + 65536u + 333u) * 4);
      EXPECT_LT(host_master, (5000u + 65536u + 333u + 3 * 32) * 4 + 64);
      EXPECT_EQ(model->registry().groups().size(), 2u) << "the masters kept on the device are a group of their own";
    } else {
      EXPECT_EQ(model->registry().groups().size(), 1u);
      // Half the elements, the first ones, to a tier boundary's granule.
      EXPECT_GE(host_master, (140869u / 2 - 4096) * 4);
      EXPECT_LE(host_master, (140869u / 2 + 4096) * 4);
    }
  }
}

// A stage-3 shard off the device keeps its tensor's optimizer off it too
// (the device's update writes the shard in place): with offload.params on
// the host the ratio keeps nothing on the device, finalize says so, and
// does not refuse the job.
TEST(OpaqueDeviceRatio, ShardsOffTheDeviceTakeTheirOptimizerWithThem) {
  JobOptions o;
  o.device = "opaque";
  o.stage = 3;
  o.offload.params = ZD_TIER_HOST;
  o.offload.optimizer = ZD_TIER_HOST;
  o.offload.ratio = 0.5;
  auto model = make_model(o, 1);
  model->register_param(0, "w0", "m0", ZD_DTYPE_F32, {4096}, nullptr, 0);
  model->register_param(0, "w1", "m1", ZD_DTYPE_F32, {4096}, nullptr, 0);
  ::testing::internal::CaptureStderr();
  model->finalize(0);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(model->ledger(0).current(ZD_TIER_DEVICE, ZD_MEM_MASTER), 0u);
  EXPECT_NE(log.find("offload.ratio = 0.5 keeps nothing on the device"), std::string::npos) << log;
}

// The one intended change of behaviour of issue 34 §2: 1-bit Adam (and the
// other compressing optimizers, and per-tensor figures) was refused on a
// device the host cannot address ("... does not support yet; use device =
// \"cpu\""); its host loops now reach the pool through host windows, so
// the model is made and finalized, and trains (CompressingOnDevice below
// compares its bits with the cpu device's).
TEST(OpaqueDeviceLimits, CompressingOptimizersAreNoLongerRefused) {
  JobOptions o;
  o.device = "opaque";
  o.optimizer = "onebit_adam";
  o.optimizer_hparams = {{"lr", 1e-2}, {"freeze_step", 1}};
  std::vector<std::vector<float>> got;
  ASSERT_NO_THROW(got = train(o, 1, {4096}, 3, nullptr));
  ASSERT_EQ(got.size(), 1u);
  bool moved = false;
  for (size_t j = 0; j < got[0].size(); ++j) moved = moved || got[0][j] != std::sin(static_cast<float>(j)) * 0.1f;
  EXPECT_TRUE(moved) << "the steps moved the parameters";
}

// Momentum compression and per-tensor figures on a device the host cannot
// address: 1-bit Adam (an exchange per tensor, the kept average's signs),
// 0/1 Adam (passes that write the exchange buffer, exchanges of what a pass
// wrote) and 1-bit LAMB (a fused exchange of each group, per-tensor
// statistics and trust ratios), at every stage, with one and two ranks,
// end with the cpu device's bits: the host runs the same loops on host
// copies of the bytes in the pool (HostWindow), and what they wrote goes
// back. A copy not written back, or one not filled, ends elsewhere (and a
// loop touching the pool itself crashes: the opaque device's memory is not
// readable by the host).
JobOptions compressing_job(const std::string& opt, int stage) {
  JobOptions o;
  o.stage = stage;
  o.optimizer = opt;
  o.optimizer_hparams = {{"lr", 1e-2}, {"weight_decay", 0.01}};
  // Compressed steps from the third on (0/1 Adam: 1-bit gradient steps at
  // 3 and 5, its variance frozen after 4, momentum syncs after).
  if (opt == "zero_one_adam")
    o.optimizer_hparams.insert(o.optimizer_hparams.end(),
                               {{"var_freeze_step", 4}, {"var_update_scaler", 2}, {"local_steps", 0}});
  else
    o.optimizer_hparams.emplace_back("freeze_step", 2);
  if (stage == 3)
    o.zero_hparams = {{"param_persistence_threshold", 0}, {"max_live_parameters", 1 << 17},
                      {"prefetch_bucket_size", 1 << 16}, {"reduce_bucket_size", 1 << 16}};
  return o;
}

const std::vector<int64_t> kCompressedSizes = {70000, 5000, 1 << 16, 333};
constexpr int kCompressedSteps = 7;

void expect_same_bits(const std::vector<std::vector<float>>& cpu, const std::vector<std::vector<float>>& got,
                      const std::string& what) {
  ASSERT_EQ(cpu.size(), got.size()) << what;
  for (size_t i = 0; i < cpu.size(); ++i) {
    ASSERT_EQ(cpu[i].size(), got[i].size()) << what;
    size_t differ = 0, first = cpu[i].size();
    for (size_t j = 0; j < cpu[i].size(); ++j)
      if (std::memcmp(&cpu[i][j], &got[i][j], 4) != 0) {
        ++differ;
        first = std::min(first, j);
      }
    EXPECT_EQ(differ, 0u) << what << ": parameter " << i << " differs in " << differ
                          << " elements from the cpu device's, the first at " << first;
  }
}

class CompressingOnDevice : public ::testing::TestWithParam<std::tuple<std::string, int, int>> {};

TEST_P(CompressingOnDevice, TrainsAsTheCpuDeviceDoes) {
  const auto& [opt, stage, world] = GetParam();
  JobOptions o = compressing_job(opt, stage);
  const auto cpu = train(o, world, kCompressedSizes, kCompressedSteps, nullptr);
  o.device = "opaque";
  const auto got = train(o, world, kCompressedSizes, kCompressedSteps, nullptr);
  expect_same_bits(cpu, got, opt + ", stage " + std::to_string(stage) + ", " + std::to_string(world) + " rank(s)");
}

// compression.replay at stages 1-3 on the opaque device: each rank replays
// the owners' update of the elements it does not own on its working copy
// in the pool (stage 3: on its whole copy of the parameters, which forward
// and backward copy from instead of all-gathering) and on whole copies of
// the replayed slots, through host windows, instead of all-gathering the
// working copies: the cpu device's bits. That the replay ran shows in the device's optimizer memory, which
// holds the slots' whole copies (4 bytes a parameter each) only when it
// does.
TEST(CompressingOnDeviceReplay, ReplayedStepsEndAsOnTheCpuDevice) {
  uint64_t params = 0;
  for (int64_t n : kCompressedSizes) params += static_cast<uint64_t>(n);
  for (const std::string opt : {"onebit_adam", "zero_one_adam", "onebit_lamb"})
    for (int stage : {1, 2, 3}) {
      const std::string what = opt + ", stage " + std::to_string(stage) + ", 2 ranks, compression.replay";
      JobOptions o = compressing_job(opt, stage);
      o.compression_replay = true;
      const auto cpu = train(o, 2, kCompressedSizes, kCompressedSteps, nullptr);
      o.device = "opaque";
      uint64_t replayed_peak = 0, plain_peak = 0;
      const auto got = train(o, 2, kCompressedSizes, kCompressedSteps, nullptr, nullptr, &replayed_peak);
      expect_same_bits(cpu, got, what);
      o.compression_replay = false;
      train(o, 2, kCompressedSizes, kCompressedSteps, nullptr, nullptr, &plain_peak);
      EXPECT_GE(replayed_peak, plain_peak + 4 * params) << what << ": the replay kept no whole copy on the device";
    }
}

// 1-bit LAMB compresses each parameter group as one fused buffer, with a
// scale per chunk of it. On a device the host cannot address, an
// offload.ratio (or placement()) that keeps part of a dtype's optimizer
// state on the device puts its tensors in two groups (Placement::
// state_class), compressed apart: with several ranks every parameter ends
// elsewhere than on the cpu device, which has one group, from the first
// compressed step. The job is told at finalize (laying the fused exchange
// out across the groups would rebuild what the compression keeps per group
// and its checkpoints: split_fused_exchange_warning says why). 1-bit Adam
// and 0/1 Adam compress each tensor on its own, and one rank exchanges
// nothing: there the split ends with the cpu device's bits, and nothing is
// said.
TEST(CompressingOnDeviceSplit, AFusedExchangeOverTwoGroupsOfADtypeIsSaidAtFinalize) {
  const std::string said = "compresses each parameter group as one buffer";
  auto run = [](const std::string& opt, int world, const char* device, std::vector<std::vector<float>>* out) {
    JobOptions o = compressing_job(opt, 1);
    o.offload.optimizer = ZD_TIER_HOST;
    o.offload.ratio = 0.5;  // w0 (70000 of 140869 elements) stays on the opaque device
    o.device = device;
    ::testing::internal::CaptureStderr();
    *out = train(o, world, kCompressedSizes, kCompressedSteps, nullptr);
    return ::testing::internal::GetCapturedStderr();
  };
  std::vector<std::vector<float>> cpu, got;
  EXPECT_EQ(run("onebit_lamb", 2, "cpu", &cpu).find(said), std::string::npos) << "one group on the cpu device";
  const std::string log = run("onebit_lamb", 2, "opaque", &got);
  EXPECT_NE(log.find(said), std::string::npos) << log;
  EXPECT_NE(log.find("on the device ('w0') and of the others off it ('w1' and 2 more)"), std::string::npos) << log;
  EXPECT_NE(log.find("offload.ratio = 1"), std::string::npos) << log << ": the way to the cpu device's results";
  EXPECT_NE(got, cpu) << "what the warning is about";
  for (const std::string opt : {"onebit_adam", "zero_one_adam"}) {
    run(opt, 2, "cpu", &cpu);
    EXPECT_EQ(run(opt, 2, "opaque", &got).find(said), std::string::npos) << opt;
    expect_same_bits(cpu, got, opt + ", 2 ranks, offload.ratio = 0.5");
  }
  run("onebit_lamb", 1, "cpu", &cpu);
  EXPECT_EQ(run("onebit_lamb", 1, "opaque", &got).find(said), std::string::npos) << "one rank";
  expect_same_bits(cpu, got, "onebit_lamb, 1 rank, offload.ratio = 0.5");
}

// A policy: the first parameter's stage-3 shard in host memory, the others'
// on the device.
struct W0ShardOnHost : JobPolicy {
  std::optional<double> lr(int64_t) override { return std::nullopt; }
  std::optional<zd_tier> placement(const TensorInfo& t) override {
    if (t.kind == "params" && t.name == "w0") return ZD_TIER_HOST;
    return std::nullopt;
  }
};

// A stage-3 shard across the host and device tiers (tier boundaries fall
// on a granule of 2048 elements, so w0's shard ends in the device segment
// after its host run) is copied out whole before its all-gather, as one on
// NVMe is: the gather sent the host segment's address for all of it, as
// host memory, and the device refused the upload ("upload got device
// memory where host memory belongs"). offload_test.cpp's
// Placement.AShardAcrossTheDeviceAndHostGathersItsOwnValues is the same on
// the cpu device.
TEST(OpaqueDevicePlacement, AShardAcrossTheDeviceAndHostGathersItsOwnValues) {
  W0ShardOnHost policy;
  const std::vector<int64_t> sizes = {5000, 70000, 3333, 9000, 20000};
  for (int world : {1, 2}) {
    JobOptions o;
    o.stage = 3;
    o.optimizer_hparams = {{"lr", 1e-2}, {"weight_decay", 0.01}};
    o.zero_hparams = {{"param_persistence_threshold", 0}};
    o.offload.optimizer = ZD_TIER_HOST;
    const auto cpu = train(o, world, sizes, 3, nullptr);
    o.device = "opaque";
    o.policy = &policy;
    const auto got = train(o, world, sizes, 3, nullptr);
    expect_same_bits(cpu, got, std::to_string(world) + " rank(s)");
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, CompressingOnDevice,
                         ::testing::Combine(::testing::Values("onebit_adam", "zero_one_adam", "onebit_lamb"),
                                            ::testing::Values(0, 1, 2, 3), ::testing::Values(1, 2)),
                         [](const ::testing::TestParamInfo<std::tuple<std::string, int, int>>& p) {
                           return std::get<0>(p.param) + "_stage" + std::to_string(std::get<1>(p.param)) + "_" +
                                  std::to_string(std::get<2>(p.param)) + "ranks";
                         });

// zd_model_set_stream inside a step is refused on a device that orders work
// on streams (the emulated device stands in for a GPU), and harmless on the
// cpu device, which has none; between steps both take it. Each tier's
// description comes from what holds it (the device's own words for the
// device tier, none for a tier the placement does not use).
// A daemon's ranks that share one GPU (more ranks than GPUs: local rank
// modulo the GPUs) split the device budget the cuda device chose when the
// job set none: the model tells each rank's device how many of its ranks
// are on that GPU. Here a stand-in for the cuda device (its name and GPU
// number) records what it is told; the cuda device's own split runs only
// on a GPU.
class GpuStandIn final : public EmulatedDevice {
 public:
  GpuStandIn(MemoryLedger& ledger, Workers& workers, int gpu, std::vector<std::pair<int, int>>* told,
             uint64_t memory_total = 0)
      : EmulatedDevice(ledger, workers, /*exported=*/false, "gpu-stand-in"), gpu_(gpu), told_(told),
        memory_total_(memory_total) {}
  const char* name() const override { return "cuda"; }
  int32_t ordinal() const override { return gpu_; }
  void share_default_budget(int ranks) override { told_->emplace_back(gpu_, ranks); }
  uint64_t memory_total() const override { return memory_total_; }

 private:
  int gpu_;
  std::vector<std::pair<int, int>>* told_;
  uint64_t memory_total_;
};

TEST(DeviceBudget, RanksOnOneGpuShareItsDefaultBudget) {
  for (const int gpus : {1, 2, 3}) {
    std::vector<std::pair<int, int>> told;
    JobOptions o;
    o.device_factory = [&](const std::string&, MemoryLedger& ledger, Workers& workers, int local_rank,
                           const std::string&) {
      return std::unique_ptr<Device>(std::make_unique<GpuStandIn>(ledger, workers, local_rank % gpus, &told));
    };
    auto model = make_model(o, 3);
    // Three ranks: on one GPU all three share it; on two, GPU 0 has ranks
    // 0 and 2; on three, each rank has its own.
    const std::vector<std::pair<int, int>> want =
        gpus == 1 ? std::vector<std::pair<int, int>>{{0, 3}, {0, 3}, {0, 3}}
        : gpus == 2 ? std::vector<std::pair<int, int>>{{0, 2}, {1, 1}, {0, 2}}
                    : std::vector<std::pair<int, int>>{{0, 1}, {1, 1}, {2, 1}};
    EXPECT_EQ(told, want) << gpus << " GPUs";
  }
}

// budgets.device is each rank's. Where the job's, times the ranks on one
// GPU, is more than that GPU has, CUDA rather than the budget would stop
// them mid-step: the job is told once per GPU, with the per-rank figure
// that fits. Within the GPU's memory, or with a GPU each, nothing is said.
TEST(DeviceBudget, RanksWhoseBudgetsTogetherExceedTheirGpuAreTold) {
  struct SharedGpu {
    int gpus;
    uint64_t budget;
    bool told;
  };
  for (const SharedGpu c :
       {SharedGpu{1, 600 << 10, true}, SharedGpu{1, 400 << 10, false}, SharedGpu{2, 600 << 10, false}}) {
    SCOPED_TRACE(std::to_string(c.gpus) + " GPUs, budget " + std::to_string(c.budget));
    std::vector<std::pair<int, int>> shared;
    JobOptions o;
    o.device_factory = [&](const std::string&, MemoryLedger& ledger, Workers& workers, int local_rank,
                           const std::string&) {
      ledger.set_budget(ZD_TIER_DEVICE, c.budget);
      return std::unique_ptr<Device>(
          std::make_unique<GpuStandIn>(ledger, workers, local_rank % c.gpus, &shared, uint64_t{1} << 20));
    };
    ::testing::internal::CaptureStderr();
    auto model = make_model(o, 2);
    const std::string err = ::testing::internal::GetCapturedStderr();
    const bool told = err.find("budgets.device lets each of the 2 ranks on GPU 0 hold 600.00 KiB, 1.17 MiB together: "
                               "more than its 1.00 MiB") != std::string::npos &&
                      err.find("budgets.device is per rank: set it to at most 512.00 KiB") != std::string::npos;
    EXPECT_EQ(told, c.told) << err;
    EXPECT_LE(std::count(err.begin(), err.end(), '\n'), c.told ? 1 : 0) << err;
  }
}

// Gradient buffers in the device tier are transient: a bucket's go back
// once its sum has left for the host, on a thread of the rank's own. A
// buffer the budget refuses while earlier buckets still hold theirs waits
// for them and is tried again, rather than failing the step (it did, with
// ZD_ERR_BUDGET naming "a gradient bucket"). Here the emulated GPU's
// downloads take 150 ms each, and the device budget holds the placed state
// and two gradient buffers, not three (stage 2; stage 3: three, not four):
// every backward_end's bucket is allocated while the one before is still
// leaving. The parameters are the bits of the job without a budget or a
// delay.
class SlowDownloads final : public EmulatedDevice {
 public:
  SlowDownloads(MemoryLedger& ledger, Workers& workers, const std::atomic<int>* delay_ms)
      : EmulatedDevice(ledger, workers, /*exported=*/false, "slow-downloads"), delay_ms_(delay_ms) {}
  const char* name() const override { return "opaque"; }
  uint64_t download(void* dst, const void* src, uint64_t n, uint64_t after) override {
    if (const int ms = delay_ms_->load()) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return EmulatedDevice::download(dst, src, n, after);
  }

 private:
  const std::atomic<int>* delay_ms_;
};

// The two DeviceBudget tests' backward of module m at step s (a gradient
// from what the forward read) and their result (every parameter in fp32).
void write_step_grad(Model& model, Device& d, const std::vector<zd_param_id>& ids,
                     const std::vector<std::vector<float>>& w, size_t m, int s) {
  std::vector<float> grad(w[m].size());
  for (size_t j = 0; j < grad.size(); ++j) grad[j] = w[m][j] - std::cos(static_cast<float>(j + s));
  write_view(d, model.grad_view(0, ids[m]), grad);
}

std::vector<std::vector<float>> read_params_f32(Model& model, const std::vector<zd_param_id>& ids, int64_t size) {
  std::vector<std::vector<float>> out;
  for (zd_param_id id : ids) {
    std::vector<float> v(static_cast<size_t>(size));
    model.read_param(0, id, ZD_DTYPE_F32, v.data(), v.size() * 4);
    out.push_back(std::move(v));
  }
  return out;
}

// Two plain steps of those tests: forward, the backward above, zd_step.
void train_two_steps(Model& model, Device& d, const std::vector<zd_param_id>& ids) {
  for (int s = 0; s < 2; ++s) {
    std::vector<std::vector<float>> w = forward_reading(model, d, 0, ids);
    for (size_t m = ids.size(); m-- > 0;) {
      model.backward_begin(0, static_cast<zd_module_id>(m));
      write_step_grad(model, d, ids, w, m, s);
      model.backward_end(0, static_cast<zd_module_id>(m));
    }
    model.step(0);
  }
}

TEST(DeviceBudget, AGradientBufferWaitsForTheBucketsStillLeaving) {
  constexpr int64_t kSize = 4000;  // elements per module; 16000 B of fp32 gradients
  const std::vector<int64_t> sizes(4, kSize);
  std::atomic<int> delay_ms{0};
  // Stage 2: the placed state and room for two gradient buffers (16000 B,
  // rounded up), not three; stage 3: three (a module gathered beside
  // them), not four.
  for (const auto& [stage, buffers] : {std::pair{2, 2}, std::pair{3, 3}}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    auto run = [&, stage = stage](uint64_t budget, uint64_t* placed) {
      JobOptions o;
      o.stage = stage;
      o.offload.optimizer = ZD_TIER_HOST;
      o.zero_hparams = {{"reduce_bucket_size", static_cast<double>(kSize)}};
      o.device_factory = [&, budget](const std::string&, MemoryLedger& ledger, Workers& workers, int,
                                     const std::string&) {
        ledger.set_budget(ZD_TIER_DEVICE, budget);
        return std::unique_ptr<Device>(std::make_unique<SlowDownloads>(ledger, workers, &delay_ms));
      };
      auto model = make_model(o, 1);
      Device& d = const_cast<Device&>(model->device(0));
      const std::vector<zd_param_id> ids = register_sine_modules(*model, 0, sizes, ZD_DTYPE_F32);
      if (placed) *placed = model->ledger(0).current(ZD_TIER_DEVICE, ZD_MEM_ALL);
      train_two_steps(*model, d, ids);
      return read_params_f32(*model, ids, kSize);
    };
    uint64_t placed = 0;
    delay_ms = 0;
    const auto free = run(MemoryLedger::kNoBudget, &placed);
    delay_ms = 150;
    std::vector<std::vector<float>> tight;
    ASSERT_NO_THROW(tight = run(placed + static_cast<uint64_t>(buffers) * 16384 + 1024, nullptr));
    EXPECT_EQ(tight, free);
  }
}

// Stage 3 gathers a module's parameters again at backward_begin. Where the
// device tier refuses that gather (gradient buffers still out), Residency
// lets the buckets sent before give their buffers back and tries once more;
// where the second try is refused too, the call fails with ZD_ERR_BUDGET
// naming the module and its bytes, before any collective, and the trainer
// can make the call again. Here the device refuses the gathers of module
// 'm1' a set number of times (the budget itself never runs out), so each
// path is taken on purpose, and the parameters end as without a refusal.
class RefusingGathers final : public EmulatedDevice {
 public:
  RefusingGathers(MemoryLedger& ledger, Workers& workers, std::atomic<int>* refusals, std::atomic<int>* refused)
      : EmulatedDevice(ledger, workers, /*exported=*/false, "refusing-gathers"),
        refusals_(refusals),
        refused_(refused) {}
  const char* name() const override { return "opaque"; }
  // Gathered copies are blocks the gather overwrites whole.
  Block allocate_for_overwrite(uint64_t bytes, zd_mem_kind kind, const std::string& what) override {
    if (kind == ZD_MEM_PARAMS && what.find("module 'm1'") != std::string::npos && refusals_->load() > 0) {
      refusals_->fetch_sub(1);
      refused_->fetch_add(1);
      throw zerod::Error(ZD_ERR_BUDGET, what + ": refused by the test");
    }
    return EmulatedDevice::allocate_for_overwrite(bytes, kind, what);
  }

 private:
  std::atomic<int>* refusals_;
  std::atomic<int>* refused_;
};

TEST(DeviceBudget, ARefusedGatherIsTriedAgainOnceThenReportedAndTheCallCanBeRepeated) {
  constexpr int64_t kSize = 4000;
  const std::vector<int64_t> sizes(3, kSize);
  std::atomic<int> refusals{0}, refused{0};
  // refuse: how many of m1's gathers the device refuses during the first
  // step's backward; a call that fails is made again.
  auto run = [&](int refuse, std::string* error) {
    JobOptions o;
    o.stage = 3;
    o.offload.optimizer = ZD_TIER_HOST;
    // Nothing persistent, one module's parameters live at a time and no
    // gathers ahead, so m1 is gathered again at its backward_begin.
    o.zero_hparams = {{"reduce_bucket_size", static_cast<double>(kSize)},
                      {"param_persistence_threshold", 0.0},
                      {"max_live_parameters", static_cast<double>(kSize)},
                      {"prefetch_bucket_size", 0.0}};
    o.device_factory = [&](const std::string&, MemoryLedger& ledger, Workers& workers, int, const std::string&) {
      return std::unique_ptr<Device>(std::make_unique<RefusingGathers>(ledger, workers, &refusals, &refused));
    };
    auto model = make_model(o, 1);
    Device& d = const_cast<Device&>(model->device(0));
    const std::vector<zd_param_id> ids = register_sine_modules(*model, 0, sizes, ZD_DTYPE_F32);
    for (int s = 0; s < 2; ++s) {
      std::vector<std::vector<float>> w = forward_reading(*model, d, 0, ids);
      refusals = s == 0 ? refuse : 0;
      for (size_t m = ids.size(); m-- > 0;) {
        const auto mid = static_cast<zd_module_id>(m);
        try {
          model->backward_begin(0, mid);
        } catch (const zerod::Error& e) {
          EXPECT_EQ(e.code(), ZD_ERR_BUDGET);
          if (error) *error = e.what();
          refusals = 0;
          model->backward_begin(0, mid);  // the same call again: nothing was lost
        }
        write_step_grad(*model, d, ids, w, m, s);
        model->backward_end(0, mid);
      }
      refusals = 0;
      model->step(0);
    }
    return read_params_f32(*model, ids, kSize);
  };
  const auto plain = run(0, nullptr);
  ASSERT_EQ(refused.load(), 0);

  // One refusal: the retry after the settle gathers it; nothing reported.
  std::string error;
  EXPECT_EQ(run(1, &error), plain);
  EXPECT_EQ(refused.load(), 1);
  EXPECT_EQ(error, "") << "a gather refused once is tried again, not reported";

  // Two: reported, with the module, its bytes and the device's words, and
  // the repeated call trains on.
  refused = 0;
  EXPECT_EQ(run(2, &error), plain);
  EXPECT_EQ(refused.load(), 2);
  EXPECT_NE(error.find("module 'm1' needs 15.62 KiB of gathered parameters in the device tier, which holds "),
            std::string::npos)
      << error;
  EXPECT_NE(error.find(" (no budget set) on rank 0 (gathering module 'm1': refused by the test)"), std::string::npos)
      << error;
}

// A gradient bucket the device tier refuses (ZD_ERR_BUDGET, after the
// wait for the buckets still out) keeps its contributions: the bucket, its
// count and the tags stay as they were, and the same call made again (the
// step, or the next flush after a refused backward_end) sends them. It
// used to take them out of the bucket first and release them with the
// refusal: the repeated zd_step applied an update without them (a norm of
// 0). Here the device refuses the first `refuse` allocations of "a
// gradient bucket"; the parameters end as without a refusal. Stage 2 and
// 3, with buckets sent at the step (a large bucket) and during the
// backward (a bucket of one module).
class RefusingBuckets final : public EmulatedDevice {
 public:
  RefusingBuckets(MemoryLedger& ledger, Workers& workers, std::atomic<int>* refusals)
      : EmulatedDevice(ledger, workers, /*exported=*/false, "refusing-buckets"), refusals_(refusals) {}
  const char* name() const override { return "opaque"; }
  Block allocate(uint64_t bytes, zd_mem_kind kind, const std::string& what) override {
    if (kind == ZD_MEM_BUFFERS && what == "a gradient bucket" && refusals_->load() > 0) {
      refusals_->fetch_sub(1);
      throw zerod::Error(ZD_ERR_BUDGET, what + ": refused by the test");
    }
    return EmulatedDevice::allocate(bytes, kind, what);
  }

 private:
  std::atomic<int>* refusals_;
};

TEST(DeviceBudget, ARefusedGradientBucketKeepsItsGradientsForTheCallMadeAgain) {
  constexpr int64_t kSize = 4000;
  const std::vector<int64_t> sizes(3, kSize);
  std::atomic<int> refusals{0};
  for (const int stage : {2, 3})
    for (const double bucket : {1e9, static_cast<double>(kSize)}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + ", bucket of " + std::to_string(bucket) + " elements");
      // refuse: allocations of a bucket refused in the first step (two:
      // the first try and the one after the wait). Returns the parameters
      // and what the refused calls said.
      auto run = [&](int refuse, std::vector<std::string>* errors) {
        JobOptions o;
        o.stage = stage;
        o.optimizer = "sgd";
        o.optimizer_hparams = {{"lr", 0.5}};
        o.offload.optimizer = ZD_TIER_HOST;
        o.zero_hparams = {{"reduce_bucket_size", bucket}};
        if (stage == 3) o.zero_hparams.push_back({"param_persistence_threshold", 0.0});
        o.device_factory = [&](const std::string&, MemoryLedger& ledger, Workers& workers, int, const std::string&) {
          return std::unique_ptr<Device>(std::make_unique<RefusingBuckets>(ledger, workers, &refusals));
        };
        auto model = make_model(o, 1);
        Device& d = const_cast<Device&>(model->device(0));
        const std::vector<zd_param_id> ids = register_sine_modules(*model, 0, sizes, ZD_DTYPE_F32);
        std::vector<double> norms;
        for (int s = 0; s < 2; ++s) {
          std::vector<std::vector<float>> w = forward_reading(*model, d, 0, ids);
          refusals = s == 0 ? refuse : 0;
          for (size_t m = ids.size(); m-- > 0;) {
            model->backward_begin(0, static_cast<zd_module_id>(m));
            write_step_grad(*model, d, ids, w, m, s);
            try {
              model->backward_end(0, static_cast<zd_module_id>(m));  // sends a full bucket
            } catch (const zerod::Error& e) {
              EXPECT_EQ(e.code(), ZD_ERR_BUDGET);
              errors->push_back(e.what());
            }
          }
          StepFigures f;
          try {
            f = model->step(0);
          } catch (const zerod::Error& e) {
            EXPECT_EQ(e.code(), ZD_ERR_BUDGET);
            errors->push_back(e.what());
            refusals = 0;
            f = model->step(0);  // the same call again: nothing was lost
          }
          EXPECT_TRUE(f.applied);
          norms.push_back(f.grad_norm);
        }
        EXPECT_EQ(refusals.load(), 0) << "every refusal was met";
        return std::make_pair(read_params_f32(*model, ids, kSize), norms);
      };
      std::vector<std::string> errors;
      const auto plain = run(0, &errors);
      ASSERT_TRUE(errors.empty());
      const auto refused = run(2, &errors);
      ASSERT_EQ(errors.size(), 1u) << "one call was refused";
      EXPECT_NE(errors[0].find("a gradient bucket: refused by the test; the bucket's gradients stay pending"),
                std::string::npos)
          << errors[0];
      EXPECT_EQ(refused.second, plain.second) << "the step's norm counts every gradient";
      EXPECT_GT(refused.second[0], 0.0);
      EXPECT_EQ(refused.first, plain.first);
    }
}

// On a device the host cannot address, the page-locked host buffers through
// which gradients leave the device (32 MiB) and new working copies go up
// (16 MiB) are in the plan (the host row's buffers) and made at finalize:
// a host budget that cannot hold them is refused there, with the table.
// They were made at their first use, outside the plan, and a refusal came
// on the thread that moves gradients off the device, mid-step, and broke
// the job. Only where they are used: gradients in host memory (the
// optimizer off the device), the upload ring where the host updates state
// whose working copies are on the device; never on the cpu device.
TEST(HostStagingBudget, TheStagingBuffersArePlannedAndMadeAtFinalize) {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  struct StagingCase {
    const char* name;
    std::string device;
    int stage;
    zd_tier params, optimizer;
    uint64_t staging;
  };
  const std::vector<StagingCase> cases = {
      {"opaque, optimizer on the host", "opaque", 2, ZD_TIER_DEVICE, ZD_TIER_HOST, 48 * kMiB},
      {"opaque, parameters and optimizer on the host", "opaque", 3, ZD_TIER_HOST, ZD_TIER_HOST, 32 * kMiB},
      {"opaque, everything on the device", "opaque", 2, ZD_TIER_DEVICE, ZD_TIER_DEVICE, 0},
      {"cpu, optimizer on the host", "cpu", 2, ZD_TIER_DEVICE, ZD_TIER_HOST, 0},
  };
  const std::vector<int64_t> sizes = {5000, 3000};
  for (const StagingCase& c : cases) {
    SCOPED_TRACE(c.name);
    auto options = [&](uint64_t host_budget) {
      JobOptions o;
      o.device = c.device;
      o.stage = c.stage;
      o.offload.params = c.params;
      o.offload.optimizer = c.optimizer;
      o.host_budget = host_budget;
      if (c.stage == 3) o.zero_hparams = {{"param_persistence_threshold", 0.0}};
      return o;
    };
    auto model = make_model(options(MemoryLedger::kNoBudget), 1);
    const std::vector<zd_param_id> ids = register_sine_modules(*model, 0, sizes, ZD_DTYPE_F32);
    // plan() after finalize: the same figures it gave before (the layout is
    // decided once). Every row is the ledger's, cell by cell: the device row
    // too, rounded as the device rounds its blocks (Device::block_align; it
    // counted the cpu pool's 64 bytes on a device that rounds to 256).
    const TierPlan plan = model->plan(0);
    EXPECT_EQ(plan.need[ZD_TIER_HOST][ZD_MEM_BUFFERS], c.staging);
    for (int t = 0; t < ZD_TIER_COUNT; ++t)
      for (int k = 0; k < ZD_MEM_KIND_COUNT; ++k)
        EXPECT_EQ(plan.need[static_cast<size_t>(t)][static_cast<size_t>(k)], model->ledger(0).current(t, k))
            << tier_name(t) << " " << mem_kind_name(k);
    uint64_t host = 0;
    for (uint64_t b : plan.need[ZD_TIER_HOST]) host += b;
    train_two_steps(*model, const_cast<Device&>(model->device(0)), ids);
    model->sync(0);
    EXPECT_EQ(model->ledger(0).peak(ZD_TIER_HOST, ZD_MEM_ALL), host) << "steps run within the plan";
    if (c.staging == 0) continue;
    // A host budget a byte short of the plan: refused at finalize, naming
    // the buffers, with nothing kept.
    auto short_of = make_model(options(host - 1), 1);
    try {
      register_sine_modules(*short_of, 0, sizes, ZD_DTYPE_F32);
      FAIL() << "the staging buffers do not fit the host budget";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ZD_ERR_BUDGET);
      const std::string what = e.what();
      EXPECT_NE(what.find("buffers"), std::string::npos) << what;
      EXPECT_NE(what.find("<- over budget"), std::string::npos) << what;
    }
    EXPECT_EQ(short_of->ledger(0).current(ZD_TIER_HOST, ZD_MEM_ALL), 0u) << "nothing kept";
  }
}

// Where the trainer's stream waits at a begin call (Residency::
// trainer_waits). A device whose marks are numbers in issue order records
// each wait: a forward waits for the mark right after its own module's
// gather, so with the next modules gathered ahead its marks rise module by
// module, where a wait at the end of zerod's stream (kTail) held every
// module behind the gathers ahead of it too. A parameter written while its
// module is gathered ahead is written after that mark: its forward waits
// for everything. (That a mark orders the GPU's streams so is
// device.CudaStream's.)
class MarkingDevice final : public EmulatedDevice {
 public:
  static constexpr uint64_t kTail = ~uint64_t{0};
  MarkingDevice(MemoryLedger& ledger, Workers& workers, std::vector<uint64_t>* waits)
      : EmulatedDevice(ledger, workers, /*exported=*/false, "marking"), waits_(waits) {}
  const char* name() const override { return "opaque"; }
  uint64_t mark() override { return ++marks_; }
  void trainer_waits() override { waits_->push_back(kTail); }
  void trainer_waits_for(uint64_t mark) override { waits_->push_back(mark); }

 private:
  std::atomic<uint64_t> marks_{0};
  std::vector<uint64_t>* waits_;
};

TEST(DeviceStreams, AForwardWaitsForItsOwnGatherNotTheGathersAheadOfIt) {
  constexpr int64_t kSize = 1000;
  const std::vector<int64_t> sizes(4, kSize);
  std::vector<uint64_t> waits;
  JobOptions o;
  o.stage = 3;
  // Nothing persistent; every later module gathered ahead.
  o.zero_hparams = {{"param_persistence_threshold", 0.0},
                    {"prefetch_bucket_size", static_cast<double>(8 * kSize)},
                    {"max_live_parameters", static_cast<double>(8 * kSize)}};
  o.device_factory = [&](const std::string&, MemoryLedger& ledger, Workers& workers, int, const std::string&) {
    return std::unique_ptr<Device>(std::make_unique<MarkingDevice>(ledger, workers, &waits));
  };
  auto model = make_model(o, 1);
  Device& d = const_cast<Device&>(model->device(0));
  const std::vector<zd_param_id> ids = register_sine_modules(*model, 0, sizes, ZD_DTYPE_F32);
  auto backward = [&](int s) {
    for (size_t m = ids.size(); m-- > 0;) {
      model->backward_begin(0, static_cast<zd_module_id>(m));
      const ViewInfo g = model->grad_view(0, ids[m]);
      write_view(d, g, std::vector<float>(static_cast<size_t>(kSize), 0.01f * static_cast<float>(s + 1)));
      model->backward_end(0, static_cast<zd_module_id>(m));
    }
    model->step(0);
  };
  // The first step records the module order: nothing is gathered ahead.
  forward_reading(*model, d, 0, ids);
  backward(0);

  // The second gathers ahead: each forward's own gather's mark.
  waits.clear();
  forward_reading(*model, d, 0, ids);
  ASSERT_EQ(waits.size(), ids.size());
  for (size_t m = 0; m < ids.size(); ++m) {
    EXPECT_NE(waits[m], MarkingDevice::kTail) << "module " << m << " waited for all of zerod's work";
    if (m > 0) {
      EXPECT_GT(waits[m], waits[m - 1]) << "module " << m << "'s gather is marked after module " << m - 1 << "'s";
    }
  }
  // The first forward's own gather is marked before the next modules'.
  EXPECT_LT(waits[0], waits.back());
  backward(1);

  // A parameter written while its module is gathered ahead (between m0's
  // end and m1's begin): m1's forward waits for everything, and reads the
  // written value.
  waits.clear();
  model->forward_begin(0, 0);
  model->forward_end(0, 0);
  const std::vector<float> written(static_cast<size_t>(kSize), 0.25f);
  model->write_param(0, ids[1], ZD_DTYPE_F32, written.data(), written.size() * 4);
  model->forward_begin(0, 1);
  EXPECT_EQ(read_view(d, model->param_view(0, ids[1])), written);
  model->forward_end(0, 1);
  ASSERT_EQ(waits.size(), 2u);
  EXPECT_NE(waits[0], MarkingDevice::kTail);
  EXPECT_EQ(waits[1], MarkingDevice::kTail) << "a gathered copy written after its gather's mark";
}

// zd_model_load between a module's forward_end and the next one's begin,
// with the next modules gathered ahead: those copies held the parameters of
// before the load, and the next forward computed with them. The load drops
// them (Residency::forget_gathered); the forward reads the loaded values.
TEST(DeviceStreams, ALoadAfterAForwardEndIsWhatTheNextForwardReads) {
  constexpr int64_t kSize = 1000;
  const std::vector<int64_t> sizes(4, kSize);
  for (const char* device : {"cpu", "opaque"}) {
    char tmpl[] = "/tmp/zerod-load-ahead-XXXXXX";
    const std::string dir = mkdtemp(tmpl);
    JobOptions o;
    o.device = device;
    o.stage = 3;
    o.zero_hparams = {{"param_persistence_threshold", 0.0},
                      {"prefetch_bucket_size", static_cast<double>(8 * kSize)},
                      {"max_live_parameters", static_cast<double>(8 * kSize)}};
    auto model = make_model(o, 1);
    Device& d = const_cast<Device&>(model->device(0));
    const std::vector<zd_param_id> ids = register_sine_modules(*model, 0, sizes, ZD_DTYPE_F32);
    auto train_step = [&](int s) {
      std::vector<std::vector<float>> w = forward_reading(*model, d, 0, ids);
      for (size_t m = ids.size(); m-- > 0;) {
        model->backward_begin(0, static_cast<zd_module_id>(m));
        write_step_grad(*model, d, ids, w, m, s);
        model->backward_end(0, static_cast<zd_module_id>(m));
      }
      model->step(0);
    };
    train_step(0);  // records the module order
    model->save_checkpoint(0, dir);
    const auto saved = read_params_f32(*model, ids, kSize);
    train_step(1);
    ASSERT_NE(read_params_f32(*model, ids, kSize), saved) << device << ": the step moved the parameters";

    model->forward_begin(0, 0);  // gathers modules 1-3 ahead
    model->forward_end(0, 0);
    model->load_checkpoint(0, dir);
    for (size_t m = 1; m < ids.size(); ++m) {
      model->forward_begin(0, static_cast<zd_module_id>(m));
      EXPECT_EQ(read_view(d, model->param_view(0, ids[m])), saved[m]) << device << ", module " << m;
      model->forward_end(0, static_cast<zd_module_id>(m));
    }
    std::filesystem::remove_all(dir);
  }
}

// Blocks the caller overwrites whole (gathered parameters) are not zeroed
// on a GPU. The emulated device hands them out full of NaN instead, so
// that every test on it (parity with the cpu device, above) fails where a
// gather leaves a byte of its block unwritten.
TEST(DeviceStreams, ABlockForOverwriteIsNaNOnTheEmulatedDeviceNotZero) {
  MemoryLedger ledger;
  ThreadPool pool{1};
  std::mutex pool_mu;
  Workers workers{pool, pool_mu};
  EmulatedDevice d(ledger, workers, /*exported=*/false, "overwrite-test");
  const Block zeroed = d.allocate(1000, ZD_MEM_PARAMS, "zeroed");
  const Block poisoned = d.allocate_for_overwrite(1000, ZD_MEM_PARAMS, "poisoned");
  std::vector<float> z(250), p(250);
  d.copy_to_host(z.data(), zeroed.ptr, 1000);
  d.copy_to_host(p.data(), poisoned.ptr, 1000);
  for (size_t i = 0; i < z.size(); ++i) {
    ASSERT_EQ(z[i], 0.0f) << i;
    ASSERT_TRUE(std::isnan(p[i])) << i;
  }
  EXPECT_EQ(ledger.current(ZD_TIER_DEVICE, ZD_MEM_PARAMS), zeroed.bytes + poisoned.bytes) << "charged alike";
  d.release(zeroed, ZD_MEM_PARAMS);
  d.release(poisoned, ZD_MEM_PARAMS);
}

TEST(DeviceStreams, SetStreamInsideAStepOnlyWhereTheDeviceHasNone) {
  for (const char* device : {"cpu", "opaque"}) {
    JobOptions o;
    o.device = device;
    auto model = make_model(o, 1);
    const bool streams = std::string(device) != "cpu";
    EXPECT_EQ(model->device(0).has_streams(), streams) << device;
    const zd_param_id p = model->register_param(0, "w", "m", ZD_DTYPE_F32, {1024}, nullptr, 0);
    model->finalize(0);
    EXPECT_EQ(model->tier_description(0, ZD_TIER_DEVICE), model->device(0).describe()) << device;
    EXPECT_EQ(model->tier_description(0, ZD_TIER_NVME), "") << device << ": no NVMe tier is in use";
    EXPECT_NO_THROW(model->set_stream(0, nullptr)) << device << ": between steps";
    model->forward_begin(0, model->registry().param(p).module);
    if (streams) {
      try {
        model->set_stream(0, nullptr);
        FAIL() << device << ": set_stream inside a step must be refused";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ZD_ERR_INVALID_STATE);
        EXPECT_NE(std::string(e.what()).find("between steps"), std::string::npos) << e.what();
      }
    } else {
      EXPECT_NO_THROW(model->set_stream(0, nullptr)) << device << ": the cpu device has no stream to change";
    }
    model->forward_end(0, model->registry().param(p).module);
  }
}

}  // namespace

namespace {

// Whole-parameter and optimizer-state access (checkpoints) reaches device
// memory through the device only.
TEST(OpaqueDeviceState, WritesAndReadsOfWholeValuesRoundTrip) {
  for (int stage : {0, 3}) {
    JobOptions o;
    o.device = "opaque";
    o.stage = stage;
    if (stage == 3) o.zero_hparams = {{"param_persistence_threshold", 100}};
    auto model = make_model(o, 1);
    model->register_param(0, "big", "a", ZD_DTYPE_F32, {5000}, nullptr, 0);
    model->register_param(0, "small", "b", ZD_DTYPE_F32, {50}, nullptr, 0);  // persistent at stage 3
    model->finalize(0);
    for (zd_param_id p : {0, 1}) {
      const auto n = static_cast<size_t>(model->registry().param(p).numel);
      std::vector<float> v(n), back(n);
      for (size_t i = 0; i < n; ++i) v[i] = 0.25f * static_cast<float>(i) - 3.0f;
      model->write_param(0, p, ZD_DTYPE_F32, v.data(), n * 4);
      model->read_param(0, p, ZD_DTYPE_F32, back.data(), n * 4);
      EXPECT_EQ(back, v) << "stage " << stage << " param " << p;
      model->write_state(0, p, 1, ZD_DTYPE_F32, v.data(), n * 4);
      model->read_state(0, p, 1, ZD_DTYPE_F32, back.data(), n * 4);
      EXPECT_EQ(back, v) << "stage " << stage << " state of param " << p;
      // The working copy the trainer sees follows the write.
      model->forward_begin(0, model->registry().param(p).module);
      const ViewInfo view = model->param_view(0, p);
      std::vector<float> seen(n);
      const_cast<Device&>(model->device(0)).copy_to_host(seen.data(), view.data, n * 4);
      EXPECT_EQ(seen, v) << "stage " << stage << " view of param " << p;
      EXPECT_EQ(view.device_type, ZD_DEVICE_CUDA);
      model->forward_end(0, model->registry().param(p).module);
    }
  }
}

}  // namespace
