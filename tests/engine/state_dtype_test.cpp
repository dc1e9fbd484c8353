// optimizer.state_dtype = "bf16": Adam's m and v kept as bf16 in whatever
// tier they live. At every ZeRO stage, with the state in the device pool, on
// the host and on NVMe (and on a device the host cannot address), a run
// ends bit for bit where a plain loop over the scalar kernel with a bf16
// state does, and elsewhere than the fp32-state run; the state takes 2 bytes
// per element in the ledger and the plan; checkpoints (fp32 on disk) resume
// bit-identical and load across state dtypes; optimizers that cannot keep a
// bf16 state are refused by name, and an old-ABI plugin still trains.
#include "zero_fixture.h"

#include "memory/align.h"
#include "runtime/dtype.h"

#include <zerod/optim/kernels.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>

using namespace zerod_test;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  TempDir() {
    char t[] = "/var/tmp/zerod-statedtype-XXXXXX";
    path = mkdtemp(t);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string path;
};

// Sizes: a tail that is no multiple of a vector, one large enough for
// several NVMe tiles and workers' tiles, one small.
const std::vector<int64_t> kSizes = {5003, 70000, 333};
constexpr double kLr = 1e-2, kDecay = 0.01;

float init_value(size_t param, size_t j) { return std::sin(static_cast<float>(j + 7 * param)); }
// The gradient every rank computes from the working copy: the same on all
// ranks, so averaging over ranks ((g + g) / 2) is exact and every stage and
// world size must agree with one rank bit for bit.
float grad_value(float w, size_t j, int step) { return w - std::cos(static_cast<float>(j + step)); }

JobOptions adamw(int stage, zd_dtype state) {
  JobOptions o;
  o.stage = stage;
  o.state_dtype = state;
  o.optimizer_hparams = {{"lr", kLr}, {"weight_decay", kDecay}};
  if (stage == 3) o.zero_hparams = {{"param_persistence_threshold", 0}};
  o.offload.nvme_tile_elems = 4096;  // several tiles per piece: the pipeline turns over
  return o;
}

std::vector<zd_param_id> register_all(Model& model, int rank) {
  std::vector<zd_param_id> ids;
  for (size_t i = 0; i < kSizes.size(); ++i) {
    std::vector<float> init(static_cast<size_t>(kSizes[i]));
    for (size_t j = 0; j < init.size(); ++j) init[j] = init_value(i, j);
    ids.push_back(model.register_param(rank, "w" + std::to_string(i), "m" + std::to_string(i), ZD_DTYPE_F32,
                                       {kSizes[i]}, init.data(), ZD_DTYPE_F32));
  }
  model.finalize(rank);
  return ids;
}

void train(Model& model, int rank, const std::vector<zd_param_id>& ids, int from, int to) {
  Device& d = const_cast<Device&>(model.device(rank));
  for (int s = from; s < to; ++s) {
    for (size_t m = ids.size(); m-- > 0;) {
      const auto mid = static_cast<zd_module_id>(m);
      model.backward_begin(rank, mid);
      const std::vector<float> w = read_view(d, model.param_view(rank, ids[m]));
      const ViewInfo g = model.grad_view(rank, ids[m]);
      std::vector<float> grad(w.size());
      for (size_t j = 0; j < w.size(); ++j) grad[j] = grad_value(w[j], j, s);
      write_view(d, g, grad);
      model.backward_end(rank, mid);
    }
    model.step(rank);
  }
}

// A model's whole values, as every rank reads them: the masters and both
// state slots (widened to fp32).
struct Values {
  std::vector<std::vector<float>> params, m, v;
  bool operator==(const Values&) const = default;
};

