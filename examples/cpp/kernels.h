// The GPT's math other than its matrix products, written once for both
// backends. Each kernel is a plain struct of arguments whose operator()(i)
// does the work of index i (a row, a column or an element); the CPU backend
// (backend_cpu.cpp) calls it for every i in a loop, the CUDA backend
// (backend_cuda.cu) from one GPU thread per i. Compiled by g++ for the one
// and by nvcc for the other, so both run the same arithmetic.
//
// Layouts are row-major: activations [rows*T, C] with row r*T + t for
// sequence r at position t; the attention's q, k and v are the three
// C-wide thirds of c_attn's output [rows*T, 3C], head h in columns
// h*hs .. (h+1)*hs of each, as torch's split + view + transpose has them.
//
// One thread per row keeps each kernel the scalar loop a reader can check;
// it is not how fast GPU kernels are written (those reduce across a
// block's threads), and it is enough for the sizes this example trains.
#pragma once

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define GPT_HD __host__ __device__
#else
#define GPT_HD
#endif

namespace gpt {

// Every kernel, for the backends' run() overloads (backend.h).
#define GPT_KERNELS(X)                                                                    \
  X(EmbedForward) X(EmbedBackwardTokens) X(EmbedBackwardPositions) X(LayerNormForward)  \
  X(LayerNormBackwardInput) X(LayerNormBackwardParams) X(AddBias) X(BiasGrad) X(Add)     \
  X(GeluForward) X(GeluBackward) X(AttentionForward) X(AttentionBackwardQuery)         \
  X(AttentionBackwardKeyValue) X(CrossEntropy)

constexpr float kLayerNormEps = 1e-5f;  // torch.nn.LayerNorm's default

// x[i, :] = wte[tokens[i], :] + wpe[i % T, :]; i over rows*T.
struct EmbedForward {
  const int32_t* tokens;
  const float* wte;
  const float* wpe;
  float* x;
  int T, C;
  GPT_HD void operator()(int i) const {
    const float* e = wte + static_cast<size_t>(tokens[i]) * C;
    const float* p = wpe + static_cast<size_t>(i % T) * C;
    float* o = x + static_cast<size_t>(i) * C;
    for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
  }
};

// dwte[v, c] = the sum of dx[:, c] over the positions whose token is v;
// e = v * C + c over the vocabulary's elements. One thread an element: no
// atomics, each sum in one order (positions ascending) on every run and
// backend, and on a GPU the threads of a warp share v (one branch) and read
// neighbouring columns of dx.
struct EmbedBackwardTokens {
  const int32_t* tokens;
  const float* dx;
  float* dwte;
  int N, C;  // N = rows*T
  GPT_HD void operator()(int e) const {
    const int v = e / C, c = e % C;
    float sum = 0.0f;
    for (int i = 0; i < N; ++i)
      if (tokens[i] == v) sum += dx[static_cast<size_t>(i) * C + c];
    dwte[e] = sum;
  }
};

// dwpe[t, c] = the sum over sequences of dx at position t, column c;
// e = t * C + c.
struct EmbedBackwardPositions {
  const float* dx;
  float* dwpe;
  int rows, T, C;
  GPT_HD void operator()(int e) const {
    const int t = e / C, c = e % C;
    float sum = 0.0f;
    for (int r = 0; r < rows; ++r) sum += dx[(static_cast<size_t>(r) * T + t) * C + c];
    dwpe[e] = sum;
  }
};

// y = (x - mean) / sqrt(var + eps) * w + b over each row of C (biased
// variance, as torch); keeps mean and 1/sqrt(var + eps) for the backward.
struct LayerNormForward {
  const float* x;
  const float* w;
  const float* b;
  float* y;
  float* mean;
  float* rstd;
  int C;
  GPT_HD void operator()(int i) const {
    const float* xi = x + static_cast<size_t>(i) * C;
    float m = 0.0f;
    for (int c = 0; c < C; ++c) m += xi[c];
    m /= static_cast<float>(C);
    float var = 0.0f;
    for (int c = 0; c < C; ++c) var += (xi[c] - m) * (xi[c] - m);
    const float s = 1.0f / sqrtf(var / static_cast<float>(C) + kLayerNormEps);
    float* yi = y + static_cast<size_t>(i) * C;
    for (int c = 0; c < C; ++c) yi[c] = (xi[c] - m) * s * w[c] + b[c];
    mean[i] = m;
    rstd[i] = s;
  }
};

// dx (+)= rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) with
// dxhat = dy * w, per row. With accumulate the result is added to dx: the
// residual stream's gradient already there.
struct LayerNormBackwardInput {
  const float* x;
  const float* w;
  const float* mean;
  const float* rstd;
  const float* dy;
  float* dx;
  int C;
  bool accumulate;
  GPT_HD void operator()(int i) const {
    const float* xi = x + static_cast<size_t>(i) * C;
    const float* dyi = dy + static_cast<size_t>(i) * C;
    const float m = mean[i], s = rstd[i];
    float sum_d = 0.0f, sum_dx = 0.0f;
    for (int c = 0; c < C; ++c) {
      const float d = dyi[c] * w[c];
      sum_d += d;
      sum_dx += d * (xi[c] - m) * s;
    }
    sum_d /= static_cast<float>(C);
    sum_dx /= static_cast<float>(C);
    float* dxi = dx + static_cast<size_t>(i) * C;
    for (int c = 0; c < C; ++c) {
      const float g = s * (dyi[c] * w[c] - sum_d - (xi[c] - m) * s * sum_dx);
      dxi[c] = accumulate ? dxi[c] + g : g;
    }
  }
};

// dw[c] = sum over rows of dy * xhat, db[c] = sum of dy; i = c.
struct LayerNormBackwardParams {
  const float* x;
  const float* mean;
  const float* rstd;
  const float* dy;
  float* dw;
  float* db;
  int N, C;
  GPT_HD void operator()(int c) const {
    float sw = 0.0f, sb = 0.0f;
    for (int i = 0; i < N; ++i) {
      const size_t k = static_cast<size_t>(i) * C + c;
      sw += dy[k] * (x[k] - mean[i]) * rstd[i];
      sb += dy[k];
    }
    dw[c] = sw;
    db[c] = sb;
  }
};

// y[i] += b[i % cols]: a linear layer's bias, after its GEMM; i over y.
struct AddBias {
  float* y;
  const float* b;
  int cols;
  GPT_HD void operator()(int i) const { y[i] += b[i % cols]; }
};

// db[j] = the sum of column j of dy [N, cols]; i = j.
struct BiasGrad {
  const float* dy;
  float* db;
  int N, cols;
  GPT_HD void operator()(int j) const {
    float s = 0.0f;
    for (int i = 0; i < N; ++i) s += dy[static_cast<size_t>(i) * cols + j];
    db[j] = s;
  }
};

// out = a + b, element-wise (the residual connections).
struct Add {
  const float* a;
  const float* b;
  float* out;
  GPT_HD void operator()(int i) const { out[i] = a[i] + b[i]; }
};

// torch's F.gelu default, with erf: x * Phi(x).
GPT_HD inline float gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }
GPT_HD inline float gelu_grad(float x) {
  return 0.5f * (1.0f + erff(x * 0.70710678118654752f)) +
         x * 0.39894228040143268f * expf(-0.5f * x * x);
}

