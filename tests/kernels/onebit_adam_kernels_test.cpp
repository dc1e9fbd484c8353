// The 1-bit Adam kernels (kernels.h, OnebitPhase):
//  - every vector path against the scalar reference, for every (grad dtype x
//    working-copy dtype) pair, over a sequence of phases as the host drives
//    them (warm-up, warm-up, then momentum / averaged / frozen twice), on
//    sizes that reach every unrolled body and tail. Tolerance as in
//    agreement_test.cpp: 2 ulp for fp32 values (the paths perform the same
//    operations, so 0 is expected); the working copy must be the
//    round-to-nearest-even conversion of the path's own master; the momentum
//    phase must leave master, v and the working copy alone; nothing outside
//    the range is written.
//  - the fp32 scalar path against a double transcription of DeepSpeed's
//    OnebitAdam (adam.py: no bias correction, update += wd * p), within 1e-6
//    of each value's running scale as reference_test.cpp explains.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "test_util.h"

namespace zerod::optim::test {
namespace {

constexpr uint64_t kMaxUlp = 2;
constexpr size_t kSizes[] = {1, 7, 8, 17, 22, 64, 65, 130, 4099, 65536 + 5};
constexpr size_t kMaxSize = 65536 + 5;

// The host's order of calls; "average" stands for the compressed average
// that replaces m between momentum() and the frozen update().
enum class Call { warmup, momentum, average, frozen };
constexpr Call kSchedule[] = {Call::warmup, Call::warmup,   Call::momentum, Call::average,
                              Call::frozen, Call::momentum, Call::average,  Call::frozen};

OnebitAdamParams params() {
  OnebitAdamParams hp;
  hp.lr = 2e-3;
  hp.weight_decay = 0.01;
  hp.grad_scale = 0.5;
  return hp;
}

struct Inputs {
  std::vector<float> master, grad[std::size(kSchedule)], averaged[std::size(kSchedule)];
  Inputs() : master(kMaxSize) {
    std::mt19937_64 rng(99);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto& x : master) x = normal(rng);
    for (size_t c = 0; c < std::size(kSchedule); ++c) {
      grad[c].resize(kMaxSize);
      averaged[c].resize(kMaxSize);
      for (size_t i = 0; i < kMaxSize; ++i) {
        grad[c][i] = i % 1009 == 500 ? 0.0f : normal(rng) * (i % 3 == 0 ? 1e-3f : 1.0f);
        averaged[c][i] = 0.05f * (normal(rng) < 0.0f ? -1.0f : 1.0f);  // +-t, as the 1-bit average is
      }
    }
  }
};

const Inputs& inputs() {
  static const Inputs in;
  return in;
}

enum class WorkKind { none, f32, bf16, f16 };

struct Trial {
  Buffer master, m, v, work;
  bool has_work;
  Trial(size_t n, WorkKind w)
      : master(Dtype::f32, n),
        m(Dtype::f32, n),
        v(Dtype::f32, n),
        work(w == WorkKind::bf16  ? Dtype::bf16
             : w == WorkKind::f16 ? Dtype::f16
                                  : Dtype::f32,
             n),
        has_work(w != WorkKind::none) {
    for (size_t i = 0; i < n; ++i) {
      master.set(i, inputs().master[i]);
      m.set(i, 0.0f);
      v.set(i, 0.0f);
      work.set(i, 0.0f);
    }
  }

  bool call(Isa isa, Call c, size_t k, Buffer& grad) {
    if (c == Call::average) {
      for (size_t i = 0; i < master.size(); ++i) m.set(i, inputs().averaged[k][i]);
      return true;
    }
    Range r;
    r.count = master.size();
    r.master = master.f32();
    r.grad = c == Call::frozen ? nullptr : grad.data();
    r.grad_dtype = grad.dtype();
    r.work = has_work ? work.data() : nullptr;
    r.work_dtype = work.dtype();
    const OnebitPhase phase = c == Call::warmup     ? OnebitPhase::warmup
                              : c == Call::momentum ? OnebitPhase::momentum
                                                    : OnebitPhase::frozen;
    return onebit_adam_update(isa, params(), phase, r, AdamState{m.f32(), v.f32()});
  }
};

void expect_close(const Buffer& got, const Buffer& want, const char* what, size_t k) {
  uint64_t worst = 0;
  int reported = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const uint64_t d = ulp_distance(got.get(i), want.get(i));
    worst = std::max(worst, d);
    if (d > kMaxUlp && reported++ < 5) {
      ADD_FAILURE() << what << "[" << i << "] after call " << k << ": vector " << got.get(i) << ", scalar "
                    << want.get(i) << " (" << d << " ulp)";
    }
  }
  EXPECT_LE(worst, kMaxUlp) << what << ", n = " << got.size();
}

