// Offload tiers in the engine: the optimizer runs where the state lives and
// gives the same parameters wherever that is; placement follows the offload
// table, the ratio and the job's placement(); budgets are exact and the plan
// is the real figure; bad disks are named.
#include "zero_fixture.h"

#include "device/cpu_device.h"
#include "device/emulated_device.h"
#include "runtime/dtype.h"

#include <hwloc.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>

using namespace zerod_test;
namespace fs = std::filesystem;

namespace {

// A fresh directory, removed (and unmounted, if mounted) at the end.
struct TempDir {
  TempDir() {
    char tmpl[] = "/tmp/zerod-offload-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() {
    if (mounted) umount2(path.c_str(), MNT_DETACH);
    fs::remove_all(path);
  }
  // Mounts a file system here; false (with a message) when not permitted.
  bool mount_fs(const char* type, const char* opts, std::string* why) {
    if (::mount(type, path.c_str(), type, 0, opts) != 0) {
      *why = std::string("mounting a ") + type + " needs CAP_SYS_ADMIN: " + std::strerror(errno);
      return false;
    }
    mounted = true;
    return true;
  }
  std::string path;
  bool mounted = false;
};

// The bytes of the files this process holds open under dir (the NVMe
// stores: unlinked, so found through /proc/self/fd), and how many there are.
uint64_t open_file_bytes(const std::string& dir, int* files) {
  uint64_t bytes = 0;
  *files = 0;
  for (const auto& e : fs::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target = fs::read_symlink(e.path(), ec).string();
    struct stat st{};
    if (ec || target.rfind(dir + "/", 0) != 0 || fstat(std::stoi(e.path().filename().string()), &st) != 0) continue;
    bytes += static_cast<uint64_t>(st.st_size);
    ++*files;
  }
  return bytes;
}

// While it lives, no file of this process grows past `bytes`
// (RLIMIT_FSIZE: fallocate fails with EFBIG, SIGXFSZ ignored): a disk with
// that much room for a store, without mounting one.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(uint64_t bytes) {
    getrlimit(RLIMIT_FSIZE, &saved_);
    handler_ = std::signal(SIGXFSZ, SIG_IGN);
    set(bytes);
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &saved_);
    std::signal(SIGXFSZ, handler_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;
  void set(uint64_t bytes) {
    rlimit r = saved_;
    r.rlim_cur = static_cast<rlim_t>(bytes);
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &r), 0) << std::strerror(errno);
  }

 private:
  rlimit saved_{};
  void (*handler_)(int) = SIG_DFL;
};

// What module 1 does in the backward of every odd step (the others always
// train).
enum class OddSteps { Train, Absent, ZeroGradient };

// Trains `steps` steps of AdamW (o.accumulation micro-batches each) on one
// parameter per module and returns the final parameters (rank 0's reads).
std::vector<std::vector<float>> train(const JobOptions& o, int world, const std::vector<int64_t>& sizes, int steps,
                                      OddSteps module1 = OddSteps::Train) {
  auto model = make_model(o, world);
  const int gas = static_cast<int>(o.accumulation);
  std::vector<std::vector<float>> out(sizes.size());
  run_ranks(world, [&](int rank) {
    std::vector<zd_param_id> ids;
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::vector<float> init(static_cast<size_t>(sizes[i]));
      for (size_t j = 0; j < init.size(); ++j) init[j] = std::sin(static_cast<float>(j + 7 * i));
      ids.push_back(model->register_param(rank, "w" + std::to_string(i), "m" + std::to_string(i),
                                          ZD_DTYPE_F32, {sizes[i]}, init.data(), ZD_DTYPE_F32));
    }
    model->finalize(rank);
    for (int s = 0; s < steps; ++s) {
      for (int k = 0; k < gas; ++k) {
        for (size_t m = ids.size(); m-- > 0;) {
          const OddSteps does = m == 1 && s % 2 == 1 ? module1 : OddSteps::Train;
          if (does == OddSteps::Absent) continue;
          const auto mid = static_cast<zd_module_id>(m);
          model->backward_begin(rank, mid);
          const ViewInfo w = model->param_view(rank, ids[m]);
          const ViewInfo g = model->grad_view(rank, ids[m]);
          const auto* wd = static_cast<const float*>(w.data);
          auto* gd = static_cast<float*>(g.data);
          for (size_t j = 0; j < g.bytes / 4; ++j)
            gd[j] = does == OddSteps::ZeroGradient ? 0.0f : wd[j] - std::cos(static_cast<float>(j + s + k + rank));
          model->backward_end(rank, mid);
        }
        model->step(rank);
      }
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      std::vector<float> v(static_cast<size_t>(sizes[i]));
      model->read_param(rank, ids[i], ZD_DTYPE_F32, v.data(), v.size() * 4);
      if (rank == 0) out[i] = v;
    }
  });
  return out;
}

JobOptions adamw(int stage) {
  JobOptions o;
  o.stage = stage;
  o.optimizer_hparams = {{"lr", 1e-2}, {"weight_decay", 0.01}};
  if (stage == 3) o.zero_hparams = {{"param_persistence_threshold", 0}};
  o.offload.nvme_tile_elems = 4096;  // several tiles per piece: the pipeline turns over
  return o;
}

}  // namespace

// The same run ends with bit-identical parameters whether the optimizer
// state lives in the device pool, on host, on NVMe, or split by a ratio.
class SameParameters : public ::testing::TestWithParam<int> {};

