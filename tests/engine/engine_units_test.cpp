// Unit tests of the engine's small parts: dtype conversion, the loss scaler,
// the ledger, the arena heap, the thread pool, the shard layout.
#include "memory/arena.h"
#include "device/cpu_device.h"
#include "device/emulated_device.h"
#include "runtime/dtype.h"
#include "error.h"
#include "grad/grad_math.h"
#include "memory/host_scratch.h"
#include "memory/host_staging.h"
#include "model/rank_resources.h"
#include "memory/ledger.h"
#include "optimizer/loss_scaler.h"
#include "model/registry.h"
#include "compression/sign_kernels.h"
#include "runtime/thread_pool.h"
#include "runtime/workers.h"

#include <zerod/optim/kernels.h>

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <thread>
#include <vector>

using namespace zerod;

TEST(Dtype, Bf16RoundsToNearestEvenAndKeepsSpecials) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3 * 2^-8 is halfway too: rounds up to the even 1 + 2^-6.
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
  EXPECT_EQ(bf16_to_f32(0xc040), -3.0f);
}

TEST(Dtype, F16RoundTripsItsOwnValuesAndRoundsTheRest) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const auto half = static_cast<uint16_t>(h);
    const float f = f16_to_f32(half);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    ASSERT_EQ(f32_to_f16(f), half) << "half 0x" << std::hex << h;
  }
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);    // the largest half
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);    // halfway to 2^16: ties to even = inf
  EXPECT_EQ(f32_to_f16(1e-8f), 0x0000);       // below half the smallest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie to even
}

TEST(Dtype, ConvertBetweenEveryPair) {
  const float src[3] = {1.5f, -2.25f, 0.0f};
  for (zd_dtype a : {ZD_DTYPE_F32, ZD_DTYPE_BF16, ZD_DTYPE_F16}) {
    std::vector<std::byte> mid(3 * dtype_size(a));
    convert(src, ZD_DTYPE_F32, mid.data(), a, 3);
    for (zd_dtype b : {ZD_DTYPE_F32, ZD_DTYPE_BF16, ZD_DTYPE_F16}) {
      std::vector<std::byte> out(3 * dtype_size(b));
      convert(mid.data(), a, out.data(), b, 3);
      for (size_t i = 0; i < 3; ++i) EXPECT_EQ(load_as_float(out.data(), b, i), src[i]);
    }
  }
  EXPECT_EQ(dtype_from_name("bf16"), ZD_DTYPE_BF16);
  EXPECT_EQ(dtype_from_name("fp8"), 0);
}

// The scale after each of `n` updates, update i overflowing where overflow(i).
template <typename Overflow>
std::vector<double> scales(const LossScaleConfig& c, int n, Overflow overflow) {
  LossScaler s(c);
  std::vector<double> seen;
  for (int i = 0; i < n; ++i) {
    s.update(overflow(i));
    seen.push_back(s.scale());
  }
  return seen;
}

// DeepSpeed's dynamic loss-scale tests, in our words.
TEST(LossScaler, NoOverflowDoublesEveryWindow) {
  LossScaleConfig c;
  c.enabled = true;
  c.initial_scale_power = 8;
  c.window = 2;
  // iter 0 is (0 - -1) % 2 = 1: no doubling; iter 1 doubles; and so on.
  EXPECT_EQ(scales(c, 10, [](int) { return false; }),
            (std::vector<double>{256, 512, 512, 1024, 1024, 2048, 2048, 4096, 4096, 8192}));
}

// DeepSpeed's DynamicLossScaler (0.19, update_scale) counts the stable
// interval without the update itself: it doubles an update later than
// torch's GradScaler, and never on the first update. Its sequence for
// window 2, scale 2^8, an overflow at the 5th update, hysteresis 1.
TEST(LossScaler, TheDeepSpeedRuleDoublesAnUpdateLater) {
  LossScaleConfig c;
  c.enabled = true;
  c.initial_scale_power = 8;
  c.window = 2;
  c.hysteresis = 1;
  c.deepspeed_window = true;
  // iter 0: stable 0; 1: 1; 2: 2 -> x2; 3: 3; 4: overflow -> /2; 5: 0; 6: 1;
  // 7: 2 -> x2; 8: 3; 9: 4 -> x2.
  EXPECT_EQ(scales(c, 10, [](int i) { return i == 4; }),
            (std::vector<double>{256, 256, 512, 512, 256, 256, 256, 512, 512, 1024}));
}

// DeepSpeed's update_scale raises (raise_error_at_min_scale) where an
// overflow finds the scale at min_scale and no hysteresis left; the scaler
// reports it and the Model fails the step.
TEST(LossScaler, AnOverflowAtTheMinimumScaleIsReported) {
  LossScaleConfig c;
  c.enabled = true;
  c.initial_scale_power = 1;
  c.hysteresis = 2;
  c.min_scale = 1.0;
  LossScaler s(c);
  EXPECT_EQ(s.update(true), OverflowOutcome::kTolerated);
  EXPECT_EQ(s.scale(), 2.0);
  EXPECT_EQ(s.update(true), OverflowOutcome::kHalved);
  EXPECT_EQ(s.scale(), 1.0);
  EXPECT_EQ(s.update(true), OverflowOutcome::kAtMinimum);
  EXPECT_EQ(s.scale(), 1.0);
  EXPECT_EQ(s.update(false), OverflowOutcome::kNone);
  // Hysteresis left at the minimum is used first (DeepSpeed tests the
  // minimum only where it would halve).
  c.initial_scale_power = 0;
  LossScaler at_min(c);
  EXPECT_EQ(at_min.update(true), OverflowOutcome::kTolerated);
  EXPECT_EQ(at_min.update(true), OverflowOutcome::kAtMinimum);
  // A scale under the minimum is lifted to it, as DeepSpeed's max() does.
  c.min_scale = 4.0;
  c.hysteresis = 1;
  LossScaler below(c);
  EXPECT_EQ(below.update(true), OverflowOutcome::kHalved);
  EXPECT_EQ(below.scale(), 4.0);
  EXPECT_EQ(below.update(true), OverflowOutcome::kAtMinimum);
  // A static scale has no minimum to reach.
  c.static_scale = 1.0;
  EXPECT_EQ(LossScaler(c).update(true), OverflowOutcome::kNone);
}

