// zd_optimizer_onebit_lamb.so as the engine sees it: dlopen'ed, reached
// only through its v3 descriptor. What it tells the host at create.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "plugin_under_test.h"

namespace zerod::optim::test {
namespace {

using Log = PluginLog;

class OnebitLambPlugin : public ::testing::Test {
 protected:
  void SetUp() override {
    handle_ = open_plugin("zd_optimizer_onebit_lamb.so");
    ASSERT_NE(handle_, nullptr) << dlerror();
    for (const zd_plugin_header* h : plugin_headers(handle_))
      if (h->kind == ZD_PLUGIN_OPTIMIZER && h->abi_version == 3) d_ = reinterpret_cast<const zd_optimizer_v3*>(h);
    ASSERT_NE(d_, nullptr) << "no optimizer v3 descriptor";
    services_ = {sizeof(zd_host_services), ZD_ABI_VERSION, &log_, Log::sink};
  }
  void TearDown() override {
    for (void* i : instances_) d_->destroy(i);
    if (handle_ != nullptr) dlclose(handle_);
  }

  // Every hyperparameter at its default (a list's elements one after
  // another, as create takes them) but freeze_step.
  void* instance(double freeze_step) {
    std::vector<double> v;
    for (uint32_t i = 0; i < d_->hparam_count; ++i) {
      const zd_hparam_spec& h = d_->hparams[i];
      if (std::string(h.name) == "freeze_step") {
        v.push_back(freeze_step);
        continue;
      }
      v.insert(v.end(), h.defaults, h.defaults + h.count);
    }
    void* inst = nullptr;
    char err[256] = "";
    EXPECT_EQ(d_->create(&services_, v.data(), v.size(), &inst, err, sizeof err), ZD_OK) << err;
    if (inst != nullptr) instances_.push_back(inst);
    return inst;
  }

  void* handle_ = nullptr;
  const zd_optimizer_v3* d_ = nullptr;
  Log log_;
  zd_host_services services_{};
  std::vector<void*> instances_;
};

// Without a warm-up the frozen trust ratio stays 0 and no update moves a
// parameter: said once, at create, as 1-bit Adam says its freeze_step = 0.
TEST_F(OnebitLambPlugin, FreezeStepZeroNeverMovesAndWarns) {
  ASSERT_NE(instance(0), nullptr);
  ASSERT_EQ(log_.lines.size(), 1u);
  EXPECT_EQ(log_.lines[0].first, ZD_LOG_WARN);
  EXPECT_NE(log_.lines[0].second.find("freeze_step = 0"), std::string::npos) << log_.lines[0].second;
  EXPECT_NE(log_.lines[0].second.find("never move"), std::string::npos) << log_.lines[0].second;
  log_.lines.clear();
  ASSERT_NE(instance(3), nullptr);
  EXPECT_TRUE(log_.lines.empty());
}

}  // namespace
}  // namespace zerod::optim::test
