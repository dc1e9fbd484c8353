#include "model.h"

#include <cmath>
#include <string>
#include <vector>

#include "rng.h"

namespace gpt {

int64_t ParamSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string block_module(int layer) { return "h." + std::to_string(layer); }

std::vector<ParamSpec> parameters(const Config& cfg) {
  const int64_t C = cfg.embd;
  const float std_ = 0.02f;
  // GPT-2's scaled residual projections, as gpt.py.
  const float proj_std = 0.02f / std::sqrt(2.0f * static_cast<float>(cfg.layers));
  std::vector<ParamSpec> p;
  p.push_back({"transformer.wte.weight", "embed", {cfg.vocab, C}, std_, 0});
  p.push_back({"transformer.wpe.weight", "embed", {cfg.block, C}, std_, 0});
  for (int l = 0; l < cfg.layers; ++l) {
    const std::string m = block_module(l), h = "transformer." + m + ".";
    p.push_back({h + "ln_1.weight", m, {C}, 0, 1});  // in BlockParam's order
    p.push_back({h + "ln_1.bias", m, {C}, 0, 0});
    p.push_back({h + "attn.c_attn.weight", m, {3 * C, C}, std_, 0});
    p.push_back({h + "attn.c_attn.bias", m, {3 * C}, 0, 0});
    p.push_back({h + "attn.c_proj.weight", m, {C, C}, proj_std, 0});
    p.push_back({h + "attn.c_proj.bias", m, {C}, 0, 0});
    p.push_back({h + "ln_2.weight", m, {C}, 0, 1});
    p.push_back({h + "ln_2.bias", m, {C}, 0, 0});
    p.push_back({h + "mlp.c_fc.weight", m, {4 * C, C}, std_, 0});
    p.push_back({h + "mlp.c_fc.bias", m, {4 * C}, 0, 0});
    p.push_back({h + "mlp.c_proj.weight", m, {C, 4 * C}, proj_std, 0});
    p.push_back({h + "mlp.c_proj.bias", m, {C}, 0, 0});
  }
  p.push_back({"transformer.ln_f.weight", "ln_f", {C}, 0, 1});
  p.push_back({"transformer.ln_f.bias", "ln_f", {C}, 0, 0});
  return p;
}

std::vector<float> initial_values(const ParamSpec& spec, int index, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(spec.numel()), spec.fill);
  if (spec.init_std > 0) {
    Rng rng(mix64(seed) ^ mix64(0x1000u + static_cast<uint64_t>(index)));
    for (float& x : v) x = static_cast<float>(rng.normal() * spec.init_std);
  }
  return v;
}

Gpt::Gpt(const Config& cfg, Backend& backend) : cfg_(cfg), be_(backend), n_(cfg.rows * cfg.block) {
  const size_t N = static_cast<size_t>(n_), C = static_cast<size_t>(cfg.embd);
  const size_t att = static_cast<size_t>(cfg.rows) * cfg.heads * cfg.block * cfg.block;
  inputs_ = static_cast<int32_t*>(be_.allocate(N * sizeof(int32_t)));
  targets_ = static_cast<int32_t*>(be_.allocate(N * sizeof(int32_t)));
  owned_ = {inputs_, targets_};
  for (int l = 0; l <= cfg.layers; ++l) x_.push_back(floats(N * C));
  for (int l = 0; l < cfg.layers; ++l)
    layers_.push_back(Layer{floats(N * C), floats(N), floats(N), floats(N * 3 * C), floats(att), floats(N * C),
                            floats(N * C), floats(N * C), floats(N), floats(N), floats(N * 4 * C),
                            floats(N * 4 * C)});
  lnf_ = floats(N * C);
  meanf_ = floats(N);
  rstdf_ = floats(N);
  logits_ = floats(N * static_cast<size_t>(cfg.vocab));
  losses_ = floats(N);
  dres_ = floats(N * C);
  dln_ = floats(N * C);
  dy_ = floats(N * C);
  dqkv_ = floats(N * 3 * C);
  dbig_ = floats(N * 4 * C);
  datt_ = floats(att);
}

