// The training step as a trainer drives it: call order, gradient views,
// accumulation, clipping, loss scaling, schedules, whole-parameter access.
// SGD without momentum keeps every expected value computable by hand.
#include "abi_fixture.h"

#include <cmath>
#include <cstring>
#include <limits>

using namespace zerod_test;

class StepTest : public AbiTest {
 protected:
  // One parameter "w" of 3 elements in module "layer".
  zd_model* one_param(const std::string& job, std::vector<float> init = {1, 2, 3}) {
    zd_model* m = model(job);
    p_ = add(m, "w", "layer", {3}, init);
    EXPECT_EQ(zd_model_finalize(m), ZD_OK) << last();
    mod_ = module_id(m, "layer");
    return m;
  }
  zd_param_id p_ = -1;
  zd_module_id mod_ = -1;
};

TEST_F(StepTest, SgdUpdateIsExact) {
  zd_model* m = one_param(sgd_job("", 0.5));
  const zd_step_result r = micro_step(m, mod_, p_, {0.5f, -1.0f, 2.0f});
  EXPECT_TRUE(r.flags & ZD_STEP_BOUNDARY);
  EXPECT_TRUE(r.flags & ZD_STEP_APPLIED);
  EXPECT_FALSE(r.flags & ZD_STEP_SKIPPED);
  EXPECT_EQ(r.step, 1);
  EXPECT_EQ(r.micro_step, 1);
  EXPECT_DOUBLE_EQ(r.lr, 0.5);
  EXPECT_DOUBLE_EQ(r.loss_scale, 1.0);
  EXPECT_NEAR(r.grad_norm, std::sqrt(0.25 + 1 + 4), 1e-6);
  EXPECT_EQ(read(m, p_, 3), (std::vector<float>{0.75f, 2.5f, 2.0f}));
  // The working copy the trainer sees agrees with the master.
  ASSERT_EQ(zd_forward_begin(m, mod_), ZD_OK);
  zd_view v = ZD_VIEW_INIT;
  ASSERT_EQ(zd_param_view(m, p_, &v), ZD_OK) << last();
  EXPECT_TRUE(v.flags & ZD_VIEW_READ_ONLY);
  EXPECT_EQ(v.dtype, ZD_DTYPE_F32);
  EXPECT_EQ(v.ndim, 1);
  EXPECT_EQ(v.shape[0], 3);
  EXPECT_EQ(v.nbytes, 12u);
  EXPECT_EQ(v.device_type, ZD_DEVICE_CPU);
  const float* w = static_cast<const float*>(v.data);
  EXPECT_EQ(std::vector<float>(w, w + 3), (std::vector<float>{0.75f, 2.5f, 2.0f}));
  ASSERT_EQ(zd_forward_end(m, mod_), ZD_OK);
  zd_model_destroy(m);
}

// zd_model_set_step takes a count of applied updates no later update
// overflows: 0..2^53-1 (the optimizers and lr() see update numbers as
// doubles, exact up to 2^53). INT64_MAX used to be taken, and every later
// step then failed ("could not plan update -9223372036854775808").
TEST_F(StepTest, SetStepTakesOnlyCountsTheNextUpdateCanFollow) {
  zd_model* m = one_param(sgd_job("", 0.5));
  const int64_t last_step = (int64_t{1} << 53) - 1;
  for (const int64_t bad : {int64_t{-1}, last_step + 1, std::numeric_limits<int64_t>::max(),
                            std::numeric_limits<int64_t>::min()}) {
    EXPECT_EQ(zd_model_set_step(m, bad), ZD_ERR_INVALID_ARGUMENT) << bad;
    EXPECT_EQ(last(), "zd_model_set_step: the step is " + std::to_string(bad) +
                          "; a count of applied updates is 0..9007199254740991 (2^53 - 1)");
  }
  EXPECT_EQ(zd_model_set_step(nullptr, 3), ZD_ERR_INVALID_ARGUMENT);
  // Refused, nothing changed: the next update is the first.
  EXPECT_EQ(micro_step(m, mod_, p_, {0.5f, -1.0f, 2.0f}).step, 1);
  ASSERT_EQ(zd_model_set_step(m, last_step), ZD_OK) << last();
  const zd_step_result r = micro_step(m, mod_, p_, {0.5f, -1.0f, 2.0f});
  EXPECT_TRUE(r.flags & ZD_STEP_APPLIED);
  EXPECT_EQ(r.step, last_step + 1);
  EXPECT_EQ(read(m, p_, 3), (std::vector<float>{0.5f, 3.0f, 1.0f}));
  zd_model_destroy(m);
}

