// The optimizer plugins as the engine sees them: dlopen'ed from the plugin
// folder, reached only through zd_plugin_descriptors and the descriptor.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <zerod/zerod_plugin.h>

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"

#ifndef ZEROD_TEST_PLUGIN_DIR
#error "ZEROD_TEST_PLUGIN_DIR must name the folder holding zd_optimizer_*.so"
#endif

namespace zerod::optim::test {
namespace {

class Plugin {
 public:
  explicit Plugin(const std::string& name) {
    const std::string path = std::string(ZEROD_TEST_PLUGIN_DIR) + "/zd_optimizer_" + name + ".so";
    handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle_ == nullptr) {
      error_ = dlerror();
      return;
    }
    auto entry = reinterpret_cast<zd_plugin_entry_fn>(dlsym(handle_, ZD_PLUGIN_ENTRY_SYMBOL));
    if (entry == nullptr) {
      error_ = "no " ZD_PLUGIN_ENTRY_SYMBOL " in " + path;
      return;
    }
    list_ = entry();
    for (const zd_plugin_header* const* h = list_; h != nullptr && *h != nullptr; ++h) {
      if ((*h)->kind == ZD_PLUGIN_OPTIMIZER && (*h)->abi_version == 1) {
        desc_ = reinterpret_cast<const zd_optimizer_v1*>(*h);
      }
      if ((*h)->kind == ZD_PLUGIN_OPTIMIZER && (*h)->abi_version == 4) {
        v4_ = reinterpret_cast<const zd_optimizer_v4*>(*h);
      }
    }
  }
  ~Plugin() {
    if (handle_ != nullptr) dlclose(handle_);
  }
  Plugin(const Plugin&) = delete;
  Plugin& operator=(const Plugin&) = delete;

  const zd_optimizer_v1* desc() const { return desc_; }
  // The optimizer ABI v4 descriptor (adam, adamw), or null.
  const zd_optimizer_v4* v4() const { return v4_; }
  const zd_plugin_header* const* list() const { return list_; }
  const std::string& error() const { return error_; }

  // The spec defaults, flattened as create() takes them.
  std::vector<double> defaults() const {
    std::vector<double> v;
    for (uint32_t i = 0; i < desc_->hparam_count; ++i) {
      for (int32_t j = 0; j < desc_->hparams[i].count; ++j) v.push_back(desc_->hparams[i].defaults[j]);
    }
    return v;
  }
  // Index of a spec's first value in the flattened list.
  size_t offset_of(const char* name) const {
    size_t k = 0;
    for (uint32_t i = 0; i < desc_->hparam_count; ++i) {
      if (std::strcmp(desc_->hparams[i].name, name) == 0) return k;
      k += static_cast<size_t>(desc_->hparams[i].count);
    }
    ADD_FAILURE() << "no hyperparameter " << name;
    return 0;
  }

  // create() with the values; on failure returns the status and fills err.
  zd_status create(const std::vector<double>& values, void** inst, std::string* err = nullptr) const {
    char buf[256] = "";
    const zd_status st = desc_->create(nullptr, values.data(), values.size(), inst, buf, sizeof buf);
    if (err != nullptr) *err = buf;
    return st;
  }

 private:
  void* handle_ = nullptr;
  const zd_plugin_header* const* list_ = nullptr;
  const zd_optimizer_v1* desc_ = nullptr;
  const zd_optimizer_v4* v4_ = nullptr;
  std::string error_;
};

// An instance made from defaults, destroyed at scope end.
struct Instance {
  const Plugin& plugin;
  void* ptr = nullptr;
  Instance(const Plugin& p, const std::vector<double>& values) : plugin(p) {
    std::string err;
    EXPECT_EQ(p.create(values, &ptr, &err), ZD_OK) << err;
  }
  ~Instance() { plugin.desc()->destroy(ptr); }
};

class OptimizerPlugin : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    plugin_ = std::make_unique<Plugin>(GetParam());
    ASSERT_NE(plugin_->desc(), nullptr) << plugin_->error();
  }
  std::unique_ptr<Plugin> plugin_;
};

