// One fp16/bf16 rounding for the whole tree (zerod/kit/half.h): round to
// nearest even, PyTorch's NaN rule (bf16: every NaN is 0x7FC0; fp16: a quiet
// NaN keeping sign and the payload's top bits). A table of known answers,
// worked out independently (exact rational rounding), holds the kit; then
// every place that rounds is held to the same bits: the engine's convert()
// and gradient arithmetic, the optimizer kernels' working-copy store on each
// ISA (scalar, AVX2, AVX-512), and the comm plugin's reduction kernels on each
// ISA. The CUDA kernels call the same header; they are not run here.
#include <gtest/gtest.h>
#include <zerod/kit/half.h>
#include <zerod/optim/kernels.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "runtime/dtype.h"      // engine
#include "grad/grad_math.h"  // engine
#include "kernels.h"    // plugins/comm/local

namespace zerod {
namespace {

struct Answer {
  uint32_t f32;
  uint16_t bf16;
  uint16_t f16;
  const char* what;
};

// fp32 bits -> the bf16 and fp16 bits the rule gives.
const std::vector<Answer>& answers() {
  static const std::vector<Answer> a = {
      {0x7FC00000u, 0x7FC0, 0x7E00, "quiet NaN"},
      {0xFFC00000u, 0x7FC0, 0xFE00, "negative quiet NaN"},
      {0x7F800001u, 0x7FC0, 0x7E00, "signalling NaN, low payload"},
      {0x7FA00000u, 0x7FC0, 0x7F00, "signalling NaN, high payload"},
      {0x7FC12345u, 0x7FC0, 0x7E09, "quiet NaN with a payload"},
      {0xFFFFFFFFu, 0x7FC0, 0xFFFF, "all-ones NaN"},
      {0x7FFFFFFFu, 0x7FC0, 0x7FFF, "largest positive NaN"},
      {0xFF800001u, 0x7FC0, 0xFE00, "negative signalling NaN"},
      {0x7F800000u, 0x7F80, 0x7C00, "+inf"},
      {0xFF800000u, 0xFF80, 0xFC00, "-inf"},
      {0x00000000u, 0x0000, 0x0000, "+0"},
      {0x80000000u, 0x8000, 0x8000, "-0"},
      {0x3F800000u, 0x3F80, 0x3C00, "1"},
      {0x3F808000u, 0x3F80, 0x3C04, "bf16 tie, even below"},
      {0x3F818000u, 0x3F82, 0x3C0C, "bf16 tie, even above"},
      {0x3F808001u, 0x3F81, 0x3C04, "past a bf16 tie"},
      {0x3F807FFFu, 0x3F80, 0x3C04, "below a bf16 tie"},
      {0x7F7FFFFFu, 0x7F80, 0x7C00, "largest fp32"},
      {0x7F7F8000u, 0x7F80, 0x7C00, "bf16 tie at the top: to inf"},
      {0x00000001u, 0x0000, 0x0000, "smallest fp32 denormal"},
      {0x00008000u, 0x0000, 0x0000, "fp32 denormal, bf16 tie to 0"},
      {0x00018000u, 0x0002, 0x0000, "fp32 denormal, bf16 tie up"},
      {0x807FFFFFu, 0x8080, 0x8000, "largest negative fp32 denormal"},
      {0x3F801000u, 0x3F80, 0x3C00, "fp16 tie, even below (1 + 2^-11)"},
      {0x3F803000u, 0x3F80, 0x3C02, "fp16 tie, even above (1 + 3*2^-11)"},
      {0x3F801001u, 0x3F80, 0x3C01, "past an fp16 tie"},
      {0x477FE000u, 0x4780, 0x7BFF, "65504, largest fp16"},
      {0x477FEFFFu, 0x4780, 0x7BFF, "just below 65520"},
      {0x477FF000u, 0x4780, 0x7C00, "65520: fp16 tie to inf"},
      {0xC77FF000u, 0xC780, 0xFC00, "-65520"},
      {0x38800000u, 0x3880, 0x0400, "2^-14, smallest fp16 normal"},
      {0x387FC000u, 0x3880, 0x03FF, "largest fp16 subnormal"},
      {0x33800000u, 0x3380, 0x0001, "2^-24, smallest fp16 subnormal"},
      {0x33000000u, 0x3300, 0x0000, "2^-25: fp16 tie to 0"},
      {0xB3000000u, 0xB300, 0x8000, "-2^-25"},
      {0x33000001u, 0x3300, 0x0001, "just above 2^-25"},
      {0x33C00000u, 0x33C0, 0x0002, "1.5 * 2^-24: fp16 tie to 2"},
      {0x34200000u, 0x3420, 0x0002, "2.5 * 2^-24: fp16 tie to 2"},
      {0x387FE000u, 0x3880, 0x0400, "2^-14 - 2^-25: tie up into the fp16 normals"},
  };
  return a;
}

std::string hex(uint32_t u) {
  char s[16];
  std::snprintf(s, sizeof s, "0x%X", u);
  return s;
}

std::string case_name(const Answer& a) { return hex(a.f32) + " (" + a.what + ")"; }

TEST(HalfRule, KitMatchesTheKnownAnswers) {
  for (const Answer& a : answers()) {
    EXPECT_EQ(f32_to_bf16(f32_from_bits(a.f32)), a.bf16) << "bf16 of " << case_name(a);
    EXPECT_EQ(f32_to_f16(f32_from_bits(a.f32)), a.f16) << "fp16 of " << case_name(a);
  }
}

// Widening: bf16 is exact, bits and all; fp16 exact for numbers, and a NaN
// comes back quiet with its sign and payload (vcvtph2ps, c10's F16C path).
TEST(HalfRule, KitWidensExactlyAndNaNsComeBackQuiet) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    ASSERT_EQ(f32_bits(bf16_to_f32(static_cast<uint16_t>(h))), h << 16) << hex(h);
    const uint32_t m = h & 0x3FFu;
    if ((h & 0x7C00u) == 0x7C00u && m != 0) {
      ASSERT_EQ(f32_bits(f16_to_f32(static_cast<uint16_t>(h))), ((h & 0x8000u) << 16) | 0x7FC00000u | (m << 13))
          << hex(h);
    }
  }
}