void expect_work_is_master(const Trial& t, const char* who) {
  if (!t.has_work) return;
  int reported = 0;
  for (size_t i = 0; i < t.master.size(); ++i) {
    const float p = t.master.get(i);
    const uint32_t want = t.work.dtype() == Dtype::f32    ? f32_bits(p)
                          : t.work.dtype() == Dtype::bf16 ? f32_to_bf16(p)
                                                          : f32_to_f16(p);
    if (t.work.bits(i) != want && reported++ < 5) {
      ADD_FAILURE() << who << " working copy [" << i << "] = 0x" << std::hex << t.work.bits(i) << ", want 0x" << want;
    }
  }
}

// Bits of every element, to prove a phase left an array alone.
std::vector<uint32_t> snapshot(const Buffer& b) {
  std::vector<uint32_t> out(b.size());
  for (size_t i = 0; i < b.size(); ++i) out[i] = b.bits(i);
  return out;
}

using Param = std::tuple<Dtype, WorkKind, Isa>;

class OnebitAgreement : public ::testing::TestWithParam<Param> {};

TEST_P(OnebitAgreement, VectorMatchesScalarThroughThePhases) {
  const auto [grad_dtype, work_kind, isa] = GetParam();
  if (!isa_supported(isa)) GTEST_SKIP() << missing_isa_message(isa);
  for (const size_t n : kSizes) {
    SCOPED_TRACE("n = " + std::to_string(n));
    Trial vec(n, work_kind), ref(n, work_kind);
    for (size_t k = 0; k < std::size(kSchedule); ++k) {
      Buffer grad(grad_dtype, n);
      for (size_t i = 0; i < n; ++i) grad.set(i, inputs().grad[k][i]);
      const auto master0 = snapshot(vec.master), v0 = snapshot(vec.v), work0 = snapshot(vec.work);
      ASSERT_TRUE(vec.call(isa, kSchedule[k], k, grad));
      ASSERT_TRUE(ref.call(Isa::scalar, kSchedule[k], k, grad));
      if (kSchedule[k] == Call::momentum) {
        EXPECT_EQ(snapshot(vec.master), master0) << "momentum() changed the master";
        EXPECT_EQ(snapshot(vec.v), v0) << "momentum() changed v";
        EXPECT_EQ(snapshot(vec.work), work0) << "momentum() wrote the working copy";
      }
      if (kSchedule[k] == Call::frozen) {
        EXPECT_EQ(snapshot(vec.v), v0) << "the frozen update changed v";
      }
      expect_close(vec.master, ref.master, "master", k);
      expect_close(vec.m, ref.m, "exp_avg", k);
      expect_close(vec.v, ref.v, "exp_avg_sq", k);
      expect_work_is_master(vec, isa_name(isa));
      expect_work_is_master(ref, "scalar");
      for (const Buffer* b : {&vec.master, &vec.m, &vec.v, &vec.work, &grad}) {
        ASSERT_TRUE(b->guards_intact()) << "a kernel wrote outside its range";
      }
    }
    if (HasFailure()) return;
  }
}

std::string agreement_name(const ::testing::TestParamInfo<Param>& i) {
  static const char* works[] = {"none", "f32", "bf16", "f16"};
  return std::string("grad_") + dtype_name(std::get<0>(i.param)) + "_work_" +
         works[static_cast<int>(std::get<1>(i.param))] + "_" + isa_name(std::get<2>(i.param));
}

INSTANTIATE_TEST_SUITE_P(All, OnebitAgreement,
                         ::testing::Combine(::testing::Values(Dtype::f32, Dtype::bf16, Dtype::f16),
                                            ::testing::Values(WorkKind::none, WorkKind::f32, WorkKind::bf16,
                                                              WorkKind::f16),
                                            ::testing::ValuesIn(vector_isas())),
                         agreement_name);

// ---- against DeepSpeed's formulas, in double --------------------------------

constexpr size_t kN = 4099 + 64;

// A value and the largest magnitude it, or a term summed into it, has had.
struct Tracked {
  std::vector<double> x, scale;
  explicit Tracked(std::vector<double> init) : x(std::move(init)), scale(x.size()) {
    for (size_t i = 0; i < x.size(); ++i) scale[i] = std::fabs(x[i]);
  }
  void set(size_t i, double v, std::initializer_list<double> terms) {
    x[i] = v;
    double s = std::max(scale[i], std::fabs(v));
    for (const double t : terms) s = std::max(s, std::fabs(t));
    scale[i] = s;
  }
};