TEST_P(OptimizerPlugin, HeaderFields) {
  const zd_optimizer_v1* d = plugin_->desc();
  EXPECT_EQ(d->header.kind, ZD_PLUGIN_OPTIMIZER);
  EXPECT_EQ(d->header.abi_version, 1u);
  EXPECT_EQ(d->header.struct_size, sizeof(zd_optimizer_v1));
  EXPECT_STREQ(d->header.name, GetParam());
  ASSERT_NE(d->header.description, nullptr);
  EXPECT_GT(std::strlen(d->header.description), 10u);
  ASSERT_NE(plugin_->list()[0], nullptr);
  if (std::string(GetParam()) == "sgd") {
    EXPECT_EQ(d->header.plugin_version, (0u << 16) | 1u);
    EXPECT_EQ(plugin_->list()[1], nullptr) << "one descriptor, then the NULL terminator";
  } else {
    // v4 first (bf16 state), then v1 for hosts before it, then NULL.
    EXPECT_EQ(d->header.plugin_version, (0u << 16) | 2u);
    const zd_optimizer_v4* v4 = plugin_->v4();
    ASSERT_NE(v4, nullptr);
    EXPECT_EQ(plugin_->list()[0], &v4->header);
    EXPECT_EQ(plugin_->list()[1], &d->header);
    EXPECT_EQ(plugin_->list()[2], nullptr);
    EXPECT_EQ(v4->header.struct_size, sizeof(zd_optimizer_v4));
    EXPECT_EQ(v4->header.plugin_version, d->header.plugin_version);
    EXPECT_STREQ(v4->header.name, d->header.name);
    for (const bool set : {v4->create != nullptr, v4->destroy != nullptr, v4->state_slots != nullptr,
                           v4->state_name != nullptr, v4->supports_isa != nullptr, v4->update != nullptr,
                           v4->plan != nullptr, v4->average_slot != nullptr, v4->tensor_scalars != nullptr,
                           v4->tensor_stats != nullptr, v4->stat_op != nullptr, v4->check_partitions != nullptr,
                           v4->compresses != nullptr, v4->supports_state_dtype != nullptr})
      EXPECT_TRUE(set) << "a required v4 function is empty";
  }
  EXPECT_NE(d->create, nullptr);
  EXPECT_NE(d->destroy, nullptr);
  EXPECT_NE(d->state_slots, nullptr);
  EXPECT_NE(d->state_name, nullptr);
  EXPECT_NE(d->supports_isa, nullptr);
  EXPECT_NE(d->update, nullptr);
#if defined(ZEROD_HAVE_CUDA)
  EXPECT_NE(d->update_cuda, nullptr);
#else
  EXPECT_EQ(d->update_cuda, nullptr);
#endif
}

TEST_P(OptimizerPlugin, SupportsIsa) {
  const zd_optimizer_v1* d = plugin_->desc();
  EXPECT_EQ(d->supports_isa(ZD_ISA_AUTO), 1);
  EXPECT_EQ(d->supports_isa(ZD_ISA_SCALAR), 1);
  EXPECT_EQ(d->supports_isa(ZD_ISA_AVX2), isa_supported(Isa::avx2) ? 1 : 0);
  EXPECT_EQ(d->supports_isa(ZD_ISA_AVX512), isa_supported(Isa::avx512) ? 1 : 0);
  EXPECT_EQ(d->supports_isa(99), 0);
}

TEST_P(OptimizerPlugin, DestroyNullIsANoOp) { plugin_->desc()->destroy(nullptr); }

