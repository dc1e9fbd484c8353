// The vectorised loops of the compressing optimizer plugins (0/1 Adam, 1-bit
// LAMB) against their baseline builds: each plugin is dlopen'ed and every
// pass of every kind is called once with ZD_ISA_SCALAR and once with
// ZD_ISA_AVX2 on identical inputs, in every gradient and working-copy type,
// with and without weight decay, over a count that is not a multiple of any
// vector width. Every element must come out the same bits (the kernels do
// the same arithmetic per element, FMA for FMA); 1-bit LAMB's per-range
// sums may differ in their last bits (their terms are added in another
// order) and its maxima not at all. The engine always asks for
// ZD_ISA_AUTO, so on an AVX2 host the baseline build runs only here. Their
// loops stop at AVX2, and neither claims an AVX-512 kernel.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <zerod/optim/kernels.h>
#include <zerod/zerod_plugin.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#ifndef ZEROD_TEST_PLUGIN_DIR
#error "ZEROD_TEST_PLUGIN_DIR must name the folder holding zd_optimizer_*.so"
#endif

namespace {

constexpr size_t kCount = 1037;  // odd: every loop has a remainder

struct Plugin {
  void* handle = nullptr;
  const zd_optimizer_v3* d = nullptr;
};

Plugin open_plugin(const std::string& name) {
  Plugin p;
  const std::string path = std::string(ZEROD_TEST_PLUGIN_DIR) + "/zd_optimizer_" + name + ".so";
  p.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (p.handle == nullptr) return p;
  auto entry = reinterpret_cast<zd_plugin_entry_fn>(dlsym(p.handle, ZD_PLUGIN_ENTRY_SYMBOL));
  if (entry == nullptr) return p;
  for (const zd_plugin_header* const* h = entry(); *h != nullptr; ++h)
    if ((*h)->kind == ZD_PLUGIN_OPTIMIZER && (*h)->abi_version == 3)
      p.d = reinterpret_cast<const zd_optimizer_v3*>(*h);
  return p;
}

// One call's inputs and outputs: every array a pass may read or write.
struct Arrays {
  std::vector<float> master, m, v, u, v2, exchange;
  std::vector<uint8_t> grad, work;
  std::vector<float> tensor;
  std::vector<double> stats;
};

std::vector<uint8_t> random_bytes(std::mt19937& rng, zd_dtype dt, size_t n) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<uint8_t> out(n * (dt == ZD_DTYPE_F32 ? 4 : 2));
  for (size_t i = 0; i < n; ++i) {
    const float x = g(rng) * 0.1f;
    if (dt == ZD_DTYPE_F32) {
      std::memcpy(out.data() + i * 4, &x, 4);
    } else {
      uint32_t b;
      std::memcpy(&b, &x, 4);
      // Truncated to 16 bits: any 16-bit pattern of a normal number serves.
      const uint16_t h = dt == ZD_DTYPE_BF16 ? static_cast<uint16_t>(b >> 16)
                                             : static_cast<uint16_t>(0x3000u | (b >> 22 & 0x3ffu) | (b >> 16 & 0x8000u));
      std::memcpy(out.data() + i * 2, &h, 2);
    }
  }
  return out;
}

Arrays inputs(zd_dtype grad_dt, zd_dtype work_dt, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  auto vec = [&](float scale, bool positive) {
    std::vector<float> x(kCount);
    for (float& e : x) e = positive ? std::fabs(g(rng)) * scale + 1e-6f : g(rng) * scale;
    return x;
  };
  Arrays a;
  a.master = vec(1.0f, false);
  a.m = vec(0.01f, false);
  a.v = vec(1e-4f, true);
  a.u = vec(1e-3f, false);
  a.v2 = vec(1e-4f, true);
  a.exchange = vec(0.01f, false);
  a.grad = random_bytes(rng, grad_dt, kCount);
  a.work.assign(kCount * (work_dt == ZD_DTYPE_F32 ? 4 : 2), 0);
  a.tensor = {0.7f, 1.1f, 1.3f, 0.9f};  // positive tensor scalars (lrs, LAMB's ratios and scales)
  a.stats.assign(8, 0.0);
  return a;
}

struct Call {
  bool prepare;
  uint32_t kind, pass;
  bool grad, exchange, stats, u;
  int32_t exchange_in;
};

