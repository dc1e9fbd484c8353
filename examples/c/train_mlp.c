/*
 * A trainer in plain C against zerod.h: a three-layer MLP that learns to
 * classify points of a three-armed spiral it generates itself. The trainer
 * does all the math; zerod owns the parameters, gradients and optimizer
 * state, and applies the optimizer the job script names.
 *
 *   train_mlp [--job job.lua] [--steps N] [--dtype f32|bf16|f16] [--quiet]
 *   zerod run --nproc 2 --job job.lua -- train_mlp        (data parallel)
 *
 * It connects where the environment says (embedded when run alone, the
 * daemon under `zerod run`, the node's daemon it starts on demand under
 * another launcher: torchrun, mpirun, srun). Every rank walks the same
 * shuffled order and takes its own slice of each global batch of
 * BATCH * world_size points.
 * Rank 0 prints the loss at every step.
 */
#include <zerod/zerod.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CLASSES 3
#define PER_CLASS 300
#define POINTS (CLASSES * PER_CLASS)
#define HIDDEN 64
#define BATCH 100

/* Stops with the call, its status and zerod's message. */
#define CHECK(call)                                                                    \
  do {                                                                                 \
    zd_status st_ = (call);                                                            \
    if (st_ != ZD_OK) {                                                                \
      fprintf(stderr, "%s failed: %s\n  %s\n", #call, zd_status_str(st_), zd_last_error()); \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)

/* A small deterministic generator (xorshift64*), so every run is the same. */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double rand_uniform(void) {
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return (double)((rng_state * 0x2545F4914F6CDD1Dull) >> 11) / 9007199254740992.0;
}
static double rand_normal(void) {
  double u = rand_uniform(), v = rand_uniform();
  if (u < 1e-12) u = 1e-12;
  return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* Reading and writing elements of a view in whatever dtype it has. */
static float bf16_to_f32(uint16_t h) {
  uint32_t b = (uint32_t)h << 16;
  float f;
  memcpy(&f, &b, 4);
  return f;
}
static uint16_t f32_to_bf16(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  if ((b & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u; /* every NaN: PyTorch's quiet NaN, as zerod rounds */
  b += 0x7fffu + ((b >> 16) & 1u);
  return (uint16_t)(b >> 16);
}
static float f16_to_f32(uint16_t h) {
  uint32_t e = (h >> 10) & 31u, m = h & 0x3ffu;
  if (e == 31u && m) { /* NaN: quiet, with its sign and payload, as zerod widens */
    const uint32_t b = ((uint32_t)(h & 0x8000u) << 16) | 0x7fc00000u | (m << 13);
    float f;
    memcpy(&f, &b, 4);
    return f;
  }
  float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? INFINITY
                                                     : ldexpf((float)(m | 0x400u), (int)e - 25);
  return (h & 0x8000u) ? -v : v;
}
static uint16_t f32_to_f16(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  const uint16_t sign = (uint16_t)((b >> 16) & 0x8000u);
  const uint32_t a = b & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u | (uint16_t)((a >> 13) & 0x3ffu); /* NaN: quiet, top payload */
  if (a >= 0x477ff000u) return sign | 0x7c00u;        /* rounds to inf */
  if (a < 0x38800000u) {                              /* subnormal half */
    float af;
    memcpy(&af, &a, 4);
    return sign | (uint16_t)nearbyintf(af * 16777216.0f);
  }
  uint32_t h = (a >> 13) - (112u << 10);              /* rebias, keep 10 bits */
  const uint32_t rest = a & 0x1fffu;                  /* round to nearest even */
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h += 1;
  return sign | (uint16_t)h;
}
static float load(const zd_view* v, size_t i) {
  switch (v->dtype) {
    case ZD_DTYPE_BF16: return bf16_to_f32(((const uint16_t*)v->data)[i]);
    case ZD_DTYPE_F16: return f16_to_f32(((const uint16_t*)v->data)[i]);
    default: return ((const float*)v->data)[i];
  }
}
static void store(const zd_view* v, size_t i, float x) {
  switch (v->dtype) {
    case ZD_DTYPE_BF16: ((uint16_t*)v->data)[i] = f32_to_bf16(x); break;
    case ZD_DTYPE_F16: ((uint16_t*)v->data)[i] = f32_to_f16(x); break;
    default: ((float*)v->data)[i] = x; break;
  }
}

/* One dense layer y = x W^T + b with W [out, in], as a zerod module. */
typedef struct {
  const char* name;
  int in, out;
  zd_module_id module;
  zd_param_id weight, bias;
  float* w; /* fp32 copies of the params while the module runs */
  float* b;
} Layer;

static void layer_register(zd_model* model, Layer* L, zd_dtype dtype) {
  char wname[64], bname[64];
  snprintf(wname, sizeof wname, "%s.weight", L->name);
  snprintf(bname, sizeof bname, "%s.bias", L->name);
  float* init = malloc(sizeof(float) * (size_t)L->in * (size_t)L->out);
  const double scale = sqrt(2.0 / L->in); /* He initialisation for ReLU */
  for (int i = 0; i < L->in * L->out; ++i) init[i] = (float)(rand_normal() * scale);
  int64_t wshape[2] = {L->out, L->in}, bshape[1] = {L->out};
  zd_param_desc d = ZD_PARAM_DESC_INIT;
  d.dtype = dtype;
  d.name = wname;
  d.module = L->name;
  d.ndim = 2;
  d.shape = wshape;
  d.init = init;
  d.init_dtype = ZD_DTYPE_F32;
  CHECK(zd_model_register_param(model, &d, &L->weight));
  d.name = bname;
  d.ndim = 1;
  d.shape = bshape;
  d.init = NULL; /* biases start at zero */
  CHECK(zd_model_register_param(model, &d, &L->bias));
  free(init);
  L->w = malloc(sizeof(float) * (size_t)L->in * (size_t)L->out);
  L->b = malloc(sizeof(float) * (size_t)L->out);
}

/* Copies the module's resident params into fp32 scratch (they may be 16-bit). */
static void layer_fetch(zd_model* model, Layer* L) {
  zd_view v = ZD_VIEW_INIT;
  CHECK(zd_param_view(model, L->weight, &v));
  for (int i = 0; i < L->in * L->out; ++i) L->w[i] = load(&v, (size_t)i);
  zd_view vb = ZD_VIEW_INIT;
  CHECK(zd_param_view(model, L->bias, &vb));
  for (int i = 0; i < L->out; ++i) L->b[i] = load(&vb, (size_t)i);
}

static void layer_forward(zd_model* model, Layer* L, const float* x, float* y, int n, int relu) {
  CHECK(zd_forward_begin(model, L->module));
  layer_fetch(model, L);
  for (int r = 0; r < n; ++r)
    for (int o = 0; o < L->out; ++o) {
      float s = L->b[o];
      for (int i = 0; i < L->in; ++i) s += x[r * L->in + i] * L->w[o * L->in + i];
      y[r * L->out + o] = relu && s < 0 ? 0 : s;
    }
  CHECK(zd_forward_end(model, L->module));
}

/* Given dy (already through the activation), writes dW, db into zerod's
 * gradient views and dx (if wanted) for the layer below. */
static void layer_backward(zd_model* model, Layer* L, const float* x, const float* dy, float* dx,
                           int n) {
  CHECK(zd_backward_begin(model, L->module));
  layer_fetch(model, L);
  zd_view gw = ZD_VIEW_INIT, gb = ZD_VIEW_INIT;
  CHECK(zd_grad_view(model, L->weight, &gw));
  CHECK(zd_grad_view(model, L->bias, &gb));
  for (int o = 0; o < L->out; ++o) {
    float sb = 0;
    for (int r = 0; r < n; ++r) sb += dy[r * L->out + o];
    store(&gb, (size_t)o, sb);
    for (int i = 0; i < L->in; ++i) {
      float s = 0;
      for (int r = 0; r < n; ++r) s += dy[r * L->out + o] * x[r * L->in + i];
      store(&gw, (size_t)(o * L->in + i), s);
    }
  }
  if (dx)
    for (int r = 0; r < n; ++r)
      for (int i = 0; i < L->in; ++i) {
        float s = 0;
        for (int o = 0; o < L->out; ++o) s += dy[r * L->out + o] * L->w[o * L->in + i];
        dx[r * L->in + i] = s;
      }
  CHECK(zd_backward_end(model, L->module));
}

static void make_spiral(float* x, int* y) {
  for (int c = 0; c < CLASSES; ++c)
    for (int i = 0; i < PER_CLASS; ++i) {
      const double r = (double)i / PER_CLASS;
      const double t = c * 4.0 + 4.0 * r + rand_normal() * 0.2;
      const int k = c * PER_CLASS + i;
      x[2 * k] = (float)(r * sin(t));
      x[2 * k + 1] = (float)(r * cos(t));
      y[k] = c;
    }
}

/* The job script beside this file, wherever the trainer is run from (the
   build names the folder; a copy built elsewhere looks in examples/c). */
#ifndef ZEROD_EXAMPLE_DIR
#define ZEROD_EXAMPLE_DIR "examples/c"
#endif

int main(int argc, char** argv) {
  const char* job = getenv("ZEROD_JOB") ? NULL : ZEROD_EXAMPLE_DIR "/job.lua"; /* NULL: ZEROD_JOB */
  int steps = 300, quiet = 0;
  zd_dtype dtype = ZD_DTYPE_F32;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--job") && i + 1 < argc) job = argv[++i];
    else if (!strcmp(argv[i], "--steps") && i + 1 < argc) {
      /* All of the argument a count from 1 (atoi read "abc" as 0). */
      const char* text = argv[++i];
      char* end = NULL;
      errno = 0;
      const long v = strtol(text, &end, 10);
      if (errno != 0 || end == text || *end != '\0' || v < 1 || v > 100000000L) {
        fprintf(stderr, "%s: --steps %s: a count from 1 to 100000000\n", argv[0], text);
        return 2;
      }
      steps = (int)v;
    }
    else if (!strcmp(argv[i], "--quiet")) quiet = 1;
    else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) {
      const char* d = argv[++i];
      if (!strcmp(d, "f32") || !strcmp(d, "fp32")) dtype = ZD_DTYPE_F32;
      else if (!strcmp(d, "bf16")) dtype = ZD_DTYPE_BF16;
      else if (!strcmp(d, "f16") || !strcmp(d, "fp16")) dtype = ZD_DTYPE_F16;
      else {
        fprintf(stderr, "%s: --dtype %s: f32, bf16 or f16\n", argv[0], d);
        return 2;
      }
    } else {
      fprintf(stderr, "usage: %s [--job job.lua] [--steps N] [--dtype f32|bf16|f16] [--quiet]\n",
              argv[0]);
      return 2;
    }
  }

  static float X[POINTS * 2];
  static int Y[POINTS];
  make_spiral(X, Y);

  /* Under another launcher (torchrun, mpirun, srun) with no ZEROD_ENDPOINT,
     zd_connect joins this node's daemon or starts it, and that daemon needs
     the job script before any rank connects: ZEROD_JOB, which a caller's
     own value keeps (setenv's 0). */
  if (job && setenv("ZEROD_JOB", job, 0) != 0) {
    perror("setenv ZEROD_JOB");
    return 1;
  }
  zd_client* client = NULL;
  /* ZEROD_ENDPOINT; else, under a launcher, the node's daemon; else embedded */
  CHECK(zd_connect(NULL, NULL, &client));
  zd_client_info ci = ZD_CLIENT_INFO_INIT;
  CHECK(zd_client_get_info(client, &ci));
  const int rank = ci.rank, world = ci.world_size;
  if (world > POINTS / BATCH) {
    fprintf(stderr, "at most %d ranks: a global batch must fit the data\n", POINTS / BATCH);
    return 2;
  }
  zd_model_options mo = ZD_MODEL_OPTIONS_INIT;
  mo.script_path = job;
  zd_model* model = NULL;
  CHECK(zd_model_create(client, &mo, &model));

  Layer layers[3] = {{"fc1", 2, HIDDEN, 0, 0, 0, NULL, NULL},
                     {"fc2", HIDDEN, HIDDEN, 0, 0, 0, NULL, NULL},
                     {"fc3", HIDDEN, CLASSES, 0, 0, 0, NULL, NULL}};
  for (int l = 0; l < 3; ++l) layer_register(model, &layers[l], dtype);
  CHECK(zd_model_finalize(model));
  for (int l = 0; l < 3; ++l) CHECK(zd_model_find_module(model, layers[l].name, &layers[l].module));

  static float xb[BATCH * 2], h1[BATCH * HIDDEN], h2[BATCH * HIDDEN], logits[BATCH * CLASSES];
  static float dlogits[BATCH * CLASSES], dh2[BATCH * HIDDEN], dh1[BATCH * HIDDEN];
  static int yb[BATCH];
  static int order[POINTS];
  for (int i = 0; i < POINTS; ++i) order[i] = i;
  int cursor = POINTS;
  double loss = 0.0;

  for (int micro = 0; ; ++micro) {
    /* A fresh shuffled pass over the data when one ends (the same order on
     * every rank: the generator is seeded alike). */
    if (cursor + BATCH * world > POINTS) {
      for (int i = POINTS - 1; i > 0; --i) {
        int j = (int)(rand_uniform() * (i + 1));
        int t = order[i]; order[i] = order[j]; order[j] = t;
      }
      cursor = 0;
    }
    for (int r = 0; r < BATCH; ++r) {
      const int k = order[cursor + rank * BATCH + r];
      xb[2 * r] = X[2 * k];
      xb[2 * r + 1] = X[2 * k + 1];
      yb[r] = Y[k];
    }
    cursor += BATCH * world;

    layer_forward(model, &layers[0], xb, h1, BATCH, 1);
    layer_forward(model, &layers[1], h1, h2, BATCH, 1);
    layer_forward(model, &layers[2], h2, logits, BATCH, 0);

    /* Softmax cross-entropy, mean over the batch; the gradient is scaled by
     * the loss scale (1 unless the job is fp16). */
    double scale = 1.0;
    CHECK(zd_model_loss_scale(model, &scale));
    loss = 0.0;
    for (int r = 0; r < BATCH; ++r) {
      float mx = logits[r * CLASSES];
      for (int c = 1; c < CLASSES; ++c) mx = fmaxf(mx, logits[r * CLASSES + c]);
      double z = 0;
      for (int c = 0; c < CLASSES; ++c) z += exp(logits[r * CLASSES + c] - mx);
      for (int c = 0; c < CLASSES; ++c) {
        const double p = exp(logits[r * CLASSES + c] - mx) / z;
        dlogits[r * CLASSES + c] = (float)((p - (c == yb[r])) / BATCH * scale);
      }
      loss -= (logits[r * CLASSES + yb[r]] - mx) - log(z);
    }
    loss /= BATCH;

    layer_backward(model, &layers[2], h2, dlogits, dh2, BATCH);
    for (int i = 0; i < BATCH * HIDDEN; ++i) dh2[i] = h2[i] > 0 ? dh2[i] : 0;
    layer_backward(model, &layers[1], h1, dh2, dh1, BATCH);
    for (int i = 0; i < BATCH * HIDDEN; ++i) dh1[i] = h1[i] > 0 ? dh1[i] : 0;
    layer_backward(model, &layers[0], xb, dh1, NULL, BATCH);

    zd_step_result sr = ZD_STEP_RESULT_INIT;
    CHECK(zd_step(model, &sr));
    /* What this rank processed and its loss: zerod's metrics and the trace's loss plot. */
    zd_progress progress = ZD_PROGRESS_INIT;
    progress.samples = BATCH;
    progress.flags = ZD_PROGRESS_HAS_LOSS;
    progress.loss = loss;
    CHECK(zd_model_report(model, &progress));
    if (sr.flags & ZD_STEP_BOUNDARY) {
      if (rank == 0 && (!quiet || sr.step == steps))
        printf("step %4lld  loss %.4f  lr %.5f  grad_norm %.4f%s\n", (long long)sr.step, loss,
               sr.lr, sr.grad_norm, (sr.flags & ZD_STEP_SKIPPED) ? "  (skipped: overflow)" : "");
      if (sr.step >= steps) break;
    }
  }

  /* Accuracy on the whole dataset, reading the trained weights back. */
  int correct = 0;
  for (int k = 0; k < POINTS; ++k) {
    layer_forward(model, &layers[0], &X[2 * k], h1, 1, 1);
    layer_forward(model, &layers[1], h1, h2, 1, 1);
    layer_forward(model, &layers[2], h2, logits, 1, 0);
    int best = 0;
    for (int c = 1; c < CLASSES; ++c)
      if (logits[c] > logits[best]) best = c;
    correct += best == Y[k];
  }
  /* Every tier's bytes: with offload (job_offload.lua) most state is off the device. */
  zd_memory_figures mem[3] = {ZD_MEMORY_FIGURES_INIT, ZD_MEMORY_FIGURES_INIT, ZD_MEMORY_FIGURES_INIT};
  const zd_tier tiers[3] = {ZD_TIER_DEVICE, ZD_TIER_HOST, ZD_TIER_NVME};
  for (int t = 0; t < 3; ++t) CHECK(zd_model_memory(model, -1, tiers[t], ZD_MEM_ALL, &mem[t]));
  if (rank == 0)
    printf("final loss %.4f  accuracy %.1f%%  ranks %d  model state per rank: device %llu bytes "
           "(peak %llu), host %llu, nvme %llu\n",
           loss, 100.0 * correct / POINTS, world, (unsigned long long)mem[0].current,
           (unsigned long long)mem[0].peak, (unsigned long long)mem[1].current,
           (unsigned long long)mem[2].current);

  for (int l = 0; l < 3; ++l) {
    free(layers[l].w);
    free(layers[l].b);
  }
  zd_model_destroy(model);
  zd_disconnect(client);
  return 0;
}