Gpt::~Gpt() {
  for (void* p : owned_) be_.release(p);
}

float* Gpt::floats(size_t n) {
  owned_.push_back(be_.allocate(n * sizeof(float)));
  return static_cast<float*>(owned_.back());
}

void Gpt::set_batch(const int32_t* sequences) {
  const int T = cfg_.block;
  staging_.resize(2 * static_cast<size_t>(n_));
  for (int r = 0; r < cfg_.rows; ++r)
    for (int t = 0; t < T; ++t) {
      staging_[static_cast<size_t>(r) * T + t] = sequences[static_cast<size_t>(r) * (T + 1) + t];
      staging_[static_cast<size_t>(n_ + r * T + t)] = sequences[static_cast<size_t>(r) * (T + 1) + t + 1];
    }
  be_.upload(inputs_, staging_.data(), static_cast<size_t>(n_) * sizeof(int32_t));
  be_.upload(targets_, staging_.data() + n_, static_cast<size_t>(n_) * sizeof(int32_t));
}

void Gpt::embed_forward(const float* wte, const float* wpe) {
  be_.run(EmbedForward{inputs_, wte, wpe, x_[0], cfg_.block, cfg_.embd}, n_);
}

void Gpt::block_forward(int layer, const BlockWeights& w) {
  const int N = n_, C = cfg_.embd;
  const Layer& a = layers_[static_cast<size_t>(layer)];
  const float* x = x_[static_cast<size_t>(layer)];
  float* out = x_[static_cast<size_t>(layer) + 1];
  // x1 = x + c_proj(attention(c_attn(ln_1(x))))
  be_.run(LayerNormForward{x, w[LN1_W], w[LN1_B], a.ln1, a.mean1, a.rstd1, C}, N);
  be_.gemm(linear_forward(a.ln1, w[ATTN_W], a.qkv, N, C, 3 * C));
  be_.run(AddBias{a.qkv, w[ATTN_B], 3 * C}, N * 3 * C);
  be_.run(AttentionForward{{cfg_.block, C, cfg_.heads}, a.qkv, a.att, a.y}, cfg_.rows * cfg_.heads * cfg_.block);
  be_.gemm(linear_forward(a.y, w[ATTN_PROJ_W], a.x1, N, C, C));
  be_.run(AddBias{a.x1, w[ATTN_PROJ_B], C}, N * C);
  be_.run(Add{a.x1, x, a.x1}, N * C);
  // out = x1 + c_proj(gelu(c_fc(ln_2(x1))))
  be_.run(LayerNormForward{a.x1, w[LN2_W], w[LN2_B], a.ln2, a.mean2, a.rstd2, C}, N);
  be_.gemm(linear_forward(a.ln2, w[FC_W], a.h, N, C, 4 * C));
  be_.run(AddBias{a.h, w[FC_B], 4 * C}, N * 4 * C);
  be_.run(GeluForward{a.h, a.g}, N * 4 * C);
  be_.gemm(linear_forward(a.g, w[MLP_PROJ_W], out, N, 4 * C, C));
  be_.run(AddBias{out, w[MLP_PROJ_B], C}, N * C);
  be_.run(Add{out, a.x1, out}, N * C);
}

void Gpt::final_norm_forward(const float* w, const float* b) {
  be_.run(LayerNormForward{x_.back(), w, b, lnf_, meanf_, rstdf_, cfg_.embd}, n_);
}

void Gpt::head_forward(const float* wte, float grad_scale) {
  be_.gemm(linear_forward(lnf_, wte, logits_, n_, cfg_.embd, cfg_.vocab));
  be_.run(CrossEntropy{logits_, targets_, losses_, cfg_.vocab, grad_scale}, n_);
}

double Gpt::loss() {
  std::vector<float> l(static_cast<size_t>(n_));
  be_.download(l.data(), losses_, l.size() * sizeof(float));
  double sum = 0;
  for (float x : l) sum += x;
  return sum / n_;
}

