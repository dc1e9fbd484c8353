// Every vector entry point returns with the upper halves of the vector
// registers clean (a vzeroupper at its end). A kernel that returns with them
// dirty makes the baseline-x86-64 (SSE) code that runs next on the thread,
// the engine's and libm's, pay on every instruction on Intel cores: the AVX2
// Adam path did, and the scalar Adam loop then ran 60x slower on a Xeon VM.
//
// The state is read with XGETBV(1) (XINUSE), which says which register state
// components hold anything but their initial values: bit 2 the upper halves
// of YMM0-15, bit 6 the upper halves of ZMM0-15, the two that vzeroupper
// clears. Bit 7 (ZMM16-31) is left alone: vzeroupper does not touch it, SSE
// code does not pay for it, and glibc's own AVX-512 string functions set it.
#include <gtest/gtest.h>

#include <tuple>

#include "test_util.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace zerod::optim::test {
namespace {

enum class Call { adam, adam_bf16_work, sgd_momentum, onebit_warmup, onebit_momentum, onebit_frozen };

const char* call_name(Call c) {
  switch (c) {
    case Call::adam: return "adam";
    case Call::adam_bf16_work: return "adam_bf16_work";
    case Call::sgd_momentum: return "sgd_momentum";
    case Call::onebit_warmup: return "onebit_warmup";
    case Call::onebit_momentum: return "onebit_momentum";
    case Call::onebit_frozen: return "onebit_frozen";
  }
  return "?";
}
void PrintTo(Call c, std::ostream* os) { *os << call_name(c); }

#if defined(__x86_64__)
constexpr uint64_t kDirtyUpper = (uint64_t{1} << 2) | (uint64_t{1} << 6);

bool xinuse_readable() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid_count(0xD, 1, &a, &b, &c, &d) != 0 && ((a >> 2) & 1u) != 0;
}

uint64_t xinuse() {
  uint32_t lo = 0, hi = 0;
  asm volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(1));
  return (uint64_t{hi} << 32) | lo;
}

// Only called where the CPU has AVX (every vector path needs it).
__attribute__((target("avx"))) void zero_upper() { _mm256_zeroupper(); }

// 7: the tail alone; 130: the unrolled bodies; kStreamWork + 5 and 2^20 + 5:
// the AVX2 plain loop and walk of large ranges with streaming stores of the
// working copy.
constexpr size_t kSizes[] = {7, 130, kStreamWork + 5, (size_t{1} << 20) + 5};

// The kernel's answer, and XINUSE just before and just after it.
struct Outcome {
  bool ok = false;
  uint64_t before = 0, after = 0;
};

// One call of the entry point under test.
bool call_kernel(Isa isa, Call call, const Range& r, const AdamState& s, float* momentum) {
  switch (call) {
    case Call::adam:
    case Call::adam_bf16_work: {
      AdamParams hp;
      hp.step = 3;
      hp.weight_decay = 0.01;
      hp.decoupled = true;
      return adam_update(isa, hp, r, s);
    }
    case Call::sgd_momentum: {
      SgdParams hp;
      hp.step = 3;
      hp.momentum = 0.9;
      return sgd_update(isa, hp, r, momentum);
    }
    case Call::onebit_warmup: return onebit_adam_update(isa, OnebitAdamParams{}, OnebitPhase::warmup, r, s);
    case Call::onebit_momentum: return onebit_adam_update(isa, OnebitAdamParams{}, OnebitPhase::momentum, r, s);
    case Call::onebit_frozen: return onebit_adam_update(isa, OnebitAdamParams{}, OnebitPhase::frozen, r, s);
  }
  return false;
}

// The call on n elements of made-up values, with XINUSE around it.
Outcome run(Isa isa, Call call, size_t n) {
  Buffer master(Dtype::f32, n), grad(Dtype::f32, n), m(Dtype::f32, n), v(Dtype::f32, n), work(Dtype::bf16, n);
  for (size_t i = 0; i < n; ++i) {
    master.set(i, 0.5f + 1e-3f * static_cast<float>(i % 17));
    grad.set(i, 1e-2f * (static_cast<float>(i % 13) - 6.0f));
    m.set(i, 1e-3f);
    v.set(i, 1e-4f);
    work.set(i, 0.0f);
  }
  Range r;
  r.count = n;
  r.master = master.f32();
  r.grad = grad.data();
  r.grad_dtype = Dtype::f32;
  r.work = call == Call::adam_bf16_work ? work.data() : nullptr;
  r.work_dtype = Dtype::bf16;
  const AdamState s{m.f32(), v.f32()};
  Outcome o;
  zero_upper();
  o.before = xinuse();
  o.ok = call_kernel(isa, call, r, s, m.f32());
  o.after = xinuse();
  return o;
}
#endif

using Param = std::tuple<Call, Isa>;

class UpperState : public ::testing::TestWithParam<Param> {};

TEST_P(UpperState, IsCleanWhenTheKernelReturns) {
#if defined(__x86_64__)
  const auto [call, isa] = GetParam();
  if (!isa_supported(isa)) GTEST_SKIP() << missing_isa_message(isa);
  if (!xinuse_readable()) GTEST_SKIP() << "this CPU cannot report which register state is in use (no XGETBV(1))";
  for (const size_t n : kSizes) {
    SCOPED_TRACE("n = " + std::to_string(n));
    const Outcome o = run(isa, call, n);
    ASSERT_EQ(o.before & kDirtyUpper, 0u) << "the upper halves were dirty before the call: the test cannot tell";
    ASSERT_TRUE(o.ok);
    EXPECT_EQ(o.after & kDirtyUpper, 0u) << call_name(call) << " on " << isa_name(isa)
                                         << " returned with the upper halves of the vector registers dirty (XINUSE 0x"
                                         << std::hex << o.after << "): SSE code after it runs slowly on Intel cores";
  }
#else
  GTEST_SKIP() << "XINUSE is an x86-64 register; there are no AVX kernels on this architecture";
#endif
}

INSTANTIATE_TEST_SUITE_P(EveryEntryPoint, UpperState,
                         ::testing::Combine(::testing::Values(Call::adam, Call::adam_bf16_work, Call::sgd_momentum,
                                                              Call::onebit_warmup, Call::onebit_momentum,
                                                              Call::onebit_frozen),
                                            ::testing::ValuesIn(vector_isas())),
                         [](const ::testing::TestParamInfo<Param>& p) {
                           return std::string(call_name(std::get<0>(p.param))) + "_" + isa_name(std::get<1>(p.param));
                         });

}  // namespace
}  // namespace zerod::optim::test