Values read_all(Model& model, int world) {
  std::vector<Values> per(static_cast<size_t>(world));
  run_ranks(world, [&](int rank) {
    Values& out = per[static_cast<size_t>(rank)];
    for (size_t i = 0; i < kSizes.size(); ++i) {
      const auto id = static_cast<zd_param_id>(i);
      const auto n = static_cast<size_t>(kSizes[i]);
      std::vector<float> p(n), m(n), v(n);
      model.read_param(rank, id, ZD_DTYPE_F32, p.data(), n * 4);
      model.read_state(rank, id, 0, ZD_DTYPE_F32, m.data(), n * 4);
      model.read_state(rank, id, 1, ZD_DTYPE_F32, v.data(), n * 4);
      out.params.push_back(p);
      out.m.push_back(m);
      out.v.push_back(v);
    }
  });
  for (int r = 1; r < world; ++r) EXPECT_EQ(per[static_cast<size_t>(r)], per[0]) << "rank " << r << " reads otherwise";
  return per[0];
}

Values run(const JobOptions& o, int world, int steps) {
  auto model = make_model(o, world);
  run_ranks(world, [&](int rank) { train(*model, rank, register_all(*model, rank), 0, steps); });
  return read_all(*model, world);
}

// The same training as a plain loop over the kernels' scalar AdamW with the
// state kept as bf16: what the engine must reproduce at every stage and tier.
Values reference(int steps) {
  using namespace zerod::optim;
  Values out;
  for (size_t i = 0; i < kSizes.size(); ++i) {
    const auto n = static_cast<size_t>(kSizes[i]);
    std::vector<float> p(n), g(n);
    std::vector<uint16_t> m(n, 0), v(n, 0);
    for (size_t j = 0; j < n; ++j) p[j] = init_value(i, j);
    AdamParams hp;
    hp.lr = kLr;
    hp.weight_decay = kDecay;
    hp.decoupled = true;
    for (int s = 0; s < steps; ++s) {
      for (size_t j = 0; j < n; ++j) g[j] = grad_value(p[j], j, s);
      hp.step = s + 1;
      Range r;
      r.count = n;
      r.master = p.data();
      r.grad = g.data();
      EXPECT_TRUE(adam_update(Isa::scalar, hp, r,
                              AdamState{reinterpret_cast<float*>(m.data()), reinterpret_cast<float*>(v.data()),
                                        Dtype::bf16}));
    }
    std::vector<float> mf(n), vf(n);
    for (size_t j = 0; j < n; ++j) {
      mf[j] = bf16_to_f32(m[j]);
      vf[j] = bf16_to_f32(v[j]);
    }
    out.params.push_back(p);
    out.m.push_back(mf);
    out.v.push_back(vf);
  }
  return out;
}

uint64_t held(const Model& m, int rank, zd_tier t, zd_mem_kind k) { return m.ledger(rank).current(t, k); }

}  // namespace

// (stage, where the optimizer state lives)
using Where = std::tuple<int, zd_tier>;

class Bf16State : public ::testing::TestWithParam<Where> {};

TEST_P(Bf16State, TrainsAsTheScalarReferenceAndNotAsFp32) {
  const auto [stage, tier] = GetParam();
  const int world = stage == 0 ? 1 : 2;
  constexpr int kSteps = 4;
  TempDir nvme;
  JobOptions o = adamw(stage, ZD_DTYPE_BF16);
  o.offload.optimizer = tier;
  o.offload.nvme_paths = {nvme.path};
  if (stage == 3 && tier != ZD_TIER_DEVICE) o.offload.params = tier;  // the shards go with the state
  const Values got = run(o, world, kSteps);
  const Values want = reference(kSteps);
  for (size_t i = 0; i < kSizes.size(); ++i) {
    EXPECT_EQ(got.params[i], want.params[i]) << "parameter " << i;
    EXPECT_EQ(got.m[i], want.m[i]) << "exp_avg " << i;
    EXPECT_EQ(got.v[i], want.v[i]) << "exp_avg_sq " << i;
    for (float x : got.v[i]) ASSERT_EQ(bf16_to_f32(f32_to_bf16(x)), x) << "the state reads back as bf16 values";
  }
  JobOptions f = o;
  f.state_dtype = ZD_DTYPE_F32;
  const Values fp32 = run(f, world, kSteps);
  EXPECT_NE(fp32.params, got.params) << "bf16 state changes the result: the option is in effect";
  size_t m_not_bf16 = 0;
  for (const auto& m : fp32.m)
    for (float x : m) m_not_bf16 += bf16_to_f32(f32_to_bf16(x)) != x;
  EXPECT_GT(m_not_bf16, 1000u) << "the fp32 run's state is not bf16 values";
}

