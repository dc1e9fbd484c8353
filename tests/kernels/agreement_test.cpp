// Every vector path against the scalar reference, for every (grad dtype x
// working-copy dtype) pair, and for Adam with its state kept in fp32 and in
// bf16, on sizes that reach each unrolled body and the tail, over three
// steps (SGD's first step differs from the later ones).
//
// Tolerance: none. The master and the state, fp32 or bf16, equal the
// reference's bit for bit, NaN payloads and the sign of zero included: the
// paths perform the same fp32 operations, FMA for FMA, and a bf16 state's
// rounding is integer arithmetic, the same on every path (docs/offload.md
// and README.md promise scalar, AVX2 and AVX-512 bit for bit alike). A
// 16-bit working copy must equal the round-to-nearest-even conversion of the
// path's own fp32 master bit for bit, an fp32 one must equal the master.
// Nothing outside the range may be written.
#include <gtest/gtest.h>

#include <tuple>

#include "test_util.h"

namespace zerod::optim::test {
namespace {

constexpr int kSteps = 3;
// 1 and 7: tail only; 8, 17, 22: the one-vector body (AVX2) and masked tail
// (AVX-512); 64, 65, 130: the 2x8 and 4x16 bodies; the large ones: all of
// it, kStreamWork + 103 (an engine tile and some) and 2^20 + 103 through
// the walks where the working copy goes by streaming stores from its first
// vector boundary (AVX2: the plain loop, then the two halves; AVX-512: its
// one walk at both). Buffer's data
// starts 3 elements into a 16-byte-aligned allocation, so there is always a
// head before that boundary (the scalar loop in AVX2, a masked vector in
// AVX-512) of 1, 5, 9 or 13 elements; then AVX2's two halves at once, or
// AVX-512's one walk in 8-vector bodies, whose 103 - head left over always
// leaves single vectors (5 or 6) and a masked tail.
constexpr size_t kSizes[] = {1, 7, 8, 17, 22, 64, 65, 130, 4099, kStreamWork + 103, (size_t{1} << 20) + 103};
constexpr size_t kMaxSize = (size_t{1} << 20) + 103;

enum class Algo { adam, adam_l2, adamw, adam_no_bias_correction, sgd, sgd_momentum, sgd_nesterov };
enum class WorkKind { none, f32, bf16, f16 };

const char* algo_name(Algo a) {
  switch (a) {
    case Algo::adam: return "adam";
    case Algo::adam_l2: return "adam_l2";
    case Algo::adamw: return "adamw";
    case Algo::adam_no_bias_correction: return "adam_no_bias_correction";
    case Algo::sgd: return "sgd";
    case Algo::sgd_momentum: return "sgd_momentum";
    case Algo::sgd_nesterov: return "sgd_nesterov";
  }
  return "?";
}

bool is_adam(Algo a) { return a <= Algo::adam_no_bias_correction; }

AdamParams adam_params(Algo a, int64_t step) {
  AdamParams hp;
  hp.step = step;
  if (a == Algo::adam_l2) {
    hp.weight_decay = 0.01;
    hp.grad_scale = 0.5;
  } else if (a == Algo::adamw) {
    hp.weight_decay = 0.01;
    hp.decoupled = true;
    hp.lr = 2e-3;
  } else if (a == Algo::adam_no_bias_correction) {
    hp.weight_decay = 0.1;
    hp.decoupled = true;
    hp.bias_correction = false;
  }
  return hp;
}

SgdParams sgd_params(Algo a, int64_t step) {
  SgdParams hp;
  hp.step = step;
  if (a == Algo::sgd_momentum) {
    hp.momentum = 0.9;
    hp.dampening = 0.1;
    hp.weight_decay = 1e-4;
    hp.grad_scale = 0.25;
  } else if (a == Algo::sgd_nesterov) {
    hp.momentum = 0.9;
    hp.nesterov = true;
    hp.weight_decay = 1e-2;
  }
  return hp;
}

// Values that exercise conversions and special cases; every 97th element.
constexpr float kSpecialMaster[] = {0.0f,     -0.0f,     1e-6f,      6e-8f,    7e4f,       -65520.0f,
                                    65504.0f, 1.00048828125f, 1.00390625f, 3.4e38f, 1e-40f, -2.5e-5f};
constexpr float kSpecialGrad[] = {__builtin_nanf(""), __builtin_inff(), -1e30f, 1e-30f, 0.0f, 65519.0f};

// Inputs drawn once and shared by every test.
struct Inputs {
  std::vector<float> master;
  std::vector<float> grad[kSteps];
  Inputs() : master(kMaxSize) {
    std::mt19937_64 rng(42);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (size_t i = 0; i < kMaxSize; ++i) {
      master[i] = i % 97 == 13 ? kSpecialMaster[(i / 97) % std::size(kSpecialMaster)] : normal(rng);
    }
    const float scales[] = {1.0f, 1e-3f, 1e-6f, 100.0f};
    for (auto& g : grad) {
      g.resize(kMaxSize);
      for (size_t i = 0; i < kMaxSize; ++i) {
        g[i] = i % 1009 == 500 ? kSpecialGrad[(i / 1009) % std::size(kSpecialGrad)]
                               : normal(rng) * scales[i % std::size(scales)];
      }
    }
  }
};

const Inputs& inputs() {
  static const Inputs in;
  return in;
}

// One run's arrays: master, two state slots (in the state dtype), and the
// working copy.
struct Trial {
  Buffer master, s0, s1, work;
  bool has_work;
  Trial(size_t n, WorkKind w, Dtype state = Dtype::f32)
      : master(Dtype::f32, n),
        s0(state, n),
        s1(state, n),
        work(w == WorkKind::bf16 ? Dtype::bf16 : w == WorkKind::f16 ? Dtype::f16 : Dtype::f32, n),
        has_work(w != WorkKind::none) {
    for (size_t i = 0; i < n; ++i) {
      master.set(i, inputs().master[i]);
      s0.set(i, 0.0f);
      s1.set(i, 0.0f);
      work.set(i, 0.0f);
    }
  }