TEST_F(StepTest, GradientsAreAveragedOverAnAccumulationWindow) {
  zd_model* m = one_param(sgd_job("gradient_accumulation_steps = 2", 1.0));
  zd_step_result r = micro_step(m, mod_, p_, {1, 2, 3});
  EXPECT_FALSE(r.flags & ZD_STEP_BOUNDARY);
  EXPECT_EQ(r.step, 0);
  EXPECT_EQ(read(m, p_, 3), (std::vector<float>{1, 2, 3}));  // nothing applied yet
  r = micro_step(m, mod_, p_, {3, 2, 1});
  EXPECT_TRUE(r.flags & ZD_STEP_APPLIED);
  EXPECT_EQ(r.step, 1);
  EXPECT_EQ(r.micro_step, 2);
  // mean gradient {2, 2, 2}
  EXPECT_EQ(read(m, p_, 3), (std::vector<float>{-1, 0, 1}));
  zd_model_destroy(m);
}

TEST_F(StepTest, GradientViewsStartAtZeroAndContributionsAdd) {
  zd_model* m = one_param(sgd_job("gradient_accumulation_steps = 2", 1.0), {0, 0, 0});
  // Micro-batch 1: the module runs twice (weight tying): contributions add.
  for (int rep = 0; rep < 2; ++rep) {
    ASSERT_EQ(zd_backward_begin(m, mod_), ZD_OK) << last();
    zd_view g = ZD_VIEW_INIT;
    ASSERT_EQ(zd_grad_view(m, p_, &g), ZD_OK) << last();
    EXPECT_FALSE(g.flags & ZD_VIEW_READ_ONLY);
    float* gd = static_cast<float*>(g.data);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(gd[i], 0.0f) << "view not zero at begin, rep " << rep;
    for (int i = 0; i < 3; ++i) gd[i] = 1.0f;
    ASSERT_EQ(zd_backward_end(m, mod_), ZD_OK) << last();
  }
  zd_step_result r = ZD_STEP_RESULT_INIT;
  ASSERT_EQ(zd_step(m, &r), ZD_OK);
  // Micro-batch 2: the trainer *writes* (=) its contribution; the view
  // started at zero, so nothing earlier is lost.
  ASSERT_EQ(zd_backward_begin(m, mod_), ZD_OK);
  zd_view g = ZD_VIEW_INIT;
  ASSERT_EQ(zd_grad_view(m, p_, &g), ZD_OK);
  float* gd = static_cast<float*>(g.data);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(gd[i], 0.0f);
    gd[i] = 4.0f;
  }
  ASSERT_EQ(zd_backward_end(m, mod_), ZD_OK);
  ASSERT_EQ(zd_step(m, &r), ZD_OK);
  ASSERT_TRUE(r.flags & ZD_STEP_APPLIED);
  // (1 + 1 + 4) / 2 = 3 per element.
  EXPECT_EQ(read(m, p_, 3), (std::vector<float>{-3, -3, -3}));
  zd_model_destroy(m);
}

TEST_F(StepTest, ClippingScalesTheUpdateToTheMaxNorm) {
  zd_model* m = one_param(sgd_job("gradient_clipping = 1.0", 1.0), {0, 0, 0});
  const zd_step_result r = micro_step(m, mod_, p_, {3, 4, 0});  // norm 5
  EXPECT_NEAR(r.grad_norm, 5.0, 1e-9);  // reported before clipping
  const auto w = read(m, p_, 3);
  EXPECT_NEAR(w[0], -0.6f, 1e-6);
  EXPECT_NEAR(w[1], -0.8f, 1e-6);
  EXPECT_EQ(w[2], 0.0f);
  zd_model_destroy(m);
}

