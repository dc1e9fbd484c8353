// A GPT trained in C++ through zerod.h: the model's math is the trainer's
// (model.h, on the CPU or on a GPU with cuBLAS), the parameters, gradients
// and AdamW state are zerod's. This file is the part a trainer writes to
// drive zerod: register the parameters, then every micro-batch walk the
// modules forward and back between their begin and end calls, computing on
// zerod's views, and call zd_step.
//
//   train_gpt [--job gpt_job.lua] [--device cpu|cuda] [--steps N] [--batch ROWS]
//             [--block T] [--layers L] [--heads H] [--embd C] [--text FILE]
//             [--seed S] [--dump DIR] [--quiet]
//   zerod run --nproc 2 --job gpt_job.lua -- train_gpt      (data parallel)
//
// It connects where the environment says: embedded when run alone, the
// daemon under `zerod run`, the node's daemon it starts on demand under
// another launcher (torchrun, mpirun, srun). Every rank draws the same
// global batch of --batch sequences and trains on its own slice; rank 0
// prints its loss.
// --dump DIR writes the initial weights and the batches for reference.py,
// which trains examples/python/gpt.py on them with torch.optim.AdamW.
// Exit status 77: the device asked for cannot be used here (no GPU, or a
// build without CUDA); 1: an error; 2: bad arguments.
#include <zerod/zerod.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "data.h"
#include "model.h"

namespace {

constexpr int kCannotRunHere = 77;

// Stops with the call, its status and zerod's message.
#define ZD_CHECK(call)                                                                       \
  do {                                                                                       \
    const zd_status st_ = (call);                                                            \
    if (st_ != ZD_OK) {                                                                      \
      std::fprintf(stderr, "%s failed: %s\n  %s\n", #call, zd_status_str(st_), zd_last_error()); \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

struct Options {
  const char* job = nullptr;  // nullptr: ZEROD_JOB (zerod run --job), else gpt_job.lua beside the source
  std::string device = "cpu";
  int steps = 600;
  int global_rows = 16;
  gpt::Config cfg;
  std::string text;
  std::string dump;
  uint64_t seed = 1337;
  bool quiet = false;
};

[[noreturn]] void usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--job FILE] [--device cpu|cuda] [--steps N] [--batch ROWS] [--block T]\n"
               "          [--layers L] [--heads H] [--embd C] [--text FILE] [--seed S] [--dump DIR] [--quiet]\n",
               argv0);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  if (!std::getenv("ZEROD_JOB")) o.job = ZEROD_EXAMPLE_DIR "/gpt_job.lua";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    // A whole number, all of the argument; anything else is a usage error
    // (atoi read "abc" as 0 and "12x" as 12).
    auto whole = [&](long long lo, long long hi) {
      if (!has_value) usage(argv[0]);
      const char* text = argv[++i];
      char* end = nullptr;
      errno = 0;
      const long long v = std::strtoll(text, &end, 10);
      if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi) {
        std::fprintf(stderr, "%s: %s %s: a whole number from %lld to %lld\n", argv[0], a.c_str(), text, lo, hi);
        std::exit(2);
      }
      return v;
    };
    auto number = [&] { return static_cast<int>(whole(1, std::numeric_limits<int>::max())); };
    if (a == "--job" && has_value) o.job = argv[++i];
    else if (a == "--device" && has_value) o.device = argv[++i];
    else if (a == "--steps") o.steps = number();
    else if (a == "--batch") o.global_rows = number();
    else if (a == "--block") o.cfg.block = number();
    else if (a == "--layers") o.cfg.layers = number();
    else if (a == "--heads") o.cfg.heads = number();
    else if (a == "--embd") o.cfg.embd = number();
    else if (a == "--text" && has_value) o.text = argv[++i];
    else if (a == "--seed") o.seed = static_cast<uint64_t>(whole(0, std::numeric_limits<long long>::max()));
    else if (a == "--dump" && has_value) o.dump = argv[++i];
    else if (a == "--quiet") o.quiet = true;
    else usage(argv[0]);
  }
  const gpt::Config& c = o.cfg;
  if (o.steps < 1 || o.global_rows < 1 || c.block < 1 || c.layers < 1 || c.heads < 1 || c.embd < 1 ||
      c.embd % c.heads != 0 || (o.device != "cpu" && o.device != "cuda")) {
    std::fprintf(stderr, "%s: sizes must be positive, --embd a multiple of --heads, --device cpu or cuda\n",
                 argv[0]);
    std::exit(2);
  }
  return o;
}

