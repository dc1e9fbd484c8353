// Checkpoints through the ABI: parameters, optimizer state slots and the
// step are read out, a fresh model loads them, and training goes on exactly
// as if it had never stopped. Also the errors of the state calls.
#include "abi_fixture.h"

#include <cstring>
#include <filesystem>
#include <string>

#include <stdlib.h>

namespace {

using zerod_test::AbiTest;
using zerod_test::last;

const char* kJob =
    "local zerod = require('zerod')\n"
    "return { optimizer = { type = 'adamw', lr = 0.01, weight_decay = 0.1 },\n"
    "         lr = zerod.warmup_linear{ warmup_steps = 5, max_lr = 0.01 } }\n";

std::vector<float> grad_at(int step, size_t n) {
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) g[i] = 0.1f * static_cast<float>((step * 7 + static_cast<int>(i) * 3) % 11) - 0.5f;
  return g;
}

struct Checkpoint {
  std::vector<float> params;
  std::vector<std::vector<float>> slots;
  int64_t step = 0;
};

class CheckpointTest : public AbiTest {
 protected:
  static constexpr size_t kN = 1000;

  zd_model* fresh(zd_param_id* p, zd_module_id* m) {
    zd_model* model = this->model(kJob);
    std::vector<float> init(kN);
    for (size_t i = 0; i < kN; ++i) init[i] = 0.001f * static_cast<float>(i);
    *p = add(model, "w", "layer", {static_cast<int64_t>(kN)}, init);
    EXPECT_EQ(zd_model_finalize(model), ZD_OK) << last();
    *m = module_id(model, "layer");
    return model;
  }

  static void train(zd_model* model, zd_module_id m, zd_param_id p, int from, int to) {
    for (int s = from; s < to; ++s) micro_step(model, m, p, grad_at(s, kN));
  }

  static Checkpoint save(zd_model* model, zd_param_id p) {
    Checkpoint c;
    c.params = read(model, p, kN);
    zd_optimizer_info oi = ZD_OPTIMIZER_INFO_INIT;
    EXPECT_EQ(zd_model_optimizer_info(model, &oi), ZD_OK) << last();
    c.step = oi.step;
    for (int s = 0; s < oi.state_slots; ++s) {
      std::vector<float> v(kN);
      EXPECT_EQ(zd_optimizer_state_read(model, p, s, ZD_DTYPE_F32, v.data(), kN * 4), ZD_OK) << last();
      c.slots.push_back(v);
    }
    return c;
  }

  static void load(zd_model* model, zd_param_id p, const Checkpoint& c) {
    EXPECT_EQ(zd_param_write(model, p, ZD_DTYPE_F32, c.params.data(), kN * 4), ZD_OK) << last();
    for (size_t s = 0; s < c.slots.size(); ++s)
      EXPECT_EQ(zd_optimizer_state_write(model, p, static_cast<int32_t>(s), ZD_DTYPE_F32, c.slots[s].data(), kN * 4),
                ZD_OK)
          << last();
    EXPECT_EQ(zd_model_set_step(model, c.step), ZD_OK) << last();
  }
};

TEST_F(CheckpointTest, AResumedRunEndsWhereTheUninterruptedOneDoes) {
  zd_param_id p1, p2;
  zd_module_id m1, m2;
  zd_model* a = fresh(&p1, &m1);
  train(a, m1, p1, 0, 8);
  const Checkpoint c = save(a, p1);
  EXPECT_EQ(c.step, 8);
  ASSERT_EQ(c.slots.size(), 2u);
  EXPECT_NE(c.slots[0][10], 0.0f) << "exp_avg moved";
  EXPECT_GT(c.slots[1][10], 0.0f) << "exp_avg_sq moved";
  train(a, m1, p1, 8, 14);
  const std::vector<float> want = read(a, p1, kN);

  zd_model* b = fresh(&p2, &m2);
  load(b, p2, c);
  train(b, m2, p2, 8, 14);
  EXPECT_EQ(read(b, p2, kN), want) << "bias correction, schedule and moments all resumed";
  zd_optimizer_info oi = ZD_OPTIMIZER_INFO_INIT;
  ASSERT_EQ(zd_model_optimizer_info(b, &oi), ZD_OK) << last();
  EXPECT_EQ(oi.step, 14);
  zd_model_destroy(a);
  zd_model_destroy(b);
}

TEST_F(CheckpointTest, WithoutTheStateTheRunDiffers) {
  // The check above could pass by accident if state did not matter.
  zd_param_id p1, p2;
  zd_module_id m1, m2;
  zd_model* a = fresh(&p1, &m1);
  train(a, m1, p1, 0, 8);
  Checkpoint c = save(a, p1);
  train(a, m1, p1, 8, 10);
  const std::vector<float> want = read(a, p1, kN);
  zd_model* b = fresh(&p2, &m2);
  c.slots.clear();  // parameters and step only
  load(b, p2, c);
  train(b, m2, p2, 8, 10);
  EXPECT_NE(read(b, p2, kN), want);
  zd_model_destroy(a);
  zd_model_destroy(b);
}

