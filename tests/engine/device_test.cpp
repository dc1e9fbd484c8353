// Every device does the engine's work on its memory as the scalar reference
// does (engine/grad/grad_math.h on host memory): copies, fills, gradient
// arithmetic in every dtype pair, the statistics of a step, the optimizer
// update. The cpu device runs everywhere; the cuda device where this
// process sees a GPU, and is reported skipped, with the reason, elsewhere.
#include "device/context_failure_watch.h"
#include "device/cuda_failure.h"
#include "device/select.h"
#include "device/signal_page.h"
#include "memory/arena.h"
#include "runtime/dtype.h"
#include "error.h"
#include "grad/grad_math.h"
#include "runtime/plugin_host.h"
#include "runtime/workers.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#ifndef ZEROD_PLUGIN_DIR
#error "the build passes ZEROD_PLUGIN_DIR"
#endif

namespace {

using namespace zerod;

class OnDevice : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "cuda") {
      const CudaAvailability a = cuda_availability();
      if (a.devices == 0) GTEST_SKIP() << "the cuda device cannot be tested here: " << a.why;
    }
    device_ = open_device(GetParam(), ledger_, workers_, -1, "device-test");
  }
  void TearDown() override {
    for (const Block& b : blocks_) device_->release(b, ZD_MEM_BUFFERS);
  }

  // A block on the device holding `bytes` of host data.
  Block put(const void* data, uint64_t bytes) {
    blocks_.push_back(device_->allocate(bytes, ZD_MEM_BUFFERS, "a test buffer"));
    device_->copy_to_device(blocks_.back().ptr, data, bytes);
    return blocks_.back();
  }
  std::vector<std::byte> get(const Block& b, uint64_t bytes) {
    std::vector<std::byte> out(bytes);
    device_->copy_to_host(out.data(), b.ptr, bytes);
    return out;
  }

  MemoryLedger ledger_;
  ThreadPool pool_{2};
  std::mutex pool_mu_;
  Workers workers_{pool_, pool_mu_};
  std::unique_ptr<Device> device_;
  std::vector<Block> blocks_;
};

// n values of dtype dt: small, signed, with an exact zero and a value that
// rounds differently in each 16-bit type.
std::vector<std::byte> values(zd_dtype dt, uint64_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-3.0f, 3.0f);
  std::vector<float> f(n);
  for (auto& v : f) v = d(gen);
  if (n > 2) f[0] = 0.0f, f[1] = 1.0f + 1.0f / 1024 + 1.0f / 65536;
  std::vector<std::byte> out(n * dtype_size(dt));
  convert(f.data(), ZD_DTYPE_F32, out.data(), dt, n);
  return out;
}

constexpr zd_dtype kTypes[] = {ZD_DTYPE_F32, ZD_DTYPE_BF16, ZD_DTYPE_F16};

TEST_P(OnDevice, BlocksAreZeroAlignedAndCharged) {
  const Block b = device_->allocate(1000, ZD_MEM_PARAMS, "a block");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.ptr) % 64, 0u);
  EXPECT_GE(ledger_.current(ZD_TIER_DEVICE, ZD_MEM_PARAMS), 1000u);
  const auto bytes = get(b, 1000);
  for (std::byte x : bytes) ASSERT_EQ(x, std::byte{0});
  device_->release(b, ZD_MEM_PARAMS);
  EXPECT_EQ(ledger_.current(ZD_TIER_DEVICE, ZD_MEM_ALL), 0u);
}

TEST_P(OnDevice, TheBudgetRefusesWithTheNameOfWhatWantedIt) {
  ledger_.set_budget(ZD_TIER_DEVICE, 4096);
  try {
    device_->allocate(8192, ZD_MEM_PARAMS, "the big one");
    FAIL() << "over the budget";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ZD_ERR_BUDGET);
    EXPECT_NE(std::string(e.what()).find("the big one"), std::string::npos) << e.what();
  }
  EXPECT_EQ(ledger_.current(ZD_TIER_DEVICE, ZD_MEM_ALL), 0u);
}

TEST_P(OnDevice, CopiesAndZeroRoundTrip) {
  const auto data = values(ZD_DTYPE_F32, 3001, 1);
  const Block a = put(data.data(), data.size());
  blocks_.push_back(device_->allocate(data.size(), ZD_MEM_BUFFERS, "b"));
  const Block b = blocks_.back();
  device_->copy_within(b.ptr, a.ptr, data.size());
  EXPECT_EQ(get(b, data.size()), data);
  device_->zero(a.ptr + 400, 800);
  std::vector<std::byte> expect(data.size());  // zero where the device zeroed
  std::copy_n(data.begin(), 400, expect.begin());
  std::copy(data.begin() + 1200, data.end(), expect.begin() + 1200);
  EXPECT_EQ(get(a, data.size()), expect);
}

