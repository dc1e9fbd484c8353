// fp16/bf16 conversion edge cases: the scalar conversions against known
// answers and against the F16C instructions, and every ISA's working-copy
// store and 16-bit gradient load against the scalar conversions.
#include <gtest/gtest.h>
#include <zerod/kit/cpu.h>

#include "test_util.h"

// The F16C comparison is x86-only: <immintrin.h> is an #error elsewhere, so
// an unguarded include fails the whole aarch64 build (house.portable_sources).
#if ZEROD_KIT_CPU_X86
#include <immintrin.h>
#endif

namespace zerod::optim::test {
namespace {

#if ZEROD_KIT_CPU_X86
__attribute__((target("f16c"))) uint16_t hw_f32_to_f16(float f) {
  return static_cast<uint16_t>(_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT), 0));
}

__attribute__((target("f16c"))) float hw_f16_to_f32(uint16_t h) {
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}
#endif

float from_bits(uint32_t u) { return f32_from_bits(u); }

TEST(Convert, F16KnownAnswers) {
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7BFF);                  // largest finite
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7BFF);                  // below the midpoint to 65536
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);                  // the midpoint ties to even: infinity
  EXPECT_EQ(f32_to_f16(-1e6f), 0xFC00);                     // overflow
  EXPECT_EQ(f32_to_f16(__builtin_inff()), 0x7C00);
  EXPECT_EQ(f32_to_f16(-__builtin_inff()), 0xFC00);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f), 0x3C00);           // tie, even below
  EXPECT_EQ(f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3C02);       // tie, even above
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3C01);  // just past the tie
  EXPECT_EQ(f32_to_f16(0x1p-14f), 0x0400);                  // smallest normal
  EXPECT_EQ(f32_to_f16(1023 * 0x1p-24f), 0x03FF);           // largest subnormal
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001);                  // smallest subnormal
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);                  // tie between 0 and 2^-24: even is 0
  EXPECT_EQ(f32_to_f16(-0x1p-25f), 0x8000);
  EXPECT_EQ(f32_to_f16(3 * 0x1p-26f), 0x0001);              // above that tie
  EXPECT_EQ(f32_to_f16(3 * 0x1p-25f), 0x0002);              // 1.5 units: tie to even 2
  EXPECT_EQ(f32_to_f16(5 * 0x1p-25f), 0x0002);              // 2.5 units: tie to even 2
  EXPECT_EQ(f32_to_f16(0x1p-14f - 0x1p-26f), 0x0400);       // rounds up into the normals
  EXPECT_EQ(f32_to_f16(1e-40f), 0x0000);                    // fp32 subnormal
  const uint16_t nan = f32_to_f16(__builtin_nanf(""));
  EXPECT_EQ(nan & 0x7C00, 0x7C00);
  EXPECT_NE(nan & 0x03FF, 0) << "NaN must stay NaN, not become infinity";
  EXPECT_NE(f32_to_f16(from_bits(0x7F800001u)) & 0x03FF, 0) << "a signalling NaN with a low payload";

  EXPECT_EQ(f16_to_f32(0x0001), 0x1p-24f);
  EXPECT_EQ(f16_to_f32(0x03FF), 1023 * 0x1p-24f);
  EXPECT_EQ(f16_to_f32(0x8000), 0.0f);
  EXPECT_TRUE(std::signbit(f16_to_f32(0x8000)));
  EXPECT_EQ(f16_to_f32(0x7C00), __builtin_inff());
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7C01)));
  EXPECT_TRUE(std::isnan(f16_to_f32(0xFE00)));
}

TEST(Convert, F16RoundTripsEveryValue) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_EQ(f32_to_f16(f), h | 0x0200) << std::hex << h << ": NaN comes back quiet";
    } else {
      ASSERT_EQ(f32_to_f16(f), h) << std::hex << h;
    }
  }
}

TEST(Convert, F16MatchesF16cInstructions) {
#if ZEROD_KIT_CPU_X86
  // The kit's probe, not __builtin_cpu_supports("f16c"), which clang 14 refuses.
  if (!zerod::cpu::features().f16c) {
    GTEST_SKIP() << "this CPU lacks F16C, so there is no hardware conversion to compare with";
  }
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    ASSERT_EQ(f32_bits(f16_to_f32(static_cast<uint16_t>(h))), f32_bits(hw_f16_to_f32(static_cast<uint16_t>(h))))
        << std::hex << h;
  }
  // A sweep over all fp32 bit patterns (stride coprime to every field width),
  // plus every pattern around the fp16 rounding boundaries.
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 251) {
    const float f = from_bits(static_cast<uint32_t>(u));
    ASSERT_EQ(f32_to_f16(f), hw_f32_to_f16(f)) << std::hex << u;
  }
  for (uint32_t e = 100; e <= 143; ++e) {
    for (uint32_t m = 0; m < (1u << 14); ++m) {
      for (const uint32_t s : {0u, 0x80000000u}) {
        const uint32_t lo = s | (e << 23) | (m << 9) | 0x0FFu;  // low bits set near the 2^13 rounding point
        const uint32_t tie = s | (e << 23) | (m << 9);
        for (const uint32_t u : {lo, tie}) {
          ASSERT_EQ(f32_to_f16(from_bits(u)), hw_f32_to_f16(from_bits(u))) << std::hex << u;
        }
      }
    }
  }
#else
  GTEST_SKIP() << "F16C is an x86 instruction set: there is no hardware conversion to compare with on this "
                  "architecture";
#endif
}