TEST_F(CheckpointTest, BadStateCallsAreRefusedAndChangeNothing) {
  zd_param_id p;
  zd_module_id m;
  zd_model* model = fresh(&p, &m);
  train(model, m, p, 0, 2);
  const Checkpoint before = save(model, p);
  std::vector<float> v(kN);
  EXPECT_EQ(zd_optimizer_state_read(model, p, 2, ZD_DTYPE_F32, v.data(), kN * 4), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("has 2 state slots (0..1), not 2"), std::string::npos) << last();
  EXPECT_EQ(zd_optimizer_state_write(model, p, -1, ZD_DTYPE_F32, v.data(), kN * 4), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(zd_optimizer_state_write(model, p, 0, ZD_DTYPE_F32, v.data(), 12), ZD_ERR_SHAPE_MISMATCH);
  EXPECT_EQ(zd_optimizer_state_read(model, 99, 0, ZD_DTYPE_F32, v.data(), kN * 4), ZD_ERR_NOT_FOUND);
  EXPECT_EQ(zd_model_set_step(model, -1), ZD_ERR_INVALID_ARGUMENT);
  // Inside a step's window the step cannot be set, nor the state written.
  ASSERT_EQ(zd_forward_begin(model, m), ZD_OK) << last();
  EXPECT_EQ(zd_optimizer_state_write(model, p, 0, ZD_DTYPE_F32, v.data(), kN * 4), ZD_ERR_INVALID_STATE);
  EXPECT_EQ(zd_model_set_step(model, 3), ZD_ERR_INVALID_STATE);
  ASSERT_EQ(zd_forward_end(model, m), ZD_OK) << last();
  const Checkpoint after = save(model, p);
  EXPECT_EQ(after.params, before.params);
  EXPECT_EQ(after.slots, before.slots);
  EXPECT_EQ(after.step, before.step);
  zd_optimizer_info small{};  // a caller that knows only the first fields
  small.struct_size = 16;
  EXPECT_EQ(zd_model_optimizer_info(model, &small), ZD_OK) << last();
  EXPECT_EQ(small.state_slots, 2);
  EXPECT_EQ(small.step, 2);
  zd_model_destroy(model);
}

}  // namespace

namespace {

// A checkpoint directory (zd_model_save / zd_model_load, ABI 1.2): a fresh
// model loads it and ends where the uninterrupted run ends; a relative path
// means the trainer's working directory in both modes.
TEST_F(CheckpointTest, ADirectoryCheckpointResumesExactly) {
  char tmpl[] = "/tmp/zerod-abi-ckpt-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = std::string(tmpl) + "/ckpt";
  zd_param_id p1, p2;
  zd_module_id m1, m2;
  zd_model* a = fresh(&p1, &m1);
  train(a, m1, p1, 0, 8);
  ASSERT_EQ(zd_model_save(a, dir.c_str()), ZD_OK) << last();
  train(a, m1, p1, 8, 14);
  const std::vector<float> want = read(a, p1, kN);
  zd_model* b = fresh(&p2, &m2);
  ASSERT_EQ(zd_model_load(b, dir.c_str()), ZD_OK) << last();
  zd_optimizer_info oi = ZD_OPTIMIZER_INFO_INIT;
  ASSERT_EQ(zd_model_optimizer_info(b, &oi), ZD_OK) << last();
  EXPECT_EQ(oi.step, 8);
  train(b, m2, p2, 8, 14);
  EXPECT_EQ(read(b, p2, kN), want);
  // Inside an accumulation window, and a directory that holds none.
  ASSERT_EQ(zd_forward_begin(b, m2), ZD_OK) << last();
  EXPECT_EQ(zd_model_save(b, dir.c_str()), ZD_ERR_INVALID_STATE) << last();
  ASSERT_EQ(zd_forward_end(b, m2), ZD_OK) << last();
  EXPECT_EQ(zd_model_load(b, tmpl), ZD_ERR_IO);
  EXPECT_NE(last().find("no checkpoint at"), std::string::npos) << last();
  EXPECT_EQ(zd_model_load(b, nullptr), ZD_ERR_INVALID_ARGUMENT);
  zd_model_destroy(a);
  zd_model_destroy(b);
  std::filesystem::remove_all(tmpl);
}

// The lr zd_model_set_lr set is part of where the run stands: a checkpoint
// holds it with the step, and a model that loads it trains on at that lr
// (the job's warm-up would give another), where the uninterrupted run
// does. A checkpoint saved while none was set gives the job's schedule
// back.
TEST_F(CheckpointTest, ADirectoryCheckpointKeepsTheLrTheTrainerSet) {
  char tmpl[] = "/tmp/zerod-abi-ckpt-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string with_lr = std::string(tmpl) + "/with-lr", without = std::string(tmpl) + "/without";
  zd_param_id p1, p2;
  zd_module_id m1, m2;
  zd_model* a = fresh(&p1, &m1);
  train(a, m1, p1, 0, 2);
  ASSERT_EQ(zd_model_save(a, without.c_str()), ZD_OK) << last();
  ASSERT_EQ(zd_model_set_lr(a, 0.0007), ZD_OK) << last();
  train(a, m1, p1, 2, 4);
  ASSERT_EQ(zd_model_save(a, with_lr.c_str()), ZD_OK) << last();
  train(a, m1, p1, 4, 7);
  const std::vector<float> want = read(a, p1, kN);

  zd_model* b = fresh(&p2, &m2);
  ASSERT_EQ(zd_model_load(b, with_lr.c_str()), ZD_OK) << last();
  EXPECT_EQ(micro_step(b, m2, p2, grad_at(4, kN)).lr, 0.0007);
  train(b, m2, p2, 5, 7);
  EXPECT_EQ(read(b, p2, kN), want);
  // Back to a checkpoint saved before any set_lr: the warm-up's lr after
  // 2 updates (lr(2) = 0.01 * 2 / 5), not the lr b had set.
  ASSERT_EQ(zd_model_load(b, without.c_str()), ZD_OK) << last();
  EXPECT_DOUBLE_EQ(micro_step(b, m2, p2, grad_at(2, kN)).lr, 0.004);
  zd_model_destroy(a);
  zd_model_destroy(b);
  std::filesystem::remove_all(tmpl);
}

}  // namespace