TEST_P(OnDevice, AccumulateMatchesTheReferenceInEveryDtypePair) {
  const uint64_t n = 70001;  // several blocks of a GPU grid, a ragged end
  for (zd_dtype sdt : kTypes)
    for (zd_dtype ddt : kTypes)
      for (float factor : {1.0f, 0.25f, 1.0f / 3}) {
        const auto src = values(sdt, n, 2), dst = values(ddt, n, 3);
        auto expect = dst;
        if (factor == 1.0f)
          accumulate(src.data(), sdt, expect.data(), ddt, n);
        else
          accumulate_scaled(src.data(), sdt, expect.data(), ddt, n, factor);
        const Block s = put(src.data(), src.size()), d = put(dst.data(), dst.size());
        if (factor == 1.0f)
          device_->accumulate(s.ptr, sdt, d.ptr, ddt, n);
        else
          device_->accumulate_scaled(s.ptr, sdt, d.ptr, ddt, n, factor);
        EXPECT_EQ(get(d, dst.size()), expect)
            << dtype_name(sdt) << " into " << dtype_name(ddt) << ", factor " << factor;
      }
}

TEST_P(OnDevice, ScaleMatchesTheReference) {
  const uint64_t n = 4099;
  for (zd_dtype dt : kTypes) {
    auto data = values(dt, n, 4);
    auto expect = data;
    scale_in_place(expect.data(), dt, n, 0.5f / 3);
    const Block b = put(data.data(), data.size());
    device_->scale(b.ptr, dt, n, 0.5f / 3);
    EXPECT_EQ(get(b, data.size()), expect) << dtype_name(dt);
  }
}

TEST_P(OnDevice, GradStatsSumEverySpanAndSeeInfAndNan) {
  std::vector<GradSpan> spans;
  double expect = 0.0;
  const uint64_t sizes[] = {100000, 7, 33333};
  for (size_t k = 0; k < 3; ++k) {
    const zd_dtype dt = kTypes[k];
    const auto v = values(dt, sizes[k], static_cast<unsigned>(5 + k));
    expect += grad_stats(v.data(), dt, sizes[k]).sumsq;
    spans.push_back({put(v.data(), v.size()).ptr, dt, sizes[k]});
  }
  const GradStats s = device_->grad_stats(spans);
  EXPECT_TRUE(s.finite);
  EXPECT_NEAR(s.sumsq, expect, 1e-12 * expect);  // double sums in another order on a GPU
  const GradStats again = device_->grad_stats(spans);
  EXPECT_EQ(again.sumsq, s.sumsq) << "the same gradients give the same figure";
  for (float bad : {INFINITY, NAN}) {
    std::vector<float> v(1000, 1.0f);
    v[777] = bad;
    const Block b = put(v.data(), v.size() * 4);
    EXPECT_FALSE(device_->grad_stats({{b.ptr, ZD_DTYPE_F32, v.size()}}).finite) << bad;
  }
}