// fp16.hysteresis = 2: the first overflow is tolerated, the second halves;
// the count is not refilled until a doubling, so later overflows halve at
// once; after the doubling the next overflow is tolerated again.
TEST(LossScaler, HysteresisTwoHalvesOnTheSecondOverflow) {
  LossScaleConfig c;
  c.enabled = true;
  c.initial_scale_power = 10;
  c.hysteresis = 2;
  c.window = 2;
  const std::vector<bool> overflow = {true, true, true, false, false, false, true, true};
  EXPECT_EQ(scales(c, static_cast<int>(overflow.size()), [&](int i) { return overflow[static_cast<size_t>(i)]; }),
            (std::vector<double>{1024, 512, 256, 256, 512, 512, 512, 256}));
}

TEST(LossScaler, EveryOverflowHalvesDownToTheMinimum) {
  LossScaleConfig c;
  c.enabled = true;
  c.initial_scale_power = 4;
  c.hysteresis = 1;
  c.min_scale = 0.25;
  EXPECT_EQ(scales(c, 8, [](int) { return true; }), (std::vector<double>{8, 4, 2, 1, 0.5, 0.25, 0.25, 0.25}));
}

TEST(LossScaler, HysteresisToleratesOverflowsBeforeHalving) {
  LossScaleConfig c;
  c.enabled = true;
  c.initial_scale_power = 10;
  c.hysteresis = 2;
  c.window = 1000;
  LossScaler s(c);
  s.update(true);
  EXPECT_EQ(s.scale(), 1024);  // first overflow only uses up hysteresis
  EXPECT_EQ(s.hysteresis_left(), 1);
  s.update(true);
  EXPECT_EQ(s.scale(), 512);
  s.update(false);  // not consecutive: hysteresis is not refilled yet
  EXPECT_EQ(s.hysteresis_left(), 1);
  s.update(true);
  EXPECT_EQ(s.scale(), 256);
}

TEST(LossScaler, ConsecutiveHysteresisRefillsAfterACleanStep) {
  LossScaleConfig c;
  c.enabled = true;
  c.initial_scale_power = 10;
  c.hysteresis = 2;
  c.consecutive_hysteresis = true;
  LossScaler s(c);
  s.update(true);
  s.update(false);
  s.update(true);
  EXPECT_EQ(s.scale(), 1024);  // never two overflows in a row
}

TEST(LossScaler, StaticAndDisabled) {
  LossScaleConfig c;
  LossScaler off(c);
  off.update(true);
  EXPECT_EQ(off.scale(), 1.0);
  EXPECT_FALSE(off.dynamic());
  c.enabled = true;
  c.static_scale = 128;
  LossScaler fixed(c);
  fixed.update(true);
  fixed.update(false);
  EXPECT_EQ(fixed.scale(), 128.0);
}

TEST(Ledger, ChargesReleasesPeaksAndBudgets) {
  MemoryLedger l;
  l.set_budget(ZD_TIER_DEVICE, 1000);
  l.charge(ZD_TIER_DEVICE, ZD_MEM_PARAMS, 600, "a");
  l.charge(ZD_TIER_DEVICE, ZD_MEM_GRADS, 300, "b");
  try {
    l.charge(ZD_TIER_DEVICE, ZD_MEM_BUFFERS, 200, "the thing");
    FAIL() << "over budget accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ZD_ERR_BUDGET);
    EXPECT_NE(std::string(e.what()).find("the thing needs 200 B in the device tier"),
              std::string::npos) << e.what();
  }
  EXPECT_EQ(l.current(ZD_TIER_DEVICE, ZD_MEM_ALL), 900u);
  l.release(ZD_TIER_DEVICE, ZD_MEM_PARAMS, 600);
  EXPECT_EQ(l.current(ZD_TIER_DEVICE, ZD_MEM_PARAMS), 0u);
  EXPECT_EQ(l.peak(ZD_TIER_DEVICE, ZD_MEM_PARAMS), 600u);
  EXPECT_EQ(l.peak(ZD_TIER_DEVICE, ZD_MEM_ALL), 900u);
  EXPECT_EQ(l.current(ZD_TIER_HOST, ZD_MEM_ALL), 0u);
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
}

TEST(RangeHeap, AlignsSplitsAndCoalesces) {
  RangeHeap h(1024);
  uint64_t a = 0, b = 0, c = 0;
  ASSERT_TRUE(h.allocate(100, 64, &a));
  ASSERT_TRUE(h.allocate(100, 64, &b));
  EXPECT_EQ(a, 0u);
  EXPECT_EQ(b % 64, 0u);
  EXPECT_GE(b, 100u);
  EXPECT_FALSE(h.allocate(2000, 64, &c));
  h.release(a, 100);
  h.release(b, 100);
  EXPECT_TRUE(h.empty());
  ASSERT_TRUE(h.allocate(1024, 64, &c));  // whole again after coalescing
  EXPECT_EQ(c, 0u);
}

