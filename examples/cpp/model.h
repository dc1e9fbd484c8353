// The GPT of examples/python/gpt.py (minGPT: pre-norm blocks, causal
// self-attention, a GELU MLP, the token embedding tied to the output head),
// forward and backward by hand over a Backend, in fp32. It knows nothing of
// zerod: its calls take the parameters' and gradients' memory as pointers,
// one zerod module at a time, and the trainer (train_gpt.cpp) gets those
// pointers from zerod's views between the module's begin and end. The
// activations are the model's own.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "backend.h"

namespace gpt {

struct Config {
  int vocab = 0;   // from the corpus
  int block = 32;  // T, positions per sequence
  int layers = 2;
  int heads = 4;
  int embd = 64;   // C
  int rows = 16;   // sequences per rank per micro-batch (the trainer's --batch / ranks)
};

// A parameter as gpt.py names it, the zerod module that holds it, its shape
// and how gpt.py initialises it: normal(0, init_std) when init_std > 0,
// else every element `fill`.
struct ParamSpec {
  std::string name, module;
  std::vector<int64_t> shape;
  float init_std = 0.0f;
  float fill = 0.0f;
  int64_t numel() const;
};

// The zerod modules: "embed" (wte, wpe; it runs again at the end as the
// tied head), "h.0" ... "h.<layers-1>", "ln_f".
std::string block_module(int layer);

// Every parameter in gpt.py's named_parameters() order (its lm_head.weight
// is transformer.wte.weight): wte, wpe, each block's twelve, ln_f's two.
std::vector<ParamSpec> parameters(const Config& cfg);
// Initial values of the parameter at `index` of parameters(): its own
// stream of the generator, so they do not depend on the order of drawing.
std::vector<float> initial_values(const ParamSpec& spec, int index, uint64_t seed);

// A block's parameters in parameters()' order.
enum BlockParam {
  LN1_W, LN1_B, ATTN_W, ATTN_B, ATTN_PROJ_W, ATTN_PROJ_B,
  LN2_W, LN2_B, FC_W, FC_B, MLP_PROJ_W, MLP_PROJ_B, kBlockParams
};
using BlockWeights = std::array<const float*, kBlockParams>;
using BlockGrads = std::array<float*, kBlockParams>;

class Gpt {
 public:
  Gpt(const Config& cfg, Backend& backend);
  ~Gpt();
  Gpt(const Gpt&) = delete;
  Gpt& operator=(const Gpt&) = delete;

  // This rank's sequences: rows * (T + 1) tokens each, host memory.
  void set_batch(const int32_t* sequences);

  // Forward, module by module, in this order.
  void embed_forward(const float* wte, const float* wpe);
  void block_forward(int layer, const BlockWeights& w);
  void final_norm_forward(const float* w, const float* b);
  // Logits through the tied head, each position's cross-entropy, and in
  // place of the logits the gradient of grad_scale * the summed loss.
  void head_forward(const float* wte, float grad_scale);
  // The mean loss of the batch (waits for the work queued so far).
  double loss();

  // Backward, in the reverse order. Each writes (=) its gradients.
  void head_backward(const float* wte, float* dwte);
  void final_norm_backward(const float* w, float* dw, float* db);
  void block_backward(int layer, const BlockWeights& w, const BlockGrads& d);
  void embed_backward(float* dwte, float* dwpe);

 private:
  struct Layer {  // what a block's forward keeps for its backward
    float *ln1, *mean1, *rstd1, *qkv, *att, *y, *x1, *ln2, *mean2, *rstd2, *h, *g;
  };
  float* floats(size_t n);

  Config cfg_;
  Backend& be_;
  int n_;  // positions in the batch, rows * T
  std::vector<void*> owned_;
  int32_t *inputs_, *targets_;
  std::vector<float*> x_;  // the residual stream entering each block, and leaving the last
  std::vector<Layer> layers_;
  float *lnf_, *meanf_, *rstdf_, *logits_, *losses_;
  float *dres_, *dln_, *dy_, *dqkv_, *dbig_, *datt_;  // backward scratch
  std::vector<int32_t> staging_;
};

}  // namespace gpt
