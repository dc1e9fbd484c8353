// The GPT's matrix products: a linear layer's forward and its two backward
// products, each written as one GEMM in cuBLAS's column-major convention.
// The CUDA backend hands a Gemm to cublasSgemm as it is; the CPU backend
// runs the same Gemm through a plain column-major loop (backend_cpu.cpp),
// so the argument lists below are checked on the CPU too.
//
// A row-major matrix [r, c] is the column-major matrix [c, r] with leading
// dimension c, i.e. its transpose: that is all the index juggling below.
#pragma once

namespace gpt {

// C = op(A) op(B) + beta C, column-major: C is m x n (leading dimension
// ldc), op(A) is m x k, op(B) is k x n; op transposes when ta / tb is set.
struct Gemm {
  bool ta, tb;
  int m, n, k;
  const float* A;
  int lda;
  const float* B;
  int ldb;
  float beta;
  float* C;
  int ldc;
};

// y[M, N] = x[M, K] W[N, K]^T (nn.Linear's weight is [out, in]).
// Column-major: y^T (N x M) = (W as K x N)^T (x as K x M).
inline Gemm linear_forward(const float* x, const float* W, float* y, int M, int K, int N) {
  return Gemm{true, false, N, M, K, W, K, x, K, 0.0f, y, N};
}

// dx[M, K] = dy[M, N] W[N, K]. Column-major: dx^T (K x M) = (W as K x N)(dy as N x M).
inline Gemm linear_backward_input(const float* dy, const float* W, float* dx, int M, int K, int N) {
  return Gemm{false, false, K, M, N, W, K, dy, N, 0.0f, dx, K};
}

// dW[N, K] = dy[M, N]^T x[M, K]. Column-major: dW^T (K x N) = (x as K x M)(dy as N x M)^T.
inline Gemm linear_backward_weight(const float* dy, const float* x, float* dW, int M, int K, int N) {
  return Gemm{false, true, K, N, M, x, K, dy, N, 0.0f, dW, K};
}

}  // namespace gpt