zd_status run(const Plugin& p, void* inst, zd_isa isa, const Call& c, zd_dtype grad_dt, zd_dtype work_dt, bool work,
              Arrays& a) {
  zd_optimizer_update u{};
  u.struct_size = sizeof u;
  u.count = kCount;
  u.master = a.master.data();
  u.grad = c.grad ? a.grad.data() : nullptr;
  u.work = work ? a.work.data() : nullptr;
  u.state[0] = a.m.data();
  u.state[1] = a.v.data();
  u.state[2] = c.u ? a.u.data() : a.v2.data();
  u.grad_dtype = grad_dt;
  u.work_dtype = work_dt;
  u.grad_scale = 0.5;
  u.lr = 1e-3;
  u.step = 7;
  u.kind = c.kind;
  u.pass = c.pass;
  u.exchange = c.exchange ? a.exchange.data() : nullptr;
  u.tensor = a.tensor.data();
  u.stats = c.stats ? a.stats.data() : nullptr;
  u.exchange_in = c.exchange_in;
  return c.prepare ? p.d->prepare(inst, isa, &u) : p.d->update(inst, isa, &u);
}

void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  size_t differ = 0, first = a.size();
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], 4) != 0 && differ++ == 0) first = i;
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " elements differ, first at " << first << " (" << a[first]
                        << " vs " << b[first] << ")";
}

// A compressing plugin and how to drive it: its hyperparameters (weight
// decay at decay_at), every pass it has, and how many of the statistics a
// pass writes are sums (the rest are maxima).
struct Subject {
  std::string name;
  std::vector<double> values;
  size_t decay_at;
  std::vector<Call> calls;
  size_t sum_stats;
};

Subject zero_one_adam() {
  // lr, b1, b2, eps, weight_decay, var_freeze_step, var_update_scaler,
  // local_step_scaler, local_step_clipper, local_steps.
  // Kinds: 0 variance, 1 1-bit gradient, 2 local, 3 sync (pass 1 and 2),
  // 4 momentum sync (prepare and pass).
  return {"zero_one_adam",
          {1e-3, 0.9, 0.999, 1e-8, 0.0, 4, 16, 32678, 16, 1},
          4,
          {
              {false, 0, 1, true, false, false, false, 0}, {true, 1, 0, true, true, false, false, 0},
              {false, 1, 1, false, true, false, false, 0}, {false, 2, 1, true, false, false, true, 0},
              {false, 3, 1, true, true, false, true, 0},   {false, 3, 2, false, true, false, true, 0},
              {true, 4, 0, true, true, false, false, 0},   {false, 4, 1, false, true, false, false, 0},
          },
          0};
}

Subject onebit_lamb() {
  // lr, b1, b2, eps, weight_decay, freeze_step, max_coeff, min_coeff,
  // coeff_beta, factor_max, factor_min, factor_threshold.
  // Kinds: 0 warm-up (pass 1 moments, pass 2 apply), 1 compressed (prepare
  // from the slot and from the kept average, pass 1 moments, pass 2 apply).
  // Statistics 0-2 are sums, 3 the largest ratio.
  return {"onebit_lamb",
          {1e-3, 0.9, 0.999, 1e-8, 0.0, 4, 10.0, 0.01, 0.9, 4.0, 0.5, 0.1},
          4,
          {
              {false, 0, 1, true, false, true, false, 0},
              {false, 0, 2, false, false, false, false, 0},
              {true, 1, 0, true, true, false, false, ZD_EXCHANGE_IN_SLOT},
              {true, 1, 0, true, true, false, false, ZD_EXCHANGE_IN_AVERAGE},
              {false, 1, 1, false, true, true, false, 0},
              {false, 1, 2, false, false, false, false, 0},
          },
          3};
}