TEST_F(StepTest, CallOrderErrorsChangeNothing) {
  zd_model* m = one_param(sgd_job("", 1.0));
  EXPECT_EQ(zd_forward_end(m, mod_), ZD_ERR_INVALID_STATE);
  EXPECT_NE(last().find("module 'layer' is not in forward"), std::string::npos) << last();
  EXPECT_EQ(zd_backward_end(m, mod_), ZD_ERR_INVALID_STATE);
  EXPECT_NE(last().find("without zd_backward_begin"), std::string::npos) << last();
  EXPECT_EQ(zd_forward_begin(m, 99), ZD_ERR_NOT_FOUND);
  EXPECT_NE(last().find("no module with id 99"), std::string::npos) << last();
  zd_view v = ZD_VIEW_INIT;
  EXPECT_EQ(zd_param_view(m, p_, &v), ZD_ERR_INVALID_STATE);
  EXPECT_NE(last().find("'w' is not resident"), std::string::npos) << last();

  ASSERT_EQ(zd_forward_begin(m, mod_), ZD_OK);
  EXPECT_EQ(zd_forward_begin(m, mod_), ZD_ERR_INVALID_STATE);
  EXPECT_NE(last().find("already in forward"), std::string::npos) << last();
  zd_step_result r = ZD_STEP_RESULT_INIT;
  EXPECT_EQ(zd_step(m, &r), ZD_ERR_INVALID_STATE);
  EXPECT_NE(last().find("zd_step while module 'layer' is still in forward"), std::string::npos)
      << last();
  EXPECT_EQ(zd_backward_begin(m, mod_), ZD_ERR_INVALID_STATE);
  EXPECT_EQ(zd_grad_view(m, p_, &v), ZD_ERR_INVALID_STATE);
  EXPECT_NE(last().find("no gradient buffer now"), std::string::npos) << last();
  ASSERT_EQ(zd_forward_end(m, mod_), ZD_OK);

  ASSERT_EQ(zd_backward_begin(m, mod_), ZD_OK);
  EXPECT_EQ(zd_backward_begin(m, mod_), ZD_ERR_INVALID_STATE);
  EXPECT_EQ(zd_step(m, &r), ZD_ERR_INVALID_STATE);
  EXPECT_NE(last().find("still in backward"), std::string::npos) << last();
  EXPECT_EQ(zd_param_write(m, p_, ZD_DTYPE_F32, "\0\0\0\0\0\0\0\0\0\0\0", 12), ZD_ERR_INVALID_STATE);
  ASSERT_EQ(zd_grad_view(m, p_, &v), ZD_OK);
  static_cast<float*>(v.data)[0] = 1.0f;
  ASSERT_EQ(zd_backward_end(m, mod_), ZD_OK);

  // After all of that, the step is the one the correct calls asked for.
  ASSERT_EQ(zd_step(m, &r), ZD_OK) << last();
  EXPECT_EQ(r.step, 1);
  EXPECT_EQ(r.micro_step, 1);
  EXPECT_EQ(read(m, p_, 3), (std::vector<float>{0, 2, 3}));
  zd_model_destroy(m);
}

TEST_F(StepTest, CallsBeforeFinalizeAreRefused) {
  zd_model* m = model(sgd_job());
  add(m, "w", "layer", {3});
  zd_step_result r = ZD_STEP_RESULT_INIT;
  EXPECT_EQ(zd_step(m, &r), ZD_ERR_INVALID_STATE);
  EXPECT_EQ(zd_forward_begin(m, 0), ZD_ERR_INVALID_STATE);
  float buf[3];
  EXPECT_EQ(zd_param_read(m, 0, ZD_DTYPE_F32, buf, sizeof buf), ZD_ERR_INVALID_STATE);
  zd_model_destroy(m);
}

TEST_F(StepTest, ReadAndWriteWholeParameters) {
  zd_model* m = one_param(sgd_job());
  const float v[3] = {7, 8, 9};
  ASSERT_EQ(zd_param_write(m, p_, ZD_DTYPE_F32, v, sizeof v), ZD_OK) << last();
  EXPECT_EQ(read(m, p_, 3), (std::vector<float>{7, 8, 9}));
  float small[2];
  EXPECT_EQ(zd_param_read(m, p_, ZD_DTYPE_F32, small, sizeof small), ZD_ERR_SHAPE_MISMATCH);
  EXPECT_NE(last().find("'w': it has 3 elements (12 bytes as f32), the buffer has 8 bytes"),
            std::string::npos) << last();
  EXPECT_EQ(zd_param_write(m, p_, ZD_DTYPE_F32, v, 8), ZD_ERR_SHAPE_MISMATCH);
  EXPECT_EQ(zd_param_read(m, p_, 77, small, 8), ZD_ERR_INVALID_ARGUMENT);
  // Reading as bf16 converts.
  uint16_t h[3];
  ASSERT_EQ(zd_param_read(m, p_, ZD_DTYPE_BF16, h, sizeof h), ZD_OK);
  EXPECT_EQ(h[0], 0x40e0);  // 7.0
  zd_model_destroy(m);
}

