// The CPU backend: each kernel in a loop over its indices, each GEMM in a
// plain column-major loop with cuBLAS's arguments (gemm.h). It is what the
// ctest holds against PyTorch, so it stays simple rather than fast.
#include <zerod/zerod.h>

#include <cstdlib>
#include <cstring>
#include <new>

#include "backend.h"

namespace gpt {
namespace {

// C = op(A) op(B) + beta C, column-major, with the two loop orders that keep
// the innermost loop on contiguous memory for the products gemm.h makes.
void gemm_reference(const Gemm& g) {
  for (int j = 0; j < g.n; ++j) {
    float* c = g.C + static_cast<size_t>(j) * g.ldc;
    for (int i = 0; i < g.m; ++i) c[i] = g.beta == 0.0f ? 0.0f : g.beta * c[i];
  }
  auto a_at = [&](int i, int p) {
    return g.ta ? g.A[p + static_cast<size_t>(i) * g.lda] : g.A[i + static_cast<size_t>(p) * g.lda];
  };
  auto b_at = [&](int p, int j) {
    return g.tb ? g.B[j + static_cast<size_t>(p) * g.ldb] : g.B[p + static_cast<size_t>(j) * g.ldb];
  };
  if (g.ta) {  // rows of op(A) are contiguous: dot products
    for (int j = 0; j < g.n; ++j)
      for (int i = 0; i < g.m; ++i) {
        float s = 0.0f;
        for (int p = 0; p < g.k; ++p) s += a_at(i, p) * b_at(p, j);
        g.C[i + static_cast<size_t>(j) * g.ldc] += s;
      }
  } else {  // columns of A are contiguous: C[:, j] += A[:, p] * op(B)[p, j]
    for (int j = 0; j < g.n; ++j)
      for (int p = 0; p < g.k; ++p) {
        const float b = b_at(p, j);
        const float* a = g.A + static_cast<size_t>(p) * g.lda;
        float* c = g.C + static_cast<size_t>(j) * g.ldc;
        for (int i = 0; i < g.m; ++i) c[i] += a[i] * b;
      }
  }
}

template <class Kernel>
void each(const Kernel& kernel, int n) {
  for (int i = 0; i < n; ++i) kernel(i);
}

class CpuBackend final : public Backend {
 public:
  const char* name() const override { return "cpu"; }
  int view_device_type() const override { return ZD_DEVICE_CPU; }
  int view_device_id() const override { return 0; }
  const char* zerod_device() const override { return "cpu"; }
  void* stream() override { return nullptr; }
  void* allocate(size_t bytes) override {
    void* p = std::calloc(1, bytes ? bytes : 1);
    if (!p) throw std::bad_alloc();
    return p;
  }
  void release(void* p) override { std::free(p); }
  void upload(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void gemm(const Gemm& g) override { gemm_reference(g); }
#define GPT_RUN_ON_CPU(K) \
  void run(const K& kernel, int n) override { each(kernel, n); }
  GPT_KERNELS(GPT_RUN_ON_CPU)
#undef GPT_RUN_ON_CPU
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace gpt