// The words of VmFlags in /proc/self/smaps for the mapping holding p.
std::string vm_flags(const void* p) {
  std::FILE* f = std::fopen("/proc/self/smaps", "r");
  if (f == nullptr) return "";
  const auto at = reinterpret_cast<uintptr_t>(p);
  char line[512];
  bool inside = false;
  std::string flags;
  while (flags.empty() && std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line, "%lx-%lx", &lo, &hi) == 2) {  // a mapping's first line; no field parses so
      inside = lo <= at && at < hi;
    } else if (inside && std::strncmp(line, "VmFlags:", 8) == 0) {
      flags = line + 8;
    }
  }
  std::fclose(f);
  return flags;
}

TEST(SharedArena, AsksForHugePages) {
  SharedArena arena(0, 8 << 20, "zerod-test-arena");
  // "hg": the mapping was advised MADV_HUGEPAGE, whatever the kernel's
  // shmem mode makes of it (the advice is refused only without THP).
  if (access("/sys/kernel/mm/transparent_hugepage/enabled", F_OK) != 0)
    GTEST_SKIP() << "this kernel has no transparent huge pages";
  const std::string flags = vm_flags(arena.base());
  ASSERT_FALSE(flags.empty()) << "no VmFlags for the arena in /proc/self/smaps";
  EXPECT_NE((" " + flags + " ").find(" hg "), std::string::npos) << flags;
}

TEST(DevicePool, BlocksAreZeroedSharedAndAccounted) {
  MemoryLedger l;
  DevicePool pool(l, 1 << 16, "test");
  Block b = pool.allocate(1000, ZD_MEM_BUFFERS, "x");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.ptr) % DevicePool::kAlign, 0u);
  EXPECT_EQ(b.arena, 0);
  EXPECT_EQ(l.current(ZD_TIER_DEVICE, ZD_MEM_BUFFERS), 1024u);
  std::memset(b.ptr, 0xab, 1000);
  pool.release(b, ZD_MEM_BUFFERS);
  Block b2 = pool.allocate(1000, ZD_MEM_BUFFERS, "x");
  EXPECT_EQ(b2.ptr, b.ptr);  // reused, and zeroed again
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(b2.ptr[i], std::byte{0});
  Block big = pool.allocate(1 << 20, ZD_MEM_PARAMS, "big");  // larger than a chunk
  EXPECT_EQ(big.arena, 1);
  ASSERT_EQ(pool.arenas().size(), 2u);
  EXPECT_GE(pool.arenas()[1]->size(), uint64_t{1} << 20);
  EXPECT_GE(pool.arenas()[1]->fd(), 0);
  pool.release(big, ZD_MEM_PARAMS);
  pool.release(b2, ZD_MEM_BUFFERS);
  EXPECT_EQ(l.current(ZD_TIER_DEVICE, ZD_MEM_ALL), 0u);
}

namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

// A block whose every page is written (resident), as a trainer's would be.
Block written_block(DevicePool& pool, uint64_t mib) {
  Block b = pool.allocate(mib * kMiB, ZD_MEM_BUFFERS, "x", false);
  std::memset(b.ptr, 0x5a, b.bytes);
  return b;
}

// The MiB of [from, to) MiB of arena 0 the kernel holds.
uint64_t resident_mib(const DevicePool& pool, uint64_t from, uint64_t to) {
  std::vector<unsigned char> in((to - from) * kMiB / 4096);
  if (mincore(pool.arenas()[0]->base() + from * kMiB, (to - from) * kMiB, in.data()) != 0) return ~uint64_t{0};
  uint64_t pages = 0;
  for (unsigned char c : in) pages += c & 1;
  return pages * 4096 / kMiB;
}

}  // namespace

// The pool keeps the pages of freed blocks while steps use them (a block
// freed and handed out again each step is not faulted in again) and gives
// back, at a step's end, the free pages no block used in that step; live
// blocks keep theirs.
TEST(DevicePool, AStepsEndGivesBackTheFreePagesTheStepDidNotUse) {
  MemoryLedger l;
  DevicePool pool(l, 64 * kMiB, "test");
  pool.release(written_block(pool, 14), ZD_MEM_BUFFERS);  // step 1: 14 MiB, as finalize might
  pool.end_step();
  EXPECT_EQ(resident_mib(pool, 0, 14), 14u) << "the step used them: they stay";
  EXPECT_EQ(pool.resident_bytes(), 14 * kMiB);
  Block live = written_block(pool, 1);  // step 2: a block that outlives it, and a short-lived one
  pool.release(written_block(pool, 2), ZD_MEM_BUFFERS);
  pool.end_step();
  EXPECT_EQ(resident_mib(pool, 0, 3), 3u) << "used in step 2";
  EXPECT_EQ(resident_mib(pool, 3, 14), 0u) << "not used in step 2: given back";
  EXPECT_EQ(pool.resident_bytes(), 3 * kMiB);
  pool.end_step();  // step 3 uses nothing: only the live block keeps its pages
  EXPECT_EQ(resident_mib(pool, 0, 14), 1u);
  EXPECT_EQ(live.ptr[kMiB - 1], std::byte{0x5a}) << "a live block's bytes stay";
  Block again = pool.allocate(13 * kMiB, ZD_MEM_BUFFERS, "x", false);
  ASSERT_EQ(again.offset, kMiB);
  for (uint64_t i = 0; i < again.bytes; i += 4096) ASSERT_EQ(again.ptr[i], std::byte{0}) << "given back: zero";
  pool.release(again, ZD_MEM_BUFFERS);
  pool.release(live, ZD_MEM_BUFFERS);
}

