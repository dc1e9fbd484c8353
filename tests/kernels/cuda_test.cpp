// update_cuda of each plugin against the CPU scalar reference. Built only
// with CUDA; on a machine without a usable device every test skips.
//
// Tolerance: master and state within 2 ulp (same fp32 operations with
// --fmad=false and IEEE division/sqrt); a 16-bit working copy equals the
// round-to-nearest-even conversion of the device's own master.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <zerod/zerod_plugin.h>

#include <string>
#include <vector>

#include "test_util.h"

namespace zerod::optim::test {
namespace {

template <typename T>
struct DeviceArray {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceArray(const std::vector<T>& host) : n(host.size()) {
    EXPECT_EQ(cudaMalloc(&ptr, n * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr, host.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceArray() { cudaFree(ptr); }
  std::vector<T> get() const {
    std::vector<T> out(n);
    EXPECT_EQ(cudaMemcpy(out.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }
};

// The plugin's descriptor of optimizer ABI `version` (v1: every plugin;
// v4: adam and adamw).
const zd_plugin_header* load_version(const char* name, uint32_t version, void** handle) {
  const std::string path = std::string(ZEROD_TEST_PLUGIN_DIR) + "/zd_optimizer_" + name + ".so";
  *handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (*handle == nullptr) return nullptr;
  auto entry = reinterpret_cast<zd_plugin_entry_fn>(dlsym(*handle, ZD_PLUGIN_ENTRY_SYMBOL));
  if (!entry) return nullptr;
  for (const zd_plugin_header* const* h = entry(); *h != nullptr; ++h)
    if ((*h)->abi_version == version) return *h;
  return nullptr;
}

const zd_optimizer_v1* load(const char* name, void** handle) {
  return reinterpret_cast<const zd_optimizer_v1*>(load_version(name, 1, handle));
}

class CudaUpdate : public ::testing::TestWithParam<std::tuple<const char*, Dtype, Dtype>> {
 protected:
  void SetUp() override {
    int count = 0;
    const cudaError_t rc = cudaGetDeviceCount(&count);
    if (rc != cudaSuccess || count == 0) {
      GTEST_SKIP() << "no CUDA device: " << (rc != cudaSuccess ? cudaGetErrorString(rc) : "device count is 0");
    }
  }
};

TEST_P(CudaUpdate, MatchesScalarReference) {
  const auto [name, grad_dtype, work_dtype] = GetParam();
  void* handle = nullptr;
  const zd_optimizer_v1* d = load(name, &handle);
  ASSERT_NE(d, nullptr) << dlerror();
  ASSERT_NE(d->update_cuda, nullptr);
  std::vector<double> values;
  for (uint32_t i = 0; i < d->hparam_count; ++i) {
    for (int32_t j = 0; j < d->hparams[i].count; ++j) values.push_back(d->hparams[i].defaults[j]);
  }
  const bool sgd = std::string(name) == "sgd";
  if (sgd) values[1] = 0.9;  // momentum, so the buffer is exercised
  void* inst = nullptr;
  char err[256] = "";
  ASSERT_EQ(d->create(nullptr, values.data(), values.size(), &inst, err, sizeof err), ZD_OK) << err;

  const size_t n = (size_t{1} << 20) + 77;
  std::mt19937 rng(9);
  std::normal_distribution<float> normal;
  std::vector<float> p(n), s0(n, 0.0f), s1(n, 0.0f);
  for (auto& x : p) x = normal(rng);
  DeviceArray<float> dp(p), d0(s0), d1(s1);
  std::vector<float> cp = p, c0 = s0, c1 = s1;
  for (int64_t t = 1; t <= 3; ++t) {
    Buffer g(grad_dtype, n);
    for (size_t i = 0; i < n; ++i) g.set(i, normal(rng));
    std::vector<uint8_t> gbytes(static_cast<uint8_t*>(g.data()),
                                static_cast<uint8_t*>(g.data()) + n * dtype_size(grad_dtype));
    DeviceArray<uint8_t> dg(gbytes);
    DeviceArray<uint8_t> dw(std::vector<uint8_t>(n * dtype_size(work_dtype), 0));
    zd_optimizer_update u{};
    u.struct_size = sizeof u;
    u.count = n;
    u.grad_dtype = static_cast<zd_dtype>(grad_dtype);
    u.work_dtype = static_cast<zd_dtype>(work_dtype);
    u.grad_scale = 0.5;
    u.lr = 1e-3;
    u.step = t;
    u.master = dp.ptr;
    u.grad = dg.ptr;
    u.work = dw.ptr;
    u.state[0] = d0.ptr;
    u.state[1] = d1.ptr;
    ASSERT_EQ(d->update_cuda(inst, &u, nullptr), ZD_OK);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    u.master = cp.data();
    u.grad = g.data();
    u.work = nullptr;
    u.state[0] = c0.data();
    u.state[1] = c1.data();
    ASSERT_EQ(d->update(inst, ZD_ISA_SCALAR, &u), ZD_OK);

    const std::vector<float> gp = dp.get(), g0 = d0.get(), g1 = d1.get();
    const std::vector<uint8_t> gw = dw.get();
    for (size_t i = 0; i < n; ++i) {
      ASSERT_LE(ulp_distance(gp[i], cp[i]), 2u) << "master [" << i << "] step " << t;
      ASSERT_LE(ulp_distance(g0[i], c0[i]), 2u) << "state0 [" << i << "] step " << t;
      if (!sgd) {
        ASSERT_LE(ulp_distance(g1[i], c1[i]), 2u) << "state1 [" << i << "] step " << t;
      }
      if (work_dtype == Dtype::f32) {
        float w;
        std::memcpy(&w, gw.data() + 4 * i, 4);
        ASSERT_EQ(f32_bits(w), f32_bits(gp[i]));
      } else {
        uint16_t w;
        std::memcpy(&w, gw.data() + 2 * i, 2);
        ASSERT_EQ(w, work_dtype == Dtype::bf16 ? f32_to_bf16(gp[i]) : f32_to_f16(gp[i])) << "[" << i << "]";
      }
    }
  }
  d->destroy(inst);
  dlclose(handle);
}

// Adam's state kept in bf16 (optimizer.state_dtype), through the v4
// descriptor: the device's m and v are the CPU scalar path's bits (the same
// fp32 operations, then the same integer rounding), the master within 2 ulp.
TEST_P(CudaUpdate, Bf16StateMatchesScalarReference) {
  const auto [name, grad_dtype, work_dtype] = GetParam();
  if (std::string(name) == "sgd") GTEST_SKIP() << "sgd keeps its momentum in fp32 only";
  void* handle = nullptr;
  const auto* d = reinterpret_cast<const zd_optimizer_v4*>(load_version(name, 4, &handle));
  ASSERT_NE(d, nullptr) << dlerror();
  ASSERT_NE(d->update_cuda, nullptr);
  std::vector<double> values;
  for (uint32_t i = 0; i < d->hparam_count; ++i)
    for (int32_t j = 0; j < d->hparams[i].count; ++j) values.push_back(d->hparams[i].defaults[j]);
  void* inst = nullptr;
  char err[256] = "";
  ASSERT_EQ(d->create(nullptr, values.data(), values.size(), &inst, err, sizeof err), ZD_OK) << err;
  ASSERT_EQ(d->supports_state_dtype(inst, ZD_DTYPE_BF16), 1);

  const size_t n = (size_t{1} << 20) + 77;
  std::mt19937 rng(13);
  std::normal_distribution<float> normal;
  std::vector<float> p(n);
  for (auto& x : p) x = normal(rng);
  std::vector<uint16_t> s0(n, 0), s1(n, 0);
  DeviceArray<float> dp(p);
  DeviceArray<uint16_t> d0(s0), d1(s1);
  std::vector<float> cp = p;
  std::vector<uint16_t> c0 = s0, c1 = s1;
  for (int64_t t = 1; t <= 3; ++t) {
    Buffer g(grad_dtype, n);
    for (size_t i = 0; i < n; ++i) g.set(i, normal(rng));
    std::vector<uint8_t> gbytes(static_cast<uint8_t*>(g.data()),
                                static_cast<uint8_t*>(g.data()) + n * dtype_size(grad_dtype));
    DeviceArray<uint8_t> dg(gbytes);
    DeviceArray<uint8_t> dw(std::vector<uint8_t>(n * dtype_size(work_dtype), 0));
    zd_optimizer_update u{};
    u.struct_size = sizeof u;
    u.count = n;
    u.grad_dtype = static_cast<zd_dtype>(grad_dtype);
    u.work_dtype = static_cast<zd_dtype>(work_dtype);
    u.state_dtype = ZD_DTYPE_BF16;
    u.grad_scale = 0.5;
    u.lr = 1e-3;
    u.step = t;
    u.master = dp.ptr;
    u.grad = dg.ptr;
    u.work = dw.ptr;
    u.state[0] = reinterpret_cast<float*>(d0.ptr);
    u.state[1] = reinterpret_cast<float*>(d1.ptr);
    ASSERT_EQ(d->update_cuda(inst, &u, nullptr), ZD_OK);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    u.master = cp.data();
    u.grad = g.data();
    u.work = nullptr;
    u.state[0] = reinterpret_cast<float*>(c0.data());
    u.state[1] = reinterpret_cast<float*>(c1.data());
    ASSERT_EQ(d->update(inst, ZD_ISA_SCALAR, &u), ZD_OK);
    const std::vector<float> gp = dp.get();
    const std::vector<uint16_t> g0 = d0.get(), g1 = d1.get();
    for (size_t i = 0; i < n; ++i) {
      ASSERT_LE(ulp_distance(gp[i], cp[i]), 2u) << "master [" << i << "] step " << t;
      ASSERT_EQ(g0[i], c0[i]) << "exp_avg [" << i << "] step " << t;
      ASSERT_EQ(g1[i], c1[i]) << "exp_avg_sq [" << i << "] step " << t;
    }
  }
  d->destroy(inst);
  dlclose(handle);
}

INSTANTIATE_TEST_SUITE_P(Plugins, CudaUpdate,
                         ::testing::Combine(::testing::Values("adam", "adamw", "sgd"),
                                            ::testing::Values(Dtype::f32, Dtype::bf16, Dtype::f16),
                                            ::testing::Values(Dtype::f32, Dtype::bf16, Dtype::f16)),
                         [](const auto& p) {
                           return std::string(std::get<0>(p.param)) + "_grad_" +
                                  dtype_name(std::get<1>(p.param)) + "_work_" +
                                  dtype_name(std::get<2>(p.param));
                         });

}  // namespace
}  // namespace zerod::optim::test
