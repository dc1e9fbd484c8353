// The overlapped update (offload.overlap, engine/optimizer/overlapped_update.h) gives
// the bits of the synchronous one: the same working copies seen by every
// forward, the same step figures, the same final parameters, at stages 0-3,
// with the optimizer (and at stage 3 the parameters) in host memory, with
// accumulation, clipping that triggers, an fp16 overflow that skips a step,
// part of the state on the device, and a checkpoint saved and loaded
// between steps; on the cpu device and on the emulated device the host
// cannot address (whose transfers land late, so a missing wait reads old
// bytes), and on the cuda device where this process sees a GPU (reported
// skipped, with the reason, elsewhere): the same GPU kernels either way, so
// the same bits there too. Each case also checks that the overlap happened
// where it can.
#include "zero_fixture.h"

#include "device/select.h"
#include "runtime/dtype.h"

#include "observe/tracer.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

using namespace zerod_test;

namespace {

struct Case {
  const char* name;
  int stage;
  zd_tier params, optimizer;
  zd_dtype precision;
  int world = 1;
  int64_t accumulation = 1;
  double clipping = 0.0;
  double ratio = 1.0;          // offload.ratio: the rest of the state stays on the device
  bool overflow = false;       // an inf gradient at step 4 (fp16: the step is skipped)
  bool can_overlap = true;     // the engine overlaps this job's update (on the cpu device)
  // offload.accumulate of the overlapped run (the synchronous one: host).
  OffloadConfig::Accumulate accumulate = OffloadConfig::Accumulate::Auto;
  // In each window's last micro-batch module 0's backward runs a second time
  // (a module used twice): with the window on the device, its range was
  // handed to the accumulators already, and the second sum must not be lost
  // to that settle's zero of the range.
  bool backward_twice = false;
  // The trainer sets each step's lr (zd_model_set_lr) right after the step
  // before returns, the next update still running (docs/abi.md's pattern).
  bool set_lr = false;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// Stage 3 on several ranks overlaps where its gathers are collectives (a
// device the host cannot address); on the cpu device they copy the peers'
// shards at a version the whole update moves.
bool overlaps(const Case& c, const std::string& device) {
  return c.can_overlap || (c.stage == 3 && device != "cpu");
}

struct Result {
  std::vector<std::vector<float>> seen;  // every working copy every forward saw, in order
  std::vector<double> norms;             // the step figures
  std::vector<double> lrs;
  std::vector<int> skipped;
  std::vector<std::vector<float>> params;
  uint64_t overlapped = 0;
  uint64_t device_grads = 0;  // bytes of gradients in the device tier (the accumulation window)
};

constexpr int kSteps = 6;
const std::vector<int64_t> kSizes = {70000, 300, 1 << 16, 333, 40000};

Result train(const Case& c, const std::string& device, bool overlap, OffloadConfig::Accumulate accumulate,
             const std::string& ckpt_dir) {
  JobOptions o;
  o.device = device;
  o.stage = c.stage;
  o.precision = c.precision;
  o.accumulation = c.accumulation;
  o.clipping = c.clipping;
  o.threads = 2;
  o.optimizer_hparams = {{"lr", 1e-2}, {"weight_decay", 0.01}};
  if (c.stage == 3)  // the small ones stay gathered (persistent), the rest is gathered per module
    o.zero_hparams = {{"param_persistence_threshold", 400}, {"max_live_parameters", 1 << 17},
                      {"prefetch_bucket_size", 1 << 16}, {"reduce_bucket_size", 1 << 16}};
  o.offload.params = c.params;
  o.offload.optimizer = c.optimizer;
  o.offload.ratio = c.ratio;
  o.offload.overlap = overlap;
  o.offload.accumulate = accumulate;
  auto model = make_model(o, c.world);
  Result out;
  std::mutex mu;
  run_ranks(c.world, [&](int rank) {
    Device& d = const_cast<Device&>(model->device(rank));
    const std::vector<zd_param_id> ids = register_sine_modules(*model, rank, kSizes, c.precision);
    for (int s = 0; s < kSteps; ++s) {
      if (c.set_lr) model->set_lr(rank, 1e-2 / (1 + s));
      if (s == 3) {
        // Between steps: a checkpoint out and back in changes nothing.
        model->save_checkpoint(rank, ckpt_dir);
        model->load_checkpoint(rank, ckpt_dir);
      }
      for (int64_t micro = 0; micro < c.accumulation; ++micro) {
        std::vector<std::vector<float>> w = forward_reading(*model, d, rank, ids);
        for (size_t m = ids.size(); m-- > 0;) {
          model->backward_begin(rank, static_cast<zd_module_id>(m));
          const ViewInfo g = model->grad_view(rank, ids[m]);
          std::vector<float> grad(w[m].size());
          for (size_t j = 0; j < grad.size(); ++j)
            grad[j] = w[m][j] - std::cos(static_cast<float>(j + s + rank + micro));
          if (c.overflow && s == 4 && m == 2 && rank == 0) grad[7] = std::numeric_limits<float>::infinity();
          write_view(d, g, grad);
          model->backward_end(rank, static_cast<zd_module_id>(m));
        }
        if (c.backward_twice && micro == c.accumulation - 1) {
          model->backward_begin(rank, 0);
          const ViewInfo g = model->grad_view(rank, ids[0]);
          std::vector<float> grad(w[0].size());
          for (size_t j = 0; j < grad.size(); ++j) grad[j] = 0.5f * w[0][j] - std::sin(static_cast<float>(j + s));
          write_view(d, g, grad);
          model->backward_end(rank, 0);
        }
        const StepFigures f = model->step(rank);
        if (rank == 0) {
          std::lock_guard<std::mutex> lock(mu);
          for (auto& x : w) out.seen.push_back(std::move(x));
          if (f.boundary) {
            out.norms.push_back(f.grad_norm);
            out.lrs.push_back(f.lr);
            out.skipped.push_back(f.skipped ? 1 : 0);
          }
        }
      }
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      std::vector<float> v(static_cast<size_t>(model->registry().param(ids[i]).numel));
      model->read_param(rank, ids[i], ZD_DTYPE_F32, v.data(), v.size() * 4);
      if (rank == 0) out.params.push_back(std::move(v));
    }
  });
  out.overlapped = model->counters(0).overlapped_updates.load();
  out.device_grads = model->ledger(0).current(ZD_TIER_DEVICE, ZD_MEM_GRADS);
  return out;
}

// Equal as bits (NaN norms of skipped steps included).
bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

class Overlap : public ::testing::TestWithParam<std::tuple<std::string, Case>> {};

TEST_P(Overlap, GivesTheBitsOfTheSynchronousUpdate) {
  const auto& [device, c] = GetParam();
  if (device == "cuda") {
    const CudaAvailability a = cuda_availability();
    if (a.devices == 0) GTEST_SKIP() << "the cuda device cannot be tested here: " << a.why;
  }
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("zerod-overlap-" + std::to_string(getpid()) + "-" + c.name);
  std::filesystem::remove_all(dir);
  const Result sync = train(c, device, false, OffloadConfig::Accumulate::Host, dir + "/sync");
  const Result over = train(c, device, true, c.accumulate, dir + "/overlap");
  std::filesystem::remove_all(dir);
  EXPECT_EQ(sync.overlapped, 0u);
  EXPECT_EQ(sync.device_grads, 0u) << "the synchronous run accumulates on the host";
  if (c.accumulate == OffloadConfig::Accumulate::Device) {
    EXPECT_GT(over.device_grads, 0u) << c.name << ": the accumulation window is on the device";
  }
  if (overlaps(c, device)) {
    // Every applied step overlapped its update (a skipped one has none).
    int applied = 0;
    for (int s : over.skipped) applied += s ? 0 : 1;
    EXPECT_EQ(over.overlapped, static_cast<uint64_t>(applied)) << c.name;
  } else {
    EXPECT_EQ(over.overlapped, 0u) << c.name << ": this job cannot overlap its update";
  }
  ASSERT_EQ(sync.seen.size(), over.seen.size());
  for (size_t i = 0; i < sync.seen.size(); ++i)
    ASSERT_TRUE(sync.seen[i] == over.seen[i]) << c.name << ": forward " << i << " saw other values";
  EXPECT_TRUE(same_bits(sync.norms, over.norms)) << c.name;
  EXPECT_TRUE(same_bits(sync.lrs, over.lrs)) << c.name;
  if (c.set_lr) {
    EXPECT_EQ(over.lrs.back(), 1e-2 / kSteps) << c.name << ": the updates took the lr the trainer set";
  }
  EXPECT_EQ(sync.skipped, over.skipped) << c.name;
  if (c.overflow) {
    EXPECT_EQ(over.skipped[4], 1) << c.name << ": the overflow skipped step 5";
  }
  if (c.clipping > 0) {
    EXPECT_GT(over.norms.front(), c.clipping) << c.name << ": clipping triggers";
  }
  EXPECT_TRUE(sync.params == over.params) << c.name;
}

INSTANTIATE_TEST_SUITE_P(
    Jobs, Overlap,
    ::testing::Combine(
        ::testing::Values("cpu", "opaque", "cuda"),
        ::testing::Values(
            Case{"stage0_host_f32", 0, ZD_TIER_DEVICE, ZD_TIER_HOST, ZD_DTYPE_F32},
            Case{"stage1_host_bf16_accumulation", 1, ZD_TIER_DEVICE, ZD_TIER_HOST, ZD_DTYPE_BF16, 1, 2},
            Case{"stage2_host_bf16_clipping", 2, ZD_TIER_DEVICE, ZD_TIER_HOST, ZD_DTYPE_BF16, 1, 1, 0.05},
            Case{"stage3_host_bf16_accumulation_clipping", 3, ZD_TIER_DEVICE, ZD_TIER_HOST, ZD_DTYPE_BF16, 1, 2, 0.05},
            // The micro-batches before the last add up on the device.
            Case{"stage3_host_bf16_window_on_device", 3, ZD_TIER_DEVICE, ZD_TIER_HOST, ZD_DTYPE_BF16, 1, 3, 0.05,
                 1.0, false, true, OffloadConfig::Accumulate::Device},
            Case{"stage2_host_f32_window_on_device", 2, ZD_TIER_DEVICE, ZD_TIER_HOST, ZD_DTYPE_F32, 1, 2, 0, 1.0,
                 false, true, OffloadConfig::Accumulate::Device},
            Case{"stage3_params_host_f16_window_overflow", 3, ZD_TIER_HOST, ZD_TIER_HOST, ZD_DTYPE_F16, 1, 2, 0,
                 1.0, true, true, OffloadConfig::Accumulate::Device},
            Case{"stage3_host_f32_window_backward_twice", 3, ZD_TIER_DEVICE, ZD_TIER_HOST, ZD_DTYPE_F32, 1, 2, 0,
                 1.0, false, true, OffloadConfig::Accumulate::Device, true},
            Case{"stage3_params_host_f32", 3, ZD_TIER_HOST, ZD_TIER_HOST, ZD_DTYPE_F32},
            Case{"stage3_params_host_f16_overflow", 3, ZD_TIER_HOST, ZD_TIER_HOST, ZD_DTYPE_F16, 1, 1, 0, 1.0, true},
            Case{"stage0_host_f32_2ranks", 0, ZD_TIER_DEVICE, ZD_TIER_HOST, ZD_DTYPE_F32, 2},
            // Several ranks that gather each other's new working copies
            // right after the update (stage 1), or read each other's
            // shards one-sided (stage 3 on the cpu device): the update
            // stays inside zd_step.
            Case{"stage1_host_bf16_2ranks", 1, ZD_TIER_DEVICE, ZD_TIER_HOST, ZD_DTYPE_BF16, 2, 1, 0, 1.0, false,
                 false},
            Case{"stage3_host_f32_2ranks", 3, ZD_TIER_DEVICE, ZD_TIER_HOST, ZD_DTYPE_F32, 2, 1, 0, 1.0, false,
                 false},
            Case{"stage2_host_bf16_2ranks_window_on_device", 2, ZD_TIER_DEVICE, ZD_TIER_HOST, ZD_DTYPE_BF16, 2, 2,
                 0, 1.0, false, false, OffloadConfig::Accumulate::Device})),
    [](const auto& p) { return std::get<0>(p.param) + "_" + std::get<1>(p.param).name; });

// What a rank gathers ahead does not depend on how far its update has got:
// stage 3's prefetched gathers are collectives, so every rank must issue the
// same ones in the same order, and ranks whose updates run at different
// paces once disagreed ("ranks disagree at collective #16", CI). A trainer
// that begins the next forward at once (its update still running) and one
// that waits first (its update done) must gather the same modules ahead:
// the same count of begins that found their module already gathered, and
// the same bits as the synchronous update. On the emulated device, where
// every gather goes through the comm plugin, with 1 rank (whose pace only
// its trainer sets) and with 2.
struct PaceRun {
  std::vector<std::vector<float>> params;
  uint64_t ready = 0, waited = 0, overlapped = 0;
};

PaceRun run_at_pace(int world, bool overlap, int pause_ms) {
  // A small first module, then larger ones whose updates take a while; a
  // window and a prefetch budget that reach past the forward into the
  // backward's modules.
  const std::vector<int64_t> sizes = {2000, 100000, 1000000, 1000000};
  JobOptions o;
  o.device = "opaque";
  o.stage = 3;
  o.precision = ZD_DTYPE_BF16;
  o.threads = 1;
  o.optimizer_hparams = {{"lr", 1e-2}, {"weight_decay", 0.01}};
  o.zero_hparams = {{"param_persistence_threshold", 0}, {"max_live_parameters", 1 << 23},
                    {"prefetch_bucket_size", 1 << 22}, {"reduce_bucket_size", 1 << 20}};
  o.offload.params = ZD_TIER_HOST;
  o.offload.optimizer = ZD_TIER_HOST;
  o.offload.overlap = overlap;
  auto model = make_model(o, world);
  PaceRun out;
  run_ranks(world, [&](int rank) {
    Device& d = const_cast<Device&>(model->device(rank));
    const std::vector<zd_param_id> ids = register_sine_modules(*model, rank, sizes, o.precision);
    for (int s = 0; s < 5; ++s) {
      if (rank == 0 && pause_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
      std::vector<std::vector<float>> w = forward_reading(*model, d, rank, ids);
      for (size_t m = ids.size(); m-- > 0;) {
        model->backward_begin(rank, static_cast<zd_module_id>(m));
        std::vector<float> grad(w[m].size());
        for (size_t j = 0; j < grad.size(); ++j) grad[j] = w[m][j] - std::cos(static_cast<float>(j + s + rank));
        write_view(d, model->grad_view(rank, ids[m]), grad);
        model->backward_end(rank, static_cast<zd_module_id>(m));
      }
      model->step(rank);
    }
    for (zd_param_id id : ids) {  // a collective: every rank reads
      std::vector<float> v(static_cast<size_t>(model->registry().param(id).numel));
      model->read_param(rank, id, ZD_DTYPE_F32, v.data(), v.size() * 4);
      if (rank == 0) out.params.push_back(std::move(v));
    }
  });
  out.ready = model->counters(world - 1).gathers_ready.load();
  out.waited = model->counters(world - 1).gathers_waited.load();
  out.overlapped = model->counters(world - 1).overlapped_updates.load();
  return out;
}

class OverlapPaces : public ::testing::TestWithParam<int> {};

TEST_P(OverlapPaces, PrefetchDoesNotDependOnTheUpdatesProgress) {
  const int world = GetParam();
  const PaceRun sync = run_at_pace(world, false, 0);
  const PaceRun eager = run_at_pace(world, true, 0);
  const PaceRun patient = run_at_pace(world, true, 60);
  EXPECT_EQ(eager.overlapped, 5u);
  EXPECT_EQ(patient.overlapped, 5u);
  // The last rank's begins (rank 1 of 2 never pauses): as many found their
  // module gathered ahead whether or not its update was still running.
  EXPECT_EQ(eager.ready, patient.ready) << "begins that found their module gathered ahead";
  EXPECT_EQ(eager.waited, patient.waited);
  EXPECT_EQ(sync.ready, patient.ready);
  EXPECT_GT(patient.ready, 0u) << "the modules were gathered ahead";
  EXPECT_TRUE(sync.params == eager.params) << "the overlapped update gives the synchronous bits";
  EXPECT_TRUE(sync.params == patient.params);
}

INSTANTIATE_TEST_SUITE_P(Ranks, OverlapPaces, ::testing::Values(1, 2),
                         [](const auto& p) { return std::to_string(p.param) + (p.param == 1 ? "rank" : "ranks"); });

// One micro-batch of rank 0 over modules 0..count-1: each forward in
// order, then each backward in reverse.
void forward_and_backward(Model& model, zd_module_id count) {
  for (zd_module_id m = 0; m < count; ++m) {
    model.forward_begin(0, m);
    model.forward_end(0, m);
  }
  for (zd_module_id m = count; m-- > 0;) {
    model.backward_begin(0, m);
    model.backward_end(0, m);
  }
}

// What the overlapped update leaves exposed is counted (update_wait_ns, the
// metrics' zerod_update_wait_seconds_total, `zerod top`'s "update wait"): a
// trainer that begins each forward as soon as zd_step returns finds its
// modules' updates still running (three modules of 2^20 fp32 elements, Adam
// on one thread, take milliseconds; the begins come microseconds after the
// step, over six steps), and the time it waits is added up. The synchronous
// update never makes a begin wait.
uint64_t update_wait_ns(bool overlap, uint64_t* overlapped) {
  JobOptions o;
  o.threads = 1;
  o.offload.optimizer = ZD_TIER_HOST;
  o.offload.overlap = overlap;
  auto model = make_model(o, 1);
  const std::vector<zd_param_id> ids = register_sine_modules(*model, 0, {1 << 20, 1 << 20, 1 << 20}, ZD_DTYPE_F32);
  for (int s = 0; s < 6; ++s) {
    forward_and_backward(*model, 3);
    model->step(0);
  }
  *overlapped = model->counters(0).overlapped_updates.load();
  return static_cast<uint64_t>(model->counters(0).update_wait_ns.load());
}

TEST(OverlapCounters, TheForwardsWaitForTheUpdateIsCounted) {
  uint64_t overlapped = 0;
  EXPECT_EQ(update_wait_ns(false, &overlapped), 0u) << "the synchronous update is inside zd_step";
  EXPECT_EQ(overlapped, 0u);
  EXPECT_GT(update_wait_ns(true, &overlapped), 0u) << "begins right after the step wait for their module";
  EXPECT_EQ(overlapped, 6u) << "every step's update ran behind it";
}

// A trainer that sets each step's lr right after the step before returns
// (its own schedule): the update still running took its lr at its boundary,
// and the next takes the one set. On one rank and on two (where the call is
// a collective), at stages 0 and 3, with accumulation.
INSTANTIATE_TEST_SUITE_P(
    SetLr, Overlap,
    ::testing::Combine(
        ::testing::Values("cpu", "opaque"),
        ::testing::Values(
            Case{.name = "stage0_host_f32_set_lr", .stage = 0, .params = ZD_TIER_DEVICE, .optimizer = ZD_TIER_HOST,
                 .precision = ZD_DTYPE_F32, .set_lr = true},
            Case{.name = "stage3_params_host_bf16_accumulation_set_lr", .stage = 3, .params = ZD_TIER_HOST,
                 .optimizer = ZD_TIER_HOST, .precision = ZD_DTYPE_BF16, .accumulation = 2, .set_lr = true},
            Case{.name = "stage0_host_f32_2ranks_set_lr", .stage = 0, .params = ZD_TIER_DEVICE,
                 .optimizer = ZD_TIER_HOST, .precision = ZD_DTYPE_F32, .world = 2, .set_lr = true},
            Case{.name = "stage3_host_f32_2ranks_set_lr", .stage = 3, .params = ZD_TIER_DEVICE,
                 .optimizer = ZD_TIER_HOST, .precision = ZD_DTYPE_F32, .world = 2, .can_overlap = false,
                 .set_lr = true})),
    [](const auto& p) { return std::get<0>(p.param) + "_" + std::get<1>(p.param).name; });

// A call right after zd_step, while the update runs behind it:
// zd_model_set_lr (a trainer's own schedule, set before each step's first
// micro-batch) or a parameter read, which waits for the whole update. The
// update is long (three modules of 2^21 fp32 elements, Adam on one thread);
// what the calls took, what the update took (optimizer_ns), and what the
// trainer was counted as waiting for it.
struct AfterStep {
  double calls_ns = 0;
  double update_ns = 0;
  double wait_ns = 0;
};

AfterStep call_after_each_step(bool set_lr) {
  JobOptions o;
  o.threads = 1;
  o.offload.optimizer = ZD_TIER_HOST;
  o.offload.overlap = true;
  auto model = make_model(o, 1);
  const std::vector<zd_param_id> ids = register_sine_modules(*model, 0, {1 << 21, 1 << 21, 1 << 21}, ZD_DTYPE_F32);
  std::vector<float> read(1 << 21);
  AfterStep out;
  for (int s = 0; s < 5; ++s) {
    forward_and_backward(*model, 3);
    model->step(0);
    const auto t0 = std::chrono::steady_clock::now();
    if (set_lr)
      model->set_lr(0, 1e-3 / (1 + s));
    else
      model->read_param(0, ids[2], ZD_DTYPE_F32, read.data(), read.size() * 4);
    out.calls_ns += std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  }
  const observe::RankCounters& c = model->counters(0);
  EXPECT_EQ(c.overlapped_updates.load(), 5u);
  out.update_ns = static_cast<double>(c.optimizer_ns[ZD_TIER_HOST].load());
  out.wait_ns = static_cast<double>(c.update_wait_ns.load());
  return out;
}

// The update behind the step took its lr at the boundary; set_lr sets the
// next one's, so it does not wait for that update (it waited for all of
// it, and the overlap was lost for every trainer that sets its own lr).
TEST(OverlapCounters, SetLrRightAfterTheStepDoesNotWaitForTheUpdate) {
  const AfterStep r = call_after_each_step(true);
  EXPECT_LT(r.calls_ns, 0.25 * r.update_ns) << "set_lr waited for the update behind the step";
  // Whatever it waited is counted.
  EXPECT_GE(r.wait_ns + 1e6, r.calls_ns);
}

// A call that reads what the update writes waits for all of it, and that
// wait is the trainer's as a begin call's is: counted, and a "wait for
// update" span on the timeline (docs/offload.md).
TEST(OverlapCounters, AWaitForTheWholeUpdateIsCounted) {
  const AfterStep r = call_after_each_step(false);
  EXPECT_GT(r.calls_ns, 0.5 * r.update_ns) << "the reads came while the updates ran";
  EXPECT_GT(r.wait_ns, 0.5 * r.update_ns) << "the reads' waits for the update were not counted";
  EXPECT_LE(r.wait_ns, r.calls_ns);
}

// An overlapped update that fails is a step that stopped part-way, as a
// synchronous one is, whichever of the rank's waits comes to the failure
// first: the job breaks, half_applied_step() says which step, every later
// call fails saying so, and no final snapshot saves the half-applied state.
// On the emulated device, whose upload of module 1's new working copy
// fails in the third update (stage 3, the optimizer on the host).
struct Faults {
  std::atomic<bool> armed{false};
  std::atomic<int> uploads{0};  // the failing thread's, since armed
  // The thread whose uploads fail: the overlapped update's, or the rank's
  // own ("calls"), where a synchronous pass runs.
  const char* failing_role = "optimizer";
  int fail_at = 2;  // the overlapped update's: module 0's goes, module 1's fails
  // The failing upload is issued and every wait for it fails (a copy
  // engine's error, which CUDA reports at the waits), not the call.
  bool fail_at_wait = false;
  std::atomic<uint64_t> failed_ticket{0};
  // The failing upload waits until the trainer releases it; the trainer's
  // next gather, when held, waits until the failed update has ended.
  bool wait_for_release = false;
  std::atomic<bool> hold_gather{false};
  bool held = false;  // the held gather saw the update end
  // The failing upload waits until the held gather has begun, so the
  // failure lands inside it whatever the machine's load (without this, a
  // loaded machine's update could fail before the begin reached its gather).
  bool fail_while_gathering = false;

  std::mutex mu;
  std::condition_variable cv;
  bool released = false;
  bool update_ended = false;
  bool gather_reached = false;

  void set(bool Faults::*flag) {
    {
      std::lock_guard<std::mutex> lock(mu);
      this->*flag = true;
    }
    cv.notify_all();
  }
  bool wait(bool Faults::*flag) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(30), [&] { return this->*flag; });
  }
};

// Runs `at_exit` as the thread ends: on the update's thread, once its
// failure is recorded (OverlappedUpdate::run returned).
struct AtThreadExit {
  std::function<void()> at_exit;
  ~AtThreadExit() {
    if (at_exit) at_exit();
  }
};
thread_local AtThreadExit this_thread_exit;

class FailingUpload final : public EmulatedDevice {
 public:
  FailingUpload(MemoryLedger& ledger, Workers& workers, Faults& f)
      : EmulatedDevice(ledger, workers, /*exported=*/false, "opaque"), f_(f) {}
  const char* name() const override { return "opaque"; }