TEST_F(StepTest, LearningRateComesFromTheScriptsSchedule) {
  zd_model* m = one_param(
      "return { optimizer = { type = 'sgd', lr = 1.0 },\n"
      "  lr = function(step) return 0.5 / (step + 1) end }",
      {0, 0, 0});
  zd_step_result r = micro_step(m, mod_, p_, {1, 1, 1});
  EXPECT_DOUBLE_EQ(r.lr, 0.5);
  r = micro_step(m, mod_, p_, {1, 1, 1});
  EXPECT_DOUBLE_EQ(r.lr, 0.25);
  EXPECT_EQ(read(m, p_, 3), (std::vector<float>{-0.75f, -0.75f, -0.75f}));
  zd_model_destroy(m);
}

// zd_model_set_lr (ABI 1.7): the trainer's lr in place of the job's
// schedule. An update at a set lr is the update of a job whose lr that is,
// bit for bit (AdamW: its weight decay is scaled by the lr too), whatever
// the job's own schedule says, and zd_step_result.lr reports it.
TEST_F(StepTest, AnUpdateAtASetLrIsTheJobsUpdateAtThatLr) {
  zd_model* want = one_param("return { optimizer = { type = 'adamw', lr = 0.003, weight_decay = 0.1 } }");
  zd_model* got = one_param(
      "return { optimizer = { type = 'adamw', lr = 0.05, weight_decay = 0.1 },\n"
      "  lr = function(step) return 0.05 / (step + 1) end }");
  EXPECT_DOUBLE_EQ(micro_step(got, mod_, p_, {0, 0, 0}).lr, 0.05) << "the schedule, before any set_lr";
  ASSERT_EQ(zd_model_set_step(got, 0), ZD_OK) << last();  // back to update 1, as `want`
  std::vector<float> w(3);
  ASSERT_EQ(zd_param_read(want, p_, ZD_DTYPE_F32, w.data(), 12), ZD_OK) << last();
  ASSERT_EQ(zd_param_write(got, p_, ZD_DTYPE_F32, w.data(), 12), ZD_OK) << last();
  ASSERT_EQ(zd_model_set_lr(got, 0.003), ZD_OK) << last();
  for (int s = 0; s < 4; ++s) {
    const std::vector<float> g = {0.5f - 0.25f * static_cast<float>(s), -1.0f, 2.0f};
    const zd_step_result a = micro_step(want, mod_, p_, g);
    const zd_step_result b = micro_step(got, mod_, p_, g);
    EXPECT_EQ(b.lr, 0.003) << "update " << s + 1;
    EXPECT_EQ(b.lr, a.lr);
    EXPECT_EQ(b.step, a.step);
    EXPECT_EQ(read(got, p_, 3), read(want, p_, 3)) << "update " << s + 1;
  }
  zd_model_destroy(want);
  zd_model_destroy(got);
}

// It may be called inside an accumulation window, between modules: the lr
// is read at the window's boundary. A set lr holds until the next one.
TEST_F(StepTest, ASetLrAppliesFromTheNextBoundaryAndHolds) {
  zd_model* m = one_param(sgd_job("gradient_accumulation_steps = 2", 1.0), {0, 0, 0});
  EXPECT_FALSE(micro_step(m, mod_, p_, {1, 1, 1}).flags & ZD_STEP_BOUNDARY);
  ASSERT_EQ(zd_model_set_lr(m, 0.5), ZD_OK) << last();
  zd_step_result r = micro_step(m, mod_, p_, {1, 1, 1});
  ASSERT_TRUE(r.flags & ZD_STEP_APPLIED);
  EXPECT_EQ(r.lr, 0.5);
  EXPECT_EQ(read(m, p_, 3), (std::vector<float>{-0.5f, -0.5f, -0.5f}));
  micro_step(m, mod_, p_, {2, 2, 2});
  r = micro_step(m, mod_, p_, {2, 2, 2});
  EXPECT_EQ(r.lr, 0.5) << "the lr set holds at later boundaries";
  EXPECT_EQ(read(m, p_, 3), (std::vector<float>{-1.5f, -1.5f, -1.5f}));
  ASSERT_EQ(zd_model_set_lr(m, 0.0), ZD_OK) << last();  // 0 is a learning rate: nothing moves
  micro_step(m, mod_, p_, {2, 2, 2});
  EXPECT_EQ(micro_step(m, mod_, p_, {2, 2, 2}).lr, 0.0);
  EXPECT_EQ(read(m, p_, 3), (std::vector<float>{-1.5f, -1.5f, -1.5f}));
  zd_model_destroy(m);
}

