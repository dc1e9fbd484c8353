// A compressing optimizer's schedules in a job script (compression.warmup,
// compression.sync: Lua functions of the step, like lr) and its stage
// checks, through the ABI.
#include "abi_fixture.h"

using namespace zerod_test;

#ifndef ZEROD_FAKE_PLUGIN_DIR
#error "the build passes ZEROD_FAKE_PLUGIN_DIR"
#endif

class CompressionScript : public AbiTest {
 protected:
  std::string error_of(const std::string& script) {
    zd_model* m = nullptr;
    const zd_status st = create(script, &m);
    zd_model_destroy(m);
    return st == ZD_OK ? "" : last();
  }

  // Trains one parameter for `steps` steps on one rank and returns it.
  std::vector<float> train(const std::string& script, int steps) {
    zd_model* m = model(script);
    if (m == nullptr) return {};
    const size_t n = 300;
    std::vector<float> init(n);
    for (size_t i = 0; i < n; ++i) init[i] = 0.01f * static_cast<float>(i % 17) - 0.08f;
    const zd_param_id p = add(m, "w", "layer", {static_cast<int64_t>(n)}, init);
    EXPECT_EQ(zd_model_finalize(m), ZD_OK) << last();
    const zd_module_id mod = module_id(m, "layer");
    for (int s = 0; s < steps; ++s) {
      std::vector<float> g(n);
      for (size_t i = 0; i < n; ++i) g[i] = 0.1f * static_cast<float>(((i + 3 * s) % 11)) - 0.5f;
      EXPECT_EQ(zd_forward_begin(m, mod), ZD_OK) << last();
      EXPECT_EQ(zd_forward_end(m, mod), ZD_OK) << last();
      EXPECT_EQ(zd_backward_begin(m, mod), ZD_OK) << last();
      zd_view v = ZD_VIEW_INIT;
      EXPECT_EQ(zd_grad_view(m, p, &v), ZD_OK) << last();
      for (size_t i = 0; i < n; ++i) static_cast<float*>(v.data)[i] = g[i];
      EXPECT_EQ(zd_backward_end(m, mod), ZD_OK) << last();
      zd_step_result r = ZD_STEP_RESULT_INIT;
      EXPECT_EQ(zd_step(m, &r), ZD_OK) << last();
    }
    std::vector<float> out = read(m, p, n);
    zd_model_destroy(m);
    return out;
  }
};

TEST_F(CompressionScript, SchedulesAreCheckedLikeAnyKey) {
  const std::string e = error_of("return { optimizer = { type = 'onebit_adam' },\n compression = { warmup = 5 } }");
  EXPECT_NE(e.find("test.lua:2: compression.warmup: must be a function"), std::string::npos) << e;
  const std::string e2 = error_of("return { optimizer = { type = 'onebit_adam' },\n"
                                  " compression = { warmpu = function(step) return true end } }");
  EXPECT_NE(e2.find("test.lua:2:"), std::string::npos) << e2;
  EXPECT_NE(e2.find("unknown key 'compression.warmpu' (did you mean 'compression.warmup'?)"), std::string::npos) << e2;
}

TEST_F(CompressionScript, APluginWithAFixedScheduleRefusesOne) {
  const std::string e = error_of(std::string("return { plugin_path = '") + ZEROD_FAKE_PLUGIN_DIR +
                                 "', optimizer = { type = 'onebit_adam_v2' },\n"
                                 " compression = { warmup = function(step) return step < 3 end } }");
  EXPECT_NE(e.find("'onebit_adam_v2' (plugin ABI version 2) has a fixed schedule"), std::string::npos) << e;
}

