// Creating models from job scripts, registering parameters, finalizing, and
// the lookups.
#include "abi_fixture.h"

#include <cstdio>
#include <fstream>
#include <string>
#include <unistd.h>

using namespace zerod_test;

class ModelTest : public AbiTest {};

TEST_F(ModelTest, CreatesFromAScriptFile) {
  char path[] = "/tmp/zerod-job-XXXXXX.lua";
  const int fd = mkstemps(path, 4);
  ASSERT_GE(fd, 0);
  const std::string text = sgd_job();
  ASSERT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  close(fd);
  zd_model_options o = ZD_MODEL_OPTIONS_INIT;
  o.script_path = path;
  zd_model* m = nullptr;
  EXPECT_EQ(zd_model_create(client_, &o, &m), ZD_OK) << last();
  zd_model_destroy(m);
  unlink(path);
}

TEST_F(ModelTest, AMissingScriptFileIsAnIoErrorNamingThePath) {
  zd_model_options o = ZD_MODEL_OPTIONS_INIT;
  o.script_path = "/nonexistent/dir/job.lua";
  zd_model* m = nullptr;
  EXPECT_EQ(zd_model_create(client_, &o, &m), ZD_ERR_IO);
  EXPECT_EQ(m, nullptr);
  EXPECT_NE(last().find("/nonexistent/dir/job.lua"), std::string::npos) << last();
}