TEST_P(OnDevice, TheOptimizerUpdateMatchesTheCpuKernels) {
  const std::vector<std::string> dirs = {ZEROD_PLUGIN_DIR};
  auto plugin = Plugin::load(ZD_PLUGIN_OPTIMIZER, "adamw", dirs);
  auto opt = OptimizerInstance::create(plugin, plugin->default_values());
  if (GetParam() == "cuda" && !opt->has_cuda()) FAIL() << "the adamw plugin was built without CUDA kernels";
  const uint64_t n = 100003;
  auto master = values(ZD_DTYPE_F32, n, 6), grad = values(ZD_DTYPE_BF16, n, 7);
  std::vector<std::byte> m(n * 4), v(n * 4), work(n * 2);
  // The reference: the plugin's CPU kernels on host memory.
  auto rm = master, rmom = m, rvar = v, rwork = work, rgrad = grad;
  zd_optimizer_update u{};
  u.struct_size = sizeof u;
  u.count = n;
  u.grad_dtype = ZD_DTYPE_BF16;
  u.work_dtype = ZD_DTYPE_BF16;
  u.grad_scale = 0.5;
  u.lr = 1e-3;
  u.step = 3;
  zd_optimizer_update ref = u;
  ref.master = reinterpret_cast<float*>(rm.data());
  ref.grad = rgrad.data();
  ref.work = rwork.data();
  ref.state[0] = reinterpret_cast<float*>(rmom.data());
  ref.state[1] = reinterpret_cast<float*>(rvar.data());
  parallel_update(workers_, *opt, ref, true);
  // The device.
  zd_optimizer_update d = u;
  const Block bm = put(master.data(), master.size()), bg = put(grad.data(), grad.size());
  const Block bw = put(work.data(), work.size()), b0 = put(m.data(), m.size()), b1 = put(v.data(), v.size());
  d.master = bm.as<float>();
  d.grad = bg.ptr;
  d.work = bw.ptr;
  d.state[0] = b0.as<float>();
  d.state[1] = b1.as<float>();
  device_->optimizer_update(*opt, d, true);
  const auto got_master = get(bm, master.size());
  if (GetParam() == "cpu") {
    EXPECT_EQ(got_master, rm);
    EXPECT_EQ(get(bw, work.size()), rwork);
  } else {
    // The CUDA kernels round every operation as the CPU does but may order
    // the square root and division differently: within an ulp.
    const auto* a = reinterpret_cast<const float*>(got_master.data());
    const auto* b = reinterpret_cast<const float*>(rm.data());
    for (uint64_t i = 0; i < n; ++i) ASSERT_NEAR(a[i], b[i], 1e-6f * std::fabs(b[i]) + 1e-12f) << i;
  }
  const auto zeroed = get(bg, grad.size());
  for (std::byte x : zeroed) ASSERT_EQ(x, std::byte{0}) << "the gradients are zero after their update";
}

TEST_P(OnDevice, StreamsAreAcceptedWhereTheDeviceHasThem) {
  device_->set_trainer_stream(nullptr);
  device_->trainer_waits();
  device_->wait_for_trainer();
  device_->synchronize();
  if (GetParam() == "cpu") {
    int not_a_stream = 0;
    try {
      device_->set_trainer_stream(&not_a_stream);
      FAIL() << "the cpu device has no streams";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ZD_ERR_INVALID_ARGUMENT);
      EXPECT_NE(std::string(e.what()).find("device = \"cuda\""), std::string::npos) << e.what();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, OnDevice, ::testing::Values("cpu", "cuda"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

TEST(DeviceChoice, CudaWithoutAGpuIsAClearErrorAndAutoFallsBackToTheCpu) {
  const CudaAvailability a = cuda_availability();
  EXPECT_EQ(resolve_device("cpu", "job.lua"), "cpu");
  if (a.devices > 0) {
    EXPECT_EQ(resolve_device("auto", "job.lua"), "cuda");
    EXPECT_EQ(resolve_device("cuda", "job.lua"), "cuda");
    return;
  }
  EXPECT_FALSE(a.why.empty());
  EXPECT_EQ(resolve_device("auto", "job.lua"), "cpu");
  try {
    resolve_device("cuda", "job.lua");
    FAIL() << "no GPU here";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ZD_ERR_CONFIG);
    const std::string s = e.what();
    EXPECT_NE(s.find("job.lua: device = \"cuda\", but"), std::string::npos) << s;
    EXPECT_NE(s.find(a.why), std::string::npos) << s;
  }
  try {
    resolve_device("tpu", "job.lua");
    FAIL() << "not a device";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ZD_ERR_CONFIG);
  }
}

}  // namespace

// The GPU stream signals' comparison (device/signal_page.h): a wait ends
// once the word has reached the record's number, modulo 2^32 the way
// cuStreamWaitValue32 compares, so a long job's wrap changes nothing.
TEST(StreamSignals, AWaitEndsOnceTheWordReachesTheRecordEvenAcrossTheWrap) {
  EXPECT_FALSE(signal_behind(0, 0)) << "nothing recorded: nothing to wait for";
  EXPECT_TRUE(signal_behind(0, 1));
  EXPECT_TRUE(signal_behind(4, 5));
  EXPECT_FALSE(signal_behind(5, 5));
  EXPECT_FALSE(signal_behind(6, 5)) << "a later record (or a release) has run";
  const uint64_t wrap = uint64_t{1} << 32;
  EXPECT_TRUE(signal_behind(0xFFFFFFFFu, wrap)) << "the record after 2^32 - 1 writes 0";
  EXPECT_FALSE(signal_behind(0, wrap));
  EXPECT_FALSE(signal_behind(3, wrap + 2));
  EXPECT_TRUE(signal_behind(0xFFFFFFF0u, wrap + 2));
  EXPECT_TRUE(signal_behind(7, 3 * wrap + 8));
}