// What set_lr refuses changes nothing: the lr in force stays.
TEST_F(StepTest, SetLrRefusesWhatIsNoLearningRateAndCallsInsideAModule) {
  zd_model* unfinalized = model(sgd_job());
  add(unfinalized, "w", "layer", {3});
  EXPECT_EQ(zd_model_set_lr(unfinalized, 0.1), ZD_ERR_INVALID_STATE) << last();
  zd_model_destroy(unfinalized);
  zd_model* m = one_param(sgd_job("", 0.5));
  const double inf = std::numeric_limits<double>::infinity();
  for (const auto& [bad, text] : {std::pair{std::nan(""), "nan"}, std::pair{inf, "inf"}, std::pair{-inf, "-inf"},
                                  std::pair{-0.5, "-0.5"}}) {
    EXPECT_EQ(zd_model_set_lr(m, bad), ZD_ERR_INVALID_ARGUMENT) << text;
    EXPECT_EQ(last(), std::string("zd_model_set_lr: the learning rate is ") + text + "; it must be finite and >= 0");
  }
  EXPECT_EQ(zd_model_set_lr(nullptr, 0.1), ZD_ERR_INVALID_ARGUMENT);
  ASSERT_EQ(zd_forward_begin(m, mod_), ZD_OK) << last();
  EXPECT_EQ(zd_model_set_lr(m, 0.1), ZD_ERR_INVALID_STATE);
  EXPECT_EQ(last(), "zd_model_set_lr while modules are begun; call it between modules (it sets the lr from the next "
                    "accumulation boundary on)");
  ASSERT_EQ(zd_forward_end(m, mod_), ZD_OK) << last();
  const zd_step_result r = micro_step(m, mod_, p_, {1, 1, 1});
  EXPECT_EQ(r.lr, 0.5) << "the job's lr: nothing was set";
  EXPECT_EQ(read(m, p_, 3), (std::vector<float>{0.5f, 1.5f, 2.5f}));
  zd_model_destroy(m);
}

TEST_F(StepTest, AFailingScheduleIsAConfigErrorWithItsLineAndAppliesNothing) {
  zd_model* m = one_param(
      "return { optimizer = { type = 'sgd', lr = 1.0 },\n"
      "  lr = function(step)\n"
      "    if step > 0 then error('schedule broke') end\n"
      "    return 0.1 end }");
  micro_step(m, mod_, p_, {1, 1, 1});
  const auto before = read(m, p_, 3);
  ASSERT_EQ(zd_backward_begin(m, mod_), ZD_OK);
  zd_view g = ZD_VIEW_INIT;
  ASSERT_EQ(zd_grad_view(m, p_, &g), ZD_OK);
  static_cast<float*>(g.data)[0] = 1.0f;
  ASSERT_EQ(zd_backward_end(m, mod_), ZD_OK);
  zd_step_result r = ZD_STEP_RESULT_INIT;
  EXPECT_EQ(zd_step(m, &r), ZD_ERR_CONFIG);
  EXPECT_NE(last().find("test.lua:3: schedule broke"), std::string::npos) << last();
  EXPECT_EQ(read(m, p_, 3), before);
  zd_model_destroy(m);
}

TEST_F(StepTest, AScheduleReturningANonNumberIsNamed) {
  zd_model* m = one_param("return { optimizer = { type = 'sgd' },\n lr = function(s) return 'x' end }");
  ASSERT_EQ(zd_backward_begin(m, mod_), ZD_OK);
  ASSERT_EQ(zd_backward_end(m, mod_), ZD_OK);
  zd_step_result r = ZD_STEP_RESULT_INIT;
  EXPECT_EQ(zd_step(m, &r), ZD_ERR_CONFIG);
  EXPECT_NE(last().find("test.lua:2: lr(0) returned a string"), std::string::npos) << last();
  zd_model_destroy(m);
}

