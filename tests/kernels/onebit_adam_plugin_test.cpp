// zd_optimizer_onebit_adam.so as the engine sees it: dlopen'ed, reached only
// through its descriptors, v3 first and v2 after it. Through v2: its
// hyperparameter checks, the phase protocol of zerod_plugin.h (warm-up
// update with the gradient, then momentum() and update() with grad NULL),
// and that each call does what the kernels do. Through v3: the plans (the
// job's warm-up schedule, else freeze_step) and prepare() and the passes
// doing what the same kernels do.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "plugin_under_test.h"
#include "test_util.h"

namespace zerod::optim::test {
namespace {

using Log = PluginLog;

class OnebitPlugin : public ::testing::Test {
 protected:
  void SetUp() override {
    handle_ = open_plugin("zd_optimizer_onebit_adam.so");
    ASSERT_NE(handle_, nullptr) << dlerror();
    for (const zd_plugin_header* h : plugin_headers(handle_)) {
      versions_.push_back(h->abi_version);
      if (h->kind == ZD_PLUGIN_OPTIMIZER && h->abi_version == 2) d_ = reinterpret_cast<const zd_optimizer_v2*>(h);
      if (h->kind == ZD_PLUGIN_OPTIMIZER && h->abi_version == 3) d3_ = reinterpret_cast<const zd_optimizer_v3*>(h);
    }
    ASSERT_NE(d3_, nullptr) << "no optimizer v3 descriptor";
    ASSERT_NE(d_, nullptr) << "no optimizer v2 descriptor";
    services_ = {sizeof(zd_host_services), ZD_ABI_VERSION, &log_, Log::sink};
  }
  void TearDown() override {
    for (void* i : instances_) d_->destroy(i);
    if (handle_ != nullptr) dlclose(handle_);
  }

  // lr, betas[0], betas[1], eps, weight_decay, freeze_step.
  static std::vector<double> values(double freeze_step = 2, double beta1 = 0.9, double eps = 1e-8) {
    return {1e-3, beta1, 0.999, eps, 0.01, freeze_step};
  }

  zd_status create(const std::vector<double>& v, void** out, std::string* err = nullptr) {
    char buf[256] = "";
    const zd_status st = d_->create(&services_, v.data(), v.size(), out, buf, sizeof buf);
    if (st == ZD_OK) instances_.push_back(*out);
    if (err != nullptr) *err = buf;
    return st;
  }

  void* instance(double freeze_step = 2) {
    void* inst = nullptr;
    EXPECT_EQ(create(values(freeze_step), &inst), ZD_OK);
    return inst;
  }