  bool step(Isa isa, Algo a, Buffer& grad, int64_t t) {
    Range r;
    r.count = master.size();
    r.master = master.f32();
    r.grad = grad.data();
    r.grad_dtype = grad.dtype();
    r.work = has_work ? work.data() : nullptr;
    r.work_dtype = work.dtype();
    if (is_adam(a)) return adam_update(isa, adam_params(a, t), r, AdamState{s0.f32(), s1.f32(), s0.dtype()});
    return sgd_update(isa, sgd_params(a, t), r, s0.f32());
  }
};

// The working copy must be the conversion of the run's own master.
void expect_work_matches_master(const Trial& run, const char* who) {
  if (!run.has_work) return;
  int reported = 0;
  for (size_t i = 0; i < run.master.size() && reported < 5; ++i) {
    const float p = run.master.get(i);
    uint32_t want = 0;
    switch (run.work.dtype()) {
      case Dtype::f32: want = f32_bits(p); break;
      case Dtype::bf16: want = f32_to_bf16(p); break;
      case Dtype::f16: want = f32_to_f16(p); break;
    }
    if (run.work.bits(i) != want) {
      ADD_FAILURE() << who << " working copy [" << i << "] = 0x" << std::hex << run.work.bits(i)
                    << ", conversion of master " << std::dec << p << " is 0x" << std::hex << want;
      ++reported;
    }
  }
}

void expect_same_bits(const Buffer& got, const Buffer& want, const char* what, size_t n, int64_t t) {
  int reported = 0;
  size_t differ = 0;
  for (size_t i = 0; i < n; ++i) {
    if (got.bits(i) == want.bits(i)) continue;
    ++differ;
    if (reported++ < 5)
      ADD_FAILURE() << what << "[" << i << "] after step " << t << ": vector " << got.get(i) << " (0x" << std::hex
                    << got.bits(i) << "), scalar " << std::dec << want.get(i) << " (0x" << std::hex << want.bits(i)
                    << ")" << std::dec;
  }
  EXPECT_EQ(differ, 0u) << what << " (" << dtype_name(got.dtype()) << "), n = " << n;
}

// (algorithm, gradient dtype, working copy, ISA, state dtype)
using Param = std::tuple<Algo, Dtype, WorkKind, Isa, Dtype>;

class Agreement : public ::testing::TestWithParam<Param> {};

TEST_P(Agreement, VectorMatchesScalar) {
  const auto [algo, grad_dtype, work_kind, isa, state_dtype] = GetParam();
  if (!isa_supported(isa)) GTEST_SKIP() << missing_isa_message(isa);
  for (const size_t n : kSizes) {
    SCOPED_TRACE("n = " + std::to_string(n));
    Trial vec(n, work_kind, state_dtype), ref(n, work_kind, state_dtype);
    for (int64_t t = 1; t <= kSteps; ++t) {
      Buffer grad(grad_dtype, n);
      for (size_t i = 0; i < n; ++i) grad.set(i, inputs().grad[t - 1][i]);
      ASSERT_TRUE(vec.step(isa, algo, grad, t));
      ASSERT_TRUE(ref.step(Isa::scalar, algo, grad, t));
      expect_same_bits(vec.master, ref.master, "master", n, t);
      expect_same_bits(vec.s0, ref.s0, "state0", n, t);
      expect_same_bits(vec.s1, ref.s1, "state1", n, t);
      expect_work_matches_master(vec, isa_name(isa));
      expect_work_matches_master(ref, "scalar");
      for (const Buffer* b : {&vec.master, &vec.s0, &vec.s1, &vec.work, &grad}) {
        ASSERT_TRUE(b->guards_intact()) << "a kernel wrote outside its range (n = " << n << ")";
      }
    }
    if (HasFailure()) return;
  }
}

const char* work_name(WorkKind w) {
  switch (w) {
    case WorkKind::none: return "nowork";
    case WorkKind::f32: return "work_f32";
    case WorkKind::bf16: return "work_bf16";
    case WorkKind::f16: return "work_f16";
  }
  return "?";
}

std::string param_name(const ::testing::TestParamInfo<Param>& p) {
  const std::string state = std::get<4>(p.param) == Dtype::f32 ? "" : std::string("_state_") + dtype_name(std::get<4>(p.param));
  return std::string(algo_name(std::get<0>(p.param))) + "_grad_" + dtype_name(std::get<1>(p.param)) + "_" +
         work_name(std::get<2>(p.param)) + "_" + isa_name(std::get<3>(p.param)) + state;
}

INSTANTIATE_TEST_SUITE_P(
    Kernels, Agreement,
    ::testing::Combine(::testing::Values(Algo::adam, Algo::adam_l2, Algo::adamw, Algo::adam_no_bias_correction,
                                         Algo::sgd, Algo::sgd_momentum, Algo::sgd_nesterov),
                       ::testing::Values(Dtype::f32, Dtype::bf16, Dtype::f16),
                       ::testing::Values(WorkKind::none, WorkKind::f32, WorkKind::bf16, WorkKind::f16),
                       ::testing::Values(Isa::avx2, Isa::avx512), ::testing::Values(Dtype::f32)),
    param_name);

// Adam's state kept in bf16 (optimizer.state_dtype): every path loads,
// updates and rounds it alike.
INSTANTIATE_TEST_SUITE_P(
    StateBf16, Agreement,
    ::testing::Combine(::testing::Values(Algo::adam, Algo::adam_l2, Algo::adamw, Algo::adam_no_bias_correction),
                       ::testing::Values(Dtype::f32, Dtype::bf16, Dtype::f16),
                       ::testing::Values(WorkKind::none, WorkKind::f32, WorkKind::bf16, WorkKind::f16),
                       ::testing::Values(Isa::avx2, Isa::avx512), ::testing::Values(Dtype::bf16)),
    param_name);

TEST(Kernels, RejectsUnknownDtypes) {
  float p = 1.0f, g = 1.0f, m = 0.0f, v = 0.0f;
  Range r;
  r.count = 1;
  r.master = &p;
  r.grad = &g;
  r.grad_dtype = static_cast<Dtype>(7);
  for (const Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512}) {
    if (!isa_supported(isa)) continue;
    EXPECT_FALSE(adam_update(isa, AdamParams{}, r, AdamState{&m, &v})) << isa_name(isa);
    EXPECT_FALSE(sgd_update(isa, SgdParams{}, r, nullptr)) << isa_name(isa);
  }
  EXPECT_EQ(p, 1.0f) << "nothing may be written for a bad dtype";
  r.grad_dtype = Dtype::f32;
  r.work = &v;
  r.work_dtype = static_cast<Dtype>(0);
  EXPECT_FALSE(adam_update(Isa::scalar, AdamParams{}, r, AdamState{&m, &v}));
  EXPECT_EQ(p, 1.0f);
}

TEST(Kernels, RejectsAStateDtypeOtherThanF32AndBf16) {
  float p = 1.0f, g = 1.0f, m = 0.0f, v = 0.0f;
  Range r;
  r.count = 1;
  r.master = &p;
  r.grad = &g;
  for (const Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512}) {
    if (!isa_supported(isa)) continue;
    EXPECT_FALSE(adam_update(isa, AdamParams{}, r, AdamState{&m, &v, Dtype::f16})) << isa_name(isa);
    EXPECT_FALSE(adam_update(isa, AdamParams{}, r, AdamState{&m, &v, static_cast<Dtype>(7)})) << isa_name(isa);
    // 1-bit Adam keeps fp32 state alone.
    EXPECT_FALSE(onebit_adam_update(isa, OnebitAdamParams{}, OnebitPhase::warmup, r,
                                    AdamState{&m, &v, Dtype::bf16}))
        << isa_name(isa);
  }
  EXPECT_EQ(p, 1.0f) << "nothing may be written for a bad state dtype";
  EXPECT_EQ(m, 0.0f);
}

TEST(Kernels, DispatchReportsIsas) {
  EXPECT_TRUE(isa_supported(Isa::scalar));
  EXPECT_TRUE(isa_supported(best_isa()));
  if (isa_supported(Isa::avx512)) {
    EXPECT_TRUE(isa_supported(Isa::avx2)) << "AVX-512 support implies the AVX2 path";
    EXPECT_EQ(best_isa(), Isa::avx512);
  }
  EXPECT_STREQ(isa_name(Isa::avx2), "avx2");
  EXPECT_FALSE(isa_supported(static_cast<Isa>(9)));
}

}  // namespace
}  // namespace zerod::optim::test