// The engine: convert() and the gradient arithmetic's store (accumulate into
// a 16-bit -0, so the sum is the input itself, NaN payload and sign of zero
// included), and its widening.
TEST(HalfRule, EngineRoundsByTheRule) {
  std::vector<float> in;
  for (const Answer& a : answers()) in.push_back(f32_from_bits(a.f32));
  const size_t n = in.size();
  std::vector<uint16_t> bf(n), hf(n);
  convert(in.data(), ZD_DTYPE_F32, bf.data(), ZD_DTYPE_BF16, n);
  convert(in.data(), ZD_DTYPE_F32, hf.data(), ZD_DTYPE_F16, n);
  std::vector<uint16_t> bf_acc(n, 0x8000), hf_acc(n, 0x8000);
  accumulate(in.data(), ZD_DTYPE_F32, bf_acc.data(), ZD_DTYPE_BF16, n);
  accumulate(in.data(), ZD_DTYPE_F32, hf_acc.data(), ZD_DTYPE_F16, n);
  for (size_t i = 0; i < n; ++i) {
    const Answer& a = answers()[i];
    EXPECT_EQ(bf[i], a.bf16) << "convert to bf16 of " << case_name(a);
    EXPECT_EQ(hf[i], a.f16) << "convert to fp16 of " << case_name(a);
    EXPECT_EQ(bf_acc[i], a.bf16) << "accumulate into bf16 of " << case_name(a);
    EXPECT_EQ(hf_acc[i], a.f16) << "accumulate into fp16 of " << case_name(a);
  }
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const uint16_t x = static_cast<uint16_t>(h);
    ASSERT_EQ(f32_bits(load_as_float(&x, ZD_DTYPE_F16, 0)), f32_bits(f16_to_f32(x))) << "fp16 " << hex(h);
    ASSERT_EQ(f32_bits(load_as_float(&x, ZD_DTYPE_BF16, 0)), f32_bits(bf16_to_f32(x))) << "bf16 " << hex(h);
  }
}

// The optimizer kernels' working copy on each ISA: SGD with lr = 0 and zero
// gradients leaves the master as it was, so the copy is the rounding of the
// input. Three copies of the table reach the unrolled bodies, the single
// vectors and the tail.
class HalfRuleIsa : public ::testing::TestWithParam<optim::Isa> {
 protected:
  void SetUp() override {
    if (!optim::isa_supported(GetParam()))
      GTEST_SKIP() << "this CPU cannot run the " << optim::isa_name(GetParam()) << " path";
  }
};

