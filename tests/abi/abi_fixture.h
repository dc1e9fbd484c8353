// Shared set-up for the ABI tests. They use nothing but zerod.h and connect
// to ZEROD_TEST_ENDPOINT if set, else where the environment says (the
// daemon under `zerod run`, embedded otherwise): the same suite runs
// against both.
#pragma once

#include <zerod/zerod.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace zerod_test {

inline const char* endpoint() {
  const char* e = std::getenv("ZEROD_TEST_ENDPOINT");
  return e && *e ? e : nullptr;
}

// Whether this run talks to a daemon.
inline bool daemon_mode() {
  const char* e = std::getenv("ZEROD_TEST_ENDPOINT");
  if (!e || !*e) e = std::getenv("ZEROD_ENDPOINT");
  return e && std::string(e).rfind("unix:", 0) == 0;
}

// "<status>: <message>" of the last failure on this thread, for assertions.
inline std::string last() { return zd_last_error(); }

// Sets an environment variable for the scope of a test, then puts it back.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_, old_.c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

class AbiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(zd_connect(endpoint(), nullptr, &client_), ZD_OK) << last();
  }
  void TearDown() override { zd_disconnect(client_); }

  // A model from script text; fails the test if it cannot be made.
  zd_model* model(const std::string& script) {
    zd_model* m = nullptr;
    const zd_status st = create(script, &m);
    EXPECT_EQ(st, ZD_OK) << last();
    return m;
  }
  zd_status create(const std::string& script, zd_model** out) {
    zd_model_options o = ZD_MODEL_OPTIONS_INIT;
    o.script_text = script.c_str();
    o.script_name = "test.lua";
    return zd_model_create(client_, &o, out);
  }

  static zd_param_id add(zd_model* m, const char* name, const char* module,
                         std::vector<int64_t> shape, const std::vector<float>& init = {},
                         zd_dtype dtype = ZD_DTYPE_F32) {
    zd_param_desc d = ZD_PARAM_DESC_INIT;
    d.dtype = dtype;
    d.name = name;
    d.module = module;
    d.ndim = static_cast<int32_t>(shape.size());
    d.shape = shape.data();
    d.init = init.empty() ? nullptr : init.data();
    d.init_dtype = ZD_DTYPE_F32;
    zd_param_id id = -1;
    EXPECT_EQ(zd_model_register_param(m, &d, &id), ZD_OK) << last();
    return id;
  }

  static zd_module_id module_id(zd_model* m, const char* name) {
    zd_module_id id = -1;
    EXPECT_EQ(zd_model_find_module(m, name, &id), ZD_OK) << last();
    return id;
  }

  static std::vector<float> read(zd_model* m, zd_param_id p, size_t n) {
    std::vector<float> v(n);
    EXPECT_EQ(zd_param_read(m, p, ZD_DTYPE_F32, v.data(), n * 4), ZD_OK) << last();
    return v;
  }

  // One micro-batch of a one-module model whose gradient is given directly.
  static zd_step_result micro_step(zd_model* m, zd_module_id mod, zd_param_id p,
                                   const std::vector<float>& grad) {
    EXPECT_EQ(zd_forward_begin(m, mod), ZD_OK) << last();
    EXPECT_EQ(zd_forward_end(m, mod), ZD_OK) << last();
    EXPECT_EQ(zd_backward_begin(m, mod), ZD_OK) << last();
    zd_view g = ZD_VIEW_INIT;
    EXPECT_EQ(zd_grad_view(m, p, &g), ZD_OK) << last();
    if (g.data) {
      float* gd = static_cast<float*>(g.data);
      for (size_t i = 0; i < grad.size(); ++i) gd[i] = grad[i];
    }
    EXPECT_EQ(zd_backward_end(m, mod), ZD_OK) << last();
    zd_step_result r = ZD_STEP_RESULT_INIT;
    EXPECT_EQ(zd_step(m, &r), ZD_OK) << last();
    return r;
  }

  zd_client* client_ = nullptr;
};

// A job with plain SGD, so every update can be checked by hand.
inline std::string sgd_job(const std::string& extra = "", double lr = 0.1) {
  return "return { optimizer = { type = 'sgd', lr = " + std::to_string(lr) + " }, " + extra + " }";
}

}  // namespace zerod_test