TEST(ThreadPool, RunsEveryIndexOnceAndPropagatesErrors) {
  ThreadPool pool(3);
  EXPECT_EQ(pool.size(), 3u);
  std::vector<std::atomic<int>> hits(1000);
  for (int round = 0; round < 20; ++round)
    pool.run(hits.size(), [&](size_t i) { hits[i].fetch_add(1); });
  for (auto& h : hits) ASSERT_EQ(h.load(), 20);
  EXPECT_THROW(pool.run(100, [](size_t i) {
    if (i == 37) throw std::runtime_error("task 37");
  }),
               std::runtime_error);
  // Still usable afterwards.
  std::atomic<int> n{0};
  pool.run(10, [&](size_t) { n.fetch_add(1); });
  EXPECT_EQ(n.load(), 10);
  EXPECT_GE(available_cores(), 1u);
}

// Gradients leaving a GPU are added on the host's workers: the same sums as
// the serial add, bit for bit, for a length that ends mid-tile, and two
// threads of a rank (its calls and its collectives stream) may add at once.
TEST(Workers, ParallelAccumulateMatchesTheSerialAddFromTwoThreads) {
  ThreadPool pool(3);
  std::mutex mu;
  Workers w(pool, mu);
  const uint64_t n = kTile * 8 * 3 + 17;
  std::vector<uint16_t> src(n);
  std::vector<float> want(n), got_a(n), got_b(n);
  for (uint64_t i = 0; i < n; ++i) {
    src[i] = f32_to_bf16(static_cast<float>(i % 977) * 0.37f - 100.0f);
    want[i] = got_a[i] = got_b[i] = static_cast<float>(i % 13) * 0.25f;
  }
  accumulate(src.data(), ZD_DTYPE_BF16, want.data(), ZD_DTYPE_F32, n);
  std::thread other([&] { parallel_accumulate(w, src.data(), ZD_DTYPE_BF16, got_b.data(), ZD_DTYPE_F32, n); });
  parallel_accumulate(w, src.data(), ZD_DTYPE_BF16, got_a.data(), ZD_DTYPE_F32, n);
  other.join();
  EXPECT_EQ(std::memcmp(want.data(), got_a.data(), n * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(want.data(), got_b.data(), n * sizeof(float)), 0);
}

// The optimizer kernels write a working copy by streaming stores only in
// ranges of kStreamWork elements or more (plain stores read every line
// first); the engine calls them one tile at a time, so a full tile must be
// that large, or no update in the engine ever streams its working copy.
// That was the case with the kernels' former 2^20-element threshold: the
// update of 32M fp32 parameters with an fp32 working copy took 29 ms a step
// on 2 threads instead of 19-20 (issue 33).
TEST(Workers, AnUpdateTileIsLargeEnoughToStreamTheWorkingCopy) {
  EXPECT_GE(kTile, optim::kStreamWork);
}

// A window's first contribution is written, not added: the same bits as
// adding into zeros (a -0 gradient becomes +0 either way), whatever the
// accumulator held, in the fast bf16 -> f32 and f32 -> f32 loops and the
// generic one.
TEST(GradMath, AssignToZeroIsAddingIntoZeros) {
  ThreadPool pool(2);
  std::mutex mu;
  Workers w(pool, mu);
  const uint64_t n = kTile * 8 + 5;
  for (zd_dtype src_dt : {ZD_DTYPE_BF16, ZD_DTYPE_F32})
    for (zd_dtype dst_dt : {ZD_DTYPE_F32, ZD_DTYPE_BF16}) {
      const size_t ssz = dtype_size(src_dt), dsz = dtype_size(dst_dt);
      std::vector<std::byte> src(n * ssz);
      for (uint64_t i = 0; i < n; ++i) {
        const float v = i % 7 == 0 ? -0.0f : static_cast<float>(i % 501) * -0.11f + 20.0f;
        if (src_dt == ZD_DTYPE_F32) {
          std::memcpy(src.data() + i * 4, &v, 4);
        } else {
          const uint16_t b = f32_to_bf16(v);
          std::memcpy(src.data() + i * 2, &b, 2);
        }
      }
      std::vector<std::byte> want(n * dsz, std::byte{0}), got(n * dsz, std::byte{0x5a});
      accumulate(src.data(), src_dt, want.data(), dst_dt, n);
      parallel_accumulate(w, src.data(), src_dt, got.data(), dst_dt, n, /*dst_is_zero=*/true);
      EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size()), 0) << dtype_name(src_dt) << " -> "
                                                                       << dtype_name(dst_dt);
    }
}

// The fp32 sum of squares (the gradient norm) by the AVX2 loop and by the
// baseline one: the same bits at every length around the lane count, close
// to a long double sum, and inf or NaN anywhere shows.
TEST(GradMath, SumOfSquaresIsTheSameOnEveryPath) {
  std::vector<float> v(100003);
  uint32_t x = 12345;
  for (float& f : v) {
    x = x * 1664525u + 1013904223u;
    // Magnitudes from 1e-6 to 1e3, both signs: the lanes' sums differ a lot.
    f = static_cast<float>((static_cast<double>(x >> 8) / (1 << 24) - 0.5) * std::pow(10.0, (x % 10) - 6.0));
  }
  for (uint64_t n : {uint64_t{0}, uint64_t{1}, uint64_t{15}, uint64_t{16}, uint64_t{17}, uint64_t{31}, uint64_t{4099},
                     uint64_t{100003}}) {
    long double ref = 0;
    for (uint64_t i = 0; i < n; ++i) ref += static_cast<long double>(v[i]) * v[i];
    const double base = detail::sumsq_f32_baseline(v.data(), n);
    EXPECT_NEAR(base, static_cast<double>(ref), 1e-13 * static_cast<double>(ref)) << n;
    EXPECT_EQ(grad_stats(v.data(), ZD_DTYPE_F32, n).sumsq, base) << "grad_stats takes another path, n = " << n;
#if ZEROD_GRAD_MATH_X86
    if (detail::cpu_has_avx2_fma()) {
      EXPECT_EQ(detail::sumsq_f32_avx2(v.data(), n), base) << "AVX2 and baseline differ at n = " << n;
    }
#endif
  }
  for (float bad : {INFINITY, -INFINITY, NAN})
    for (uint64_t at : {uint64_t{3}, uint64_t{4096}, uint64_t{100002}}) {
      std::vector<float> w(v);
      w[at] = bad;
      EXPECT_FALSE(grad_stats(w.data(), ZD_DTYPE_F32, w.size()).finite) << bad << " at " << at;
    }
#if ZEROD_GRAD_MATH_X86
  if (!detail::cpu_has_avx2_fma()) GTEST_SKIP() << "no AVX2 here: only the baseline path was checked";
#endif
}