void check_plugin(Subject s) {
  const Plugin p = open_plugin(s.name);
  ASSERT_NE(p.d, nullptr) << s.name << ": no v3 descriptor (" << dlerror() << ")";
  if (!p.d->supports_isa(ZD_ISA_AVX2)) {
    dlclose(p.handle);
    GTEST_SKIP() << "this CPU has no AVX2: only the baseline loops can run here";
  }
  int checked = 0;
  for (double decay : {0.0, 0.01}) {
    s.values[s.decay_at] = decay;
    void* inst = nullptr;
    char err[256] = "";
    ASSERT_EQ(p.d->create(nullptr, s.values.data(), s.values.size(), &inst, err, sizeof err), ZD_OK) << err;
    for (const Call& c : s.calls)
      for (zd_dtype gdt : {ZD_DTYPE_F32, ZD_DTYPE_BF16, ZD_DTYPE_F16})
        for (zd_dtype wdt : {ZD_DTYPE_F32, ZD_DTYPE_BF16, ZD_DTYPE_F16})
          for (bool work : {false, true}) {
            SCOPED_TRACE(s.name + " kind " + std::to_string(c.kind) + " pass " + std::to_string(c.pass) +
                         (c.prepare ? " prepare" : " update") + " grad " + std::to_string(gdt) + " work " +
                         (work ? std::to_string(wdt) : "none") + " decay " + std::to_string(decay));
            Arrays scalar = inputs(gdt, wdt, 11), vector = scalar;
            const zd_status s1 = run(p, inst, ZD_ISA_SCALAR, c, gdt, wdt, work, scalar);
            const zd_status s2 = run(p, inst, ZD_ISA_AVX2, c, gdt, wdt, work, vector);
            ASSERT_EQ(s1, ZD_OK);
            ASSERT_EQ(s2, ZD_OK);
            expect_same_bits(scalar.master, vector.master, "master");
            expect_same_bits(scalar.m, vector.m, "state 0");
            expect_same_bits(scalar.v, vector.v, "state 1");
            expect_same_bits(scalar.u, vector.u, "state 2 (0/1 Adam)");
            expect_same_bits(scalar.v2, vector.v2, "state 2 (1-bit LAMB)");
            expect_same_bits(scalar.exchange, vector.exchange, "exchange");
            EXPECT_EQ(scalar.work, vector.work) << "working copy";
            for (size_t k = 0; k < scalar.stats.size(); ++k) {
              if (k < s.sum_stats)
                EXPECT_NEAR(scalar.stats[k], vector.stats[k], 1e-12 * (1.0 + std::fabs(scalar.stats[k])))
                    << "statistic " << k;
              else
                EXPECT_EQ(scalar.stats[k], vector.stats[k]) << "statistic " << k;
            }
            ++checked;
          }
    p.d->destroy(inst);
  }
  EXPECT_EQ(checked, static_cast<int>(s.calls.size()) * 2 * 9 * 2);
  dlclose(p.handle);
}

TEST(CompressingIsa, ZeroOneAdamVectorLoopsEqualTheBaselineBitForBit) { check_plugin(zero_one_adam()); }

TEST(CompressingIsa, OnebitLambVectorLoopsEqualTheBaseline) { check_plugin(onebit_lamb()); }

// Neither plugin has AVX-512 loops (an AVX-512 host runs the AVX2 ones), so
// neither claims an AVX-512 kernel: `zerod check` names the loops that run
// (it printed "avx512" for both), and a call that asks for AVX-512 is
// refused as for any kernel a plugin lacks. ZD_ISA_AUTO still runs the
// vector loops where the CPU has AVX2.
TEST(CompressingIsa, ClaimsNoAvx512Kernel) {
  for (Subject s : {zero_one_adam(), onebit_lamb()}) {
    SCOPED_TRACE(s.name);
    const Plugin p = open_plugin(s.name);
    ASSERT_NE(p.d, nullptr) << s.name << ": no v3 descriptor (" << dlerror() << ")";
    EXPECT_EQ(p.d->supports_isa(ZD_ISA_AVX512), 0);
    EXPECT_EQ(p.d->supports_isa(ZD_ISA_AVX2), zerod::optim::isa_supported(zerod::optim::Isa::avx2) ? 1 : 0);
    EXPECT_EQ(p.d->supports_isa(ZD_ISA_SCALAR), 1);
    EXPECT_EQ(p.d->supports_isa(ZD_ISA_AUTO), 1);
    void* inst = nullptr;
    char err[256] = "";
    ASSERT_EQ(p.d->create(nullptr, s.values.data(), s.values.size(), &inst, err, sizeof err), ZD_OK) << err;
    for (const Call& c : s.calls) {
      Arrays a = inputs(ZD_DTYPE_F32, ZD_DTYPE_F32, 11);
      EXPECT_EQ(run(p, inst, ZD_ISA_AVX512, c, ZD_DTYPE_F32, ZD_DTYPE_F32, false, a), ZD_ERR_NOT_IMPLEMENTED)
          << "kind " << c.kind << " pass " << c.pass << (c.prepare ? " prepare" : " update");
      Arrays b = inputs(ZD_DTYPE_F32, ZD_DTYPE_F32, 11);
      EXPECT_EQ(run(p, inst, ZD_ISA_AUTO, c, ZD_DTYPE_F32, ZD_DTYPE_F32, false, b), ZD_OK)
          << "kind " << c.kind << " pass " << c.pass << (c.prepare ? " prepare" : " update");
    }
    p.d->destroy(inst);
    dlclose(p.handle);
  }
}

}  // namespace