TEST_F(CompressionScript, ReplayIsCheckedWhereTheScriptSaysIt) {
  const std::string e = error_of("return { optimizer = { type = 'onebit_adam' },\n compression = { replay = 'yes' } }");
  EXPECT_NE(e.find("test.lua:2: compression.replay: must be a boolean"), std::string::npos) << e;
  const std::string s0 = error_of("return { optimizer = { type = 'onebit_adam' },\n compression = { replay = true } }");
  EXPECT_NE(s0.find("test.lua:2: compression.replay: replays what stages 1-3 all-gather"), std::string::npos) << s0;
  EXPECT_NE(s0.find("(zero.stage = 1, 2 or 3)"), std::string::npos) << s0;
  EXPECT_EQ(error_of("return { optimizer = { type = 'onebit_adam' }, zero = { stage = 3 },\n"
                     " compression = { replay = true } }"),
            "");
  const std::string bf = error_of("return { optimizer = { type = 'onebit_adam' }, zero = { stage = 1 }, precision = "
                                  "'bf16',\n compression = { replay = true } }");
  EXPECT_NE(bf.find("test.lua:2: compression.replay: needs fp32 working copies"), std::string::npos) << bf;
  const std::string adam = error_of("return { optimizer = { type = 'adamw' }, zero = { stage = 1 },\n"
                                    " compression = { replay = true } }");
  EXPECT_NE(adam.find("optimizer 'adamw' never compresses"), std::string::npos) << adam;
  const std::string v2 = error_of(std::string("return { plugin_path = '") + ZEROD_FAKE_PLUGIN_DIR +
                                  "', optimizer = { type = 'onebit_adam_v2' }, zero = { stage = 1 },\n"
                                  " compression = { replay = true } }");
  EXPECT_NE(v2.find("test.lua:2: compression.replay: optimizer 'onebit_adam_v2' plans no compressed step that "
                    "another rank can replay"),
            std::string::npos)
      << v2;
  EXPECT_EQ(error_of("return { optimizer = { type = 'onebit_lamb' }, zero = { stage = 1 },\n"
                     " compression = { replay = true } }"),
            "");
  EXPECT_EQ(error_of("return { optimizer = { type = 'onebit_adam' }, zero = { stage = 2 },\n"
                     " compression = { replay = true } }"),
            "");
  EXPECT_EQ(error_of("return { optimizer = { type = 'zero_one_adam', local_steps = false }, zero = { stage = 1 },\n"
                     " compression = { replay = true } }"),
            "");
}

TEST_F(CompressionScript, ZeroOneAdamsLocalStepsNeedStage0) {
  const std::string e = error_of("return { optimizer = { type = 'zero_one_adam' },\n zero = { stage = 2 } }");
  EXPECT_NE(e.find("test.lua:2: zero: optimizer 'zero_one_adam': local steps"), std::string::npos) << e;
  EXPECT_NE(e.find("which ZeRO stage 2 partitions; set local_steps = false"), std::string::npos) << e;
  EXPECT_EQ(error_of("return { optimizer = { type = 'zero_one_adam', local_steps = false }, zero = { stage = 2 } }"),
            "");
  EXPECT_EQ(error_of("return { optimizer = { type = 'zero_one_adam' }, zero = { stage = 0 } }"), "");
}

TEST_F(CompressionScript, TheJobsWarmupScheduleReplacesFreezeStep) {
  const auto by_freeze = train("return { optimizer = { type = 'onebit_adam', lr = 0.01, freeze_step = 2 } }", 6);
  const auto by_lua = train(
      "return { optimizer = { type = 'onebit_adam', lr = 0.01, freeze_step = 100 },\n"
      "  compression = { warmup = function(step) return step < 2 end } }",
      6);
  const auto later = train("return { optimizer = { type = 'onebit_adam', lr = 0.01, freeze_step = 4 } }", 6);
  ASSERT_FALSE(by_lua.empty());
  EXPECT_EQ(by_lua, by_freeze) << "warmup(step) is true for updates 1 and 2 (steps 0 and 1)";
  EXPECT_NE(later, by_freeze) << "the schedule decides something";
}

// The first call that needs the step's plan (the window's first backward,
// which decides whether its gradients stay local) asks the schedule.
TEST_F(CompressionScript, AScheduleThatReturnsANumberFailsWithItsLine) {
  zd_model* m = model("return { optimizer = { type = 'onebit_adam' },\n"
                      "  compression = { warmup = function(step) return 1 end } }");
  ASSERT_NE(m, nullptr);
  const zd_param_id p = add(m, "w", "layer", {8});
  (void)p;
  ASSERT_EQ(zd_model_finalize(m), ZD_OK) << last();
  const zd_module_id mod = module_id(m, "layer");
  ASSERT_EQ(zd_forward_begin(m, mod), ZD_OK) << last();
  ASSERT_EQ(zd_forward_end(m, mod), ZD_OK) << last();
  EXPECT_EQ(zd_backward_begin(m, mod), ZD_ERR_CONFIG);
  EXPECT_NE(last().find("test.lua:2: compression.warmup(0) returned a number; it must return true or false"),
            std::string::npos)
      << last();
  zd_model_destroy(m);
}