TEST(Convert, Bf16KnownAnswers) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F808000u)), 0x3F80);  // tie, even below
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F818000u)), 0x3F82);  // tie, even above
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F808001u)), 0x3F81);  // past the tie
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F807FFFu)), 0x3F80);
  EXPECT_EQ(f32_to_bf16(from_bits(0x7F7FFFFFu)), 0x7F80);  // largest fp32 rounds to infinity
  EXPECT_EQ(f32_to_bf16(__builtin_inff()), 0x7F80);
  EXPECT_EQ(f32_to_bf16(-__builtin_inff()), 0xFF80);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_bf16(from_bits(0x00008000u)), 0x0000);  // subnormal tie to even 0
  EXPECT_EQ(f32_to_bf16(from_bits(0x00018000u)), 0x0002);
  EXPECT_EQ(f32_to_bf16(__builtin_nanf("")), 0x7FC0);
  // Naive rounding would turn these NaNs into +inf and into +0.
  EXPECT_EQ(f32_to_bf16(from_bits(0x7F800001u)), 0x7FC0);
  EXPECT_EQ(f32_to_bf16(from_bits(0xFFFFFFFFu)), 0x7FC0);
  EXPECT_EQ(f32_to_bf16(from_bits(0x7FFFFFFFu)), 0x7FC0);
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const float f = bf16_to_f32(static_cast<uint16_t>(h));
    ASSERT_EQ(f32_bits(f), h << 16);
    if (!std::isnan(f)) {
      ASSERT_EQ(f32_to_bf16(f), h) << std::hex << h;
    }
  }
}

// fp32 values around every rounding edge above.
std::vector<float> edge_values() {
  std::vector<float> v = {65504.0f, 65519.0f, 65520.0f, -65520.0f, -1e6f, __builtin_inff(), -__builtin_inff(),
                          -0.0f, 0.0f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 0x1p-14f, 1023 * 0x1p-24f,
                          0x1p-24f, 0x1p-25f, -0x1p-25f, 3 * 0x1p-26f, 3 * 0x1p-25f, 5 * 0x1p-25f,
                          0x1p-14f - 0x1p-26f, 1e-40f, __builtin_nanf(""), -__builtin_nanf("")};
  for (const uint32_t u : {0x3F808000u, 0x3F818000u, 0x3F808001u, 0x3F807FFFu, 0x7F7FFFFFu, 0x00008000u,
                           0x00018000u, 0x7F800001u, 0xFFFFFFFFu, 0x7FFFFFFFu, 0xFFC00001u}) {
    v.push_back(from_bits(u));
  }
  return v;
}

class ConvertIsa : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!isa_supported(GetParam())) GTEST_SKIP() << missing_isa_message(GetParam());
  }
};

// Each ISA's fused working-copy store: SGD with lr = 0 and zero gradients
// leaves the master unchanged, so the copy is the conversion of the input.
TEST_P(ConvertIsa, StoresWorkingCopyAsScalarConversion) {
  const Isa isa = GetParam();
  const std::vector<float> edges = edge_values();
  for (const Dtype wd : {Dtype::bf16, Dtype::f16}) {
    // 3 copies: through the unrolled bodies, the single-vector body and the tail.
    const size_t n = 3 * edges.size();
    std::vector<float> p(n), g(n, 0.0f);
    for (size_t i = 0; i < n; ++i) p[i] = edges[i % edges.size()];
    std::vector<uint16_t> w(n, 0xDEAD);
    SgdParams hp;
    hp.lr = 0.0;
    Range r;
    r.count = n;
    r.master = p.data();
    r.grad = g.data();
    r.work = w.data();
    r.work_dtype = wd;
    ASSERT_TRUE(sgd_update(isa, hp, r, nullptr));
    for (size_t i = 0; i < n; ++i) {
      const float x = edges[i % edges.size()];
      // The arithmetic may quiet a signalling NaN; anything else is unchanged.
      if (std::isnan(x)) {
        ASSERT_TRUE(std::isnan(p[i]));
      } else {
        ASSERT_EQ(f32_bits(p[i]), f32_bits(x));
      }
      const uint16_t want = wd == Dtype::bf16 ? f32_to_bf16(p[i]) : f32_to_f16(p[i]);
      EXPECT_EQ(w[i], want) << isa_name(isa) << " " << dtype_name(wd) << " of " << x << " (0x" << std::hex
                            << f32_bits(x) << ")";
    }
  }
}

// Each ISA's 16-bit gradient load, on every bit pattern: with p = -0 and
// lr = -1, SGD computes p = fma(1, g, -0) = g exactly.
TEST_P(ConvertIsa, WidensEvery16BitGradient) {
  const Isa isa = GetParam();
  for (const Dtype gd : {Dtype::bf16, Dtype::f16}) {
    const size_t n = 0x10000;
    std::vector<uint16_t> g(n);
    for (size_t i = 0; i < n; ++i) g[i] = static_cast<uint16_t>(i);
    std::vector<float> p(n, -0.0f);
    SgdParams hp;
    hp.lr = -1.0;
    Range r;
    r.count = n;
    r.master = p.data();
    r.grad = g.data();
    r.grad_dtype = gd;
    ASSERT_TRUE(sgd_update(isa, hp, r, nullptr));
    for (size_t i = 0; i < n; ++i) {
      const float want = gd == Dtype::bf16 ? bf16_to_f32(g[i]) : f16_to_f32(g[i]);
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(p[i])) << isa_name(isa) << " " << dtype_name(gd) << " 0x" << std::hex << i;
      } else {
        ASSERT_EQ(f32_bits(p[i]), f32_bits(want))
            << isa_name(isa) << " " << dtype_name(gd) << " 0x" << std::hex << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, ConvertIsa, ::testing::Values(Isa::scalar, Isa::avx2, Isa::avx512),
                         [](const ::testing::TestParamInfo<Isa>& p) { return std::string(isa_name(p.param)); });

}  // namespace
}  // namespace zerod::optim::test