TEST_F(ModelTest, TheJobScriptComesFromThePathTheTextOrZerodRun) {
  zd_model_options o = ZD_MODEL_OPTIONS_INIT;
  zd_model* m = nullptr;
  {
    ScopedEnv none("ZEROD_JOB", nullptr);
    EXPECT_EQ(zd_model_create(client_, &o, &m), ZD_ERR_INVALID_ARGUMENT);
    EXPECT_NE(last().find("ZEROD_JOB"), std::string::npos) << last();
  }
  {
    // `zerod run --job` names the job in ZEROD_JOB for options without one.
    char path[] = "/tmp/zerod-env-job-XXXXXX.lua";
    const int fd = mkstemps(path, 4);
    ASSERT_GE(fd, 0);
    const std::string text = sgd_job();
    ASSERT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
    close(fd);
    ScopedEnv job("ZEROD_JOB", path);
    EXPECT_EQ(zd_model_create(client_, &o, &m), ZD_OK) << last();
    zd_model_destroy(m);
    unlink(path);
  }
  o.script_path = "a.lua";
  o.script_text = "return {}";
  EXPECT_EQ(zd_model_create(client_, &o, &m), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(zd_model_create(client_, nullptr, &m), ZD_ERR_INVALID_ARGUMENT);
}

TEST_F(ModelTest, ASyntaxErrorNamesTheScriptAndLine) {
  zd_model* m = nullptr;
  EXPECT_EQ(create("return {\n  precision = 'fp32',\n  zero = { stage = 0 \n", &m), ZD_ERR_CONFIG);
  EXPECT_NE(last().find("test.lua:"), std::string::npos) << last();
}

TEST_F(ModelTest, EveryConfigProblemIsReportedTogetherWithItsLine) {
  zd_model* m = nullptr;
  const std::string script =
      "return {\n"
      "  optimizer = { type = 'sgd', lr = -1 },\n"   // line 2: out of range
      "  gradient_clipp1ng = 1.0,\n"                 // line 3: typo
      "  precision = 'fp8',\n"                       // line 4: bad choice
      "  zero = { stage = 7 },\n"                    // line 5: out of range
      "}\n";
  ASSERT_EQ(create(script, &m), ZD_ERR_CONFIG);
  const std::string e = last();
  EXPECT_NE(e.find("test.lua:2: optimizer.lr: must be > 0, got -1"), std::string::npos) << e;
  EXPECT_NE(e.find("test.lua:3: unknown key 'gradient_clipp1ng' (did you mean 'gradient_clipping'?)"),
            std::string::npos) << e;
  EXPECT_NE(e.find("test.lua:4: precision: must be one of"), std::string::npos) << e;
  EXPECT_NE(e.find("test.lua:5: zero.stage: must be <= 3, got 7"), std::string::npos) << e;
}

TEST_F(ModelTest, AnUnknownOptimizerListsTheAvailableOnes) {
  zd_model* m = nullptr;
  ASSERT_EQ(create("return { optimizer = { type = 'adamx' } }", &m), ZD_ERR_CONFIG);
  EXPECT_NE(last().find("no optimizer plugin named 'adamx'"), std::string::npos) << last();
  EXPECT_NE(last().find("adamw"), std::string::npos) << last();
}

TEST_F(ModelTest, ABadHyperparameterCombinationIsAConfigError) {
  zd_model* m = nullptr;
  ASSERT_EQ(create("return { optimizer = { type = 'sgd', nesterov = true } }", &m), ZD_ERR_CONFIG);
  EXPECT_NE(last().find("nesterov"), std::string::npos) << last();
}

TEST_F(ModelTest, RegistrationErrorsNameTheParameterAndLeaveTheModelUsable) {
  zd_model* m = model(sgd_job());
  add(m, "w", "layer", {2, 3});
  zd_param_desc d = ZD_PARAM_DESC_INIT;
  int64_t shape[2] = {2, 3};
  d.name = "w";
  d.module = "layer";
  d.ndim = 2;
  d.shape = shape;
  zd_param_id id = -1;
  EXPECT_EQ(zd_model_register_param(m, &d, &id), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(zd_model_last_error(m)).find("'w' is already registered"), std::string::npos)
      << zd_model_last_error(m);
  int64_t bad[2] = {2, 0};
  d.name = "v";
  d.shape = bad;
  EXPECT_EQ(zd_model_register_param(m, &d, &id), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("'v' has extent 0 in dimension 1"), std::string::npos) << last();
  d.shape = shape;
  d.ndim = 9;
  EXPECT_EQ(zd_model_register_param(m, &d, &id), ZD_ERR_INVALID_ARGUMENT);
  d.ndim = 2;
  d.dtype = ZD_DTYPE_BF16;
  EXPECT_EQ(zd_model_register_param(m, &d, &id), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("precision"), std::string::npos) << last();
  d.dtype = ZD_DTYPE_F32;
  ASSERT_EQ(zd_model_register_param(m, &d, &id), ZD_OK) << last();
  EXPECT_EQ(id, 1);
  EXPECT_EQ(zd_model_finalize(m), ZD_OK) << last();
  zd_model_destroy(m);
}

TEST_F(ModelTest, FinalizeRules) {
  zd_model* m = model(sgd_job());
  EXPECT_EQ(zd_model_finalize(m), ZD_ERR_INVALID_STATE);  // nothing registered
  add(m, "w", "layer", {4});
  ASSERT_EQ(zd_model_finalize(m), ZD_OK) << last();
  EXPECT_EQ(zd_model_finalize(m), ZD_ERR_INVALID_STATE);
  EXPECT_NE(last().find("finalize called twice"), std::string::npos) << last();
  zd_param_desc d = ZD_PARAM_DESC_INIT;
  int64_t shape[1] = {4};
  d.name = "late";
  d.module = "layer";
  d.ndim = 1;
  d.shape = shape;
  EXPECT_EQ(zd_model_register_param(m, &d, nullptr), ZD_ERR_INVALID_STATE);
  EXPECT_NE(last().find("'late' registered after zd_model_finalize"), std::string::npos) << last();
  zd_model_destroy(m);
}

TEST_F(ModelTest, LookupsAndInfo) {
  zd_model* m = model(sgd_job());
  const zd_param_id a = add(m, "enc.w", "enc", {3, 5});
  const zd_param_id b = add(m, "dec.w", "dec", {7});
  const zd_param_id c = add(m, "enc.b", "enc", {5});
  int32_t n = 0;
  ASSERT_EQ(zd_model_param_count(m, &n), ZD_OK);
  EXPECT_EQ(n, 3);
  ASSERT_EQ(zd_model_module_count(m, &n), ZD_OK);
  EXPECT_EQ(n, 2);
  zd_param_id found = -1;
  ASSERT_EQ(zd_model_find_param(m, "dec.w", &found), ZD_OK);
  EXPECT_EQ(found, b);
  EXPECT_EQ(zd_model_find_param(m, "nope", &found), ZD_ERR_NOT_FOUND);
  EXPECT_NE(last().find("'nope'"), std::string::npos);
  zd_module_id enc = -1;
  ASSERT_EQ(zd_model_find_module(m, "enc", &enc), ZD_OK);
  EXPECT_EQ(zd_model_find_module(m, "mid", &enc), ZD_ERR_NOT_FOUND);
  ASSERT_EQ(zd_model_find_module(m, "enc", &enc), ZD_OK);

  zd_param_info info = ZD_PARAM_INFO_INIT;
  ASSERT_EQ(zd_model_param_info(m, a, &info), ZD_OK);
  EXPECT_STREQ(info.name, "enc.w");
  EXPECT_EQ(info.module, enc);
  EXPECT_EQ(info.ndim, 2);
  EXPECT_EQ(info.shape[0], 3);
  EXPECT_EQ(info.shape[1], 5);
  EXPECT_EQ(info.numel, 15);
  EXPECT_EQ(info.dtype, ZD_DTYPE_F32);
  EXPECT_EQ(zd_model_param_info(m, 42, &info), ZD_ERR_NOT_FOUND);

  const char* name = nullptr;
  int32_t count = 0;
  ASSERT_EQ(zd_model_module_info(m, enc, &name, nullptr, &count), ZD_OK);
  EXPECT_STREQ(name, "enc");
  EXPECT_EQ(count, 2);
  zd_param_id ids[1];
  count = 1;
  EXPECT_EQ(zd_model_module_info(m, enc, nullptr, ids, &count), ZD_ERR_BUFFER_TOO_SMALL);
  EXPECT_EQ(count, 2);
  zd_param_id ids2[2];
  ASSERT_EQ(zd_model_module_info(m, enc, nullptr, ids2, &count), ZD_OK);
  EXPECT_EQ(ids2[0], a);
  EXPECT_EQ(ids2[1], c);
  zd_model_destroy(m);
}

TEST_F(ModelTest, ErrorsAreKeptPerModelAndPerThread) {
  zd_model* m1 = model(sgd_job());
  zd_model* m2 = model(sgd_job());
  add(m1, "w", "l", {2});
  EXPECT_EQ(zd_forward_begin(m1, 0), ZD_ERR_INVALID_STATE);  // not finalized
  EXPECT_NE(std::string(zd_model_last_error(m1)).find("before zd_model_finalize"), std::string::npos);
  EXPECT_STREQ(zd_model_last_error(m2), "");
  EXPECT_EQ(last(), zd_model_last_error(m1));
  zd_model_destroy(m1);
  zd_model_destroy(m2);
}
