// Loading optimizer plugins: versions, broken plugins, the search path.
#include "abi_fixture.h"

#include <zerod/zerod_plugin.h>

using namespace zerod_test;

#ifndef ZEROD_FAKE_PLUGIN_DIR
#error "the build passes ZEROD_FAKE_PLUGIN_DIR"
#endif

class PluginTest : public AbiTest {
 protected:
  zd_status load(const std::string& name) {
    const std::string job = "return { plugin_path = '" ZEROD_FAKE_PLUGIN_DIR
                            "', optimizer = { type = '" + name + "' } }";
    zd_model* m = nullptr;
    const zd_status st = create(job, &m);
    model_ = m;
    return st;
  }
  void TearDown() override {
    zd_model_destroy(model_);
    AbiTest::TearDown();
  }
  zd_model* model_ = nullptr;
};

TEST_F(PluginTest, AGoodPluginFromTheJobsPluginPathTrains) {
  ASSERT_EQ(load("fake"), ZD_OK) << last();
  const zd_param_id p = add(model_, "w", "l", {2}, {1, 1});
  ASSERT_EQ(zd_model_finalize(model_), ZD_OK) << last();
  micro_step(model_, module_id(model_, "l"), p, {1, 2});
  EXPECT_EQ(read(model_, p, 2), (std::vector<float>{0.9f, 0.8f}));
}

TEST_F(PluginTest, APluginFromTheFutureIsRefusedWithBothVersions) {
  EXPECT_EQ(load("fakefuture"), ZD_ERR_VERSION);
  EXPECT_NE(last().find("optimizer plugin ABI version expected " + std::to_string(ZD_OPTIMIZER_ABI_VERSION) +
                        " (or older), got 99"),
            std::string::npos) << last();
  EXPECT_NE(last().find("zd_optimizer_fakefuture.so"), std::string::npos) << last();
}

TEST_F(PluginTest, TheNewestVersionTheHostKnowsIsChosen) {
  ASSERT_EQ(load("fakemulti"), ZD_OK) << last();
}

TEST_F(PluginTest, AFileWithoutTheEntryPointIsNotAPlugin) {
  EXPECT_EQ(load("fakenoentry"), ZD_ERR_PLUGIN);
  EXPECT_NE(last().find("exports no zd_plugin_descriptors()"), std::string::npos) << last();
}

TEST_F(PluginTest, ADescriptorWithAnotherNameIsRefused) {
  EXPECT_EQ(load("fakemisnamed"), ZD_ERR_PLUGIN);
  EXPECT_NE(last().find("describes optimizer 'other', not 'fakemisnamed'"), std::string::npos)
      << last();
}

TEST_F(PluginTest, ADescriptorMissingAFunctionIsRefused) {
  EXPECT_EQ(load("fakeincomplete"), ZD_ERR_PLUGIN);
  EXPECT_NE(last().find("leaves a required function empty"), std::string::npos) << last();
}

TEST_F(PluginTest, APluginThatRefusesItsConfigSaysWhy) {
  EXPECT_EQ(load("fakerefuses"), ZD_ERR_CONFIG);
  EXPECT_NE(last().find("fake refuses: lr must be exactly 42"), std::string::npos) << last();
  EXPECT_NE(last().find("test.lua:1:"), std::string::npos) << last();
}

TEST_F(PluginTest, ANameThatIsNotAFileNameIsRefused) {
  EXPECT_NE(load("../../etc/passwd"), ZD_OK);
  EXPECT_NE(last().find("may hold only letters"), std::string::npos) << last();
}