std::unique_ptr<gpt::Backend> open_backend(const std::string& device, int local_rank) {
  if (device == "cpu") return gpt::make_cpu_backend();
  std::string why_not = "this build has no CUDA backend (train_gpt_cuda has it, built where nvcc is found)";
#ifdef GPT_HAVE_CUDA
  if (auto b = gpt::make_cuda_backend(local_rank, &why_not)) return b;
#else
  (void)local_rank;
#endif
  std::printf("SKIPPED: --device cuda: %s\n", why_not.c_str());
  std::exit(kCannotRunHere);
}

// One zerod module and its parameters, in registration order.
struct Module {
  std::string name;
  zd_module_id id = 0;
  std::vector<zd_param_id> params;
};

// The view's memory, checked to be what the backend computes on.
void* checked(const zd_view& v, const gpt::Backend& be, const char* what) {
  if (v.dtype != ZD_DTYPE_F32) {
    std::fprintf(stderr, "%s has dtype %d: this trainer computes in fp32 (the job's precision must be \"fp32\")\n",
                 what, static_cast<int>(v.dtype));
    std::exit(1);
  }
  if (v.device_type != be.view_device_type() ||
      (v.device_type == ZD_DEVICE_CUDA && v.device_id != be.view_device_id())) {
    std::fprintf(stderr, "%s is on device type %d, device %d: this trainer computes on %s, device %d\n", what,
                 v.device_type, v.device_id, be.name(), be.view_device_id());
    std::exit(1);
  }
  return v.data;
}
const float* weight(zd_model* model, zd_param_id p, const gpt::Backend& be) {
  zd_view v = ZD_VIEW_INIT;
  ZD_CHECK(zd_param_view(model, p, &v));
  return static_cast<const float*>(checked(v, be, "a parameter view"));
}
float* grad(zd_model* model, zd_param_id p, const gpt::Backend& be) {
  zd_view v = ZD_VIEW_INIT;
  ZD_CHECK(zd_grad_view(model, p, &v));
  return static_cast<float*>(checked(v, be, "a gradient view"));
}

// Under another launcher (torchrun, mpirun, srun) with no ZEROD_ENDPOINT,
// zd_connect joins this node's daemon or starts it, and that daemon needs
// the job script before any rank connects: ZEROD_JOB, which a caller's own
// value keeps (setenv's 0).
void name_job_for_node_daemon(const char* job) {
  if (job && setenv("ZEROD_JOB", job, 0) != 0) {
    std::perror("setenv ZEROD_JOB");
    std::exit(1);
  }
}