TEST_F(StepTest, NonFiniteGradientsSkipTheStepInFp32Too) {
  zd_model* m = one_param(sgd_job());
  const zd_step_result r = micro_step(m, mod_, p_, {1, std::numeric_limits<float>::quiet_NaN(), 0});
  EXPECT_TRUE(r.flags & ZD_STEP_SKIPPED);
  EXPECT_FALSE(r.flags & ZD_STEP_APPLIED);
  EXPECT_EQ(r.step, 0);
  EXPECT_TRUE(std::isnan(r.grad_norm));
  EXPECT_EQ(read(m, p_, 3), (std::vector<float>{1, 2, 3}));
  // The bad gradients are gone: the next step is clean.
  const zd_step_result r2 = micro_step(m, mod_, p_, {1, 1, 1});
  EXPECT_TRUE(r2.flags & ZD_STEP_APPLIED);
  EXPECT_EQ(read(m, p_, 3), (std::vector<float>{0.9f, 1.9f, 2.9f}));
  zd_model_destroy(m);
}

namespace {
uint16_t to_half(float f) {  // exact for the small values used here
  if (f == 0) return 0;
  int e;
  const float m = std::frexp(std::fabs(f), &e);
  const uint16_t sign = f < 0 ? 0x8000 : 0;
  return sign | static_cast<uint16_t>(((e + 14) << 10) | (static_cast<int>(m * 2048) & 0x3ff));
}
float from_half(uint16_t h) {
  const int e = (h >> 10) & 31;
  const float v = std::ldexp(static_cast<float>((h & 0x3ff) | 0x400), e - 25);
  return (h & 0x8000) ? -v : v;
}
}  // namespace

TEST_F(StepTest, Fp16OverflowSkipsTheStepAndLowersTheScale) {
  zd_model* m = model(
      "return { precision = 'fp16', optimizer = { type = 'sgd', lr = 1.0 },\n"
      "  fp16 = { initial_scale_power = 4, hysteresis = 1, loss_scale_window = 2 } }");
  const std::vector<float> init = {1, 2, 3};
  zd_param_desc d = ZD_PARAM_DESC_INIT;
  int64_t shape[1] = {3};
  d.dtype = ZD_DTYPE_F16;
  d.name = "w";
  d.module = "layer";
  d.ndim = 1;
  d.shape = shape;
  d.init = init.data();
  d.init_dtype = ZD_DTYPE_F32;
  zd_param_id p = -1;
  ASSERT_EQ(zd_model_register_param(m, &d, &p), ZD_OK) << last();
  ASSERT_EQ(zd_model_finalize(m), ZD_OK) << last();
  const zd_module_id mod = module_id(m, "layer");
  double scale = 0;
  ASSERT_EQ(zd_model_loss_scale(m, &scale), ZD_OK);
  EXPECT_EQ(scale, 16.0);

  auto run = [&](float g0) {
    EXPECT_EQ(zd_backward_begin(m, mod), ZD_OK);
    zd_view g = ZD_VIEW_INIT;
    EXPECT_EQ(zd_grad_view(m, p, &g), ZD_OK);
    EXPECT_EQ(g.dtype, ZD_DTYPE_F16);
    uint16_t* gh = static_cast<uint16_t*>(g.data);
    gh[0] = std::isinf(g0) ? 0x7c00 : to_half(g0 * static_cast<float>(scale));
    gh[1] = gh[2] = 0;
    EXPECT_EQ(zd_backward_end(m, mod), ZD_OK);
    zd_step_result r = ZD_STEP_RESULT_INIT;
    EXPECT_EQ(zd_step(m, &r), ZD_OK) << last();
    zd_model_loss_scale(m, &scale);
    return r;
  };
  zd_step_result r = run(std::numeric_limits<float>::infinity());
  EXPECT_TRUE(r.flags & ZD_STEP_SKIPPED);
  EXPECT_EQ(r.loss_scale, 8.0);
  EXPECT_EQ(scale, 8.0);
  EXPECT_EQ(read(m, p, 3), (std::vector<float>{1, 2, 3}));
  // A clean step: the gradient is unscaled before the update.
  r = run(0.5f);
  EXPECT_TRUE(r.flags & ZD_STEP_APPLIED);
  EXPECT_NEAR(r.grad_norm, 0.5, 1e-6);
  EXPECT_EQ(read(m, p, 3), (std::vector<float>{0.5f, 2, 3}));
  // Two clean steps since the overflow (the window) double the scale.
  r = run(0.0f);
  EXPECT_EQ(scale, 16.0);
  // The fp16 working copy is the rounded master.
  ASSERT_EQ(zd_forward_begin(m, mod), ZD_OK);
  zd_view v = ZD_VIEW_INIT;
  ASSERT_EQ(zd_param_view(m, p, &v), ZD_OK);
  const uint16_t* wh = static_cast<const uint16_t*>(v.data);
  EXPECT_EQ(from_half(wh[0]), 0.5f);
  EXPECT_EQ(from_half(wh[2]), 3.0f);
  ASSERT_EQ(zd_forward_end(m, mod), ZD_OK);
  zd_model_destroy(m);
}