TEST_P(HalfRuleIsa, OptimizerWorkingCopyRoundsByTheRule) {
  const std::vector<Answer>& t = answers();
  for (const optim::Dtype wd : {optim::Dtype::bf16, optim::Dtype::f16}) {
    const size_t n = 3 * t.size();
    std::vector<float> p(n), g(n, 0.0f);
    for (size_t i = 0; i < n; ++i) p[i] = f32_from_bits(t[i % t.size()].f32);
    std::vector<uint16_t> w(n, 0xDEAD);
    optim::SgdParams hp;
    hp.lr = 0.0;
    optim::Range r;
    r.count = n;
    r.master = p.data();
    r.grad = g.data();
    r.work = w.data();
    r.work_dtype = wd;
    ASSERT_TRUE(optim::sgd_update(GetParam(), hp, r, nullptr));
    for (size_t i = 0; i < n; ++i) {
      const Answer& a = t[i % t.size()];
      EXPECT_EQ(w[i], wd == optim::Dtype::bf16 ? a.bf16 : a.f16)
          << optim::isa_name(GetParam()) << (wd == optim::Dtype::bf16 ? " bf16" : " fp16") << " element " << i
          << " of " << case_name(a);
    }
  }
}

// The 16-bit gradient loads, every pattern: p = fma(1, g, -0) = g, and an
// FMA with one NaN operand returns that NaN quiet, payload kept.
TEST_P(HalfRuleIsa, OptimizerGradientWidensByTheRule) {
  for (const optim::Dtype gd : {optim::Dtype::bf16, optim::Dtype::f16}) {
    const size_t n = 0x10000;
    std::vector<uint16_t> g(n);
    for (size_t i = 0; i < n; ++i) g[i] = static_cast<uint16_t>(i);
    std::vector<float> p(n, -0.0f);
    optim::SgdParams hp;
    hp.lr = -1.0;
    optim::Range r;
    r.count = n;
    r.master = p.data();
    r.grad = g.data();
    r.grad_dtype = gd;
    ASSERT_TRUE(optim::sgd_update(GetParam(), hp, r, nullptr));
    for (size_t i = 0; i < n; ++i) {
      float want = gd == optim::Dtype::bf16 ? bf16_to_f32(g[i]) : f16_to_f32(g[i]);
      if (std::isnan(want)) want = f32_from_bits(f32_bits(want) | 0x400000u);  // a bf16 sNaN comes back quiet
      ASSERT_EQ(f32_bits(p[i]), f32_bits(want))
          << optim::isa_name(GetParam()) << (gd == optim::Dtype::bf16 ? " bf16 " : " fp16 ") << hex(static_cast<uint32_t>(i));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, HalfRuleIsa,
                         ::testing::Values(optim::Isa::scalar, optim::Isa::avx2, optim::Isa::avx512),
                         [](const ::testing::TestParamInfo<optim::Isa>& p) {
                           return std::string(optim::isa_name(p.param));
                         });

// The comm plugin's reduction (sum of two ranks, combined in fp32 and rounded
// once) on each ISA path. Its inputs are 16-bit, so the edges are reached as
// sums: every pair from a set holding NaNs with payloads, infinities, signed
// zeros, subnormals, the largest finite values and the operands of ties.
struct CommPath {
  const char* name;
  void (*fn)(const comm::ReduceJob&);
};

std::vector<CommPath> comm_paths() {
  std::vector<CommPath> p = {{"baseline", comm::kernels::base::reduce}};
#if ZEROD_COMM_X86
  if (comm::kernels::avx2_supported()) p.push_back({"avx2", comm::kernels::avx2::reduce});
#endif
  return p;
}

bool is_nan16(comm::Dtype d, uint16_t h) {
  return d == comm::Dtype::bf16 ? (h & 0x7FFFu) > 0x7F80u : (h & 0x7FFFu) > 0x7C00u;
}

std::vector<uint16_t> comm_inputs(comm::Dtype d) {
  if (d == comm::Dtype::bf16) {
    // 1, 2^-8 and 3 * 2^-8 (1 + them: ties), the largest finite, subnormals,
    // the smallest normal, infinities, zeros, NaNs with payloads and signs.
    return {0x3F80, 0x3B80, 0x3C40, 0xBB80, 0x7F7F, 0xFF7F, 0x0001, 0x8001, 0x0080, 0x8080,
            0x7F80, 0xFF80, 0x0000, 0x8000, 0x7FC1, 0xFFC1, 0x7F81, 0x7FFF};
  }
  // 1, 2^-11 and 3 * 2^-11 (ties after 1), 65504 and 16 (65520: a tie to
  // inf), subnormals, the smallest normal, infinities, zeros, NaNs.
  return {0x3C00, 0x1000, 0x1A00, 0x9000, 0x7BFF, 0xFBFF, 0x4C00, 0x0001, 0x8001, 0x0003, 0x0400,
          0x7C00, 0xFC00, 0x0000, 0x8000, 0x7E01, 0xFE01, 0x7C01, 0x7FFF};
}

TEST(HalfRule, CommReductionRoundsByTheRule) {
  for (const comm::Dtype d : {comm::Dtype::bf16, comm::Dtype::f16}) {
    const std::vector<uint16_t> v = comm_inputs(d);
    std::vector<uint16_t> a, b;
    for (uint16_t x : v)
      for (uint16_t y : v) a.push_back(x), b.push_back(y);
    for (const CommPath& path : comm_paths()) {
      std::vector<uint16_t> out(a.size(), 0xDEAD);
      const void* srcs[2] = {a.data(), b.data()};
      void* dsts[1] = {out.data()};
      comm::ReduceJob j;
      j.srcs = srcs;
      j.nsrc = 2;
      j.dsts = dsts;
      j.ndst = 1;
      j.count = a.size();
      j.dtype = d;
      j.op = comm::Reduce::sum;
      path.fn(j);
      const bool bf = d == comm::Dtype::bf16;
      for (size_t i = 0; i < a.size(); ++i) {
        const float fa = bf ? bf16_to_f32(a[i]) : f16_to_f32(a[i]);
        const float fb = bf ? bf16_to_f32(b[i]) : f16_to_f32(b[i]);
        const std::string where = std::string(path.name) + (bf ? " bf16 " : " fp16 ") + hex(a[i]) + " + " + hex(b[i]);
        if (is_nan16(d, a[i]) && is_nan16(d, b[i])) {
          // Which NaN an add of two keeps depends on the operand order the
          // compiler chose; either one, rounded by the rule.
          const uint16_t one = bf ? f32_to_bf16(fa) : f32_to_f16(fa);
          const uint16_t other = bf ? f32_to_bf16(fb) : f32_to_f16(fb);
          EXPECT_TRUE(out[i] == one || out[i] == other) << where << " gave " << hex(out[i]);
          continue;
        }
        // x86 adds return the one NaN operand quiet; any number sum is exact
        // IEEE, so the reference is the kit's rounding of the fp32 sum.
        volatile float sum = fa + fb;
        const uint16_t want = bf ? f32_to_bf16(sum) : f32_to_f16(sum);
        EXPECT_EQ(out[i], want) << where;
      }
    }
  }
  // The cases that told the old engine rule from this one, spelled out.
  for (const CommPath& path : comm_paths()) {
    const uint16_t a[3] = {0x7FC1, 0xFFC1, 0x3F80}, b[3] = {0x3F80, 0x3F80, 0x3B80};
    uint16_t out[3] = {};
    const void* srcs[2] = {a, b};
    void* dsts[1] = {out};
    comm::ReduceJob j;
    j.srcs = srcs;
    j.nsrc = 2;
    j.dsts = dsts;
    j.ndst = 1;
    j.count = 3;
    j.dtype = comm::Dtype::bf16;
    path.fn(j);
    EXPECT_EQ(out[0], 0x7FC0) << path.name << ": a bf16 NaN with a payload becomes 0x7FC0";
    EXPECT_EQ(out[1], 0x7FC0) << path.name << ": a negative bf16 NaN becomes 0x7FC0";
    EXPECT_EQ(out[2], 0x3F80) << path.name << ": 1 + 2^-8 ties to the even 1";
  }
}

}  // namespace
}  // namespace zerod