int run(const Options& opt) {
  gpt::Config cfg = opt.cfg;
  const gpt::Corpus corpus =
      opt.text.empty() ? gpt::synthetic_corpus(opt.seed) : gpt::text_corpus(opt.text, static_cast<size_t>(cfg.block) + 1);
  cfg.vocab = static_cast<int>(corpus.alphabet.size());
  if (corpus.tokens.size() < static_cast<size_t>(cfg.block) + 1) {
    std::fprintf(stderr, "--block %d needs a corpus of at least %d tokens; it has %zu\n", cfg.block, cfg.block + 1,
                 corpus.tokens.size());
    return 2;
  }

  name_job_for_node_daemon(opt.job);
  zd_client* client = nullptr;
  // ZEROD_ENDPOINT; else, under a launcher, the node's daemon; else embedded
  ZD_CHECK(zd_connect(nullptr, nullptr, &client));
  zd_client_info ci = ZD_CLIENT_INFO_INIT;
  ZD_CHECK(zd_client_get_info(client, &ci));
  const int rank = ci.rank, world = ci.world_size;
  if (opt.global_rows % world != 0) {
    std::fprintf(stderr, "--batch %d does not split over %d ranks\n", opt.global_rows, world);
    return 2;
  }
  cfg.rows = opt.global_rows / world;
  std::unique_ptr<gpt::Backend> backend = open_backend(opt.device, ci.local_rank);
  gpt::Backend& be = *backend;

  zd_model_options mo = ZD_MODEL_OPTIONS_INIT;
  mo.script_path = opt.job;
  mo.device = be.zerod_device();  // views point into the memory the trainer computes on
  zd_model* model = nullptr;
  ZD_CHECK(zd_model_create(client, &mo, &model));

  // Every rank registers the same parameters with the same initial values
  // (rank 0's are used); one zerod module per block, the embedding (and
  // the head tied to it) and the final norm.
  const std::vector<gpt::ParamSpec> specs = gpt::parameters(cfg);
  std::vector<gpt::NamedTensor> initial;
  std::vector<Module> modules;
  for (size_t i = 0; i < specs.size(); ++i) {
    const gpt::ParamSpec& s = specs[i];
    std::vector<float> init = gpt::initial_values(s, static_cast<int>(i), opt.seed);
    zd_param_desc d = ZD_PARAM_DESC_INIT;
    d.dtype = ZD_DTYPE_F32;
    d.name = s.name.c_str();
    d.module = s.module.c_str();
    d.ndim = static_cast<int32_t>(s.shape.size());
    d.shape = s.shape.data();
    d.init = init.data();
    d.init_dtype = ZD_DTYPE_F32;
    zd_param_id id = 0;
    ZD_CHECK(zd_model_register_param(model, &d, &id));
    if (modules.empty() || modules.back().name != s.module) modules.push_back(Module{s.module, 0, {}});
    modules.back().params.push_back(id);
    if (!opt.dump.empty()) initial.push_back(gpt::NamedTensor{s.name, s.shape, std::move(init)});
  }
  ZD_CHECK(zd_model_finalize(model));
  for (Module& m : modules) ZD_CHECK(zd_model_find_module(model, m.name.c_str(), &m.id));
  const Module& embed = modules.front();  // wte, wpe
  const Module& ln_f = modules.back();
  // On the GPU zerod orders its copies against the trainer's stream (the cpu takes NULL).
  ZD_CHECK(zd_model_set_stream(model, be.stream()));

  if (!opt.dump.empty() && rank == 0)
    gpt::write_reference_inputs(opt.dump, {cfg.vocab, cfg.block, cfg.layers, cfg.heads, cfg.embd,
                                           opt.global_rows, opt.steps}, initial, corpus, opt.seed);
  initial.clear();
  if (rank == 0)
    std::printf("GPT %d layers, %d heads, width %d, context %d, vocabulary %d; %d sequences per step on %d rank%s; "
                "%s on %s\ncorpus: %s\n",
                cfg.layers, cfg.heads, cfg.embd, cfg.block, cfg.vocab, opt.global_rows, world, world > 1 ? "s" : "",
                be.name(), ci.embedded ? "zerod embedded" : "the zerod daemon", corpus.source.c_str());

  gpt::Gpt net(cfg, be);
  auto block_weights = [&](const Module& m) {
    gpt::BlockWeights w{};
    for (int k = 0; k < gpt::kBlockParams; ++k) w[static_cast<size_t>(k)] = weight(model, m.params[static_cast<size_t>(k)], be);
    return w;
  };
  auto block_grads = [&](const Module& m) {
    gpt::BlockGrads g{};
    for (int k = 0; k < gpt::kBlockParams; ++k) g[static_cast<size_t>(k)] = grad(model, m.params[static_cast<size_t>(k)], be);
    return g;
  };

  std::vector<double> losses;
  const auto start = std::chrono::steady_clock::now();
  int64_t micro_batches = 0;  // tokens/s counts every micro-batch, not only the steps' boundaries
  for (int64_t micro = 0;; ++micro) {
    ++micro_batches;
    const std::vector<int32_t> batch = gpt::global_batch(corpus, micro, opt.global_rows, cfg.block, opt.seed);
    net.set_batch(batch.data() + static_cast<size_t>(rank) * cfg.rows * (cfg.block + 1));
    double loss_scale = 1.0;
    ZD_CHECK(zd_model_loss_scale(model, &loss_scale));

    // Forward: each module's parameters are resident between its begin and end.
    ZD_CHECK(zd_forward_begin(model, embed.id));
    net.embed_forward(weight(model, embed.params[0], be), weight(model, embed.params[1], be));
    ZD_CHECK(zd_forward_end(model, embed.id));
    for (int l = 0; l < cfg.layers; ++l) {
      const Module& m = modules[static_cast<size_t>(l) + 1];
      ZD_CHECK(zd_forward_begin(model, m.id));
      net.block_forward(l, block_weights(m));
      ZD_CHECK(zd_forward_end(model, m.id));
    }
    ZD_CHECK(zd_forward_begin(model, ln_f.id));
    net.final_norm_forward(weight(model, ln_f.params[0], be), weight(model, ln_f.params[1], be));
    ZD_CHECK(zd_forward_end(model, ln_f.id));
    ZD_CHECK(zd_forward_begin(model, embed.id));  // again: the head is the embedding's weight
    net.head_forward(weight(model, embed.params[0], be),
                     static_cast<float>(loss_scale / (static_cast<double>(cfg.rows) * cfg.block)));
    ZD_CHECK(zd_forward_end(model, embed.id));

    // Backward, in the reverse order. Gradient views are zero at each begin;
    // what is in them at the end is added, so the tied weight's two
    // contributions (head, embedding) add up.
    ZD_CHECK(zd_backward_begin(model, embed.id));
    net.head_backward(weight(model, embed.params[0], be), grad(model, embed.params[0], be));
    ZD_CHECK(zd_backward_end(model, embed.id));
    ZD_CHECK(zd_backward_begin(model, ln_f.id));
    net.final_norm_backward(weight(model, ln_f.params[0], be), grad(model, ln_f.params[0], be),
                            grad(model, ln_f.params[1], be));
    ZD_CHECK(zd_backward_end(model, ln_f.id));
    for (int l = cfg.layers - 1; l >= 0; --l) {
      const Module& m = modules[static_cast<size_t>(l) + 1];
      ZD_CHECK(zd_backward_begin(model, m.id));
      net.block_backward(l, block_weights(m), block_grads(m));
      ZD_CHECK(zd_backward_end(model, m.id));
    }
    ZD_CHECK(zd_backward_begin(model, embed.id));
    net.embed_backward(grad(model, embed.params[0], be), grad(model, embed.params[1], be));
    ZD_CHECK(zd_backward_end(model, embed.id));

    zd_step_result sr = ZD_STEP_RESULT_INIT;
    ZD_CHECK(zd_step(model, &sr));
    const double loss = net.loss();
    zd_progress progress = ZD_PROGRESS_INIT;  // zerod's metrics and the trace's loss plot
    progress.tokens = static_cast<uint64_t>(cfg.rows) * cfg.block;
    progress.samples = static_cast<uint64_t>(cfg.rows);
    progress.flags = ZD_PROGRESS_HAS_LOSS;
    progress.loss = loss;
    ZD_CHECK(zd_model_report(model, &progress));
    if (!(sr.flags & ZD_STEP_BOUNDARY)) continue;
    losses.push_back(loss);
    if (rank == 0 && (!opt.quiet || sr.step == opt.steps))
      std::printf("step %4lld  loss %.7f  lr %.9g  grad_norm %.7g%s\n", static_cast<long long>(sr.step), loss, sr.lr,
                  sr.grad_norm, (sr.flags & ZD_STEP_SKIPPED) ? "  (skipped: overflow)" : "");
    if (sr.step >= opt.steps) break;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  const size_t last = losses.size() < 10 ? losses.size() : 10;
  double tail = 0;
  for (size_t i = losses.size() - last; i < losses.size(); ++i) tail += losses[i];
  zd_memory_figures mem[3] = {ZD_MEMORY_FIGURES_INIT, ZD_MEMORY_FIGURES_INIT, ZD_MEMORY_FIGURES_INIT};
  const zd_tier tiers[3] = {ZD_TIER_DEVICE, ZD_TIER_HOST, ZD_TIER_NVME};
  for (int t = 0; t < 3; ++t) ZD_CHECK(zd_model_memory(model, -1, tiers[t], ZD_MEM_ALL, &mem[t]));
  if (rank == 0) {
    std::printf("final loss %.4f (mean of the last %zu steps", tail / static_cast<double>(last), last);
    if (corpus.entropy_floor >= 0) std::printf("; the corpus's floor is %.4f", corpus.entropy_floor);
    std::printf(")  %.0f tokens/s per rank\n",
                static_cast<double>(micro_batches) * cfg.rows * cfg.block / seconds);
    std::printf("model state per rank: device %llu bytes (peak %llu), host %llu, nvme %llu\n",
                static_cast<unsigned long long>(mem[0].current), static_cast<unsigned long long>(mem[0].peak),
                static_cast<unsigned long long>(mem[1].current), static_cast<unsigned long long>(mem[2].current));
  }
  zd_model_destroy(model);
  zd_disconnect(client);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {  // a backend's or the data's error, with its file:line or path
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
    return 1;
  }
}