namespace {
constexpr uint16_t kHalfNan = 0x7e00;

// One window of the fp16 parameter p whose gradients are all `half`;
// zd_step's status, its result in *r.
zd_status fp16_window(zd_model* m, zd_module_id mod, zd_param_id p, uint16_t half, zd_step_result* r) {
  EXPECT_EQ(zd_backward_begin(m, mod), ZD_OK) << last();
  zd_view g = ZD_VIEW_INIT;
  EXPECT_EQ(zd_grad_view(m, p, &g), ZD_OK) << last();
  EXPECT_EQ(g.dtype, ZD_DTYPE_F16);
  uint16_t* gh = static_cast<uint16_t*>(g.data);
  for (int i = 0; i < 3; ++i) gh[i] = half;
  EXPECT_EQ(zd_backward_end(m, mod), ZD_OK) << last();
  return zd_step(m, r);
}
}  // namespace

// A run whose gradients stay NaN used to skip every step at the minimum
// scale forever, saying nothing. As DeepSpeed's ZeRO scaler, zd_step now
// fails there, the window skipped whole, and the model trains on if the
// trainer goes on; each overflow before it is logged.
TEST_F(StepTest, Fp16NanWindowsFailAtTheMinimumScale) {
  zd_model* m = model("return { precision = 'fp16', optimizer = { type = 'sgd', lr = 1.0 },\n"
                      "  fp16 = { initial_scale_power = 2 } }");  // hysteresis 2, min_loss_scale 1
  const zd_param_id p = add(m, "w", "layer", {3}, {1, 2, 3}, ZD_DTYPE_F16);
  ASSERT_EQ(zd_model_finalize(m), ZD_OK) << last();
  const zd_module_id mod = module_id(m, "layer");
  testing::internal::CaptureStderr();
  // 4 tolerated, 4 -> 2, 2 -> 1: skipped; then at the minimum: the error.
  for (const double scale : {4.0, 2.0, 1.0}) {
    zd_step_result r = ZD_STEP_RESULT_INIT;
    ASSERT_EQ(fp16_window(m, mod, p, kHalfNan, &r), ZD_OK) << last();
    EXPECT_TRUE(r.flags & ZD_STEP_SKIPPED);
    EXPECT_EQ(r.loss_scale, scale);
  }
  zd_step_result r = ZD_STEP_RESULT_INIT;
  EXPECT_EQ(fp16_window(m, mod, p, kHalfNan, &r), ZD_ERR_CONFIG);
  const std::string error = last();
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(error.find("step 1: the gradients hold inf or NaN with the loss scale already at "
                       "fp16.min_loss_scale (1)"),
            std::string::npos) << error;
  EXPECT_NE(error.find("lower the learning rate"), std::string::npos) << error;
  EXPECT_NE(error.find("fp16.raise_error_at_min_scale = false"), std::string::npos) << error;
  if (!daemon_mode()) {  // a daemon logs in its own process, not the trainer's stderr
    EXPECT_NE(log.find("step 1 skipped (overflow 1): the gradients hold inf or NaN; loss scale 4 kept"),
              std::string::npos) << log;
    EXPECT_NE(log.find("(overflow 2): the gradients hold inf or NaN; loss scale 4 -> 2"), std::string::npos) << log;
    EXPECT_NE(log.find("(overflow 3): the gradients hold inf or NaN; loss scale 2 -> 1"), std::string::npos) << log;
  }
  EXPECT_EQ(read(m, p, 3), (std::vector<float>{1, 2, 3}));
  // Nothing of the failed window is left: a clean one applies.
  EXPECT_EQ(fp16_window(m, mod, p, 0x3c00 /* 1.0 */, &r), ZD_OK) << last();
  EXPECT_TRUE(r.flags & ZD_STEP_APPLIED);
  EXPECT_EQ(r.step, 1);
  EXPECT_EQ(read(m, p, 3), (std::vector<float>{0, 1, 2}));
  zd_model_destroy(m);
}