// bf16 gradients into bf16 accumulators (a GPU job's default) and their sum
// of squares: the vector loops against the scalar rule (f32_to_bf16 of the
// fp32 sum; the fp32 widening's norm), on every bf16 bit pattern against specials
// and random partners (NaNs, infinities, -0, subnormals, sums that round
// up or overflow), at every length around the vector width.
TEST(GradMath, Bf16PathsAreTheScalarRule) {
  std::vector<uint16_t> partners = {0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x0080, 0x3F80, 0xBF80, 0x3F81,
                                    0x7F7F, 0xFF7F, 0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x7F81, 0x4000, 0xC000};
  uint32_t x = 777;
  while (partners.size() < 64) {
    x = x * 1664525u + 1013904223u;
    partners.push_back(static_cast<uint16_t>(x >> 16));
  }
  const uint64_t n = 65536;
  std::vector<uint16_t> all(n);
  for (uint64_t i = 0; i < n; ++i) all[i] = static_cast<uint16_t>(i);
  for (uint16_t b : partners) {
    std::vector<uint16_t> src(n, b), got(all), want(n);
    for (uint64_t i = 0; i < n; ++i) want[i] = f32_to_bf16(bf16_to_f32(all[i]) + bf16_to_f32(b));
    accumulate(src.data(), ZD_DTYPE_BF16, got.data(), ZD_DTYPE_BF16, n);
    ASSERT_EQ(std::memcmp(want.data(), got.data(), n * 2), 0) << "accumulate, partner " << std::hex << b;
    std::vector<uint16_t> base(all);
    detail::add_bf16_baseline(src.data(), base.data(), n);
    ASSERT_EQ(std::memcmp(want.data(), base.data(), n * 2), 0) << "baseline add, partner " << std::hex << b;
#if ZEROD_GRAD_MATH_X86
    if (detail::cpu_has_avx2_fma()) {
      // Every length's tail: the last 0..8 elements go through the scalar loop.
      for (uint64_t len : {uint64_t{1}, uint64_t{7}, uint64_t{8}, uint64_t{9}, uint64_t{15}, uint64_t{17}}) {
        std::vector<uint16_t> v(all.begin(), all.begin() + 32);
        detail::add_bf16_avx2(src.data() + 100, v.data(), len);
        for (uint64_t i = 0; i < 32; ++i)
          ASSERT_EQ(v[i], i < len ? f32_to_bf16(bf16_to_f32(all[i]) + bf16_to_f32(b)) : all[i]) << len << " " << i;
      }
    }
#endif
  }
  // The first write: 0 + x, on every pattern.
  std::vector<uint16_t> zeros(n, 0), first(n, 0x5a5a);
  accumulate(all.data(), ZD_DTYPE_BF16, zeros.data(), ZD_DTYPE_BF16, n);
  assign_to_zero(all.data(), ZD_DTYPE_BF16, first.data(), ZD_DTYPE_BF16, n);
  EXPECT_EQ(std::memcmp(zeros.data(), first.data(), n * 2), 0);
  // The sum of squares: finite patterns only for the bits (a NaN's sum is a
  // NaN, whose payload is no promise), then non-finite ones for the flag.
  std::vector<uint16_t> finite;
  for (uint16_t v : all)
    if ((v & 0x7F80u) != 0x7F80u) finite.push_back(v);
  for (uint64_t len : {uint64_t{0}, uint64_t{1}, uint64_t{3}, uint64_t{4}, uint64_t{7}, uint64_t{8}, uint64_t{9},
                       uint64_t{31}, uint64_t{4099}, static_cast<uint64_t>(finite.size())}) {
    const double base = detail::sumsq_bf16_baseline(finite.data(), len);
    std::vector<float> widened(len);
    for (uint64_t i = 0; i < len; ++i) widened[i] = bf16_to_f32(finite[i]);
    EXPECT_EQ(base, detail::sumsq_f32_baseline(widened.data(), len)) << "not the fp32 widening's norm, n = " << len;
    EXPECT_EQ(grad_stats(finite.data(), ZD_DTYPE_BF16, len).sumsq, base) << "grad_stats, n = " << len;
#if ZEROD_GRAD_MATH_X86
    if (detail::cpu_has_avx2_fma()) {
      EXPECT_EQ(detail::sumsq_bf16_avx2(finite.data(), len), base) << len;
    }
#endif
  }
  for (uint16_t bad : {uint16_t{0x7F80}, uint16_t{0xFF80}, uint16_t{0x7FC0}, uint16_t{0xFFC1}})
    for (uint64_t at : {uint64_t{2}, uint64_t{8}, uint64_t{4098}}) {
      std::vector<uint16_t> w(finite.begin(), finite.begin() + 4099);
      w[at] = bad;
      EXPECT_FALSE(grad_stats(w.data(), ZD_DTYPE_BF16, w.size()).finite) << std::hex << bad << " at " << at;
    }
#if ZEROD_GRAD_MATH_X86
  if (!detail::cpu_has_avx2_fma()) GTEST_SKIP() << "no AVX2 here: only the baseline paths were checked";
#endif
}