TEST_P(SameParameters, WhereverTheOptimizerStateLives) {
  const int stage = GetParam();
  const int world = stage == 0 ? 1 : 2;
  const std::vector<int64_t> sizes = {5000, 70000, 333};
  TempDir dir;
  const auto ref = train(adamw(stage), world, sizes, 4);
  struct Case {
    const char* name;
    zd_tier tier;
    double ratio;
  } cases[] = {{"host", ZD_TIER_HOST, 1.0}, {"nvme", ZD_TIER_NVME, 1.0}, {"nvme ratio 0.5", ZD_TIER_NVME, 0.5},
               {"host ratio 0.3", ZD_TIER_HOST, 0.3}};
  for (const Case& c : cases) {
    JobOptions o = adamw(stage);
    o.offload.optimizer = c.tier;
    o.offload.ratio = c.ratio;
    o.offload.nvme_paths = {dir.path};
    EXPECT_EQ(train(o, world, sizes, 4), ref) << c.name << ", stage " << stage;
  }
  if (stage == 3) {
    for (zd_tier t : {ZD_TIER_HOST, ZD_TIER_NVME}) {
      JobOptions o = adamw(stage);
      o.offload.params = t;
      o.offload.optimizer = t;
      o.offload.nvme_paths = {dir.path};
      EXPECT_EQ(train(o, world, sizes, 4), ref) << "parameters and optimizer on " << tier_name(t);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, SameParameters, ::testing::Values(0, 1, 2, 3),
                         [](const auto& p) { return "stage" + std::to_string(p.param); });

// An update of offloaded state leaves the host accumulators as it read
// them (GradReducer::update_zeroes): the next window writes over each
// parameter's range first. A parameter a window leaves out must then read
// as zero at the boundary (clear_untouched), exactly as if it had taken a
// zero gradient, and as where the state stays in the device pool (whose
// update zeroes as it reads). Without that it was stepped again with the
// gradient of its last window.
class UntouchedParameters : public ::testing::TestWithParam<int> {};

TEST_P(UntouchedParameters, StepAsWithAZeroGradientWhereverTheStateLives) {
  const int stage = GetParam();
  const std::vector<int64_t> sizes = {5000, 7000, 333};
  TempDir dir;
  for (int world : {1, 2}) {
    for (int64_t gas : {1, 2}) {
      JobOptions pool = adamw(stage);
      pool.accumulation = gas;
      const auto ref = train(pool, world, sizes, 4, OddSteps::ZeroGradient);
      ASSERT_NE(ref[1], train(pool, 1, sizes, 1)[1]) << "module 1 trains";
      EXPECT_EQ(train(pool, world, sizes, 4, OddSteps::Absent), ref)
          << "stage " << stage << ", " << world << " ranks, gas " << gas << ": device pool";
      for (zd_tier t : {ZD_TIER_HOST, ZD_TIER_NVME}) {
        JobOptions o = pool;
        o.offload.optimizer = t;
        o.offload.nvme_paths = {dir.path};
        EXPECT_EQ(train(o, world, sizes, 4, OddSteps::Absent), ref)
            << "stage " << stage << ", " << world << " ranks, gas " << gas << ": optimizer on " << tier_name(t);
        if (stage == 3) {
          o.offload.params = t;
          EXPECT_EQ(train(o, world, sizes, 4, OddSteps::Absent), ref)
              << world << " ranks, gas " << gas << ": parameters and optimizer on " << tier_name(t);
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, UntouchedParameters, ::testing::Values(0, 1, 2, 3),
                         [](const auto& p) { return "stage" + std::to_string(p.param); });

namespace {

// A policy: optimizer state of big parameters on NVMe, the rest on host.
struct BigOnNvme : JobPolicy {
  std::optional<double> lr(int64_t) override { return std::nullopt; }
  std::optional<zd_tier> placement(const TensorInfo& t) override {
    if (t.kind == "optimizer") return t.numel > 10000 ? ZD_TIER_NVME : ZD_TIER_HOST;
    return std::nullopt;
  }
};

uint64_t held(const Model& m, int rank, zd_tier t, zd_mem_kind k) { return m.ledger(rank).current(t, k); }

}  // namespace

namespace {

// A policy: the first parameter's master and optimizer state in host RAM,
// the rest where the offload table says (NVMe below): the group's NVMe
// piece then starts after the host run, not at the group's first element.
struct FirstOnHost : JobPolicy {
  std::optional<double> lr(int64_t) override { return std::nullopt; }
  std::optional<zd_tier> placement(const TensorInfo& t) override {
    if (t.name == "w0" && (t.kind == "master" || t.kind == "optimizer")) return ZD_TIER_HOST;
    return std::nullopt;
  }
};

}  // namespace

// An NVMe piece that does not start the group's range (the docs' "as much
// in RAM as fits, the rest on disk" policy) steps each tile with its own
// gradient: it read the gradient pc.begin elements too far along, past the
// buffer's end in its last tiles.
TEST(Nvme, APieceAfterAHostRunStepsWithItsOwnGradients) {
  TempDir dir;
  const std::vector<int64_t> sizes = {5000, 70000, 333};
  const auto ref = train(adamw(0), 1, sizes, 3);
  FirstOnHost policy;
  JobOptions o = adamw(0);
  o.policy = &policy;
  o.offload.optimizer = ZD_TIER_NVME;
  o.offload.nvme_paths = {dir.path};
  auto model = make_model(o, 1);
  run_ranks(1, [&](int rank) {
    for (size_t i = 0; i < sizes.size(); ++i)
      model->register_param(rank, "w" + std::to_string(i), "m" + std::to_string(i), ZD_DTYPE_F32, {sizes[i]},
                            nullptr, 0);
    model->finalize(rank);
  });
  // The case this test is about: both tiers hold optimizer state.
  ASSERT_GT(held(*model, 0, ZD_TIER_HOST, ZD_MEM_OPTIMIZER), 0u);
  ASSERT_GT(held(*model, 0, ZD_TIER_NVME, ZD_MEM_OPTIMIZER), 0u);
  EXPECT_TRUE(train(o, 1, sizes, 3) == ref) << "parameters differ from the run with the state in the device pool";
}

TEST(Placement, ThePolicyDecidesPerTensorAndThePlanIsTheRealFigure) {
  TempDir dir;
  BigOnNvme policy;
  JobOptions o = adamw(1);
  o.policy = &policy;
  o.offload.nvme_paths = {dir.path};
  auto model = make_model(o, 2);
  TierPlan planned;
  run_ranks(2, [&](int rank) {
    model->register_param(rank, "small", "a", ZD_DTYPE_F32, {4096}, nullptr, 0);
    model->register_param(rank, "big", "b", ZD_DTYPE_F32, {65536}, nullptr, 0);
    if (rank == 0) planned = model->plan(0);
    model->finalize(rank);
  });
  // Masters stay on the device (the offload table's default); optimizer
  // state: 'small' on host, 'big' on NVMe (2 slots each).
  EXPECT_GT(held(*model, 0, ZD_TIER_NVME, ZD_MEM_OPTIMIZER), held(*model, 0, ZD_TIER_HOST, ZD_MEM_OPTIMIZER));
  EXPECT_GT(held(*model, 0, ZD_TIER_HOST, ZD_MEM_OPTIMIZER), 0u);
  EXPECT_EQ(held(*model, 0, ZD_TIER_DEVICE, ZD_MEM_OPTIMIZER), 0u);
  EXPECT_GT(held(*model, 0, ZD_TIER_DEVICE, ZD_MEM_MASTER), 0u);
  for (int t = 0; t < ZD_TIER_COUNT; ++t)
    for (int k = 0; k < ZD_MEM_KIND_COUNT; ++k)
      EXPECT_EQ(planned.need[static_cast<size_t>(t)][static_cast<size_t>(k)], held(*model, 0, t, k))
          << "tier " << tier_name(t) << ", kind " << mem_kind_name(k);
}

// offload.ratio is the share of what offload.optimizer moves (DeepSpeed's
// offload_optimizer.ratio): half of each rank's masters and optimizer state
// leave the device, and offload.params moves every stage-3 parameter shard
// whole. Where the optimizer stays on the device the ratio moves nothing,
// and the job is told so, naming the shards it does not split.
TEST(Placement, TheRatioSplitsTheOptimizerOffloadNotTheParameterShards) {
  for (zd_tier optimizer : {ZD_TIER_HOST, ZD_TIER_DEVICE}) {
    JobOptions o = adamw(3);
    o.offload.params = ZD_TIER_HOST;
    o.offload.optimizer = optimizer;
    o.offload.ratio = 0.5;
    auto model = make_model(o, 2);
    std::vector<TierPlan> plans(2);
    ::testing::internal::CaptureStderr();
    run_ranks(2, [&](int rank) {
      model->register_param(rank, "a", "m0", ZD_DTYPE_F32, {4096}, nullptr, 0);
      model->register_param(rank, "b", "m1", ZD_DTYPE_F32, {65536}, nullptr, 0);
      model->finalize(rank);
      plans[static_cast<size_t>(rank)] = model->plan(rank);
    });
    const std::string log = ::testing::internal::GetCapturedStderr();
    const std::string what = std::string("optimizer on ") + tier_name(optimizer);
    for (int rank = 0; rank < 2; ++rank) {
      const NeedTable& need = plans[static_cast<size_t>(rank)].need;
      EXPECT_EQ(need[ZD_TIER_DEVICE][ZD_MEM_PARAMS], 0u) << what << ": every shard on the host";
      EXPECT_GE(need[ZD_TIER_HOST][ZD_MEM_PARAMS], (4096 + 65536) / 2 * 4u) << what << ": the whole shard";
      for (int t = 0; t < ZD_TIER_COUNT; ++t)
        for (int k = 0; k < ZD_MEM_KIND_COUNT; ++k)
          EXPECT_EQ(need[static_cast<size_t>(t)][static_cast<size_t>(k)], held(*model, rank, t, k))
              << what << ", rank " << rank << ", tier " << tier_name(t) << ", kind " << mem_kind_name(k);
    }
    const uint64_t master_device = plans[0].need[ZD_TIER_DEVICE][ZD_MEM_MASTER];
    const uint64_t master_host = plans[0].need[ZD_TIER_HOST][ZD_MEM_MASTER];
    if (optimizer == ZD_TIER_HOST) {
      // About half each (the cut falls on a tier granule).
      EXPECT_GT(master_device, 0u);
      EXPECT_GT(master_host, 0u);
      EXPECT_LT(master_host > master_device ? master_host - master_device : master_device - master_host,
                (master_host + master_device) / 4);
      EXPECT_EQ(log.find("offload.ratio"), std::string::npos) << log;
    } else {
      EXPECT_EQ(master_host, 0u);
      EXPECT_NE(log.find("offload.ratio = 0.5 moves nothing"), std::string::npos) << log;
      EXPECT_NE(log.find("offload.params = \"host\" moves every parameter shard whole"), std::string::npos) << log;
    }
  }
}

namespace {

// A policy: the first parameter's stage-3 shard in host RAM, the others'
// on the device.
struct W0ShardOnHost : JobPolicy {
  std::optional<double> lr(int64_t) override { return std::nullopt; }
  std::optional<zd_tier> placement(const TensorInfo& t) override {
    if (t.kind == "params" && t.name == "w0") return ZD_TIER_HOST;
    return std::nullopt;
  }
};

}  // namespace

// Tier boundaries fall on a granule of 2048 elements, tensors in the shard
// buffer on 32: w0's shard (5000 elements, or 2500 a rank) ends past the
// granule its host run is cut at, so its tail lies in the device segment
// after it. Its gather read the whole shard from the host segment's
// address, past the end of that allocation (904 elements of garbage with
// one rank); it gathers the shard's own values, whether the gather is a
// collective (1 rank, persistent parameters) or a one-sided copy (2 ranks).
TEST(Placement, AShardAcrossTheDeviceAndHostGathersItsOwnValues) {
  const std::vector<int64_t> sizes = {5000, 70000, 333};
  W0ShardOnHost policy;
  JobOptions o = adamw(3);
  o.policy = &policy;
  o.offload.optimizer = ZD_TIER_HOST;
  for (int world : {1, 2})
    EXPECT_TRUE(train(o, world, sizes, 3) == train(adamw(3), world, sizes, 3)) << world << " rank(s)";
  // The default persistence threshold: w0 and w2 are gathered once, at
  // finalize, and after each step.
  JobOptions persistent = o, ref = adamw(3);
  persistent.zero_hparams.clear();
  ref.zero_hparams.clear();
  EXPECT_TRUE(train(persistent, 2, sizes, 3) == train(ref, 2, sizes, 3)) << "the default persistence threshold";
}

TEST(Budgets, APlacementOverTheHostBudgetIsRefusedWithTheTable) {
  JobOptions o = adamw(0);
  o.offload.optimizer = ZD_TIER_HOST;
  o.host_budget = 100000;
  auto model = make_model(o, 1);
  // 1 MiB on host: the gradients (256 KiB) accumulate next to the master
  // (256 KiB) and the two moments (512 KiB).
  model->register_param(0, "w", "m", ZD_DTYPE_F32, {65536}, nullptr, 0);
  try {
    model->finalize(0);
    FAIL() << "over the host budget";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ZD_ERR_BUDGET);
    const std::string s = e.what();
    EXPECT_NE(s.find("host     0 B         256.00 KiB  256.00 KiB  512.00 KiB  0 B         1.00 MiB"),
              std::string::npos)
        << s;
    EXPECT_NE(s.find("<- over budget"), std::string::npos) << s;
  }
  EXPECT_EQ(model->ledger(0).current(ZD_TIER_HOST, ZD_MEM_ALL), 0u) << "nothing kept";
}

// The NVMe pipeline's staging buffers come out of the host budget: counted
// in the plan, refused at finalize when they do not fit, never mid-step.
TEST(Budgets, TheNvmeStagingBuffersAreReservedAtFinalize) {
  TempDir dir;
  JobOptions o = adamw(0);
  o.offload.optimizer = ZD_TIER_NVME;
  o.offload.nvme_paths = {dir.path};
  o.offload.nvme_tile_elems = uint64_t{1} << 20;  // 4 MiB of fp32
  o.offload.buffer_count = 4;
  // master + 2 moments staged: 3 operands x 4 sets x 4 MiB; beside them in
  // host memory the gradients the pipeline reads (4 MiB).
  const uint64_t staging = uint64_t{48} << 20, grads = uint64_t{4} << 20;
  o.host_budget = staging + grads - 1;
  {
    auto model = make_model(o, 1);
    model->register_param(0, "w", "m", ZD_DTYPE_F32, {1 << 20}, nullptr, 0);
    try {
      model->finalize(0);
      FAIL() << "the staging buffers do not fit the host budget";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ZD_ERR_BUDGET);
      const std::string s = e.what();
      EXPECT_NE(s.find("buffers"), std::string::npos) << s;
      EXPECT_NE(s.find("48.00 MiB"), std::string::npos) << s;
      EXPECT_NE(s.find("<- over budget"), std::string::npos) << s;
    }
    EXPECT_EQ(model->ledger(0).current(ZD_TIER_HOST, ZD_MEM_ALL), 0u) << "nothing kept";
  }
  o.host_budget = staging + grads;
  auto model = make_model(o, 1);
  model->register_param(0, "w", "m", ZD_DTYPE_F32, {1 << 20}, nullptr, 0);
  EXPECT_EQ(model->plan(0).need[ZD_TIER_HOST][ZD_MEM_BUFFERS], staging);
  model->finalize(0);
  EXPECT_EQ(model->ledger(0).current(ZD_TIER_HOST, ZD_MEM_BUFFERS), staging);
  EXPECT_EQ(model->ledger(0).current(ZD_TIER_HOST, ZD_MEM_GRADS), grads);
  EXPECT_EQ(model->ledger(0).current(ZD_TIER_HOST, ZD_MEM_ALL), staging + grads);
  for (int step = 0; step < 2; ++step) {  // steps run within the reservation
    model->backward_begin(0, 0);
    model->backward_end(0, 0);
    model->step(0);
  }
  EXPECT_EQ(model->ledger(0).peak(ZD_TIER_HOST, ZD_MEM_ALL), staging + grads);
}

// Optimizer state far over the host budget, streamed from NVMe through host
// staging, ends where the all-in-RAM run ends. The host holds the staging
// buffers and the fp32 gradients (4 B a parameter) the pipeline reads; the
// master and the moments (12 B a parameter, 1 GiB) are 2.6x its budget.
TEST(Nvme, StateOverTheHostBudgetTrainsToTheSameParameters) {
  TempDir dir;
  // master + exp_avg + exp_avg_sq: 12 bytes a parameter, 1 GiB in all
  const int64_t n = (int64_t{1} << 30) / 12;  // 1 GiB of optimizer state (with the master)
  JobOptions ram = adamw(0);
  ram.offload.nvme_tile_elems = uint64_t{1} << 20;
  JobOptions disk = ram;
  disk.offload.optimizer = ZD_TIER_NVME;
  disk.offload.nvme_paths = {dir.path};
  disk.host_budget = uint64_t{400} << 20;
  const auto a = train(ram, 1, {n}, 2);
  const auto b = train(disk, 1, {n}, 2);
  ASSERT_EQ(a[0].size(), b[0].size());
  EXPECT_TRUE(a == b) << "parameters differ";
}

TEST(Nvme, AMissingPathIsNamedAtFinalize) {
  JobOptions o = adamw(0);
  o.offload.optimizer = ZD_TIER_NVME;
  o.offload.nvme_paths = {"/nonexistent/zerod-nvme"};
  auto model = make_model(o, 1);
  model->register_param(0, "w", "m", ZD_DTYPE_F32, {1024}, nullptr, 0);
  try {
    model->finalize(0);
    FAIL() << "a missing path";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/zerod-nvme"), std::string::npos) << e.what();
  }
}

TEST(Nvme, AFileSystemWithoutODirectIsNamed) {
  TempDir dir;
  std::string why;
  if (!dir.mount_fs("ramfs", "", &why)) GTEST_SKIP() << why;
  JobOptions o = adamw(0);
  o.offload.optimizer = ZD_TIER_NVME;
  o.offload.nvme_paths = {dir.path};
  auto model = make_model(o, 1);
  model->register_param(0, "w", "m", ZD_DTYPE_F32, {1024}, nullptr, 0);
  try {
    model->finalize(0);
    FAIL() << "ramfs has no O_DIRECT";
  } catch (const Error& e) {
    const std::string s = e.what();
    EXPECT_NE(s.find(dir.path), std::string::npos) << s;
    EXPECT_NE(s.find("O_DIRECT"), std::string::npos) << s;
  }
}

// `steps` steps of module 0 whose gradient is 1 in the first element of w
// (a tensor of 2^18), each applied; that element has moved below zero.
void expect_steps_land(Model& model, zd_param_id w, int steps) {
  for (int s = 0; s < steps; ++s) {
    model.backward_begin(0, 0);
    static_cast<float*>(model.grad_view(0, w).data)[0] = 1.0f;
    model.backward_end(0, 0);
    EXPECT_TRUE(model.step(0).applied);
  }
  std::vector<float> v(1 << 18);
  model.read_param(0, w, ZD_DTYPE_F32, v.data(), v.size() * 4);
  EXPECT_LT(v[0], 0.0f) << "the updates landed";
}

TEST(Nvme, ADiskTooSmallIsRefusedAtFinalizeNamingPathAndTensor) {
  TempDir dir;
  std::string why;
  if (!dir.mount_fs("tmpfs", "size=2m", &why)) GTEST_SKIP() << why;
  JobOptions o = adamw(0);
  o.offload.optimizer = ZD_TIER_NVME;
  o.offload.nvme_paths = {dir.path};
  auto model = make_model(o, 1);
  model->register_param(0, "w", "m", ZD_DTYPE_F32, {1 << 20}, nullptr, 0);  // 12 MiB on NVMe
  try {
    model->finalize(0);
    FAIL() << "12 MiB on a 2 MiB disk";
  } catch (const Error& e) {
    const std::string s = e.what();
    EXPECT_NE(s.find(dir.path), std::string::npos) << s;
    EXPECT_NE(s.find("No space left on device"), std::string::npos) << s;
    EXPECT_TRUE(s.find("master") != std::string::npos || s.find("exp_avg") != std::string::npos) << s;
  }
}

TEST(Nvme, ADiskThatFillsAfterFinalizeDoesNotFailTraining) {
  TempDir dir;
  std::string why;
  if (!dir.mount_fs("tmpfs", "size=16m", &why)) GTEST_SKIP() << why;
  JobOptions o = adamw(0);
  o.offload.optimizer = ZD_TIER_NVME;
  o.offload.nvme_paths = {dir.path};
  auto model = make_model(o, 1);
  const zd_param_id w = model->register_param(0, "w", "m", ZD_DTYPE_F32, {1 << 18}, nullptr, 0);
  model->finalize(0);
  // Somebody fills the disk: the state's space was reserved at finalize.
  {
    std::ofstream filler(dir.path + "/filler", std::ios::binary);
    std::vector<char> mb(1 << 20, 'x');
    while (filler.write(mb.data(), static_cast<std::streamsize>(mb.size()))) {
    }
  }
  struct statvfs st{};
  ASSERT_EQ(statvfs(dir.path.c_str(), &st), 0);
  EXPECT_LT(st.f_bavail * st.f_frsize, 1u << 20) << "the disk is full";
  expect_steps_land(*model, w, 3);
}

namespace {

// AdamW at `stage` with its masters and moments on NVMe under `path`, for
// tests that limit the files' size: the device pool's memfd arenas are
// files too, so they are sized to each request (1 MiB), not 64 MiB, and fit
// under the limit.
JobOptions adamw_on_nvme(int stage, const std::string& path) {
  JobOptions o = adamw(stage);
  o.offload.optimizer = ZD_TIER_NVME;
  o.offload.nvme_paths = {path};
  o.device_factory = [](const std::string&, MemoryLedger& ledger, Workers& workers, int, const std::string& name) {
    return std::unique_ptr<Device>(std::make_unique<CpuDevice>(ledger, workers, 4096, name));
  };
  return o;
}

// The NVMe bytes the plan of rank 0 needs.
uint64_t nvme_need(Model& model) {
  const auto plan = model.plan(0);  // held: a range-for over a temporary's member outlives it (TSan)
  uint64_t need = 0;
  for (const uint64_t bytes : plan.need[ZD_TIER_NVME]) need += bytes;
  return need;
}

}  // namespace

// A finalize that cannot reserve all of a rank's NVMe state keeps none of
// it: the store is closed, so the disk has back what the failed attempt
// took, and a retry on a disk with room for exactly the state fits.
TEST(Nvme, AFailedFinalizeKeepsNoReservationsAndARetryFits) {
  TempDir dir;
  auto model = make_model(adamw_on_nvme(0, dir.path), 1);
  // The master, exp_avg and exp_avg_sq: 1 MiB each, reserved in that order.
  const zd_param_id w = model->register_param(0, "w", "m", ZD_DTYPE_F32, {1 << 18}, nullptr, 0);
  const uint64_t need = nvme_need(*model);
  ASSERT_EQ(need, uint64_t{3} << 20);
  {
    FileSizeLimit limit(need - (uint64_t{512} << 10));  // room for two of the three
    try {
      model->finalize(0);
      FAIL() << "3 MiB of state in 2.5 MiB";
    } catch (const Error& e) {
      const std::string s = e.what();
      EXPECT_NE(s.find("nvme path " + dir.path + ": reserving 1 MiB for optimizer state 'exp_avg_sq' of group f32 "
                       "on rank 0 failed: File too large ("), std::string::npos) << s;
      EXPECT_NE(s.find(" free, besides 2 MiB held by this rank's earlier reservations)"), std::string::npos) << s;
    }
    int files = 0;
    EXPECT_EQ(open_file_bytes(dir.path, &files), 0u) << "the failed finalize kept reservations";
    EXPECT_EQ(files, 0) << "the failed finalize kept its store open";
    EXPECT_EQ(model->ledger(0).current(ZD_TIER_NVME, ZD_MEM_MASTER), 0u);
    EXPECT_EQ(model->ledger(0).current(ZD_TIER_NVME, ZD_MEM_OPTIMIZER), 0u);
    // Room for exactly the state: it fits from an empty store only.
    limit.set(need);
    model->finalize(0);
    EXPECT_EQ(open_file_bytes(dir.path, &files), need);
    EXPECT_EQ(files, 1);
  }
  expect_steps_land(*model, w, 1);
}

namespace {

// bf16 values 1/8 apart from -8 up: exact in bf16, and none of them zero
// but one, so a master left at zero shows.
std::vector<uint16_t> bf16_ramp(size_t n, int offset) {
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i)
    f[i] = static_cast<float>(static_cast<int>((i + static_cast<size_t>(offset)) % 128) - 64) / 8.0f;
  std::vector<uint16_t> out(n);
  convert(f.data(), ZD_DTYPE_F32, out.data(), ZD_DTYPE_BF16, n);
  return out;
}

// The registered bf16 values widened to fp32: what the masters must hold.
std::vector<float> widened(const std::vector<uint16_t>& bf16) {
  std::vector<float> out(bf16.size());
  convert(bf16.data(), ZD_DTYPE_BF16, out.data(), ZD_DTYPE_F32, out.size());
  return out;
}

// A parameter's master on a job of one rank, without a stage-3 shard's
// padding.
std::vector<float> master_of(const Model& model, zd_param_id id) {
  std::vector<float> m = model.shard_values(0, id, ShardBuffer::Master);
  m.resize(static_cast<size_t>(model.registry().param(id).numel));
  return m;
}

}  // namespace

// A failed finalize of a job of one rank puts the initial values it had
// dropped back from the masters: the retry starts from the registered
// values, bit for bit, not from zeros.
TEST(Nvme, ARetryAfterAFailedFinalizeStartsFromTheRegisteredValues) {
  TempDir dir;
  auto model = make_model(adamw_on_nvme(0, dir.path), 1);
  constexpr int64_t kNumel = 1 << 18;
  const std::vector<uint16_t> bf16 = bf16_ramp(kNumel, 0);
  std::vector<float> f32(kNumel);
  for (int64_t i = 0; i < kNumel; ++i) f32[static_cast<size_t>(i)] = std::sin(static_cast<float>(i)) / 3.0f;
  // Staged as bf16 (2 bytes a value) and as fp32.
  const zd_param_id a = model->register_param(0, "a", "m", ZD_DTYPE_F32, {kNumel}, bf16.data(), ZD_DTYPE_BF16);
  const zd_param_id b = model->register_param(0, "b", "m", ZD_DTYPE_F32, {kNumel}, f32.data(), ZD_DTYPE_F32);
  const uint64_t need = nvme_need(*model);
  {
    FileSizeLimit limit(need / 2);
    EXPECT_THROW(model->finalize(0), Error) << "the optimizer state does not fit the store";
    for (const ParamRecord& p : model->registry().params())
      EXPECT_FALSE(p.staged_init.empty()) << p.name << ": the failed finalize did not put its initial values back";
    limit.set(need);
    model->finalize(0);
  }
  EXPECT_EQ(master_of(*model, a), widened(bf16));
  EXPECT_EQ(master_of(*model, b), f32);
  expect_steps_land(*model, a, 1);
}

// A job of several ranks cannot put them back (no rank holds them whole):
// its retry is refused, not started from zeros.
TEST(Nvme, ARetryOfSeveralRanksWithoutTheInitialValuesIsRefused) {
  TempDir dir;
  auto model = make_model(adamw_on_nvme(3, dir.path), 2);
  constexpr int64_t kNumel = 1 << 18;
  const std::vector<uint16_t> bf16 = bf16_ramp(kNumel, 0);
  run_ranks(2, [&](int rank) {
    model->register_param(rank, "w", "m", ZD_DTYPE_F32, {kNumel}, bf16.data(), ZD_DTYPE_BF16);
  });
  const uint64_t need = nvme_need(*model);
  FileSizeLimit limit(need / 2);  // every rank's store: each rank's state fails alike
  std::array<std::string, 2> failed;
  run_ranks(2, [&](int rank) {
    try {
      model->finalize(rank);
    } catch (const Error& e) {
      failed[static_cast<size_t>(rank)] = e.what();
    }
  });
  ASSERT_FALSE(failed[0].empty() || failed[1].empty()) << "every rank's state is over its store";
  limit.set(need);
  run_ranks(2, [&](int rank) {
    try {
      model->finalize(rank);
      ADD_FAILURE() << "rank " << rank << " finalized without its initial values";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ZD_ERR_INVALID_STATE);
      EXPECT_NE(std::string(e.what()).find("cannot put them back"), std::string::npos) << e.what();
    }
  });
}

namespace {

// The emulated device, noting after each allocation the most its ledger and
// the model's staged initial values held together.
class HighWaterDevice final : public EmulatedDevice {
 public:
  HighWaterDevice(MemoryLedger& ledger, Workers& workers, const Model* const& model)
      : EmulatedDevice(ledger, workers, /*exported=*/false, "high-water"), ledger_(ledger), model_(model) {}
  Block allocate(uint64_t bytes, zd_mem_kind kind, const std::string& what) override {
    Block b = EmulatedDevice::allocate(bytes, kind, what);
    note();
    return b;
  }
  Block allocate_for_overwrite(uint64_t bytes, zd_mem_kind kind, const std::string& what) override {
    Block b = EmulatedDevice::allocate_for_overwrite(bytes, kind, what);
    note();
    return b;
  }
  uint64_t high_water() const { return high_water_; }

 private:
  // One rank: its finalize allocates on the thread that stages and drops.
  void note() {
    uint64_t staged = 0;
    if (model_)
      for (const ParamRecord& p : model_->registry().params()) staged += p.staged_init.bytes.size();
    high_water_ = std::max(high_water_, ledger_.current(ZD_TIER_DEVICE, ZD_MEM_ALL) + staged);
  }
  MemoryLedger& ledger_;
  const Model* const& model_;
  uint64_t high_water_ = 0;
};

}  // namespace

// Finalize holds at its highest no more than training does: the initial
// values (2 bytes a parameter of a bf16 model) are dropped once written into
// the masters, before the gradients and the optimizer state are allocated.
// Held beside the whole state, a model sized to the host by the figure its
// training holds was killed at finalize (bench/gpu/largest.py). Everything
// on the device here, where the ledger sees each allocation as it happens;
// the order of the allocations is the same in every tier.
TEST(Finalize, HoldsAtItsHighestNoMoreThanTrainingDoes) {
  for (const int stage : {0, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    JobOptions o = adamw(stage);
    o.precision = ZD_DTYPE_BF16;
    const Model* observed = nullptr;
    HighWaterDevice* device = nullptr;
    o.device_factory = [&](const std::string&, MemoryLedger& ledger, Workers& workers, int, const std::string&) {
      auto d = std::make_unique<HighWaterDevice>(ledger, workers, observed);
      device = d.get();
      return std::unique_ptr<Device>(std::move(d));
    };
    auto model = make_model(o, 1);
    observed = model.get();
    const std::vector<int64_t> sizes = {1 << 16, 3 << 14, 4097};
    std::vector<zd_param_id> ids;
    std::vector<std::vector<uint16_t>> init;
    for (size_t i = 0; i < sizes.size(); ++i) {
      init.push_back(bf16_ramp(static_cast<size_t>(sizes[i]), static_cast<int>(i)));
      ids.push_back(model->register_param(0, "w" + std::to_string(i), "m" + std::to_string(i), ZD_DTYPE_BF16,
                                          {sizes[i]}, init.back().data(), ZD_DTYPE_BF16));
    }
    model->finalize(0);
    const uint64_t steady = model->ledger(0).current(ZD_TIER_DEVICE, ZD_MEM_ALL);
    std::printf("stage %d: finalize held at most %s; after it, %s\n", stage, format_bytes(device->high_water()).c_str(),
                format_bytes(steady).c_str());
    EXPECT_LE(device->high_water(), steady) << "the initial values were held beside the whole state";
    for (size_t i = 0; i < ids.size(); ++i)
      EXPECT_EQ(master_of(*model, ids[i]), widened(init[i])) << "parameter " << i;
  }
}

TEST(Nvme, AShortReadIsNamedAndStopsTheJob) {
  TempDir dir;
  JobOptions o = adamw(0);
  o.offload.optimizer = ZD_TIER_NVME;
  o.offload.nvme_paths = {dir.path};
  auto model = make_model(o, 1);
  const zd_param_id w = model->register_param(0, "w", "m", ZD_DTYPE_F32, {1 << 16}, nullptr, 0);
  model->finalize(0);
  const std::vector<float> master = model->shard_values(0, w, ShardBuffer::Master);
  // Someone truncates the store behind zerod's back (it is an unlinked file:
  // found through /proc/self/fd).
  bool truncated = false;
  for (const auto& e : fs::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target = fs::read_symlink(e.path(), ec).string();
    if (!ec && target.rfind(dir.path, 0) == 0) {
      ASSERT_EQ(ftruncate(std::stoi(e.path().filename().string()), 4096), 0);
      truncated = true;
    }
  }
  ASSERT_TRUE(truncated) << "found no store file under " << dir.path;
  model->backward_begin(0, 0);
  model->backward_end(0, 0);
  try {
    model->step(0);
    FAIL() << "a short read";
  } catch (const Error& e) {
    const std::string s = e.what();
    EXPECT_NE(s.find(dir.path), std::string::npos) << s;
    EXPECT_TRUE(s.find("short") != std::string::npos || s.find("expected") != std::string::npos) << s;
  }
  EXPECT_EQ(model->shard_values(0, w, ShardBuffer::WorkingShard), master) << "the working copy is untouched";
  // The step stopped part-way: the model says so to every later call.
  try {
    model->forward_begin(0, 0);
    FAIL() << "a model whose step failed part-way went on";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("stopped part-way"), std::string::npos) << e.what();
  }
}

// A 2-socket machine with 4 NUMA nodes (read from an hwloc XML file): each
// rank's host buffers go to its own node, and its optimizer threads to that
// node's cores.
TEST(Numa, BuffersAndThreadsLandWhereThePolicySays) {
  TempDir dir;
  const std::string xml = dir.path + "/machine.xml";
  hwloc_topology_t topo;
  ASSERT_EQ(hwloc_topology_init(&topo), 0);
  ASSERT_EQ(hwloc_topology_set_synthetic(topo, "pack:2 numa:2 core:4 pu:1"), 0);
  ASSERT_EQ(hwloc_topology_load(topo), 0);
  ASSERT_EQ(hwloc_topology_export_xml(topo, xml.c_str(), 0), 0);
  hwloc_topology_destroy(topo);
  setenv("HWLOC_XMLFILE", xml.c_str(), 1);
  JobOptions o = adamw(1);
  o.offload.optimizer = ZD_TIER_HOST;
  o.threads = 0;
  auto model = make_model(o, 4);
  run_ranks(4, [&](int rank) {
    model->register_param(rank, "w", "m", ZD_DTYPE_F32, {4096}, nullptr, 0);
    model->finalize(rank);
  });
  unsetenv("HWLOC_XMLFILE");
  for (int r = 0; r < 4; ++r) {
    const std::string d = model->tier_description(r, ZD_TIER_HOST);
    EXPECT_NE(d.find("NUMA node " + std::to_string(r)), std::string::npos) << "rank " << r << ": " << d;
    EXPECT_EQ(model->optimizer_cpus(r), (std::vector<int>{4 * r, 4 * r + 1, 4 * r + 2, 4 * r + 3}))
        << "rank " << r;
    EXPECT_GT(model->ledger(r).current(ZD_TIER_HOST, ZD_MEM_OPTIMIZER), 0u);
  }
}

// Stage 3 with the parameters and the optimizer off the device: the device
// tier holds the live window — the gathered modules (max_live_parameters, the
// module being begun beyond it), the gradient buffers waiting in a bucket and
// the bucket being reduced — never the model. The gradients leave the device
// at backward_end for host memory, next to the optimizer.
struct WindowCase {
  const char* name;
  zd_tier tier;
  int world;
};

class LiveWindow : public ::testing::TestWithParam<WindowCase> {};

TEST_P(LiveWindow, DeviceBytesAreBoundedByTheWindowNotTheModel) {
  const WindowCase c = GetParam();
  TempDir dir;
  const int modules = 64;
  const int64_t module_elems = 1 << 17;  // one bf16 parameter per module
  const uint64_t max_live = 2 * module_elems, bucket = module_elems;
  JobOptions o;
  o.stage = 3;
  o.precision = ZD_DTYPE_BF16;
  o.optimizer_hparams = {{"lr", 1e-3}};
  o.zero_hparams = {{"param_persistence_threshold", 0},
                    {"max_live_parameters", static_cast<double>(max_live)},
                    {"prefetch_bucket_size", static_cast<double>(module_elems)},
                    {"reduce_bucket_size", static_cast<double>(bucket)}};
  o.offload.params = c.tier;
  o.offload.optimizer = c.tier;
  o.offload.nvme_paths = {dir.path};
  o.offload.nvme_tile_elems = 1 << 16;
  auto model = make_model(o, c.world);
  run_ranks(c.world, [&](int rank) {
    std::vector<float> init(static_cast<size_t>(module_elems), 0.5f);
    for (int m = 0; m < modules; ++m)
      model->register_param(rank, "w" + std::to_string(m), "m" + std::to_string(m), ZD_DTYPE_BF16, {module_elems},
                            init.data(), ZD_DTYPE_F32);
    model->finalize(rank);
    for (int s = 0; s < 3; ++s) {
      for (int m = 0; m < modules; ++m) {
        model->forward_begin(rank, m);
        model->forward_end(rank, m);
      }
      for (int m = modules; m-- > 0;) {
        model->backward_begin(rank, m);
        const ViewInfo g = model->grad_view(rank, m);
        auto* gd = static_cast<uint16_t*>(g.data);
        for (size_t j = 0; j < g.bytes / 2; ++j) gd[j] = f32_to_bf16(0.01f * static_cast<float>(j % 7));
        model->backward_end(rank, m);
      }
      model->step(rank);
    }
  });
  const uint64_t model_bytes = uint64_t{modules} * module_elems * 2;
  // Gathered: the window and the module begun beyond it. Gradients: a
  // bucket's buffers (up to a bucket and a module), the packed bucket and
  // what the rank receives of it.
  const uint64_t gathered = max_live + module_elems, in_flight = bucket + module_elems;
  const uint64_t bound = (gathered + 3 * in_flight) * 2;
  for (int r = 0; r < c.world; ++r) {
    const MemoryLedger& l = model->ledger(r);
    const uint64_t peak = l.peak(ZD_TIER_DEVICE, ZD_MEM_ALL);
    std::printf("rank %d: device peak %s (window bound %s), model %s, host gradients %s\n", r,
                format_bytes(peak).c_str(), format_bytes(bound).c_str(), format_bytes(model_bytes).c_str(),
                format_bytes(l.current(ZD_TIER_HOST, ZD_MEM_GRADS)).c_str());
    EXPECT_LE(peak, bound) << "rank " << r;
    EXPECT_LT(peak, model_bytes / 4) << "rank " << r << ": the device holds a window, not the model";
    EXPECT_LE(l.peak(ZD_TIER_DEVICE, ZD_MEM_PARAMS), gathered * 2) << "rank " << r;
    EXPECT_EQ(l.peak(ZD_TIER_DEVICE, ZD_MEM_GRADS), 0u) << "rank " << r << ": gradients accumulate off the device";
    EXPECT_EQ(l.current(ZD_TIER_HOST, ZD_MEM_GRADS), model_bytes / static_cast<uint64_t>(c.world)) << "rank " << r;
    EXPECT_EQ(l.current(ZD_TIER_DEVICE, ZD_MEM_ALL), 0u) << "rank " << r << ": nothing left on the device between steps";
  }
}

INSTANTIATE_TEST_SUITE_P(Offload, LiveWindow,
                         ::testing::Values(WindowCase{"host_1rank", ZD_TIER_HOST, 1},
                                           WindowCase{"nvme_1rank", ZD_TIER_NVME, 1},
                                           WindowCase{"nvme_2ranks", ZD_TIER_NVME, 2}),
                         [](const ::testing::TestParamInfo<WindowCase>& p) { return std::string(p.param.name); });