void Gpt::head_backward(const float* wte, float* dwte) {
  // logits_ holds dL/dlogits now (head_forward).
  be_.gemm(linear_backward_weight(logits_, lnf_, dwte, n_, cfg_.embd, cfg_.vocab));
  be_.gemm(linear_backward_input(logits_, wte, dln_, n_, cfg_.embd, cfg_.vocab));
}

void Gpt::final_norm_backward(const float* w, float* dw, float* db) {
  const float* x = x_.back();
  be_.run(LayerNormBackwardParams{x, meanf_, rstdf_, dln_, dw, db, n_, cfg_.embd}, cfg_.embd);
  be_.run(LayerNormBackwardInput{x, w, meanf_, rstdf_, dln_, dres_, cfg_.embd, false}, n_);
}

// dres_ holds dL/d(the block's output) on entry and dL/d(its input) on return.
void Gpt::block_backward(int layer, const BlockWeights& w, const BlockGrads& d) {
  const int N = n_, C = cfg_.embd;
  const Layer& a = layers_[static_cast<size_t>(layer)];
  const float* x = x_[static_cast<size_t>(layer)];
  // The MLP branch: dres is its output's gradient.
  be_.gemm(linear_backward_weight(dres_, a.g, d[MLP_PROJ_W], N, 4 * C, C));
  be_.run(BiasGrad{dres_, d[MLP_PROJ_B], N, C}, C);
  be_.gemm(linear_backward_input(dres_, w[MLP_PROJ_W], dbig_, N, 4 * C, C));
  be_.run(GeluBackward{a.h, dbig_, dbig_}, N * 4 * C);
  be_.gemm(linear_backward_weight(dbig_, a.ln2, d[FC_W], N, C, 4 * C));
  be_.run(BiasGrad{dbig_, d[FC_B], N, 4 * C}, 4 * C);
  be_.gemm(linear_backward_input(dbig_, w[FC_W], dln_, N, C, 4 * C));
  be_.run(LayerNormBackwardParams{a.x1, a.mean2, a.rstd2, dln_, d[LN2_W], d[LN2_B], N, C}, C);
  be_.run(LayerNormBackwardInput{a.x1, w[LN2_W], a.mean2, a.rstd2, dln_, dres_, C, true}, N);
  // The attention branch: dres is now dL/dx1.
  be_.gemm(linear_backward_weight(dres_, a.y, d[ATTN_PROJ_W], N, C, C));
  be_.run(BiasGrad{dres_, d[ATTN_PROJ_B], N, C}, C);
  be_.gemm(linear_backward_input(dres_, w[ATTN_PROJ_W], dy_, N, C, C));
  const AttentionShape s{cfg_.block, C, cfg_.heads};
  const int queries = cfg_.rows * cfg_.heads * cfg_.block;
  be_.run(AttentionBackwardQuery{s, a.qkv, a.att, dy_, datt_, dqkv_}, queries);
  be_.run(AttentionBackwardKeyValue{s, a.qkv, a.att, datt_, dy_, dqkv_}, queries);
  be_.gemm(linear_backward_weight(dqkv_, a.ln1, d[ATTN_W], N, C, 3 * C));
  be_.run(BiasGrad{dqkv_, d[ATTN_B], N, 3 * C}, 3 * C);
  be_.gemm(linear_backward_input(dqkv_, w[ATTN_W], dln_, N, C, 3 * C));
  be_.run(LayerNormBackwardParams{x, a.mean1, a.rstd1, dln_, d[LN1_W], d[LN1_B], N, C}, C);
  be_.run(LayerNormBackwardInput{x, w[LN1_W], a.mean1, a.rstd1, dln_, dres_, C, true}, N);
}

void Gpt::embed_backward(float* dwte, float* dwpe) {
  be_.run(EmbedBackwardTokens{inputs_, dres_, dwte, n_, cfg_.embd}, cfg_.vocab * cfg_.embd);
  be_.run(EmbedBackwardPositions{dres_, dwpe, cfg_.rows, cfg_.block, cfg_.embd}, cfg_.block * cfg_.embd);
}

}  // namespace gpt