// The kept compressed average's sign bits: the vector path writes the same
// bits and floats as the portable loop at every start bit and length around
// a byte, keeps the neighbours' bits of a shared byte, reads -0.0 and NaN's
// sign bit as a sign, and a pack then unpack gives +-scale exactly.
TEST(SignKernels, VectorPathMatchesThePortableLoopAtEveryAlignment) {
  std::vector<float> v(203);
  uint32_t x = 777;
  for (float& f : v) {
    x = x * 1664525u + 1013904223u;
    f = static_cast<float>(static_cast<int32_t>(x)) * 1e-9f;
  }
  v[5] = -0.0f;
  v[6] = 0.0f;
  v[9] = -std::numeric_limits<float>::quiet_NaN();
  for (uint64_t e0 = 0; e0 < 16; ++e0)
    for (uint64_t n : {uint64_t{0}, uint64_t{1}, uint64_t{7}, uint64_t{8}, uint64_t{9}, uint64_t{17}, uint64_t{64},
                       uint64_t{187}}) {
      // Every byte starts 0xA5, so a bit outside [e0, e0 + n) that changes shows.
      std::vector<uint8_t> fast(32, 0xA5), slow(32, 0xA5);
      pack_signs(v.data(), n, fast.data(), e0);
      detail::pack_signs_portable(v.data(), n, slow.data(), e0);
      ASSERT_EQ(fast, slow) << sign_kernels_isa() << " packs other bits at e0 = " << e0 << ", n = " << n;
      for (uint64_t e = 0; e < fast.size() * 8; ++e) {
        const bool bit = (fast[e >> 3] >> (e & 7)) & 1;
        if (e < e0 || e >= e0 + n)
          ASSERT_EQ(bit, ((0xA5u >> (e & 7)) & 1u) != 0) << "bit " << e << " outside the range changed";
        else
          ASSERT_EQ(bit, !std::signbit(v[e - e0])) << "bit " << e << " of e0 = " << e0;
      }
      std::vector<float> a(n + 1, 42.0f), b(n + 1, 42.0f);
      unpack_signs(fast.data(), e0, 0.25f, a.data(), n);
      detail::unpack_signs_portable(fast.data(), e0, 0.25f, b.data(), n);
      for (uint64_t i = 0; i < n; ++i) {
        ASSERT_EQ(std::bit_cast<uint32_t>(a[i]), std::bit_cast<uint32_t>(b[i])) << "e0 = " << e0 << ", i = " << i;
        ASSERT_EQ(a[i], std::signbit(v[i]) ? -0.25f : 0.25f) << "e0 = " << e0 << ", i = " << i;
      }
      EXPECT_EQ(a[n], 42.0f) << "unpack wrote past n = " << n;
    }
}

// The staging buffer is made on first use, charged to the host tier once,
// reused, held by one user at a time, and gives its bytes back.
TEST(HostStaging, MadeOnceChargedOnceExclusiveAndReleased) {
  ThreadPool pool(2);
  std::mutex mu;
  RankResources res(0, pool, mu);
  res.device = std::make_unique<CpuDevice>(res.ledger, res.workers, uint64_t{1} << 16, "cpu");
  HostStaging staging(res, uint64_t{1} << 20, "the test's staging buffer");
  EXPECT_EQ(res.ledger.current(ZD_TIER_HOST, ZD_MEM_BUFFERS), 0u);
  std::byte* first = nullptr;
  {
    HostStaging::Lease l(staging);
    first = l.data();
    ASSERT_NE(first, nullptr);
    EXPECT_EQ(l.size(), uint64_t{1} << 20);
    EXPECT_EQ(res.ledger.current(ZD_TIER_HOST, ZD_MEM_BUFFERS), uint64_t{1} << 20);
  }
  // Two users: each sees its own pattern intact for as long as it holds it.
  std::atomic<int> clobbered{0};
  auto user = [&](std::byte mark) {
    for (int round = 0; round < 50; ++round) {
      HostStaging::Lease l(staging);
      EXPECT_EQ(l.data(), first);
      std::memset(l.data(), static_cast<int>(mark), 4096);
      std::this_thread::yield();
      for (int i = 0; i < 4096; ++i)
        if (l.data()[i] != mark) clobbered.fetch_add(1);
    }
  };
  std::thread a(user, std::byte{0x11});
  user(std::byte{0x22});
  a.join();
  EXPECT_EQ(clobbered.load(), 0);
  EXPECT_EQ(res.ledger.current(ZD_TIER_HOST, ZD_MEM_BUFFERS), uint64_t{1} << 20);
  staging.release();
  EXPECT_EQ(res.ledger.current(ZD_TIER_HOST, ZD_MEM_BUFFERS), 0u);
}

// Whether the page holding p is mapped in this process (mincore answers
// ENOMEM for an address with no mapping).
bool mapped(const std::byte* p) {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  unsigned char resident = 0;
  return mincore(reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) / page * page), 1, &resident) == 0;
}