  void* handle_ = nullptr;
  const zd_optimizer_v2* d_ = nullptr;
  const zd_optimizer_v3* d3_ = nullptr;
  std::vector<uint32_t> versions_;
  Log log_;
  zd_host_services services_{};
  std::vector<void*> instances_;
};

TEST_F(OnebitPlugin, DescriptorsAreV3ThenV2) {
  // The host takes the newest it knows; an older host finds v2. Never v1.
  EXPECT_EQ(versions_, (std::vector<uint32_t>{3u, 2u}));
  EXPECT_EQ(d_->header.kind, ZD_PLUGIN_OPTIMIZER);
  EXPECT_EQ(d_->header.struct_size, sizeof(zd_optimizer_v2));
  EXPECT_EQ(d3_->header.struct_size, sizeof(zd_optimizer_v3));
  EXPECT_STREQ(d_->header.name, "onebit_adam");
  EXPECT_STREQ(d3_->header.name, "onebit_adam");
  EXPECT_NE(d_->compression_start, nullptr);
  EXPECT_NE(d_->momentum_slot, nullptr);
  EXPECT_NE(d_->momentum, nullptr);
  // Both versions take the same hyperparameters.
  EXPECT_EQ(d3_->hparams, d_->hparams);
  EXPECT_EQ(d3_->hparam_count, d_->hparam_count);
}

TEST_F(OnebitPlugin, V3PlansFollowFreezeStepOrTheJobsWarmup) {
  void* inst = instance(2);
  zd_optimizer_plan p{};
  auto plan = [&](int64_t step, int32_t warmup) {
    p = zd_optimizer_plan{};
    EXPECT_EQ(d3_->plan(inst, step, warmup, -1, &p), ZD_OK);
    return p;
  };
  for (int64_t step : {1, 2}) {
    plan(step, -1);
    EXPECT_EQ(p.grads, ZD_GRADS_AVERAGED) << step;
    EXPECT_EQ(p.ops[0], ZD_OP_PASS_GRAD);
    EXPECT_EQ(p.ops[1], ZD_OP_END);
  }
  plan(3, -1);
  EXPECT_EQ(p.grads, ZD_GRADS_LOCAL);
  EXPECT_EQ(p.keep_average, 1);
  EXPECT_EQ(p.fused, 0);
  EXPECT_EQ(p.ops[0], ZD_OP_PREPARE);
  EXPECT_EQ(p.ops[1], ZD_OP_EXCHANGE);
  EXPECT_EQ(p.ops[2], ZD_OP_PASS);
  EXPECT_EQ(p.ops[3], ZD_OP_END);
  // The job's schedule wins both ways.
  EXPECT_EQ(plan(1, 0).grads, ZD_GRADS_LOCAL);
  EXPECT_EQ(plan(50, 1).grads, ZD_GRADS_AVERAGED);
  EXPECT_EQ(d3_->plan(inst, 0, -1, -1, &p), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(d3_->compresses(inst), 1);
  EXPECT_EQ(d3_->average_slot(inst), 0u);
  char err[64];
  for (uint32_t parts : {0u, 1u, 3u, 7u}) EXPECT_EQ(d3_->check_partitions(inst, parts, err, sizeof err), ZD_OK);
}

TEST_F(OnebitPlugin, SpecsDefaultsAndState) {
  ASSERT_EQ(d_->hparam_count, 5u);
  const char* names[] = {"lr", "betas", "eps", "weight_decay", "freeze_step"};
  for (uint32_t i = 0; i < 5; ++i) EXPECT_STREQ(d_->hparams[i].name, names[i]);
  EXPECT_EQ(d_->hparams[1].count, 2);
  EXPECT_EQ(d_->hparams[4].type, ZD_HPARAM_INTEGER);
  EXPECT_EQ(d_->hparams[4].defaults[0], 100000.0);  // DeepSpeed's default
  EXPECT_EQ(d_->hparams[3].defaults[0], 0.0);
  std::vector<double> defaults;
  for (uint32_t i = 0; i < d_->hparam_count; ++i) {
    for (int32_t j = 0; j < d_->hparams[i].count; ++j) defaults.push_back(d_->hparams[i].defaults[j]);
  }
  void* inst = nullptr;
  ASSERT_EQ(create(defaults, &inst), ZD_OK);
  EXPECT_EQ(d_->compression_start(inst), 100001);
  EXPECT_EQ(d_->state_slots(inst), 2u);
  EXPECT_STREQ(d_->state_name(inst, 0), "exp_avg");
  EXPECT_STREQ(d_->state_name(inst, 1), "exp_avg_sq");
  EXPECT_EQ(d_->state_name(inst, 2), nullptr);
  EXPECT_EQ(d_->momentum_slot(inst), 0u);
  EXPECT_TRUE(log_.lines.empty());
}

TEST_F(OnebitPlugin, RefusesBadHyperparametersByName) {
  struct Case {
    std::vector<double> v;
    const char* message;
  };
  const Case cases[] = {
      {{1e-3, 1.0, 0.999, 1e-8, 0, 10}, "betas[0] = 1: must be < 1"},
      {{1e-3, 0.9, -0.1, 1e-8, 0, 10}, "betas[1] = -0.1: must be >= 0"},
      {{1e-3, 0.9, 0.999, 0.0, 0, 10}, "eps = 0: must be > 0"},
      {{1e-3, 0.9, 0.999, 1e-8, -1, 10}, "weight_decay = -1: must be >= 0"},
      {{1e-3, 0.9, 0.999, 1e-8, 0, 2.5}, "freeze_step = 2.5: must be an integer"},
      {{1e-3, 0.9, 0.999, 1e-8, 0, -1}, "freeze_step = -1: must be >= 0"},
      {{0.0, 0.9, 0.999, 1e-8, 0, 10}, "lr = 0: must be > 0"},
  };
  for (const Case& c : cases) {
    void* inst = reinterpret_cast<void*>(1);
    std::string err;
    EXPECT_EQ(create(c.v, &inst, &err), ZD_ERR_CONFIG) << c.message;
    EXPECT_EQ(err, c.message);
    EXPECT_EQ(inst, nullptr);
  }
  void* inst = nullptr;
  const std::vector<double> short_list = {1e-3, 0.9};
  EXPECT_EQ(create(short_list, &inst), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(d_->create(&services_, values().data(), 6, nullptr, nullptr, 0), ZD_ERR_INVALID_ARGUMENT);
}

TEST_F(OnebitPlugin, FreezeStepZeroCompressesFromTheFirstUpdateAndWarns) {
  void* inst = instance(0);
  EXPECT_EQ(d_->compression_start(inst), 1);
  ASSERT_EQ(log_.lines.size(), 1u);
  EXPECT_EQ(log_.lines[0].first, ZD_LOG_WARN);
  EXPECT_NE(log_.lines[0].second.find("freeze_step = 0"), std::string::npos);
}

// One rank's arrays and the update struct pointing at them.
struct Arrays {
  static constexpr size_t kN = 1000;
  std::vector<float> master, grad, m, v;
  std::vector<uint16_t> work;
  explicit Arrays(uint64_t seed) : master(kN), grad(kN), m(kN, 0.0f), v(kN, 0.0f), work(kN, 0) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto& x : master) x = normal(rng);
    for (auto& x : grad) x = normal(rng);
  }
  zd_optimizer_update update(int64_t step, bool with_grad) {
    zd_optimizer_update u{};
    u.struct_size = sizeof u;
    u.count = kN;
    u.master = master.data();
    u.grad = with_grad ? grad.data() : nullptr;
    u.work = work.data();
    u.state[0] = m.data();
    u.state[1] = v.data();
    u.grad_dtype = ZD_DTYPE_F32;
    u.work_dtype = ZD_DTYPE_BF16;
    u.grad_scale = 0.5;
    u.lr = 2e-3;
    u.step = step;
    return u;
  }
};

// The protocol with freeze_step = 2: updates 1 and 2 are warm-up, update 3
// is momentum(), (the average), update(grad NULL). Each call gives exactly
// what the kernel of the same ISA gives.
TEST_F(OnebitPlugin, PhasesMatchTheKernels) {
  void* inst = instance(2);
  ASSERT_EQ(d_->compression_start(inst), 3);
  Arrays a(1), b(1);
  OnebitAdamParams hp;
  hp.lr = 2e-3;
  hp.weight_decay = 0.01;
  hp.grad_scale = 0.5;
  const Isa isa = best_isa();
  auto kernel = [&](OnebitPhase phase, bool with_grad) {
    Range r;
    r.count = Arrays::kN;
    r.master = b.master.data();
    r.grad = with_grad ? b.grad.data() : nullptr;
    r.work = phase == OnebitPhase::momentum ? nullptr : b.work.data();
    r.work_dtype = Dtype::bf16;
    ASSERT_TRUE(onebit_adam_update(isa, hp, phase, r, AdamState{b.m.data(), b.v.data()}));
  };
  for (int64_t step = 1; step <= 2; ++step) {
    zd_optimizer_update u = a.update(step, true);
    ASSERT_EQ(d_->update(inst, ZD_ISA_AUTO, &u), ZD_OK) << "warm-up update " << step;
    kernel(OnebitPhase::warmup, true);
  }
  EXPECT_NE(a.v, std::vector<float>(Arrays::kN, 0.0f)) << "warm-up estimates v";
  const std::vector<float> v_frozen = a.v;
  zd_optimizer_update u = a.update(3, true);
  u.master = nullptr;  // momentum() needs neither master nor work
  u.work = nullptr;
  const std::vector<float> master_before = a.master;
  ASSERT_EQ(d_->momentum(inst, ZD_ISA_AUTO, &u), ZD_OK);
  kernel(OnebitPhase::momentum, true);
  EXPECT_EQ(a.master, master_before);
  EXPECT_EQ(a.m, b.m);
  for (size_t i = 0; i < Arrays::kN; ++i) a.m[i] = b.m[i] = (i % 2 ? 0.01f : -0.01f);  // "the average"
  u = a.update(3, false);
  ASSERT_EQ(d_->update(inst, ZD_ISA_AUTO, &u), ZD_OK);
  kernel(OnebitPhase::frozen, false);
  EXPECT_EQ(a.master, b.master);
  EXPECT_EQ(a.work, b.work);
  EXPECT_EQ(a.v, v_frozen) << "v is frozen in the compression phase";
  EXPECT_NE(a.master, master_before);
}

TEST_F(OnebitPlugin, RefusesCallsOutOfProtocol) {
  void* inst = instance(2);
  Arrays a(2);
  // Warm-up needs the gradient.
  zd_optimizer_update u = a.update(1, false);
  EXPECT_EQ(d_->update(inst, ZD_ISA_AUTO, &u), ZD_ERR_INVALID_ARGUMENT);
  // The compression phase's update() must not get one (it went to
  // momentum()); said once in the log, however many ranges fail.
  u = a.update(3, true);
  const std::vector<float> master = a.master;
  EXPECT_EQ(d_->update(inst, ZD_ISA_AUTO, &u), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(d_->update(inst, ZD_ISA_AUTO, &u), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(a.master, master);
  ASSERT_EQ(log_.lines.size(), 1u);
  EXPECT_EQ(log_.lines[0].first, ZD_LOG_ERROR);
  EXPECT_NE(log_.lines[0].second.find("update 3 (compression from update 3)"), std::string::npos)
      << log_.lines[0].second;
  // momentum() needs the gradient and slot 0.
  u = a.update(3, false);
  EXPECT_EQ(d_->momentum(inst, ZD_ISA_AUTO, &u), ZD_ERR_INVALID_ARGUMENT);
  u = a.update(3, true);
  u.state[0] = nullptr;
  EXPECT_EQ(d_->momentum(inst, ZD_ISA_AUTO, &u), ZD_ERR_INVALID_ARGUMENT);
  // Bad ISA values and NULLs.
  u = a.update(1, true);
  EXPECT_EQ(d_->update(inst, static_cast<zd_isa>(42), &u), ZD_ERR_NOT_IMPLEMENTED);
  EXPECT_EQ(d_->update(inst, ZD_ISA_AUTO, nullptr), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(d_->update(nullptr, ZD_ISA_AUTO, &u), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(d_->momentum(nullptr, ZD_ISA_AUTO, &u), ZD_ERR_INVALID_ARGUMENT);
  u.grad_dtype = 77;
  EXPECT_EQ(d_->update(inst, ZD_ISA_AUTO, &u), ZD_ERR_INVALID_ARGUMENT);
}

TEST_F(OnebitPlugin, EveryIsaTheCpuHasGivesTheSameUpdate) {
  void* inst = instance(1);
  std::vector<std::vector<float>> results;
  for (const zd_isa isa : {ZD_ISA_SCALAR, ZD_ISA_AVX2, ZD_ISA_AVX512}) {
    if (!d_->supports_isa(isa)) continue;
    Arrays a(3);
    zd_optimizer_update u = a.update(1, true);
    ASSERT_EQ(d_->update(inst, isa, &u), ZD_OK);
    u = a.update(2, true);
    ASSERT_EQ(d_->momentum(inst, isa, &u), ZD_OK);
    u = a.update(2, false);
    ASSERT_EQ(d_->update(inst, isa, &u), ZD_OK);
    results.push_back(a.master);
  }
  for (const auto& r : results) EXPECT_EQ(r, results[0]);
}

// Through v3: prepare() is momentum() into the exchange buffer, and a
// compressed pass stores the exchanged momentum, then steps with frozen v.
TEST_F(OnebitPlugin, V3PrepareAndPassMatchTheKernels) {
  void* inst = instance(2);
  Arrays a(4), b(4);
  OnebitAdamParams hp;
  hp.lr = 2e-3;
  hp.weight_decay = 0.01;
  hp.grad_scale = 0.5;
  const Isa isa = best_isa();
  for (size_t i = 0; i < Arrays::kN; ++i) a.v[i] = b.v[i] = 0.01f * static_cast<float>(i % 7 + 1);
  std::vector<float> x(Arrays::kN);
  for (size_t i = 0; i < Arrays::kN; ++i) x[i] = b.m[i] = 0.001f * static_cast<float>(i % 5) - 0.002f;
  zd_optimizer_update u = a.update(3, true);
  u.master = nullptr;
  u.work = nullptr;
  u.state[0] = u.state[1] = nullptr;
  u.kind = 1;
  u.exchange = x.data();
  u.exchange_in = ZD_EXCHANGE_IN_AVERAGE;
  ASSERT_EQ(d3_->prepare(inst, ZD_ISA_AUTO, &u), ZD_OK);
  Range r;
  r.count = Arrays::kN;
  r.grad = b.grad.data();
  ASSERT_TRUE(onebit_adam_update(isa, hp, OnebitPhase::momentum, r, AdamState{b.m.data(), nullptr}));
  EXPECT_EQ(x, b.m);
  for (size_t i = 0; i < Arrays::kN; ++i) x[i] = b.m[i] = (i % 3 ? 0.02f : -0.02f);  // "the average"
  u = a.update(3, false);
  u.kind = 1;
  u.pass = 1;
  u.exchange = x.data();
  ASSERT_EQ(d3_->update(inst, ZD_ISA_AUTO, &u), ZD_OK);
  r.master = b.master.data();
  r.grad = nullptr;
  r.work = b.work.data();
  r.work_dtype = Dtype::bf16;
  ASSERT_TRUE(onebit_adam_update(isa, hp, OnebitPhase::frozen, r, AdamState{b.m.data(), b.v.data()}));
  EXPECT_EQ(a.m, b.m) << "the momentum slot holds the average";
  EXPECT_EQ(a.master, b.master);
  EXPECT_EQ(a.work, b.work);
  // A compressed pass with a gradient, or without the exchange, is refused.
  u = a.update(3, true);
  u.kind = 1;
  u.exchange = x.data();
  EXPECT_EQ(d3_->update(inst, ZD_ISA_AUTO, &u), ZD_ERR_INVALID_ARGUMENT);
  u = a.update(3, false);
  u.kind = 1;
  EXPECT_EQ(d3_->update(inst, ZD_ISA_AUTO, &u), ZD_ERR_INVALID_ARGUMENT);
}

}  // namespace
}  // namespace zerod::optim::test