// The host half of a GPU stream signal across a process boundary, as the
// daemon and its trainer share it (device/signal_page.h; the GPU half is
// device.CudaShared.*): another process maps the page, publishes two
// records, of which its stream ran the first (the word holds 1), and dies
// with the second queued. This side sees that record pending, and its
// release (a store from the CPU, no stream) writes the number that ends
// every wait for it. A release never moves a word back.
TEST(StreamSignals, ARecordLeftByADeadProcessIsPendingUntilReleasedFromTheCpu) {
  SharedArena arena(0, kSignalPageBytes, "zerod-test-signals");
  auto* page = new (arena.base()) SignalPage{};
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    void* p = mmap(nullptr, kSignalPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, arena.fd(), 0);
    if (p == MAP_FAILED) _exit(2);
    auto* mine = static_cast<SignalPage*>(p);
    mine->issued[kTrainerDone].store(1, std::memory_order_release);
    mine->word[kTrainerDone].store(1, std::memory_order_release);  // what its stream wrote
    mine->issued[kTrainerDone].store(2, std::memory_order_release);  // queued, never run
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_TRUE(signal_pending(*page, kTrainerDone)) << "the dead process's second record never wrote its number";
  EXPECT_FALSE(signal_pending(*page, kZerodDone)) << "never recorded: nothing pending";
  signal_release(*page, kTrainerDone);
  EXPECT_FALSE(signal_pending(*page, kTrainerDone));
  EXPECT_EQ(page->word[kTrainerDone].load(), 2u);

  // A word already past the latest number (a record that ran after the
  // count was read) is left where it is.
  page->issued[kZerodDone].store(3);
  page->word[kZerodDone].store(5);
  signal_release(*page, kZerodDone);
  EXPECT_EQ(page->word[kZerodDone].load(), 5u);
  // Across the wrap: the number after 2^32 - 1 is 0 in the word.
  page->issued[kZerodDone].store((uint64_t{1} << 32) + 1);
  page->word[kZerodDone].store(0xFFFFFFFFu);
  EXPECT_TRUE(signal_pending(*page, kZerodDone));
  signal_release(*page, kZerodDone);
  EXPECT_EQ(page->word[kZerodDone].load(), 1u);
  EXPECT_FALSE(signal_pending(*page, kZerodDone));
}

// The recording process's own release, alive, once its GPU context has
// failed (signal_release_if_context_failed; the GPU half is
// device.CudaShared.AWaitBehindAFailedKernelIsReleasedByTheLiveTrainer):
// its second record sits behind the kernel that failed, and would hold the
// other side's wait for good. Only an error that says the context failed
// releases it (one that left the context usable, or success, leaves the
// record to run, and the context unmarked); a second release, from either
// side, changes nothing, and a word already past the number is never moved
// back.
TEST(StreamSignals, ARecordBehindAFailedContextIsReleasedByItsOwnProcessAndOnlyThen) {
  SignalPage page{};
  std::atomic<bool> context_failed{false};
  page.issued[kTrainerDone].store(1);
  page.word[kTrainerDone].store(1);  // its first record ran
  page.issued[kTrainerDone].store(2);  // queued behind the failed kernel
  for (const int usable : {0, cuda_code::kOutOfMemory, 1 /* cudaErrorInvalidValue */}) {
    EXPECT_FALSE(signal_release_if_context_failed(page, kTrainerDone, usable, context_failed)) << usable;
    EXPECT_TRUE(signal_pending(page, kTrainerDone)) << "released after error " << usable;
    EXPECT_FALSE(context_failed.load()) << "marked failed after error " << usable;
  }
  EXPECT_TRUE(signal_release_if_context_failed(page, kTrainerDone, cuda_code::kIllegalAddress, context_failed));
  EXPECT_TRUE(context_failed.load());
  EXPECT_FALSE(signal_pending(page, kTrainerDone));
  EXPECT_EQ(page.word[kTrainerDone].load(), 2u);
  EXPECT_FALSE(signal_pending(page, kZerodDone)) << "the other signal is not this process's to release";
  // The daemon's hangup watch releasing it too, once the process has exited.
  signal_release(page, kTrainerDone);
  EXPECT_TRUE(signal_release_if_context_failed(page, kTrainerDone, cuda_code::kAssert, context_failed));
  EXPECT_EQ(page.word[kTrainerDone].load(), 2u);
  page.word[kTrainerDone].store(7);  // past the latest number published
  EXPECT_TRUE(signal_release_if_context_failed(page, kTrainerDone, cuda_code::kLaunchFailed, context_failed));
  EXPECT_EQ(page.word[kTrainerDone].load(), 7u);
}