INSTANTIATE_TEST_SUITE_P(
    Stages, Bf16State,
    ::testing::Combine(::testing::Values(0, 1, 2, 3), ::testing::Values(ZD_TIER_DEVICE, ZD_TIER_HOST, ZD_TIER_NVME)),
    [](const ::testing::TestParamInfo<Where>& p) {
      return "stage" + std::to_string(std::get<0>(p.param)) + "_" + tier_name(std::get<1>(p.param));
    });

// A device the host cannot address (the emulated one; a GPU's path): the
// state in the device pool is updated by the device, on the host by the CPU
// with the working copy uploaded, as the same bits.
TEST(Bf16StateOnADevice, TheHostCannotAddressTrainsAsTheReference) {
  for (const zd_tier tier : {ZD_TIER_DEVICE, ZD_TIER_HOST})
    for (const int stage : {0, 3}) {
      JobOptions o = adamw(stage, ZD_DTYPE_BF16);
      o.device = "opaque";
      o.offload.optimizer = tier;
      const Values got = run(o, stage == 0 ? 1 : 2, 3);
      EXPECT_EQ(got, reference(3)) << "stage " << stage << ", state on " << tier_name(tier);
    }
}

// The ledger, the plan and `zerod plan`'s table count 2 bytes per element of
// each state slot; the master stays 4.
TEST(Bf16StateMemory, TwoBytesPerElementInTheLedgerAndThePlan) {
  TempDir nvme;
  for (const int stage : {0, 1, 2, 3})
    for (const zd_tier tier : {ZD_TIER_HOST, ZD_TIER_NVME}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + ", " + tier_name(tier));
      const int world = stage == 0 ? 1 : 2;
      // Sizes whose owned parts are whole 64-byte (and, on NVMe, 4 KiB)
      // blocks in either dtype, so the halving is exact.
      const std::vector<int64_t> sizes = {65536, 131072};
      TierPlan plans[2];
      uint64_t state[2] = {}, master[2] = {};
      for (const zd_dtype dt : {ZD_DTYPE_F32, ZD_DTYPE_BF16}) {
        const size_t k = dt == ZD_DTYPE_BF16 ? 1 : 0;
        JobOptions o = adamw(stage, dt);
        o.offload.optimizer = tier;
        o.offload.nvme_paths = {nvme.path};
        auto model = make_model(o, world);
        run_ranks(world, [&](int rank) {
          for (size_t i = 0; i < sizes.size(); ++i)
            model->register_param(rank, "w" + std::to_string(i), "m" + std::to_string(i), ZD_DTYPE_F32, {sizes[i]},
                                  nullptr, 0);
          if (rank == 0) plans[k] = model->plan(0);
          model->finalize(rank);
        });
        state[k] = held(*model, 0, tier, ZD_MEM_OPTIMIZER);
        master[k] = held(*model, 0, tier, ZD_MEM_MASTER);
        for (int t = 0; t < ZD_TIER_COUNT; ++t)
          for (int kind = 0; kind < ZD_MEM_KIND_COUNT; ++kind)
            EXPECT_EQ(plans[k].need[static_cast<size_t>(t)][static_cast<size_t>(kind)], held(*model, 0, t, kind))
                << "the plan is the real figure: " << tier_name(t) << " " << mem_kind_name(kind);
      }
      const uint64_t owned = (65536 + 131072) / static_cast<uint64_t>(world);
      EXPECT_EQ(state[0], owned * 4 * 2) << "fp32: 4 bytes x 2 slots";
      EXPECT_EQ(state[1], owned * 2 * 2) << "bf16: 2 bytes x 2 slots";
      EXPECT_EQ(master[1], master[0]) << "the master stays fp32";
      EXPECT_EQ(master[1], owned * 4);
    }
}

