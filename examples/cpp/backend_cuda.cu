// The CUDA backend: GEMMs through cuBLAS (fp32, no TF32, as torch's
// default), the kernels of kernels.h one GPU thread per index, everything
// queued on one stream that the trainer also gives zerod
// (zd_model_set_stream), so zerod's copies and the GPT's work are ordered
// without the host waiting.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <zerod/zerod.h>

#include <stdexcept>
#include <string>

#include "backend.h"

namespace gpt {
namespace {

[[noreturn]] void fail(const char* call, const char* what, const char* file, int line) {
  throw std::runtime_error(std::string(call) + " failed: " + what + " (" + file + ":" +
                           std::to_string(line) + ")");
}
#define CUDA_CHECK(call)                                                                  \
  do {                                                                                    \
    cudaError_t e_ = (call);                                                              \
    if (e_ != cudaSuccess) fail(#call, cudaGetErrorString(e_), __FILE__, __LINE__);       \
  } while (0)
#define CUBLAS_CHECK(call)                                                                \
  do {                                                                                    \
    cublasStatus_t s_ = (call);                                                           \
    if (s_ != CUBLAS_STATUS_SUCCESS) fail(#call, cublasGetStatusString(s_), __FILE__, __LINE__); \
  } while (0)

template <class Kernel>
__global__ void each_index(Kernel kernel, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) kernel(i);
}

constexpr int kThreads = 128;

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasCreate(&blas_));
    CUBLAS_CHECK(cublasSetStream(blas_, stream_));
    // fp32 products in fp32: no TF32 (torch's default for matmuls too).
    CUBLAS_CHECK(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH));
  }
  ~CudaBackend() override {
    cudaStreamSynchronize(stream_);
    cublasDestroy(blas_);
    cudaStreamDestroy(stream_);
  }
  const char* name() const override { return "cuda"; }
  int view_device_type() const override { return ZD_DEVICE_CUDA; }
  int view_device_id() const override { return device_; }
  const char* zerod_device() const override { return "cuda"; }
  void* stream() override { return stream_; }

  void* allocate(size_t bytes) override {
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 1));
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
    return p;
  }
  void release(void* p) override {
    cudaStreamSynchronize(stream_);
    cudaFree(p);
  }
  void upload(void* dst, const void* src, size_t bytes) override {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
  }
  void download(void* dst, const void* src, size_t bytes) override {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void gemm(const Gemm& g) override {
    const float one = 1.0f;
    CUBLAS_CHECK(cublasSgemm(blas_, g.ta ? CUBLAS_OP_T : CUBLAS_OP_N, g.tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                             g.m, g.n, g.k, &one, g.A, g.lda, g.B, g.ldb, &g.beta, g.C, g.ldc));
  }
#define GPT_RUN_ON_CUDA(K) \
  void run(const K& kernel, int n) override { launch(kernel, n); }
  GPT_KERNELS(GPT_RUN_ON_CUDA)
#undef GPT_RUN_ON_CUDA

 private:
  template <class Kernel>
  void launch(const Kernel& kernel, int n) {
    if (n <= 0) return;
    each_index<<<(n + kThreads - 1) / kThreads, kThreads, 0, stream_>>>(kernel, n);
    CUDA_CHECK(cudaGetLastError());
  }

  int device_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
};

// Why cudaGetDeviceCount found no GPU, in libzerod's words
// (engine/device/cuda_device.cpp, cuda_probe): CUDA's own text for a
// machine with no driver, "CUDA driver version is insufficient for CUDA
// runtime version", reads as if a driver needed upgrading.
std::string why_no_gpu(cudaError_t e) {
  if (e == cudaErrorNoDevice) return "this machine has no CUDA device";
  if (e == cudaErrorInsufficientDriver) {
    int runtime = 0;
    cudaRuntimeGetVersion(&runtime);
    return "no NVIDIA driver for CUDA " + std::to_string(runtime / 1000) + "." +
           std::to_string(runtime % 1000 / 10) + " is loaded (no GPU here, or an older driver)";
  }
  return std::string("no CUDA device is usable by this process (") + cudaGetErrorString(e) + ")";
}

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int local_rank, std::string* why_not) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    *why_not = e != cudaSuccess ? why_no_gpu(e) : std::string("this machine has no CUDA device");
    return nullptr;
  }
  return std::make_unique<CudaBackend>(local_rank % count);
}

}  // namespace gpt
