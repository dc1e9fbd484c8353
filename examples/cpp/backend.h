// Where the GPT computes: the CPU (plain loops) or a CUDA GPU (cuBLAS and
// the kernels of kernels.h). The model (model.h) calls only this, with
// pointers into the backend's memory: zerod's views and the model's own
// activations.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "gemm.h"
#include "kernels.h"

namespace gpt {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // What zerod's views must say for this backend to use them (zd_view's
  // device_type, ZD_DEVICE_CPU or ZD_DEVICE_CUDA, and device_id) and the
  // device zerod must be asked for (zd_model_options.device).
  virtual int view_device_type() const = 0;
  virtual int view_device_id() const = 0;
  virtual const char* zerod_device() const = 0;
  // The stream the work is queued on (a cudaStream_t), for
  // zd_model_set_stream; nullptr on the CPU.
  virtual void* stream() = 0;

  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* p) = 0;
  // Host to backend memory, in stream order.
  virtual void upload(void* dst, const void* src, size_t bytes) = 0;
  // Backend to host memory; returns once the bytes are there (it waits for
  // the work queued before it).
  virtual void download(void* dst, const void* src, size_t bytes) = 0;

  virtual void gemm(const Gemm& g) = 0;
  // Runs kernel(i) for i in [0, n).
#define GPT_DECLARE_RUN(K) virtual void run(const K& kernel, int n) = 0;
  GPT_KERNELS(GPT_DECLARE_RUN)
#undef GPT_DECLARE_RUN
};

std::unique_ptr<Backend> make_cpu_backend();
#ifdef GPT_HAVE_CUDA
// The GPU zerod gives this rank (its local rank modulo the GPUs seen, as
// zerod's cuda device picks), or nullptr with *why_not saying why there is
// none.
std::unique_ptr<Backend> make_cuda_backend(int local_rank, std::string* why_not);
#endif

}  // namespace gpt
