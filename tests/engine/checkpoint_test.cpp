// Checkpoints across ranks: at every ZeRO stage (and with the optimizer
// state on NVMe) each rank reads the whole parameters and optimizer state
// (collectives where they are partitioned), a fresh model of the same job
// loads them, and the next steps end bit-identical with the uninterrupted run.
#include "zero_fixture.h"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>

namespace {

using namespace zerod_test;
namespace fs = std::filesystem;

const std::vector<int64_t> kSizes = {300, 1000, 7};

struct Saved {
  std::vector<std::vector<float>> params;
  std::vector<std::vector<std::vector<float>>> slots;  // [param][slot]
  int64_t step = 0;
};

void register_all(Model& model, int rank, std::vector<zd_param_id>* ids) {
  for (size_t i = 0; i < kSizes.size(); ++i) {
    std::vector<float> init(static_cast<size_t>(kSizes[i]));
    for (size_t j = 0; j < init.size(); ++j) init[j] = std::sin(static_cast<float>(j + 5 * i));
    ids->push_back(model.register_param(rank, "w" + std::to_string(i), "m" + std::to_string(i), ZD_DTYPE_F32,
                                        {kSizes[i]}, init.data(), ZD_DTYPE_F32));
  }
  model.finalize(rank);
}

void train(Model& model, int rank, const std::vector<zd_param_id>& ids, int from, int to) {
  for (int s = from; s < to; ++s) {
    for (size_t m = ids.size(); m-- > 0;) {
      const auto mid = static_cast<zd_module_id>(m);
      model.backward_begin(rank, mid);
      const ViewInfo w = model.param_view(rank, ids[m]);
      const ViewInfo g = model.grad_view(rank, ids[m]);
      const auto* wd = static_cast<const float*>(w.data);
      auto* gd = static_cast<float*>(g.data);
      for (size_t j = 0; j < g.bytes / 4; ++j) gd[j] = wd[j] - std::cos(static_cast<float>(j + 3 * s + rank));
      model.backward_end(rank, mid);
    }
    model.step(rank);
  }
}

Saved save(Model& model, int rank, const std::vector<zd_param_id>& ids) {
  Saved c;
  c.step = model.applied_steps(rank);
  const int slots = static_cast<int>(model.optimizer().state_slots());
  for (size_t i = 0; i < ids.size(); ++i) {
    std::vector<float> v(static_cast<size_t>(kSizes[i]));
    model.read_param(rank, ids[i], ZD_DTYPE_F32, v.data(), v.size() * 4);
    c.params.push_back(v);
    c.slots.emplace_back();
    for (int s = 0; s < slots; ++s) {
      model.read_state(rank, ids[i], s, ZD_DTYPE_F32, v.data(), v.size() * 4);
      c.slots.back().push_back(v);
    }
  }
  return c;
}

void load(Model& model, int rank, const std::vector<zd_param_id>& ids, const Saved& c) {
  for (size_t i = 0; i < ids.size(); ++i) {
    model.write_param(rank, ids[i], ZD_DTYPE_F32, c.params[i].data(), c.params[i].size() * 4);
    for (size_t s = 0; s < c.slots[i].size(); ++s)
      model.write_state(rank, ids[i], static_cast<int>(s), ZD_DTYPE_F32, c.slots[i][s].data(),
                        c.slots[i][s].size() * 4);
  }
  model.set_applied_steps(rank, c.step);
}

struct Case {
  int stage;
  bool nvme;
};

void PrintTo(const Case& c, std::ostream* os) { *os << "stage " << c.stage << (c.nvme ? ", state on nvme" : ""); }

class Checkpoint : public ::testing::TestWithParam<Case> {};

TEST_P(Checkpoint, AResumedRunEndsBitIdentical) {
  const Case k = GetParam();
  const int world = 2;
  JobOptions o;
  o.stage = k.stage;
  o.optimizer_hparams = {{"lr", 1e-2}, {"weight_decay", 0.01}};
  if (k.stage == 3) o.zero_hparams = {{"param_persistence_threshold", 0}};
  std::string dir;
  if (k.nvme) {
    char t[] = "/var/tmp/zerod-ckpt-XXXXXX";
    ASSERT_NE(mkdtemp(t), nullptr);
    dir = t;
    o.offload.optimizer = ZD_TIER_NVME;
    o.offload.nvme_paths = {dir};
    o.offload.nvme_tile_elems = 2048;
  }
  auto a = make_model(o, world);
  auto b = make_model(o, world);
  std::vector<Saved> saved(world);
  std::vector<std::vector<std::vector<float>>> want(world), got(world);
  run_ranks(world, [&](int rank) {
    std::vector<zd_param_id> ids;
    register_all(*a, rank, &ids);
    train(*a, rank, ids, 0, 3);
    saved[static_cast<size_t>(rank)] = save(*a, rank, ids);
    train(*a, rank, ids, 3, 6);
    want[static_cast<size_t>(rank)] = save(*a, rank, ids).params;

    std::vector<zd_param_id> ids_b;
    register_all(*b, rank, &ids_b);
    load(*b, rank, ids_b, saved[static_cast<size_t>(rank)]);
    train(*b, rank, ids_b, 3, 6);
    got[static_cast<size_t>(rank)] = save(*b, rank, ids_b).params;
  });
  EXPECT_EQ(saved[0].step, 3);
  EXPECT_EQ(saved[0].params, saved[1].params) << "every rank reads the whole value";
  EXPECT_EQ(saved[0].slots, saved[1].slots);
  EXPECT_NE(saved[0].slots[1][0][17], 0.0f) << "the state moved";
  for (int r = 0; r < world; ++r) EXPECT_EQ(got[static_cast<size_t>(r)], want[static_cast<size_t>(r)]) << "rank " << r;
  if (!dir.empty()) fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Stages, Checkpoint,
                         ::testing::Values(Case{0, false}, Case{1, false}, Case{2, false}, Case{3, false},
                                           Case{1, true}, Case{3, true}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return "stage" + std::to_string(i.param.stage) + (i.param.nvme ? "_nvme" : "");
                         });

}  // namespace