// A checkpoint of a bf16-state run resumes bit-identical (its fp32 values
// are bf16 values, so loading rounds them to themselves); it loads into an
// fp32-state job as exactly those values, and an fp32 checkpoint into a
// bf16-state job as its values rounded to nearest even.
TEST(Bf16StateCheckpoints, ResumeBitIdenticalAndLoadAcrossStateDtypes) {
  for (const int stage : {0, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const int world = stage == 0 ? 1 : 2;
    TempDir dir, nvme;
    JobOptions o = adamw(stage, ZD_DTYPE_BF16);
    o.offload.optimizer = ZD_TIER_NVME;
    o.offload.nvme_paths = {nvme.path};
    auto a = make_model(o, world);
    auto b = make_model(o, world);
    run_ranks(world, [&](int rank) {
      const auto ids = register_all(*a, rank);
      train(*a, rank, ids, 0, 3);
      a->save_checkpoint(rank, dir.path);
      train(*a, rank, ids, 3, 6);
      const auto ids_b = register_all(*b, rank);
      b->load_checkpoint(rank, dir.path);
      train(*b, rank, ids_b, 3, 6);
    });
    EXPECT_EQ(read_all(*b, world), read_all(*a, world)) << "resumed bf16 run";

    // bf16 checkpoint -> fp32 job: the same values.
    JobOptions f = adamw(stage, ZD_DTYPE_F32);
    auto c = make_model(f, world);
    run_ranks(world, [&](int rank) {
      register_all(*c, rank);
      c->load_checkpoint(rank, dir.path);
    });
    auto d = make_model(o, world);
    run_ranks(world, [&](int rank) {
      register_all(*d, rank);
      d->load_checkpoint(rank, dir.path);
    });
    const Values at3 = read_all(*d, world);
    EXPECT_EQ(read_all(*c, world), at3) << "a bf16 checkpoint loads into an fp32-state job as its values";

    // ... trained on there in fp32, saved, loaded into a bf16 job: rounded.
    TempDir dir32;
    run_ranks(world, [&](int rank) {
      train(*c, rank, {0, 1, 2}, 3, 5);
      c->save_checkpoint(rank, dir32.path);
    });
    const Values fp32 = read_all(*c, world);
    auto e = make_model(o, world);
    run_ranks(world, [&](int rank) {
      register_all(*e, rank);
      e->load_checkpoint(rank, dir32.path);
    });
    const Values loaded = read_all(*e, world);
    EXPECT_EQ(loaded.params, fp32.params) << "the master stays fp32";
    size_t rounded = 0;
    for (size_t i = 0; i < kSizes.size(); ++i)
      for (size_t j = 0; j < fp32.m[i].size(); ++j) {
        ASSERT_EQ(loaded.m[i][j], bf16_to_f32(f32_to_bf16(fp32.m[i][j]))) << "exp_avg " << i << "[" << j << "]";
        ASSERT_EQ(loaded.v[i][j], bf16_to_f32(f32_to_bf16(fp32.v[i][j]))) << "exp_avg_sq " << i << "[" << j << "]";
        rounded += loaded.m[i][j] != fp32.m[i][j];
      }
    EXPECT_GT(rounded, 1000u) << "loading into bf16 rounds";
  }
}

// zd_optimizer_state_write into a bf16 state rounds to nearest even; a read
// returns what is kept.
TEST(Bf16StateIo, WriteRoundsAndReadReturnsTheKeptValues) {
  auto model = make_model(adamw(2, ZD_DTYPE_BF16), 2);
  const size_t n = static_cast<size_t>(kSizes[1]);
  std::vector<float> in(n);
  for (size_t j = 0; j < n; ++j) in[j] = 1.0f + static_cast<float>(j) * 1e-5f;
  std::vector<std::vector<float>> out(2, std::vector<float>(n));
  run_ranks(2, [&](int rank) {
    register_all(*model, rank);
    model->write_state(rank, 1, 0, ZD_DTYPE_F32, in.data(), n * 4);
    model->read_state(rank, 1, 0, ZD_DTYPE_F32, out[static_cast<size_t>(rank)].data(), n * 4);
  });
  for (size_t j = 0; j < n; ++j) ASSERT_EQ(out[0][j], bf16_to_f32(f32_to_bf16(in[j]))) << "[" << j << "]";
  EXPECT_EQ(out[1], out[0]);
}

// Optimizers that cannot keep their state in bf16 are refused, naming the
// plugin, its ABI version and the key; one without state is accepted.
TEST(Bf16StateRefusals, NameThePluginAndTheKey) {
  struct Case {
    const char* optimizer;
    std::vector<std::pair<std::string, double>> hparams;
    const char* says;
  } cases[] = {
      {"sgd", {{"momentum", 0.9}}, "optimizer 'sgd' (plugin ABI version 1, "},
      {"adamw_v1", {}, "optimizer 'adamw_v1' (plugin ABI version 1, "},
      {"onebit_adam", {}, "optimizer 'onebit_adam' (plugin ABI version 3, "},
  };
  for (const Case& c : cases) {
    JobOptions o = adamw(0, ZD_DTYPE_BF16);
    o.optimizer = c.optimizer;
    o.optimizer_hparams = c.hparams;
    try {
      make_model(o, 1);
      ADD_FAILURE() << c.optimizer << " was accepted";
    } catch (const Error& e) {
      const std::string s = e.what();
      EXPECT_EQ(e.code(), ZD_ERR_CONFIG) << s;
      EXPECT_NE(s.find("optimizer.state_dtype = \"bf16\": "), std::string::npos) << s;
      EXPECT_NE(s.find(c.says), std::string::npos) << s;
      EXPECT_NE(s.find("keeps its state in fp32 only"), std::string::npos) << s;
      EXPECT_NE(s.find("(test job)"), std::string::npos) << s;
    }
  }
  // sgd without momentum keeps nothing: accepted, and nothing is allocated.
  JobOptions o = adamw(0, ZD_DTYPE_BF16);
  o.optimizer = "sgd";
  o.optimizer_hparams = {};
  auto model = make_model(o, 1);
  register_all(*model, 0);
  EXPECT_EQ(model->ledger(0).current(ZD_TIER_DEVICE, ZD_MEM_OPTIMIZER), 0u);
}

// adamw as a plugin of optimizer ABI v1 (built before v4), lifted by the v1
// adapter: fp32 state, bit for bit the v4 plugin's fp32 run.
TEST(OldAbiPlugins, AV1AdamwTrainsAsTheV4OneWithFp32State) {
  JobOptions v4 = adamw(2, ZD_DTYPE_F32);
  JobOptions v1 = v4;
  v1.optimizer = "adamw_v1";
  {
    auto m = make_model(v1, 1);
    EXPECT_EQ(m->optimizer().plugin().header().abi_version, 1u);
    EXPECT_FALSE(m->optimizer().supports_state_dtype(ZD_DTYPE_BF16));
    EXPECT_TRUE(m->optimizer().supports_state_dtype(ZD_DTYPE_F32));
  }
  {
    auto m = make_model(v4, 1);
    EXPECT_EQ(m->optimizer().plugin().header().abi_version, 4u) << "the newest descriptor the host knows";
    EXPECT_TRUE(m->optimizer().supports_state_dtype(ZD_DTYPE_BF16));
  }
  EXPECT_EQ(run(v1, 2, 3), run(v4, 2, 3));
}