// Two threads of the process that records a signal (SharedSignals on a GPU,
// whose record() is these steps with a stream): one records, queuing the
// write of record 2's number and then publishing it; another's CUDA call
// says the context failed, and its release (LivePages::release_on) lands
// between the two: it reads the count before the publish and stops at 1,
// and the queued write never runs on the failed context. The recording
// thread, seeing after its publish the mark the release set
// (signal_publish), releases 2 itself; else the other side would wait for
// it for good (a trainer held in zd_model_destroy's quiesce). Records
// published later, on the context still failed, are released as they are
// published; on a context that has not failed, a publish leaves the record
// to its stream.
TEST(StreamSignals, AReleaseBetweenARecordsWriteAndItsPublishStillEndsTheWaitForIt) {
  SignalPage page{};
  std::atomic<bool> context_failed{false};
  page.issued[kTrainerDone].store(1);
  page.word[kTrainerDone].store(1);  // record 1 ran
  const uint64_t n = page.issued[kTrainerDone].load() + 1;  // record 2: its write queued
  ASSERT_TRUE(signal_release_if_context_failed(page, kTrainerDone, cuda_code::kAssert, context_failed));
  EXPECT_EQ(page.word[kTrainerDone].load(), 1u) << "the release ran before record 2 was published";
  signal_publish(page, kTrainerDone, n, context_failed);
  EXPECT_FALSE(signal_pending(page, kTrainerDone)) << "record 2 never runs, and nothing else releases it";
  EXPECT_EQ(page.word[kTrainerDone].load(), 2u);

  signal_publish(page, kTrainerDone, 3, context_failed);
  EXPECT_EQ(page.word[kTrainerDone].load(), 3u);

  SignalPage working{};
  const std::atomic<bool> not_failed{false};
  signal_publish(working, kZerodDone, 1, not_failed);
  EXPECT_TRUE(signal_pending(working, kZerodDone)) << "released before its stream ran it";
  EXPECT_EQ(working.word[kZerodDone].load(), 0u);
}

// The daemon's watch of its own GPU context while zerod's latest record of
// kZerodDone is pending (device/context_failure_watch.h; the cuda device
// gives it the signals' page and cudaStreamQuery on zerod's stream, and
// device.CudaShared.AWaitBehindAFailedKernelIsReleasedByTheLiveDaemonBeforeItsNextCall
// tests that on a GPU). Here the page is real and the GPU a fake: its query
// answers what the test sets, and its record runs when the test writes the
// word.
struct FakeGpu {
  SignalPage page{};
  std::atomic<bool> context_failed{false};
  std::atomic<int> answer{cuda_code::kNotReady};  // what the next query returns
  std::atomic<int> query_delay_ms{0};
  std::atomic<int> pending_reads{0};
  std::atomic<int> queries{0};
  std::atomic<int> failures{0};
  std::atomic<int> failed_with{0};

  // What the cuda device gives its watch, on this page and this fake.
  ContextFailureWatch::Hooks hooks() {
    return {[this] {
              ++pending_reads;
              return signal_pending(page, kZerodDone);
            },
            [this] {
              std::this_thread::sleep_for(std::chrono::milliseconds(query_delay_ms.load()));
              ++queries;
              return answer.load();
            },
            [this](int code) {
              ++failures;
              failed_with = code;
              signal_release_if_context_failed(page, kZerodDone, code, context_failed);
            }};
  }
  // zerod's stream has the next record's write queued, and it is published.
  void record() { signal_publish(page, kZerodDone, page.issued[kZerodDone].load() + 1, context_failed); }
  // The stream gets there.
  void run_record() { page.word[kZerodDone].store(static_cast<uint32_t>(page.issued[kZerodDone].load())); }
  int hook_calls() const { return pending_reads.load() + queries.load() + failures.load(); }
};

constexpr std::chrono::milliseconds kWatchPeriod{10};

// Whether `done` holds within `ms`, looked at every millisecond.
template <typename F>
bool holds_within(int ms, F done) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

void wait_periods(int n) { std::this_thread::sleep_for(n * kWatchPeriod); }

