// The nccl plugin as the engine loads it, on a machine without a GPU (CI):
// it loads, offers the v3 descriptor (taking CUDA memory) and v2 with its
// hyperparameters, refuses bad
// arguments and values, and create() refuses with a clear error instead of
// crashing where no CUDA device is visible. Where a GPU is visible the
// no-device case is skipped (gpu_test.cpp covers that machine).
#include <gmock/gmock.h>

#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "comm_test_util.h"

namespace zerod::comm::test {
namespace {

using ::testing::HasSubstr;

const zd_comm_v3* nccl_plugin(std::string* why) {
  return reinterpret_cast<const zd_comm_v3*>(comm_descriptor("zd_comm_nccl.so", 3, why));
}

bool gpu_visible() {
  int n = 0;
  const bool yes = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  cudaGetLastError();
  return yes;
}

// timeout, port, check, spin_us.
std::vector<double> defaults() { return {30, 0, 1, 0}; }

zd_status create(const zd_comm_v3& d, const std::vector<double>& v, const zd_comm_config& cfg, void** inst,
                 std::string* err) {
  char buf[1024] = "";
  const zd_status st = d.create(nullptr, v.data(), v.size(), &cfg, inst, buf, sizeof buf);
  *err = buf;
  return st;
}

TEST(NcclPlugin, LoadsWithItsDescriptorAndHyperparameters) {
  std::string why;
  const zd_comm_v3* d = nccl_plugin(&why);
  ASSERT_NE(d, nullptr) << why;
  EXPECT_STREQ(d->header.name, "nccl");
  EXPECT_EQ(d->header.abi_version, 3u);
  ASSERT_NE(d->memory, nullptr);
  // It takes device memory: the engine hands it the pool as it is.
  EXPECT_EQ(d->memory(nullptr), ZD_COMM_MEMORY_HOST | ZD_COMM_MEMORY_CUDA);
  // v2 beside it, for hosts that know no v3.
  std::string why2;
  const auto* v2 = reinterpret_cast<const zd_comm_v2*>(comm_descriptor("zd_comm_nccl.so", 2, &why2));
  ASSERT_NE(v2, nullptr) << why2;
  EXPECT_STREQ(v2->header.name, "nccl");
  EXPECT_EQ(v2->create, d->create);
  ASSERT_EQ(d->hparam_count, 4u);
  const char* names[] = {"timeout", "port", "check", "spin_us"};
  for (uint32_t i = 0; i < 4; ++i) EXPECT_STREQ(d->hparams[i].name, names[i]);
  EXPECT_EQ(d->hparams[1].max, 65535.0);
  for (auto* f : {reinterpret_cast<void*>(d->all_reduce), reinterpret_cast<void*>(d->reduce_scatter),
                  reinterpret_cast<void*>(d->all_gather), reinterpret_cast<void*>(d->broadcast),
                  reinterpret_cast<void*>(d->barrier), reinterpret_cast<void*>(d->all_to_all),
                  reinterpret_cast<void*>(d->compressed_all_reduce), reinterpret_cast<void*>(d->figures)})
    EXPECT_NE(f, nullptr);
}

TEST(NcclPlugin, RefusesBadValuesAndLayoutsNamingThem) {
  std::string why;
  const zd_comm_v3* d = nccl_plugin(&why);
  ASSERT_NE(d, nullptr) << why;
  void* inst = reinterpret_cast<void*>(1);
  std::string err;
  std::vector<double> v = defaults();
  v[1] = 70000;
  EXPECT_EQ(create(*d, v, config_of(2, 0, 1), &inst, &err), ZD_ERR_CONFIG);
  EXPECT_THAT(err, HasSubstr("port = 70000"));
  EXPECT_EQ(inst, nullptr);
  v = defaults();
  v[1] = 1.5;
  EXPECT_EQ(create(*d, v, config_of(2, 0, 1), &inst, &err), ZD_ERR_CONFIG);
  EXPECT_THAT(err, HasSubstr("whole number"));
  EXPECT_EQ(create(*d, {1, 2}, config_of(2, 0, 1), &inst, &err), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(err, HasSubstr("expected 4 hyperparameter values, got 2"));
  EXPECT_EQ(create(*d, defaults(), config_of(4, 3, 2), &inst, &err), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(err, HasSubstr("not a block of ranks"));
  // Ranks 1-2 of 4: not a daemon's block in node order.
  EXPECT_EQ(create(*d, defaults(), config_of(4, 1, 2), &inst, &err), ZD_ERR_CONFIG);
  EXPECT_THAT(err, HasSubstr("same --nproc"));
}

TEST(NcclPlugin, CreateWithoutACudaDeviceRefusesClearly) {
  if (gpu_visible()) GTEST_SKIP() << "a CUDA device is visible here: gpu_test.cpp runs the plugin on it";
  std::string why;
  const zd_comm_v3* d = nccl_plugin(&why);
  ASSERT_NE(d, nullptr) << why;
  void* inst = nullptr;
  std::string err;
  for (const zd_comm_config& cfg : {config_of(1), config_of(2, 0, 1), config_of(4, 2, 2)}) {
    EXPECT_EQ(create(*d, defaults(), cfg, &inst, &err), ZD_ERR_CONFIG);
    EXPECT_THAT(err, HasSubstr("runs collectives on GPUs, but this daemon sees none"));
    EXPECT_THAT(err, HasSubstr("backend = \"mpi\""));
    EXPECT_EQ(inst, nullptr);
  }
}

// The entry points refuse a NULL instance rather than crash (the glue's
// contract, shared with local and mpi).
TEST(NcclPlugin, EntryPointsRefuseANullInstance) {
  std::string why;
  const zd_comm_v3* d = nccl_plugin(&why);
  ASSERT_NE(d, nullptr) << why;
  const zd_comm_call c = call_for(0);
  float x = 1;
  EXPECT_EQ(d->all_reduce(nullptr, &c, &x, 1, ZD_COMM_F32, ZD_REDUCE_SUM), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(d->barrier(nullptr, &c), ZD_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(d->last_error(nullptr, 0), "");
  zd_comm_figures f = ZD_COMM_FIGURES_INIT;
  d->figures(nullptr, 0, &f);
  EXPECT_EQ(f.bytes_sent, 0u);
  d->abort(nullptr, ZD_ERR_TIMEOUT, "x");
  d->destroy(nullptr);
}

}  // namespace
}  // namespace zerod::comm::test
