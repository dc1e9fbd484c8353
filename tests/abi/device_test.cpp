// Where the trainer computes: the job script's `device`, the override a
// trainer gives in zd_model_options (ABI 1.1), and the trainer's stream. On
// a machine without a GPU, asking for one is a clear error and "auto" is the
// cpu device; a daemon's ranks compute on the cpu device whatever the job
// says, and say so.
#include "abi_fixture.h"

#include <cstddef>
#include <cstring>

using namespace zerod_test;

namespace {

const char* kJob = "return { optimizer = { type = 'sgd', lr = 0.1 } }";

class DeviceTest : public AbiTest {
 protected:
  zd_status create_on(const char* device, const std::string& script, zd_model** out) {
    zd_model_options o = ZD_MODEL_OPTIONS_INIT;
    o.script_text = script.c_str();
    o.script_name = "device_job.lua";
    o.device = device;
    return zd_model_create(client_, &o, out);
  }
  // The device type of a parameter's view in a fresh one-parameter model.
  int32_t view_device(zd_model* m) {
    const zd_param_id p = add(m, "w", "layer", {4}, {1, 2, 3, 4});
    EXPECT_EQ(zd_model_finalize(m), ZD_OK) << last();
    const zd_module_id mod = module_id(m, "layer");
    EXPECT_EQ(zd_forward_begin(m, mod), ZD_OK) << last();
    zd_view v = ZD_VIEW_INIT;
    EXPECT_EQ(zd_param_view(m, p, &v), ZD_OK) << last();
    EXPECT_EQ(zd_forward_end(m, mod), ZD_OK) << last();
    return v.device_type;
  }
};

// Whether this process could train on a GPU: asking for one tells.
bool gpu_here(zd_client* c) {
  zd_model_options o = ZD_MODEL_OPTIONS_INIT;
  o.script_text = kJob;
  o.device = "cuda";
  zd_model* m = nullptr;
  const zd_status st = zd_model_create(c, &o, &m);
  zd_model_destroy(m);
  return st == ZD_OK;
}

}  // namespace

TEST_F(DeviceTest, TheDefaultIsTheCpuDevice) {
  zd_model* m = model(kJob);
  EXPECT_EQ(view_device(m), ZD_DEVICE_CPU);
  zd_model_destroy(m);
}

// The same in a daemon: its ranks compute on the device the job names, and
// their pools are shared with the trainer (CUDA memory on a GPU).
TEST_F(DeviceTest, AutoIsTheGpuWhereThereIsOne) {
  zd_model* m = nullptr;
  ASSERT_EQ(create_on("auto", kJob, &m), ZD_OK) << last();
  EXPECT_EQ(view_device(m), gpu_here(client_) ? ZD_DEVICE_CUDA : ZD_DEVICE_CPU);
  zd_model_destroy(m);
}

TEST_F(DeviceTest, CudaWhereThereIsNoneIsAClearError) {
  if (gpu_here(client_)) GTEST_SKIP() << "this machine has a GPU: cuda is not an error here";
  zd_model* m = nullptr;
  const zd_status st = create_on("cuda", kJob, &m);
  EXPECT_EQ(m, nullptr);
  const std::string msg = last();
  EXPECT_EQ(st, ZD_ERR_CONFIG) << msg;
  EXPECT_NE(msg.find("device = \"cuda\", but"), std::string::npos) << msg;
  EXPECT_NE(msg.find("set device = \"cpu\""), std::string::npos) << msg;
  // The job script asking for it is refused the same way, naming the script.
  const zd_status st2 = create(std::string("return { device = 'cuda' }"), &m);
  EXPECT_NE(st2, ZD_OK);
  EXPECT_NE(last().find("test.lua"), std::string::npos) << last();
}

TEST_F(DeviceTest, AnUnknownDeviceIsRefused) {
  zd_model* m = nullptr;
  EXPECT_EQ(create_on("tpu", kJob, &m), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("options.device is \"tpu\""), std::string::npos) << last();
  EXPECT_EQ(create(std::string("return { device = 'tpu' }"), &m), ZD_ERR_CONFIG);
  EXPECT_NE(last().find("device"), std::string::npos) << last();
}

TEST_F(DeviceTest, ACallerBuiltAgainstAbi10StillCreatesModels) {
  // zd_model_options as 1.0 had it: no `device` field.
  zd_model_options o = ZD_MODEL_OPTIONS_INIT;
  o.struct_size = offsetof(zd_model_options, device);
  o.script_text = kJob;
  o.device = "not read";  // beyond the caller's struct: never looked at
  zd_model* m = nullptr;
  ASSERT_EQ(zd_model_create(client_, &o, &m), ZD_OK) << last();
  EXPECT_EQ(view_device(m), ZD_DEVICE_CPU);
  zd_model_destroy(m);
}

TEST_F(DeviceTest, TheTrainersStream) {
  zd_model* m = model(kJob);
  EXPECT_EQ(zd_model_set_stream(m, nullptr), ZD_OK) << last();
  int not_a_stream = 0;
  const zd_status st = zd_model_set_stream(m, &not_a_stream);
  EXPECT_EQ(st, ZD_ERR_INVALID_ARGUMENT) << last();
  EXPECT_NE(last().find("cpu device"), std::string::npos) << last();
  EXPECT_EQ(zd_model_set_stream(nullptr, nullptr), ZD_ERR_INVALID_ARGUMENT);
  // On the cpu device NULL is harmless anywhere, inside a step too.
  add(m, "w", "layer", {2}, {1, 2});
  ASSERT_EQ(zd_model_finalize(m), ZD_OK) << last();
  const zd_module_id mod = module_id(m, "layer");
  ASSERT_EQ(zd_forward_begin(m, mod), ZD_OK) << last();
  EXPECT_EQ(zd_model_set_stream(m, nullptr), ZD_OK) << last();
  EXPECT_EQ(zd_forward_end(m, mod), ZD_OK) << last();
  zd_model_destroy(m);
}