// The gap it closes: the daemon's kernel fails after its last call, and no
// call of the daemon's finds it; a trainer waiting on the GPU for the
// record (a loss.item()) would wait for good. The watch queries while the
// record is pending, and once the query says the context failed it
// releases the record from the CPU, so the trainer's wait ends, within a
// few periods and with no call of the daemon's. It says so once: records
// published after the failure release themselves (signal_publish), and the
// watch queries no more.
TEST(StreamSignals, APendingRecordWhoseContextFailedIsReleasedWithoutAnotherCall) {
  FakeGpu gpu;
  ContextFailureWatch watch(gpu.hooks(), kWatchPeriod);
  gpu.record();
  watch.recorded();
  ASSERT_TRUE(holds_within(2000, [&] { return gpu.queries.load() >= 3; })) << "the watch never queried";
  EXPECT_TRUE(signal_pending(gpu.page, kZerodDone)) << "released while the stream was only busy";
  EXPECT_EQ(gpu.failures.load(), 0);

  gpu.answer = cuda_code::kIllegalAddress;  // a kernel before the record faulted
  const auto failed_at = std::chrono::steady_clock::now();
  const bool released = holds_within(2000, [&] { return !signal_pending(gpu.page, kZerodDone); });
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - failed_at);
  ASSERT_TRUE(released) << "the trainer's wait on the record behind the failed kernel was not released in 2 s";
  std::printf("released %lld ms after the context failed (period %lld ms)\n", static_cast<long long>(took.count()),
              static_cast<long long>(kWatchPeriod.count()));
  EXPECT_EQ(gpu.page.word[kZerodDone].load(), 1u);
  EXPECT_EQ(gpu.failures.load(), 1);
  EXPECT_EQ(gpu.failed_with.load(), cuda_code::kIllegalAddress);
  EXPECT_TRUE(watch.fired());
  EXPECT_TRUE(gpu.context_failed.load()) << "later records of the process release themselves";

  const int queried = gpu.queries.load();
  gpu.record();
  watch.recorded();
  EXPECT_FALSE(signal_pending(gpu.page, kZerodDone)) << "a record published on the failed context";
  wait_periods(10);
  EXPECT_EQ(gpu.queries.load(), queried) << "queried after the failure it reported";
  EXPECT_EQ(gpu.failures.load(), 1) << "said twice";
}

// A context that has not failed: a query that says "not ready" (the
// stream busy, or waiting for the trainer), success, or an error that
// leaves the context usable never releases the record, which the stream
// will still run; once it has (its word written), the watch goes back to
// sleep and queries no more. Meanwhile it queries once a period, not in a
// busy loop.
TEST(StreamSignals, APendingRecordOnAWorkingContextIsLeftToItsStream) {
  FakeGpu gpu;
  ContextFailureWatch watch(gpu.hooks(), kWatchPeriod);
  gpu.record();
  const auto recorded_at = std::chrono::steady_clock::now();
  watch.recorded();
  wait_periods(20);
  const int64_t periods = (std::chrono::steady_clock::now() - recorded_at) / kWatchPeriod;
  EXPECT_GE(gpu.queries.load(), 1);
  EXPECT_LE(gpu.queries.load(), periods + 1) << "queried more often than once a period";
  for (const int answer : {cuda_code::kNotReady, 0 /* success */, cuda_code::kOutOfMemory, 1 /* invalid value */}) {
    gpu.answer = answer;
    const int before = gpu.queries.load();
    ASSERT_TRUE(holds_within(2000, [&] { return gpu.queries.load() >= before + 3; })) << answer;
    EXPECT_TRUE(signal_pending(gpu.page, kZerodDone)) << "released after " << answer;
  }
  EXPECT_EQ(gpu.failures.load(), 0);
  EXPECT_FALSE(watch.fired());
  EXPECT_FALSE(gpu.context_failed.load());

  gpu.answer = cuda_code::kNotReady;
  gpu.run_record();
  const int at_run = gpu.queries.load();
  wait_periods(10);
  EXPECT_LE(gpu.queries.load(), at_run + 1) << "queried on after the record ran (one look may have been under way)";
  EXPECT_EQ(gpu.failures.load(), 0);
}