  uint64_t upload(void* dst, const void* src, uint64_t n) override {
    if (f_.armed && std::strcmp(observe::thread_role(), f_.failing_role) == 0 && ++f_.uploads == f_.fail_at) {
      if (f_.fail_at_wait) return f_.failed_ticket = EmulatedDevice::upload(dst, src, n);
      if (f_.wait_for_release) f_.wait(&Faults::released);
      if (f_.fail_while_gathering) f_.wait(&Faults::gather_reached);
      // The update's thread ends once its failure is recorded; the rank's
      // is the test's own, which outlives these Faults.
      if (std::strcmp(f_.failing_role, "optimizer") == 0)
        this_thread_exit.at_exit = [&f = f_] { f.set(&Faults::update_ended); };
      fail(ZD_ERR_IO, "injected: the upload of module 1's new working copy failed");
    }
    return EmulatedDevice::upload(dst, src, n);
  }
  void transfer_wait(uint64_t t) override {
    EmulatedDevice::transfer_wait(t);
    if (t && t == f_.failed_ticket) fail(ZD_ERR_IO, "injected: the upload of a new working copy failed");
  }
  // A begin call's gather of its own module, on the trainer's thread: after
  // the begin waited for its module's update, before it asks whether the
  // next one's is done (Residency::make_resident's prefetch).
  Block allocate_for_overwrite(uint64_t bytes, zd_mem_kind kind, const std::string& what) override {
    if (std::strcmp(observe::thread_role(), "calls") == 0 && f_.hold_gather.exchange(false)) {
      f_.set(&Faults::gather_reached);
      f_.held = f_.wait(&Faults::update_ended);
    }
    return EmulatedDevice::allocate_for_overwrite(bytes, kind, what);
  }