// fp16.raise_error_at_min_scale = false: NaN windows skip at the minimum
// scale and go on, logged (the first 5, then every 100th).
TEST_F(StepTest, Fp16NanWindowsSkipAndLogWithoutRaiseErrorAtMinScale) {
  zd_model* m = model("return { precision = 'fp16', optimizer = { type = 'sgd', lr = 1.0 },\n"
                      "  fp16 = { initial_scale_power = 0, hysteresis = 1, raise_error_at_min_scale = false } }");
  const zd_param_id p = add(m, "w", "layer", {3}, {1, 2, 3}, ZD_DTYPE_F16);
  ASSERT_EQ(zd_model_finalize(m), ZD_OK) << last();
  const zd_module_id mod = module_id(m, "layer");
  testing::internal::CaptureStderr();
  for (int i = 0; i < 100; ++i) {
    zd_step_result r = ZD_STEP_RESULT_INIT;
    ASSERT_EQ(fp16_window(m, mod, p, kHalfNan, &r), ZD_OK) << last();
    EXPECT_TRUE(r.flags & ZD_STEP_SKIPPED);
    EXPECT_EQ(r.loss_scale, 1.0);
  }
  const std::string log = testing::internal::GetCapturedStderr();
  if (!daemon_mode()) {  // a daemon logs in its own process, not the trainer's stderr
    EXPECT_NE(log.find("zerod[warn] step 1 skipped (overflow 1): the gradients hold inf or NaN; loss scale 1 is "
                       "fp16.min_loss_scale already and cannot go lower"),
              std::string::npos) << log;
    EXPECT_NE(log.find("(overflow 5): the gradients hold inf or NaN; loss scale 1 is fp16.min_loss_scale already "
                       "and cannot go lower; further overflows are logged every 100th"),
              std::string::npos) << log;
    EXPECT_EQ(log.find("(overflow 6)"), std::string::npos) << log;
    EXPECT_EQ(log.find("(overflow 99)"), std::string::npos) << log;
    EXPECT_NE(log.find("(overflow 100)"), std::string::npos) << log;
  }
  EXPECT_EQ(read(m, p, 3), (std::vector<float>{1, 2, 3}));
  zd_model_destroy(m);
}

TEST_F(StepTest, Bf16WorkingCopyOverAnFp32Master) {
  zd_model* m = model("return { precision = 'bf16', optimizer = { type = 'sgd', lr = 1e-3 } }");
  const std::vector<float> init = {1, 1, 1};
  const zd_param_id p = add(m, "w", "layer", {3}, init, ZD_DTYPE_BF16);
  ASSERT_EQ(zd_model_finalize(m), ZD_OK) << last();
  const zd_module_id mod = module_id(m, "layer");
  // 1 - 1e-3 is not representable in bf16 (step 2^-7 near 1): the master
  // keeps it, the working copy rounds back to 1.
  ASSERT_EQ(zd_backward_begin(m, mod), ZD_OK);
  zd_view g = ZD_VIEW_INIT;
  ASSERT_EQ(zd_grad_view(m, p, &g), ZD_OK);
  EXPECT_EQ(g.dtype, ZD_DTYPE_BF16);
  uint16_t* gh = static_cast<uint16_t*>(g.data);
  gh[0] = gh[1] = gh[2] = 0x3f80;  // 1.0
  ASSERT_EQ(zd_backward_end(m, mod), ZD_OK);
  zd_step_result r = ZD_STEP_RESULT_INIT;
  ASSERT_EQ(zd_step(m, &r), ZD_OK) << last();
  EXPECT_EQ(r.loss_scale, 1.0);  // no scaling in bf16
  const auto master = read(m, p, 3);
  EXPECT_FLOAT_EQ(master[0], 1.0f - 1e-3f);
  ASSERT_EQ(zd_forward_begin(m, mod), ZD_OK);
  zd_view v = ZD_VIEW_INIT;
  ASSERT_EQ(zd_param_view(m, p, &v), ZD_OK);
  EXPECT_EQ(v.dtype, ZD_DTYPE_BF16);
  EXPECT_EQ(v.nbytes, 6u);
  EXPECT_EQ(static_cast<const uint16_t*>(v.data)[0], 0x3f80);
  ASSERT_EQ(zd_forward_end(m, mod), ZD_OK);
  zd_model_destroy(m);
}