TEST_P(OptimizerPlugin, CreateRefusesWrongCountAndNullOut) {
  std::vector<double> v = plugin_->defaults();
  void* inst = reinterpret_cast<void*>(1);
  std::string err;
  v.push_back(0.0);
  EXPECT_EQ(plugin_->create(v, &inst, &err), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(inst, nullptr) << "*out_instance is cleared on failure";
  EXPECT_NE(err.find("expected"), std::string::npos) << err;
  v.pop_back();
  EXPECT_EQ(plugin_->create(v, nullptr, &err), ZD_ERR_INVALID_ARGUMENT);
  const double nan = __builtin_nan("");
  v[plugin_->offset_of("lr")] = nan;
  EXPECT_EQ(plugin_->create(v, &inst, &err), ZD_ERR_CONFIG);
  EXPECT_NE(err.find("lr"), std::string::npos) << err;
  v[plugin_->offset_of("lr")] = 0.0;
  EXPECT_EQ(plugin_->create(v, &inst, &err), ZD_ERR_CONFIG) << "lr must be > 0";
  EXPECT_NE(err.find("lr = 0"), std::string::npos) << err;
  v = plugin_->defaults();
  v[plugin_->offset_of("weight_decay")] = -1e-3;
  EXPECT_EQ(plugin_->create(v, &inst, &err), ZD_ERR_CONFIG);
  EXPECT_NE(err.find("weight_decay"), std::string::npos) << err;
}

// One step through the plugin on 1000 elements, every grad/work dtype, every
// supported ISA and AUTO; the result must equal the kernels library's scalar
// reference called directly with the same values (within 2 ulp).
TEST_P(OptimizerPlugin, UpdateMatchesKernelOnEveryIsa) {
  const zd_optimizer_v1* d = plugin_->desc();
  Instance inst(*plugin_, plugin_->defaults());
  const uint32_t slots = d->state_slots(inst.ptr);
  const size_t n = 1000;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> p0(n), g32(n);
  for (auto& x : p0) x = normal(rng);
  for (auto& x : g32) x = normal(rng);
  for (const zd_isa isa : {ZD_ISA_AUTO, ZD_ISA_SCALAR, ZD_ISA_AVX2, ZD_ISA_AVX512}) {
    if (!d->supports_isa(isa)) continue;
    for (const Dtype gd : {Dtype::f32, Dtype::bf16, Dtype::f16}) {
      Buffer g(gd, n);
      for (size_t i = 0; i < n; ++i) g.set(i, g32[i]);
      std::vector<float> p = p0, s0(n, 0.0f), s1(n, 0.0f), work(n);
      zd_optimizer_update u{};
      u.struct_size = sizeof u;
      u.count = n;
      u.master = p.data();
      u.grad = g.data();
      u.work = work.data();
      u.work_dtype = ZD_DTYPE_F32;
      u.grad_dtype = static_cast<zd_dtype>(gd);
      u.state[0] = s0.data();
      u.state[1] = s1.data();
      u.grad_scale = 0.5;
      u.lr = 2e-3;
      u.step = 1;
      ASSERT_EQ(d->update(inst.ptr, isa, &u), ZD_OK) << "isa " << isa << " grad " << dtype_name(gd);

      // The same step straight through the kernels library.
      std::vector<float> rp = p0, r0(n, 0.0f), r1(n, 0.0f);
      Range r;
      r.count = n;
      r.master = rp.data();
      r.grad = g.data();
      r.grad_dtype = gd;
      const std::string name = GetParam();
      if (name == "sgd") {
        SgdParams hp;
        hp.lr = 2e-3;
        hp.grad_scale = 0.5;
        ASSERT_TRUE(sgd_update(Isa::scalar, hp, r, r0.data()));
      } else {
        AdamParams hp;
        hp.lr = 2e-3;
        hp.grad_scale = 0.5;
        hp.decoupled = name == "adamw";
        hp.weight_decay = name == "adamw" ? 0.01 : 0.0;
        ASSERT_TRUE(adam_update(Isa::scalar, hp, r, AdamState{r0.data(), r1.data()}));
      }
      for (size_t i = 0; i < n; ++i) {
        ASSERT_LE(ulp_distance(p[i], rp[i]), 2u) << "[" << i << "] isa " << isa;
        ASSERT_EQ(work[i], p[i]) << "the fp32 working copy is the new master";
        if (slots > 0) {
          ASSERT_LE(ulp_distance(s0[i], r0[i]), 2u);
        }
        if (slots > 1) {
          ASSERT_LE(ulp_distance(s1[i], r1[i]), 2u);
        }
      }
      EXPECT_NE(p, p0) << "the update changed nothing";
    }
  }
}

TEST_P(OptimizerPlugin, UpdateRefusesBadArguments) {
  const zd_optimizer_v1* d = plugin_->desc();
  std::vector<double> values = plugin_->defaults();
  if (std::string(GetParam()) == "sgd") values[plugin_->offset_of("momentum")] = 0.5;  // one state slot
  Instance inst(*plugin_, values);
  ASSERT_GE(d->state_slots(inst.ptr), 1u);
  std::vector<float> p(64, 1.0f), g(64, 1.0f), s0(64), s1(64);
  std::vector<uint16_t> work(64);
  auto good = [&] {
    zd_optimizer_update u{};
    u.struct_size = sizeof u;
    u.count = 64;
    u.master = p.data();
    u.grad = g.data();
    u.grad_dtype = ZD_DTYPE_F32;
    u.state[0] = s0.data();
    u.state[1] = s1.data();
    u.grad_scale = 1.0;
    u.lr = 1e-3;
    u.step = 1;
    return u;
  };
  zd_optimizer_update u = good();
  ASSERT_EQ(d->update(inst.ptr, ZD_ISA_AUTO, &u), ZD_OK);
  const std::vector<float> after_good = p;

  for (const zd_dtype bad : {0, 4, -1}) {
    u = good();
    u.grad_dtype = bad;
    EXPECT_EQ(d->update(inst.ptr, ZD_ISA_AUTO, &u), ZD_ERR_INVALID_ARGUMENT) << "grad dtype " << bad;
    u = good();
    u.work = work.data();
    u.work_dtype = bad;
    EXPECT_EQ(d->update(inst.ptr, ZD_ISA_AUTO, &u), ZD_ERR_INVALID_ARGUMENT) << "work dtype " << bad;
  }
  EXPECT_EQ(p, after_good) << "a refused update must not write";
  u = good();
  u.work_dtype = 77;  // ignored without a working copy
  EXPECT_EQ(d->update(inst.ptr, ZD_ISA_AUTO, &u), ZD_OK);

  u = good();
  EXPECT_EQ(d->update(inst.ptr, 99, &u), ZD_ERR_NOT_IMPLEMENTED);
  if (!isa_supported(Isa::avx512)) {
    EXPECT_EQ(d->update(inst.ptr, ZD_ISA_AVX512, &u), ZD_ERR_NOT_IMPLEMENTED);
  }
  EXPECT_EQ(d->update(inst.ptr, ZD_ISA_AUTO, nullptr), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(d->update(nullptr, ZD_ISA_AUTO, &u), ZD_ERR_INVALID_ARGUMENT);
  u.struct_size = sizeof u - 8;
  EXPECT_EQ(d->update(inst.ptr, ZD_ISA_AUTO, &u), ZD_ERR_INVALID_ARGUMENT) << "short struct";
  u = good();
  u.step = 0;
  EXPECT_EQ(d->update(inst.ptr, ZD_ISA_AUTO, &u), ZD_ERR_INVALID_ARGUMENT) << "step 0";
  u = good();
  u.lr = -1.0;
  EXPECT_EQ(d->update(inst.ptr, ZD_ISA_AUTO, &u), ZD_ERR_INVALID_ARGUMENT) << "negative lr";
  u = good();
  u.grad_scale = __builtin_inf();
  EXPECT_EQ(d->update(inst.ptr, ZD_ISA_AUTO, &u), ZD_ERR_INVALID_ARGUMENT) << "infinite grad_scale";
  u = good();
  u.state[0] = nullptr;
  EXPECT_EQ(d->update(inst.ptr, ZD_ISA_AUTO, &u), ZD_ERR_INVALID_ARGUMENT) << "missing state";
  u = zd_optimizer_update{};
  u.struct_size = sizeof u;
  u.grad_dtype = ZD_DTYPE_F32;
  u.step = 1;
  EXPECT_EQ(d->update(inst.ptr, ZD_ISA_AUTO, &u), ZD_OK) << "an empty range needs no arrays";
}

// The host runs disjoint ranges on several threads; the result must not
// depend on the split.
TEST_P(OptimizerPlugin, DisjointRangesOnThreadsMatchOneCall) {
  const zd_optimizer_v1* d = plugin_->desc();
  std::vector<double> values = plugin_->defaults();
  if (std::string(GetParam()) == "sgd") values[plugin_->offset_of("momentum")] = 0.9;
  Instance inst(*plugin_, values);
  const size_t n = 100003;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  std::vector<float> p0(n), g(n);
  for (auto& x : p0) x = normal(rng);
  for (auto& x : g) x = normal(rng);
  auto run = [&](std::vector<float>& p, std::vector<float>& s0, std::vector<float>& s1, size_t begin, size_t end) {
    zd_optimizer_update u{};
    u.struct_size = sizeof u;
    u.count = end - begin;
    u.master = p.data() + begin;
    u.grad = g.data() + begin;
    u.grad_dtype = ZD_DTYPE_F32;
    u.state[0] = s0.data() + begin;
    u.state[1] = s1.data() + begin;
    u.grad_scale = 1.0;
    u.lr = 1e-3;
    u.step = 1;
    EXPECT_EQ(d->update(inst.ptr, ZD_ISA_AUTO, &u), ZD_OK);
  };
  std::vector<float> a = p0, a0(n, 0.0f), a1(n, 0.0f), b = p0, b0(n, 0.0f), b1(n, 0.0f);
  run(a, a0, a1, 0, n);
  const size_t cuts[] = {0, 13, 40001, 77777, n};  // odd boundaries, not vector multiples
  std::vector<std::thread> threads;
  for (size_t k = 0; k + 1 < std::size(cuts); ++k) {
    threads.emplace_back(run, std::ref(b), std::ref(b0), std::ref(b1), cuts[k], cuts[k + 1]);
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < n; ++i) ASSERT_LE(ulp_distance(a[i], b[i]), 2u) << "[" << i << "]";
}

INSTANTIATE_TEST_SUITE_P(Plugins, OptimizerPlugin, ::testing::Values("adam", "adamw", "sgd"),
                         [](const ::testing::TestParamInfo<const char*>& p) { return std::string(p.param); });

// ---- per-plugin specs and semantics --------------------------------------

void expect_spec(const zd_hparam_spec& s, const char* name, zd_hparam_type type, int32_t count,
                 std::vector<double> defaults, double min, double max, uint32_t flags) {
  SCOPED_TRACE(name);
  EXPECT_STREQ(s.name, name);
  EXPECT_EQ(s.type, type);
  EXPECT_EQ(s.count, count);
  for (int32_t i = 0; i < count; ++i) EXPECT_DOUBLE_EQ(s.defaults[i], defaults[static_cast<size_t>(i)]);
  EXPECT_EQ(s.min, min);
  EXPECT_EQ(s.max, max);
  EXPECT_EQ(s.flags, flags);
  ASSERT_NE(s.help, nullptr);
  EXPECT_GT(std::strlen(s.help), 5u);
}

void expect_adam_specs(const zd_optimizer_v1* d, double weight_decay) {
  ASSERT_EQ(d->hparam_count, 5u);
  const double inf = __builtin_inf();
  expect_spec(d->hparams[0], "lr", ZD_HPARAM_NUMBER, 1, {1e-3}, 0.0, inf, ZD_HPARAM_MIN_EXCLUSIVE);
  expect_spec(d->hparams[1], "betas", ZD_HPARAM_NUMBER, 2, {0.9, 0.999}, 0.0, 1.0, ZD_HPARAM_MAX_EXCLUSIVE);
  expect_spec(d->hparams[2], "eps", ZD_HPARAM_NUMBER, 1, {1e-8}, 0.0, inf, ZD_HPARAM_MIN_EXCLUSIVE);
  expect_spec(d->hparams[3], "weight_decay", ZD_HPARAM_NUMBER, 1, {weight_decay}, 0.0, inf, 0);
  expect_spec(d->hparams[4], "bias_correction", ZD_HPARAM_BOOL, 1, {1.0}, 0.0, 1.0, 0);
}

TEST(AdamPlugins, SpecsAndStateNames) {
  for (const char* name : {"adam", "adamw"}) {
    Plugin p(name);
    ASSERT_NE(p.desc(), nullptr) << p.error();
    expect_adam_specs(p.desc(), std::strcmp(name, "adamw") == 0 ? 0.01 : 0.0);
    Instance inst(p, p.defaults());
    EXPECT_EQ(p.desc()->state_slots(inst.ptr), 2u);
    EXPECT_STREQ(p.desc()->state_name(inst.ptr, 0), "exp_avg");
    EXPECT_STREQ(p.desc()->state_name(inst.ptr, 1), "exp_avg_sq");
    EXPECT_EQ(p.desc()->state_name(inst.ptr, 2), nullptr);
  }
  Plugin adam("adam");
  ASSERT_NE(adam.desc(), nullptr);
  EXPECT_NE(std::string(adam.desc()->hparams[3].help).find("adamw"), std::string::npos)
      << "adam's weight_decay help points DeepSpeed users to adamw";
}

TEST(AdamPlugins, BetasOutOfRangeNamed) {
  Plugin p("adamw");
  ASSERT_NE(p.desc(), nullptr) << p.error();
  std::vector<double> v = p.defaults();
  v[p.offset_of("betas") + 1] = 1.0;
  void* inst = nullptr;
  std::string err;
  EXPECT_EQ(p.create(v, &inst, &err), ZD_ERR_CONFIG);
  EXPECT_NE(err.find("betas[1]"), std::string::npos) << err;
  v = p.defaults();
  v[p.offset_of("eps")] = 0.0;
  EXPECT_EQ(p.create(v, &inst, &err), ZD_ERR_CONFIG);
  EXPECT_NE(err.find("eps"), std::string::npos) << err;
  v = p.defaults();
  v[p.offset_of("bias_correction")] = 0.5;
  EXPECT_EQ(p.create(v, &inst, &err), ZD_ERR_CONFIG);
  EXPECT_NE(err.find("bias_correction"), std::string::npos) << err;
}

// The v4 descriptor keeps m and v in bf16 when the update says so: the
// same step as the kernels' scalar reference with a bf16 state, on every ISA
// and AUTO; it accepts fp32 and bf16 state and nothing else, plans plainly,
// and never compresses. The v1 descriptor reads no state dtype (the field
// was reserved before v4): its state stays fp32 whatever the field holds.
TEST(AdamPlugins, V4KeepsBf16StateAndV1IgnoresTheField) {
  for (const char* name : {"adam", "adamw"}) {
    SCOPED_TRACE(name);
    Plugin p(name);
    ASSERT_NE(p.v4(), nullptr) << p.error();
    const zd_optimizer_v4* d = p.v4();
    Instance inst(p, p.defaults());
    EXPECT_EQ(d->supports_state_dtype(inst.ptr, ZD_DTYPE_F32), 1);
    EXPECT_EQ(d->supports_state_dtype(inst.ptr, ZD_DTYPE_BF16), 1);
    EXPECT_EQ(d->supports_state_dtype(inst.ptr, ZD_DTYPE_F16), 0);
    EXPECT_EQ(d->compresses(inst.ptr), 0);
    zd_optimizer_plan plan{};
    ASSERT_EQ(d->plan(inst.ptr, 3, -1, -1, &plan), ZD_OK);
    EXPECT_EQ(plan.grads, ZD_GRADS_AVERAGED);
    EXPECT_EQ(plan.ops[0], ZD_OP_PASS_GRAD);
    EXPECT_EQ(plan.ops[1], ZD_OP_END);

    const size_t n = 1000;
    std::mt19937 rng(5);
    std::normal_distribution<float> normal;
    std::vector<float> p0(n), g(n);
    for (auto& x : p0) x = normal(rng);
    for (auto& x : g) x = normal(rng);
    AdamParams hp;
    hp.lr = 2e-3;
    hp.decoupled = std::strcmp(name, "adamw") == 0;
    hp.weight_decay = hp.decoupled ? 0.01 : 0.0;
    for (const zd_isa isa : {ZD_ISA_AUTO, ZD_ISA_SCALAR, ZD_ISA_AVX2, ZD_ISA_AVX512}) {
      if (!d->supports_isa(isa)) continue;
      std::vector<float> pv = p0, rp = p0;
      std::vector<uint16_t> m(n, 0), v(n, 0), rm(n, 0), rv(n, 0);
      for (int64_t t = 1; t <= 2; ++t) {
        zd_optimizer_update u{};
        u.struct_size = sizeof u;
        u.count = n;
        u.master = pv.data();
        u.grad = g.data();
        u.grad_dtype = ZD_DTYPE_F32;
        u.state[0] = reinterpret_cast<float*>(m.data());
        u.state[1] = reinterpret_cast<float*>(v.data());
        u.state_dtype = ZD_DTYPE_BF16;
        u.grad_scale = 1.0;
        u.lr = 2e-3;
        u.step = t;
        ASSERT_EQ(d->update(inst.ptr, isa, &u), ZD_OK) << "isa " << isa;
        hp.step = t;
        Range r;
        r.count = n;
        r.master = rp.data();
        r.grad = g.data();
        ASSERT_TRUE(adam_update(Isa::scalar, hp, r,
                                AdamState{reinterpret_cast<float*>(rm.data()), reinterpret_cast<float*>(rv.data()),
                                          Dtype::bf16}));
      }
      EXPECT_EQ(m, rm) << "isa " << isa;
      EXPECT_EQ(v, rv) << "isa " << isa;
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(f32_bits(pv[i]), f32_bits(rp[i])) << "[" << i << "] isa " << isa;
    }

    // A state dtype the plugin does not keep: refused, nothing written.
    float master = 1.0f, grad = 1.0f, s0 = 0.0f, s1 = 0.0f;
    zd_optimizer_update u{};
    u.struct_size = sizeof u;
    u.count = 1;
    u.master = &master;
    u.grad = &grad;
    u.grad_dtype = ZD_DTYPE_F32;
    u.state[0] = &s0;
    u.state[1] = &s1;
    u.lr = 1e-3;
    u.step = 1;
    u.grad_scale = 1.0;
    u.state_dtype = ZD_DTYPE_F16;
    EXPECT_EQ(d->update(inst.ptr, ZD_ISA_SCALAR, &u), ZD_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(master, 1.0f);
    // v1: the field is not read; fp32 state.
    u.state_dtype = ZD_DTYPE_BF16;
    ASSERT_EQ(p.desc()->update(inst.ptr, ZD_ISA_SCALAR, &u), ZD_OK);
    EXPECT_NEAR(s0, 0.1f, 1e-6f) << "exp_avg kept as fp32 by the v1 descriptor";
  }
}

// With a zero gradient and p = 1 at step 1: Adam's L2 term becomes the whole
// gradient, so p moves by ~lr; AdamW only shrinks p by lr*wd.
TEST(AdamPlugins, AdamIsL2AndAdamwIsDecoupled) {
  for (const char* name : {"adam", "adamw"}) {
    Plugin p(name);
    ASSERT_NE(p.desc(), nullptr) << p.error();
    std::vector<double> v = p.defaults();
    v[p.offset_of("weight_decay")] = 0.1;
    Instance inst(p, v);
    float master = 1.0f, grad = 0.0f, m = 0.0f, s = 0.0f;
    zd_optimizer_update u{};
    u.struct_size = sizeof u;
    u.count = 1;
    u.master = &master;
    u.grad = &grad;
    u.grad_dtype = ZD_DTYPE_F32;
    u.state[0] = &m;
    u.state[1] = &s;
    u.grad_scale = 1.0;
    u.lr = 1e-3;
    u.step = 1;
    ASSERT_EQ(p.desc()->update(inst.ptr, ZD_ISA_AUTO, &u), ZD_OK);
    const double want = std::strcmp(name, "adam") == 0 ? 1.0 - 1e-3 : 1.0 - 1e-4;
    EXPECT_NEAR(master, want, 1e-7) << name;
  }
}

TEST(SgdPlugin, SpecsAndStateSlots) {
  Plugin p("sgd");
  ASSERT_NE(p.desc(), nullptr) << p.error();
  const zd_optimizer_v1* d = p.desc();
  ASSERT_EQ(d->hparam_count, 5u);
  const double inf = __builtin_inf();
  expect_spec(d->hparams[0], "lr", ZD_HPARAM_NUMBER, 1, {1e-2}, 0.0, inf, ZD_HPARAM_MIN_EXCLUSIVE);
  expect_spec(d->hparams[1], "momentum", ZD_HPARAM_NUMBER, 1, {0.0}, 0.0, 1.0, ZD_HPARAM_MAX_EXCLUSIVE);
  expect_spec(d->hparams[2], "dampening", ZD_HPARAM_NUMBER, 1, {0.0}, 0.0, 1.0, 0);
  expect_spec(d->hparams[3], "weight_decay", ZD_HPARAM_NUMBER, 1, {0.0}, 0.0, inf, 0);
  expect_spec(d->hparams[4], "nesterov", ZD_HPARAM_BOOL, 1, {0.0}, 0.0, 1.0, 0);
  {
    Instance plain(p, p.defaults());
    EXPECT_EQ(d->state_slots(plain.ptr), 0u) << "no momentum, no state";
    EXPECT_EQ(d->state_name(plain.ptr, 0), nullptr);
  }
  std::vector<double> v = p.defaults();
  v[p.offset_of("momentum")] = 0.9;
  Instance with_momentum(p, v);
  EXPECT_EQ(d->state_slots(with_momentum.ptr), 1u);
  EXPECT_STREQ(d->state_name(with_momentum.ptr, 0), "momentum_buffer");
}

TEST(SgdPlugin, NesterovNeedsMomentumAndNoDampening) {
  Plugin p("sgd");
  ASSERT_NE(p.desc(), nullptr) << p.error();
  std::vector<double> v = p.defaults();
  v[p.offset_of("nesterov")] = 1.0;
  void* inst = reinterpret_cast<void*>(1);
  std::string err;
  EXPECT_EQ(p.create(v, &inst, &err), ZD_ERR_CONFIG);
  EXPECT_EQ(inst, nullptr);
  EXPECT_NE(err.find("nesterov"), std::string::npos) << err;
  EXPECT_NE(err.find("momentum"), std::string::npos) << err;
  v[p.offset_of("momentum")] = 0.9;
  v[p.offset_of("dampening")] = 0.1;
  EXPECT_EQ(p.create(v, &inst, &err), ZD_ERR_CONFIG);
  EXPECT_NE(err.find("dampening"), std::string::npos) << err;
  v[p.offset_of("dampening")] = 0.0;
  Instance ok(p, v);
  EXPECT_NE(ok.ptr, nullptr);
}

}  // namespace
}  // namespace zerod::optim::test