 private:
  Faults& f_;
};

class OverlapFailure : public ::testing::Test {
 protected:
  void SetUp() override {
    snapshots_ = std::filesystem::temp_directory_path() /
                 ("zerod-overlap-failure-" + std::to_string(getpid()) + "-" +
                  ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(snapshots_);
    JobOptions o;
    o.stage = 3;
    o.offload.optimizer = ZD_TIER_HOST;
    o.offload.overlap = true;
    o.zero_hparams = {{"param_persistence_threshold", 0}};
    o.snapshot.path = snapshots_.string();
    o.snapshot.every = 0;  // only at the end: no step keeps its update inside zd_step for a snapshot
    o.device_factory = [this](const std::string&, MemoryLedger& ledger, Workers& workers, int, const std::string&) {
      return std::unique_ptr<Device>(std::make_unique<FailingUpload>(ledger, workers, faults_));
    };
    model_ = make_model(o, 1);
    register_sine_modules(*model_, 0, {4000, 4000, 4000}, ZD_DTYPE_F32);
  }
  void TearDown() override {
    model_.reset();
    std::filesystem::remove_all(snapshots_);
  }

  // Two steps, then a third whose update fails behind it; the forward that
  // follows has its modules gathered ahead (the recorded order).
  void fail_the_third_update() {
    for (int s = 0; s < 3; ++s) {
      window();
      if (s == 2) faults_.armed = true;  // the update before is over: the window's begins waited for it
      model_->step(0);
    }
  }
  void window() { forward_and_backward(*model_, 3); }
  // A trainer that catches each failure and goes on: what each call threw.
  std::vector<std::string> go_on_regardless() {
    std::vector<std::string> thrown;
    auto attempt = [&](const std::function<void()>& call) {
      try {
        call();
      } catch (const Error& e) {
        thrown.emplace_back(e.what());
      }
    };
    for (zd_module_id m = 0; m < 3; ++m) {
      attempt([&] { model_->forward_begin(0, m); });
      attempt([&] { model_->forward_end(0, m); });
    }
    attempt([&] { model_->step(0); });
    return thrown;
  }
  void expect_stopped_part_way(const std::vector<std::string>& thrown) {
    const std::optional<Error> half = model_->half_applied_step();
    ASSERT_TRUE(half.has_value()) << "the failed update did not mark its step half applied";
    EXPECT_EQ(half->code(), ZD_ERR_IO);
    EXPECT_NE(std::string(half->what()).find("injected"), std::string::npos) << half->what();
    EXPECT_NE(std::string(half->what()).find("the optimizer step 3 stopped part-way"), std::string::npos)
        << half->what();
    EXPECT_FALSE(model_->broken_reason().empty());
    ASSERT_FALSE(thrown.empty());
    for (const std::string& e : thrown) EXPECT_NE(e.find("stopped part-way"), std::string::npos) << e;
    model_->final_snapshot();
    if (!std::filesystem::exists(snapshots_)) return;
    for (const auto& e : std::filesystem::directory_iterator(snapshots_)) {
      EXPECT_NE(e.path().filename().string().rfind("step-", 0), 0u) << "a snapshot was saved: " << e.path();
    }
  }

  std::filesystem::path snapshots_;
  Faults faults_;  // outlives the model, whose device holds it
  std::unique_ptr<Model> model_;
};

// The failure lands while forward_begin(0) gathers module 0, after it
// waited for module 0's update: its prefetch finds module 1's update done,
// and failed. (It threw the failure bare and cleared it: the job went on,
// and the final snapshot saved the half-applied step.)
TEST_F(OverlapFailure, AFailureTheBeginsPrefetchFindsIsAStepThatStoppedPartWay) {
  faults_.fail_while_gathering = true;
  fail_the_third_update();
  faults_.hold_gather = true;
  const std::vector<std::string> thrown = go_on_regardless();
  EXPECT_TRUE(faults_.held) << "the update did not fail while the begin gathered";
  expect_stopped_part_way(thrown);
}

// The failure lands after the prefetch issued module 1's gather, which
// waits for the update on zerod's stream: the job breaks from there, before
// the trainer's next call (a wait for the stream, a drain, may come to the
// failure before the rank's own wait for module 1 does).
TEST_F(OverlapFailure, AFailureAGatherAheadWaitsForBreaksTheJobAtOnce) {
  faults_.wait_for_release = true;
  fail_the_third_update();
  model_->forward_begin(0, 0);  // module 0's update is done; module 1's gather waits for its update
  faults_.set(&Faults::released);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!model_->half_applied_step() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(model_->half_applied_step().has_value()) << "the gather's wait left the failure unreported";
  std::vector<std::string> thrown;
  try {
    model_->forward_end(0, 0);
  } catch (const Error& e) {
    thrown.emplace_back(e.what());
  }
  expect_stopped_part_way(thrown);
}

// An update whose upload of a new working copy fails, at the call or at
// the waits for it, is a step that stopped part-way, and the model can
// still be destroyed: the update gives the upload ring back however it
// ends. (A failed synchronous pass kept the ring's lease, as did an
// overlapped update whose wait for an upload failed, and the model's
// release of the ring's buffer, HostStaging::release, waited for that
// lease forever.) The optimizer on the host, the parameters on the
// emulated device the host cannot write: each new working copy is uploaded
// through the ring.
struct RingCase {
  const char* name;
  int stage;
  bool overlap;
  bool fail_at_wait;
};

class UploadRingFailure : public ::testing::TestWithParam<RingCase> {};

TEST_P(UploadRingFailure, AFailedUploadStopsTheStepAndTheModelCanStillBeDestroyed) {
  const RingCase& c = GetParam();
  // Shared with the destroying thread, which outlives this test if the
  // destroy hangs.
  auto faults = std::make_shared<Faults>();
  faults->failing_role = c.overlap ? "optimizer" : "calls";  // the update's thread, or the rank's
  faults->fail_at = 1;
  faults->fail_at_wait = c.fail_at_wait;
  JobOptions o;
  o.stage = c.stage;
  o.offload.optimizer = ZD_TIER_HOST;
  o.offload.overlap = c.overlap;
  o.device_factory = [faults](const std::string&, MemoryLedger& ledger, Workers& workers, int, const std::string&) {
    return std::unique_ptr<Device>(std::make_unique<FailingUpload>(ledger, workers, *faults));
  };
  auto model = make_model(o, 1);
  register_sine_modules(*model, 0, {4000, 4000, 4000}, ZD_DTYPE_F32);
  std::vector<std::string> thrown;
  try {
    for (int s = 0; s < 3; ++s) {
      forward_and_backward(*model, 3);
      if (s == 2) faults->armed = true;  // the rank's next upload is the third update's
      model->step(0);
    }
    forward_and_backward(*model, 3);  // an overlapped update's failure comes to its first begin
  } catch (const Error& e) {
    thrown.emplace_back(e.what());
  }
  ASSERT_EQ(thrown.size(), 1u) << "the failed upload was not reported";
  EXPECT_NE(thrown[0].find("the optimizer step 3 stopped part-way"), std::string::npos) << thrown[0];
  const std::optional<Error> half = model->half_applied_step();
  ASSERT_TRUE(half.has_value()) << "the failed update did not mark its step half applied";
  EXPECT_EQ(half->code(), ZD_ERR_IO);
  EXPECT_NE(std::string(half->what()).find("injected"), std::string::npos) << half->what();

  // On a thread of its own, detached: a destroy that hangs fails the test
  // instead of hanging it (std::async's future would wait for it).
  auto destroyed = std::make_shared<std::promise<void>>();
  std::future<void> done = destroyed->get_future();
  std::thread([model = std::move(model), destroyed, faults]() mutable {
    model.reset();
    destroyed->set_value();
  }).detach();
  EXPECT_EQ(done.wait_for(std::chrono::seconds(30)), std::future_status::ready)
      << "destroying the model whose update failed did not return";
}

INSTANTIATE_TEST_SUITE_P(
    Upload, UploadRingFailure,
    ::testing::Values(RingCase{"synchronous_stage3_the_call_fails", 3, false, false},
                      RingCase{"synchronous_stage3_its_wait_fails", 3, false, true},
                      RingCase{"overlapped_stage2_its_wait_fails", 2, true, true}),
    [](const auto& p) { return std::string(p.param.name); });

// A group's optimizer split between the device and the host (offload.ratio),
// which only the cpu device runs: the device's part in zd_step, the host's
// behind it.
INSTANTIATE_TEST_SUITE_P(
    Split, Overlap,
    ::testing::Combine(::testing::Values("cpu"),
                       ::testing::Values(Case{"stage3_half_on_device_bf16", 3, ZD_TIER_DEVICE, ZD_TIER_HOST,
                                              ZD_DTYPE_BF16, 1, 1, 0, 0.5})),
    [](const auto& p) { return std::get<0>(p.param) + "_" + std::get<1>(p.param).name; });

}  // namespace