// Nothing pending, nothing asked: a watch with no record sleeps without
// looking, and a record that runs before the watch's first look (a step's
// records mostly do, within the period) costs that one look at the page
// from the CPU and no query of the GPU; then the watch sleeps again.
TEST(StreamSignals, TheWatchQueriesNothingWhileNoRecordIsPending) {
  FakeGpu gpu;
  ContextFailureWatch watch(gpu.hooks(), kWatchPeriod);
  wait_periods(10);
  EXPECT_EQ(gpu.pending_reads.load(), 0) << "looked with nothing recorded";
  EXPECT_EQ(gpu.queries.load(), 0);

  gpu.record();
  watch.recorded();
  gpu.run_record();
  ASSERT_TRUE(holds_within(2000, [&] { return gpu.pending_reads.load() >= 1; }));
  wait_periods(10);
  EXPECT_EQ(gpu.pending_reads.load(), 1) << "looked again after the record ran";
  EXPECT_EQ(gpu.queries.load(), 0) << "queried the GPU for a record that had run";
}

// A record published while the watch looks, after its read of the page
// (which saw the one before run), is still watched: the look does not put
// the watch back to sleep, and the failure behind the new record is found.
TEST(StreamSignals, ARecordPublishedDuringALookIsStillWatched) {
  FakeGpu gpu;
  gpu.answer = cuda_code::kAssert;
  std::atomic<ContextFailureWatch*> the_watch{nullptr};
  std::atomic<bool> published_during_look{false};
  ContextFailureWatch::Hooks hooks = gpu.hooks();
  hooks.pending = [&, read = hooks.pending] {
    const bool pending = read();
    if (!published_during_look.exchange(true)) {
      gpu.record();
      the_watch.load()->recorded();
    }
    return pending;
  };
  ContextFailureWatch watch(hooks, kWatchPeriod);
  the_watch = &watch;
  watch.recorded();  // a record that had run: its word is 0 and so is its count
  ASSERT_TRUE(holds_within(2000, [&] { return gpu.failures.load() == 1; }))
      << "the record published during the watch's look was never watched";
  EXPECT_FALSE(signal_pending(gpu.page, kZerodDone));
}

// The device's teardown stops the watch while it queries (a record pending
// behind a busy stream): the stop waits for the query in progress, and
// once it returns no hook runs, so the stream and the page the hooks use
// may go (here the fake they use is freed at once: AddressSanitizer and
// ThreadSanitizer builds see a late hook). A watch that never saw a record
// stops as well.
TEST(StreamSignals, TheWatchStopsWhileItQueriesAndCallsNoHookAfter) {
  {
    FakeGpu idle;
    ContextFailureWatch never_recorded(idle.hooks(), kWatchPeriod);
  }

  auto gpu = std::make_unique<FakeGpu>();
  gpu->query_delay_ms = 30;
  auto watch = std::make_unique<ContextFailureWatch>(gpu->hooks(), kWatchPeriod);
  gpu->record();
  watch->recorded();
  ASSERT_TRUE(holds_within(2000, [&] { return gpu->queries.load() >= 2; }));
  const auto stopping = std::chrono::steady_clock::now();
  watch.reset();
  const auto took = std::chrono::steady_clock::now() - stopping;
  EXPECT_LT(took, std::chrono::seconds(1)) << "the stop waited past the query in progress";
  const int calls = gpu->hook_calls();
  wait_periods(5);
  EXPECT_EQ(gpu->hook_calls(), calls) << "a hook ran after the stop returned";
  EXPECT_TRUE(signal_pending(gpu->page, kZerodDone));
  EXPECT_EQ(gpu->failures.load(), 0);
  gpu.reset();
  wait_periods(5);
}

// A failed CUDA call's status and message (device/cuda_failure.h), what the
// cuda device and the shared GPU memory report. A kernel that failed on the
// GPU (a device-side assert: nn.Embedding given an index out of range)
// leaves its error in the process's context, and zerod's next call returns
// it: that is the model's error, not a bug in zerod (ZD_ERR_INTERNAL), and
// the message names the call, the GPU and what happened before.
TEST(CudaFailure, AnErrorAnEarlierKernelLeftIsNotCalledABugInZerod) {
  const CudaFailure f =
      describe_cuda_failure(cuda_code::kAssert, "CUDA_ERROR_ASSERT", "device-side assert triggered",
                            "cuStreamWriteValue32", "recording the trainer's signal on a stream of GPU 1");
  EXPECT_NE(f.status, ZD_ERR_INTERNAL);
  EXPECT_EQ(f.status, ZD_ERR_IO) << "a device error";
  for (const char* part : {"cuStreamWriteValue32 (recording the trainer's signal on a stream of GPU 1)",
                           "CUDA_ERROR_ASSERT: device-side assert triggered",
                           "GPU context had failed before this call", "an earlier kernel", "CUDA_LAUNCH_BLOCKING=1"})
    EXPECT_NE(f.message.find(part), std::string::npos) << "no '" << part << "' in: " << f.message;
}