struct GeluForward {
  const float* x;
  float* y;
  GPT_HD void operator()(int i) const { y[i] = gelu(x[i]); }
};

// dx = dy * gelu'(x); dx may be dy.
struct GeluBackward {
  const float* x;
  const float* dy;
  float* dx;
  GPT_HD void operator()(int i) const { dx[i] = dy[i] * gelu_grad(x[i]); }
};

// Where (sequence r, head h, position t) of i = (r*H + h)*T + t puts things.
struct AttentionShape {
  int T, C, H;
  GPT_HD int hs() const { return C / H; }
  GPT_HD size_t qkv_at(int r, int t, int part, int h) const {  // part 0 q, 1 k, 2 v
    return (static_cast<size_t>(r) * T + t) * 3 * C + static_cast<size_t>(part) * C +
           static_cast<size_t>(h) * hs();
  }
  GPT_HD size_t y_at(int r, int t, int h) const {
    return (static_cast<size_t>(r) * T + t) * C + static_cast<size_t>(h) * hs();
  }
  GPT_HD size_t att_row(int r, int h, int t) const {  // into [rows, H, T, T]
    return ((static_cast<size_t>(r) * H + h) * T + t) * T;
  }
};

// Causal softmax attention for one query: p = softmax(q.k_j / sqrt(hs)) over
// j <= t (kept in att, zeros above the diagonal), y = sum_j p_j v_j.
struct AttentionForward {
  AttentionShape s;
  const float* qkv;
  float* att;
  float* y;
  GPT_HD void operator()(int i) const {
    const int t = i % s.T, h = (i / s.T) % s.H, r = i / (s.T * s.H), hs = s.hs();
    const float scale = 1.0f / sqrtf(static_cast<float>(hs));
    const float* q = qkv + s.qkv_at(r, t, 0, h);
    float* p = att + s.att_row(r, h, t);
    float mx = -INFINITY;
    for (int j = 0; j <= t; ++j) {
      const float* k = qkv + s.qkv_at(r, j, 1, h);
      float dot = 0.0f;
      for (int d = 0; d < hs; ++d) dot += q[d] * k[d];
      p[j] = dot * scale;
      mx = fmaxf(mx, p[j]);
    }
    float sum = 0.0f;
    for (int j = 0; j <= t; ++j) {
      p[j] = expf(p[j] - mx);
      sum += p[j];
    }
    for (int j = 0; j <= t; ++j) p[j] /= sum;
    for (int j = t + 1; j < s.T; ++j) p[j] = 0.0f;
    float* yo = y + s.y_at(r, t, h);
    for (int d = 0; d < hs; ++d) {
      float acc = 0.0f;
      for (int j = 0; j <= t; ++j) acc += p[j] * qkv[s.qkv_at(r, j, 2, h) + d];
      yo[d] = acc;
    }
  }
};