// The host scratch is reserved and charged at once, lends 64-byte-aligned
// runs of itself that never overlap while they live and are reused once
// they go; a copy it cannot hold gets mapped memory of its own, charged
// while it lives (the host budget refusing it names it); released, the
// buffer is unmapped and uncharged, after the last live run where runs are
// still out.
TEST(HostScratch, ChargedLentWithoutOverlapOverflowsChargedAndUnmapped) {
  MemoryLedger ledger;
  HostScratch scratch(ledger);
  scratch.reserve(1000);
  EXPECT_EQ(scratch.reserved(), 1024u);
  EXPECT_EQ(ledger.current(ZD_TIER_HOST, ZD_MEM_BUFFERS), 1024u);
  HostScratch::Lease a = scratch.take(100, "a");
  HostScratch::Lease b = scratch.take(500, "b");
  ASSERT_NE(a.data(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % HostScratch::kAlign, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % HostScratch::kAlign, 0u);
  EXPECT_GE(b.data(), a.data() + 100);
  std::byte* const first = a.data();
  a = HostScratch::Lease();  // gone: its run is free again, before b's
  HostScratch::Lease c = scratch.take(64, "c");
  EXPECT_EQ(c.data(), first);
  EXPECT_EQ(ledger.current(ZD_TIER_HOST, ZD_MEM_BUFFERS), 1024u) << "runs of the buffer are charged with it";
  // 576 B of 1024 are out: 600 more go beyond it, charged while they live.
  {
    HostScratch::Lease over = scratch.take(600, "the test's big copy");
    ASSERT_NE(over.data(), nullptr);
    std::memset(over.data(), 1, 600);
    EXPECT_EQ(ledger.current(ZD_TIER_HOST, ZD_MEM_BUFFERS), 1024u + 640u);
  }
  EXPECT_EQ(ledger.current(ZD_TIER_HOST, ZD_MEM_BUFFERS), 1024u);
  ledger.set_budget(ZD_TIER_HOST, 1500);
  try {
    scratch.take(600, "the test's big copy");
    ADD_FAILURE() << "a copy past the host budget was lent";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ZD_ERR_BUDGET);
    EXPECT_NE(std::string(e.what()).find("the test's big copy"), std::string::npos) << e.what();
  }
  EXPECT_EQ(ledger.current(ZD_TIER_HOST, ZD_MEM_BUFFERS), 1024u);
  // Released while b and c are out: it goes once they do.
  std::byte* const buffer = c.data();
  scratch.release();
  EXPECT_TRUE(mapped(buffer));
  EXPECT_EQ(ledger.current(ZD_TIER_HOST, ZD_MEM_BUFFERS), 1024u);
  b = HostScratch::Lease();
  c = HostScratch::Lease();
  EXPECT_FALSE(mapped(buffer)) << "the buffer's memory went back to the system";
  EXPECT_EQ(ledger.current(ZD_TIER_HOST, ZD_MEM_BUFFERS), 0u);
  EXPECT_EQ(scratch.reserved(), 0u);
  // A reserve the budget refuses holds nothing.
  EXPECT_THROW(scratch.reserve(2000), Error);
  EXPECT_EQ(ledger.current(ZD_TIER_HOST, ZD_MEM_BUFFERS), 0u);
  EXPECT_EQ(scratch.reserved(), 0u);
}

// Gradients leaving a device the host cannot address (the emulated one,
// whose copies land later on threads of their own, as a GPU's do): several
// adds in one call, their chunks one sequence through the staging buffer,
// give each dst what one add at a time on the host gives, written where
// `first`, with each tile's norm partials; an add of more than one chunk,
// one of a few elements and one of 0 among them.
TEST(Transfers, SeveralAddsOffTheDeviceAreEachAsOnTheHost) {
  ThreadPool pool(2);
  std::mutex mu;
  RankResources res(0, pool, mu);
  res.device = std::make_unique<EmulatedDevice>(res.ledger, res.workers, false, "test", uint64_t{256} << 20);
  const uint64_t chunk = (uint64_t{32} << 20) / 2 / sizeof(uint16_t);  // the staging buffer's half, in bf16
  struct Case {
    uint64_t n;
    bool first, norm;
  };
  const Case cases[] = {{chunk + 3 * kTile + 5, false, true}, {7, true, false}, {0, false, false},
                        {2 * kTile + 1, true, true}};
  std::vector<std::vector<uint16_t>> grads;
  std::vector<std::vector<float>> dst, want;
  std::vector<std::vector<double>> sums, want_sums;
  std::vector<Block> blocks;
  std::vector<PoolAdd> adds;
  for (size_t c = 0; c < std::size(cases); ++c) {
    const uint64_t n = cases[c].n;
    grads.emplace_back(n);
    for (uint64_t i = 0; i < n; ++i) grads[c][i] = f32_to_bf16(static_cast<float>((i * 7 + c) % 1000) / 64.0f - 7.0f);
    dst.emplace_back(n, cases[c].first ? 0.0f : 1.5f);
    want.push_back(dst[c]);
    accumulate(grads[c].data(), ZD_DTYPE_BF16, want[c].data(), ZD_DTYPE_F32, n);
    const uint64_t tiles = (n + kTile - 1) / kTile;
    sums.emplace_back(tiles, -1.0);
    want_sums.emplace_back(tiles, 0.0);
    if (cases[c].norm) norm_tiles(want[c].data(), ZD_DTYPE_F32, n, NormTiles{want_sums[c].data(), n});
    blocks.push_back(res.device->allocate(std::max<uint64_t>(n, 1) * 2, ZD_MEM_BUFFERS, "a gradient"));
    if (n) res.device->copy_to_device(blocks[c].ptr, grads[c].data(), n * 2);
    adds.push_back(PoolAdd{blocks[c].ptr, ZD_DTYPE_BF16, dst[c].data(), ZD_DTYPE_F32, n, cases[c].first,
                           cases[c].norm ? NormTiles{sums[c].data(), n} : NormTiles{nullptr, 0}});
  }
  ASSERT_TRUE(res.transfers.bytes_travel());
  res.transfers.add_to_host(adds, res.device->mark());
  for (size_t c = 0; c < std::size(cases); ++c) {
    EXPECT_EQ(dst[c], want[c]) << "add " << c;  // no NaN among them: == is bit for bit here
    if (cases[c].norm)
      EXPECT_EQ(sums[c], want_sums[c]) << "add " << c << "'s norm partials";
    else
      for (double v : sums[c]) EXPECT_EQ(v, -1.0) << "add " << c << " was given no partials to write";
  }
  for (const Block& b : blocks) res.device->release(b, ZD_MEM_BUFFERS);
}