// The same error in the zerod daemon's process (which has opened a shared
// device: name_cuda_failures_as_the_daemons) goes to a trainer in another
// process as its call's error: it names the daemon's context and pid, and
// says the daemon is what must be restarted, never "this process's", which
// the trainer would take for its own.
TEST(CudaFailure, ADaemonsFailedContextIsNamedAsTheDaemons) {
  const CudaFailure f = describe_cuda_failure(
      cuda_code::kIllegalAddress, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered",
      "cuStreamWaitValue32", "queuing a wait for the trainer's signal on a stream of GPU 0", /*daemon_pid=*/4242);
  EXPECT_EQ(f.status, ZD_ERR_IO);
  for (const char* part : {"CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered",
                           "The zerod daemon's GPU context had failed before this call", "pid 4242",
                           "not the trainer's", "in the daemon's environment", "the daemon must be restarted"})
    EXPECT_NE(f.message.find(part), std::string::npos) << "no '" << part << "' in: " << f.message;
  EXPECT_EQ(f.message.find("This process's"), std::string::npos) << f.message;
  EXPECT_EQ(describe_cuda_failure(cuda_code::kOutOfMemory, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory", "cuMemCreate",
                                  "allocating the pool on GPU 0", 4242)
                .message,
            "cuMemCreate (allocating the pool on GPU 0): CUDA_ERROR_OUT_OF_MEMORY: out of memory")
      << "only a failed context is the daemon's to name";

  ASSERT_EQ(cuda_failures_daemon_pid(), 0) << "this process opened no shared device";
  name_cuda_failures_as_the_daemons(4242);
  const std::string marked = describe_cuda_failure(cuda_code::kAssert, "CUDA_ERROR_ASSERT", "x", "", "y").message;
  name_cuda_failures_as_the_daemons(0);
  EXPECT_NE(marked.find("The zerod daemon's GPU context"), std::string::npos) << marked;
}

// Every error cuda.h says leaves the context unusable ("any further CUDA
// work will return the same error") is reported so.
TEST(CudaFailure, EveryErrorThatBreaksTheContextForGoodIsReportedSo) {
  using namespace cuda_code;
  for (int code : {kEccUncorrectable, kContained, kIllegalAddress, kLaunchTimeout, kAssert, kHardwareStackError,
                   kIllegalInstruction, kMisalignedAddress, kInvalidAddressSpace, kInvalidPc, kLaunchFailed,
                   kTensorMemoryLeak}) {
    EXPECT_TRUE(cuda_context_failed_before(code)) << code;
    const CudaFailure f = describe_cuda_failure(code, "CUDA_ERROR_X", "x", "cuMemMap", "mapping");
    EXPECT_EQ(f.status, ZD_ERR_IO) << code;
    EXPECT_NE(f.message.find("failed before this call"), std::string::npos) << f.message;
  }
}

// The rest keep their status: memory is out of memory, and an error zerod's
// own use of CUDA caused is a bug in zerod, said without blaming a kernel.
// A call left unnamed leaves what was done first, as before.
TEST(CudaFailure, OtherErrorsAreOutOfMemoryOrZerodsOwn) {
  const CudaFailure oom =
      describe_cuda_failure(cuda_code::kOutOfMemory, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory", "cuMemCreate",
                            "allocating the pool on GPU 0");
  EXPECT_EQ(oom.status, ZD_ERR_OUT_OF_MEMORY);
  EXPECT_EQ(oom.message, "cuMemCreate (allocating the pool on GPU 0): CUDA_ERROR_OUT_OF_MEMORY: out of memory");

  constexpr int kInvalidValue = 1;  // CUDA_ERROR_INVALID_VALUE, cudaErrorInvalidValue
  EXPECT_FALSE(cuda_context_failed_before(kInvalidValue));
  const CudaFailure ours = describe_cuda_failure(kInvalidValue, "cudaErrorInvalidValue", "invalid argument", "",
                                                 "copying to GPU 0");
  EXPECT_EQ(ours.status, ZD_ERR_INTERNAL);
  EXPECT_EQ(ours.message, "copying to GPU 0: cudaErrorInvalidValue: invalid argument");
  EXPECT_EQ(describe_cuda_failure(999, "", "unknown error", "cuMemMap", "mapping").message,
            "cuMemMap (mapping): CUDA error 999: unknown error");
}