// The backward of one query row: dp_j = dy.v_j, ds_j = p_j (dp_j - sum_k
// p_k dp_k) (kept in datt for the keys' pass), dq = sum_j ds_j k_j / sqrt(hs).
struct AttentionBackwardQuery {
  AttentionShape s;
  const float* qkv;
  const float* att;
  const float* dy;
  float* datt;
  float* dqkv;
  GPT_HD void operator()(int i) const {
    const int t = i % s.T, h = (i / s.T) % s.H, r = i / (s.T * s.H), hs = s.hs();
    const float scale = 1.0f / sqrtf(static_cast<float>(hs));
    const float* p = att + s.att_row(r, h, t);
    const float* g = dy + s.y_at(r, t, h);
    float* ds = datt + s.att_row(r, h, t);
    float dot_pdp = 0.0f;
    for (int j = 0; j <= t; ++j) {
      const float* v = qkv + s.qkv_at(r, j, 2, h);
      float dp = 0.0f;
      for (int d = 0; d < hs; ++d) dp += g[d] * v[d];
      ds[j] = dp;
      dot_pdp += p[j] * dp;
    }
    for (int j = 0; j <= t; ++j) ds[j] = p[j] * (ds[j] - dot_pdp);
    for (int j = t + 1; j < s.T; ++j) ds[j] = 0.0f;
    float* dq = dqkv + s.qkv_at(r, t, 0, h);
    for (int d = 0; d < hs; ++d) {
      float acc = 0.0f;
      for (int j = 0; j <= t; ++j) acc += ds[j] * qkv[s.qkv_at(r, j, 1, h) + d];
      dq[d] = acc * scale;
    }
  }
};

// The backward for one key/value position j, after the query pass:
// dk_j = sum_{t >= j} ds_tj q_t / sqrt(hs), dv_j = sum_{t >= j} p_tj dy_t.
struct AttentionBackwardKeyValue {
  AttentionShape s;
  const float* qkv;
  const float* att;
  const float* datt;
  const float* dy;
  float* dqkv;
  GPT_HD void operator()(int i) const {
    const int j = i % s.T, h = (i / s.T) % s.H, r = i / (s.T * s.H), hs = s.hs();
    const float scale = 1.0f / sqrtf(static_cast<float>(hs));
    float* dk = dqkv + s.qkv_at(r, j, 1, h);
    float* dv = dqkv + s.qkv_at(r, j, 2, h);
    for (int d = 0; d < hs; ++d) {
      float ak = 0.0f, av = 0.0f;
      for (int t = j; t < s.T; ++t) {
        ak += datt[s.att_row(r, h, t) + j] * qkv[s.qkv_at(r, t, 0, h) + d];
        av += att[s.att_row(r, h, t) + j] * dy[s.y_at(r, t, h) + d];
      }
      dk[d] = ak * scale;
      dv[d] = av;
    }
  }
};

// Softmax cross-entropy of one row of logits [N, V] against its target:
// loss[i] = logsumexp - logit[target]; the row is replaced by its gradient
// (softmax - onehot) * grad_scale, grad_scale = 1/N for the mean loss
// (times the loss scale, in fp16).
struct CrossEntropy {
  float* logits;
  const int32_t* targets;
  float* loss;
  int V;
  float grad_scale;
  GPT_HD void operator()(int i) const {
    float* z = logits + static_cast<size_t>(i) * V;
    float mx = -INFINITY;
    for (int v = 0; v < V; ++v) mx = fmaxf(mx, z[v]);
    float sum = 0.0f;
    for (int v = 0; v < V; ++v) sum += expf(z[v] - mx);
    const int y = targets[i];
    loss[i] = logf(sum) + mx - z[y];
    for (int v = 0; v < V; ++v) z[v] = (expf(z[v] - mx) / sum - (v == y ? 1.0f : 0.0f)) * grad_scale;
  }
};

}  // namespace gpt