// A wait that fails part-way through the chunks (a copy error, as CUDA
// reports it at the wait) leaves the other half's download in flight; the
// staging buffer goes back only once it has landed, or the next lease would
// hand out memory the copy engine is still writing.
class FirstDownloadWaitFails final : public EmulatedDevice {
 public:
  FirstDownloadWaitFails(MemoryLedger& ledger, Workers& workers)
      : EmulatedDevice(ledger, workers, false, "test", uint64_t{256} << 20) {}
  uint64_t download(void* dst, const void* src, uint64_t n, uint64_t after) override {
    const uint64_t t = EmulatedDevice::download(dst, src, n, after);
    issued.push_back(t);
    return t;
  }
  void transfer_wait(uint64_t t) override {
    EmulatedDevice::transfer_wait(t);
    waited.push_back(t);
    if (!issued.empty() && t == issued.front()) fail(ZD_ERR_IO, "injected: the first chunk's download failed");
  }
  std::vector<uint64_t> issued, waited;
};

TEST(Transfers, AFailedChunkGivesTheStagingBufferBackOnlyOnceTheOtherHalfHasLanded) {
  ThreadPool pool(2);
  std::mutex mu;
  RankResources res(0, pool, mu);
  auto owned = std::make_unique<FirstDownloadWaitFails>(res.ledger, res.workers);
  FirstDownloadWaitFails& dev = *owned;
  res.device = std::move(owned);
  const uint64_t chunk = (uint64_t{32} << 20) / 2 / sizeof(uint16_t);  // the staging buffer's half, in bf16
  const uint64_t n = chunk + 3 * kTile;                                // two chunks: both halves in use
  std::vector<float> dst(n, 0.0f);
  Block grad = res.device->allocate(n * 2, ZD_MEM_BUFFERS, "a gradient");
  const PoolAdd add{grad.ptr, ZD_DTYPE_BF16, dst.data(), ZD_DTYPE_F32, n, true, NormTiles{nullptr, 0}};
  EXPECT_THROW(res.transfers.add_to_host({&add, 1}, res.device->mark()), Error);
  ASSERT_EQ(dev.issued.size(), 2u) << "the second chunk's download was issued before the first was waited for";
  for (uint64_t t : dev.issued)
    EXPECT_NE(std::find(dev.waited.begin(), dev.waited.end(), t), dev.waited.end())
        << "download " << t << " was still in flight when the staging buffer went back";
  res.device->release(grad, ZD_MEM_BUFFERS);
}

static LayoutPolicy policy(Partitioning p, uint64_t world) {
  LayoutPolicy pol;
  pol.partitioning = p;
  pol.stride = [world](uint64_t n, uint64_t a) { return ((n + world - 1) / world + a - 1) / a * a; };
  return pol;
}

TEST(Registry, ParameterShardsArePaddedAndAligned) {
  Registry r(2);
  r.add("w1", "m", ZD_DTYPE_F32, {3, 5});
  r.add("w2", "m", ZD_DTYPE_F32, {3, 5});
  r.add("h", "n", ZD_DTYPE_BF16, {7});
  r.lay_out(policy(Partitioning::Param, 2));
  const ParamRecord& w1 = r.param(0);
  EXPECT_EQ(w1.stride, 8u);  // 15 elements over 2 ranks
  EXPECT_EQ(w1.shard_real(0), 8u);
  EXPECT_EQ(w1.shard_real(1), 7u);  // one element of padding
  EXPECT_EQ(w1.flat_offset, 0u);
  EXPECT_EQ(r.param(1).flat_offset, Registry::kAlignElems);
  ASSERT_EQ(r.groups().size(), 2u);
  EXPECT_EQ(r.groups()[0].dtype, ZD_DTYPE_F32);
  EXPECT_EQ(r.groups()[1].dtype, ZD_DTYPE_BF16);
  EXPECT_EQ(r.param(2).group, 1);
  EXPECT_EQ(r.module(0).params.size(), 2u);
  EXPECT_EQ(r.find_module("n"), 1);
  EXPECT_EQ(r.total_numel(), 37u);
  EXPECT_THROW(r.param(3), Error);
}

TEST(Registry, GroupPartitionsCutTheFullLayoutIntoEqualRanges) {
  Registry r(3);
  r.add("a", "m", ZD_DTYPE_F32, {100});
  r.add("b", "m", ZD_DTYPE_F32, {10});
  r.lay_out(policy(Partitioning::Group, 3));
  const ParamGroup& g = r.groups()[0];
  // a at 0 (100 -> 128 aligned), b at 128: 160 elements in all, 54 -> 64 per rank.
  EXPECT_EQ(r.param(1).full_offset, 128u);
  EXPECT_EQ(g.stride, 64u);
  EXPECT_EQ(g.full_numel, 192u);
}

TEST(Registry, APartitionerThatCutsTooSmallIsRefused) {
  Registry r(2);
  r.add("a", "m", ZD_DTYPE_F32, {100});
  LayoutPolicy bad;
  bad.partitioning = Partitioning::Param;
  bad.stride = [](uint64_t, uint64_t) { return uint64_t{10}; };
  EXPECT_THROW(r.lay_out(bad), Error);
}