// adam.py: exp_avg.mul_(b1).add_(1 - b1, g); exp_avg_sq.mul_(b2).addcmul_(1 - b2, g, g);
// update = exp_avg / (exp_avg_sq.sqrt() + eps); update += wd * p; p.add_(-lr * update).
struct DeepSpeedRef {
  Tracked p, m, v;
  explicit DeepSpeedRef(const std::vector<float>& p0)
      : p(std::vector<double>(p0.begin(), p0.end())),
        m(std::vector<double>(p0.size())),
        v(std::vector<double>(p0.size())) {}
  void moments(const OnebitAdamParams& hp, const std::vector<float>& grad, bool also_v) {
    for (size_t i = 0; i < grad.size(); ++i) {
      const double g = double{grad[i]} * hp.grad_scale;
      const double mt = hp.beta1 * m.x[i], gt = (1.0 - hp.beta1) * g;
      m.set(i, mt + gt, {mt, gt});
      if (also_v) {
        const double vt = hp.beta2 * v.x[i], g2 = (1.0 - hp.beta2) * g * g;
        v.set(i, vt + g2, {vt, g2});
      }
    }
  }
  void step(const OnebitAdamParams& hp) {
    for (size_t i = 0; i < p.x.size(); ++i) {
      const double denom = std::sqrt(v.x[i]) + hp.eps;
      const double update = m.x[i] / denom + hp.weight_decay * p.x[i];
      const double delta = hp.lr * update;
      p.set(i, p.x[i] - delta, {delta, hp.lr * m.scale[i] / denom});
    }
  }
};

void expect_rel(const std::vector<float>& got, const Tracked& ref, const char* what, const char* isa, int call) {
  size_t bad = 0, first = 0;
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(double{got[i]} - ref.x[i]) / std::max(ref.scale[i], 1e-30);
    if (!(e <= 1e-6) && bad++ == 0) first = i;
    worst = std::max(worst, e);
  }
  EXPECT_EQ(bad, 0u) << isa << " " << what << " after call " << call << ": worst " << worst << ", first at [" << first
                     << "]: " << got[first] << " vs " << ref.x[first];
}

TEST(OnebitReference, MatchesDeepSpeedOnebitAdam) {
  OnebitAdamParams hp = params();
  hp.beta1 = 0.85;
  hp.beta2 = 0.99;
  hp.eps = 1e-6;
  for (const Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512}) {
    if (!isa_supported(isa)) continue;
    std::mt19937_64 rng(5);
    std::normal_distribution<double> normal(0.0, 1.0);
    auto draw = [&] {
      std::vector<float> v(kN);
      for (auto& x : v) x = static_cast<float>(normal(rng));
      return v;
    };
    std::vector<float> p = draw(), m(kN, 0.0f), v(kN, 0.0f);
    DeepSpeedRef ref(p);
    Range r;
    r.count = kN;
    r.master = p.data();
    const AdamState s{m.data(), v.data()};
    // Four warm-up updates, then six compressed ones whose averaged momentum
    // is the local one scaled (any replacement will do: update() must use m
    // as the host left it).
    for (int call = 1; call <= 10; ++call) {
      const std::vector<float> g = draw();
      r.grad = g.data();
      if (call <= 4) {
        ASSERT_TRUE(onebit_adam_update(isa, hp, OnebitPhase::warmup, r, s));
        ref.moments(hp, g, true);
      } else {
        ASSERT_TRUE(onebit_adam_update(isa, hp, OnebitPhase::momentum, r, s));
        ref.moments(hp, g, false);
        expect_rel(m, ref.m, "local exp_avg", isa_name(isa), call);
        for (size_t i = 0; i < kN; ++i) {
          m[i] *= 0.75f;  // exact in both
          ref.m.x[i] *= 0.75;
        }
        r.grad = nullptr;
        ASSERT_TRUE(onebit_adam_update(isa, hp, OnebitPhase::frozen, r, s));
      }
      ref.step(hp);
      expect_rel(p, ref.p, "param", isa_name(isa), call);
      expect_rel(m, ref.m, "exp_avg", isa_name(isa), call);
      expect_rel(v, ref.v, "exp_avg_sq", isa_name(isa), call);
      if (::testing::Test::HasFailure()) return;
    }
  }
}

// No bias correction: the first update moves p by lr * (1 - b1) / sqrt(1 - b2)
// = 3.16 lr (Adam with bias correction would move it by lr).
TEST(OnebitReference, NoBiasCorrection) {
  OnebitAdamParams hp;
  hp.lr = 1e-3;
  hp.eps = 1e-12;
  float p[1] = {1.0f}, g[1] = {0.25f}, m[1] = {0.0f}, v[1] = {0.0f};
  Range r;
  r.count = 1;
  r.master = p;
  r.grad = g;
  ASSERT_TRUE(onebit_adam_update(Isa::scalar, hp, OnebitPhase::warmup, r, AdamState{m, v}));
  EXPECT_NEAR(1.0 - p[0], 1e-3 * 0.1 / std::sqrt(0.001), 3e-7);
}

}  // namespace
}  // namespace zerod::optim::test
