/* A trainer for the daemon-restart test: three parameters, one module each,
 * gradients that depend on the weights, the step and the rank, so that every
 * step's weights depend on every step before. On start it asks zerod where
 * the job stands (a restarted job resumes from a snapshot) and goes on from
 * there; after every step it prints the step and an exact checksum of the
 * weights it saw:
 *   resume_trainer <steps> <ms per step> [<scale>: each parameter that many times larger]
 *   [rank r] resumed at <s>        (when s > 0)
 *   [rank r] step <s> <hex float>  */
#include <zerod/zerod.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CHECK(call)                                                                  \
  do {                                                                               \
    zd_status st_ = (call);                                                          \
    if (st_ != ZD_OK) {                                                              \
      fprintf(stderr, "%s: %s: %s\n", #call, zd_status_str(st_), zd_last_error());  \
      exit(1);                                                                       \
    }                                                                                \
  } while (0)

static const int64_t kSizes[3] = {300, 1000, 7};

int main(int argc, char** argv) {
  const int steps = argc > 1 ? atoi(argv[1]) : 30;
  const int ms = argc > 2 ? atoi(argv[2]) : 0;
  const int64_t scale = argc > 3 ? atoll(argv[3]) : 1;
  int64_t sizes[3];
  for (int i = 0; i < 3; ++i) sizes[i] = kSizes[i] * (scale > 0 ? scale : 1);
  zd_client* client;
  CHECK(zd_connect(NULL, NULL, &client));
  zd_client_info info = ZD_CLIENT_INFO_INIT;
  CHECK(zd_client_get_info(client, &info));
  zd_model_options mo = ZD_MODEL_OPTIONS_INIT;
  zd_model* model;
  CHECK(zd_model_create(client, &mo, &model));
  zd_param_id ids[3];
  for (int i = 0; i < 3; ++i) {
    float* init = malloc(sizeof(float) * (size_t)sizes[i]);
    for (int64_t j = 0; j < sizes[i]; ++j) init[j] = sinf((float)(j + 5 * i));
    char name[8], module[8];
    snprintf(name, sizeof name, "w%d", i);
    snprintf(module, sizeof module, "m%d", i);
    zd_param_desc d = ZD_PARAM_DESC_INIT;
    d.name = name;
    d.module = module;
    d.ndim = 1;
    d.shape = &sizes[i];
    d.init = init;
    CHECK(zd_model_register_param(model, &d, &ids[i]));
    free(init);
  }
  CHECK(zd_model_finalize(model));
  zd_optimizer_info oi = ZD_OPTIMIZER_INFO_INIT;
  CHECK(zd_model_optimizer_info(model, &oi));
  if (oi.step > 0) printf("resumed at %lld\n", (long long)oi.step);
  for (int s = (int)oi.step; s < steps; ++s) {
    double sum = 0;
    for (int m = 2; m >= 0; --m) {
      CHECK(zd_backward_begin(model, m));
      zd_view w = ZD_VIEW_INIT, g = ZD_VIEW_INIT;
      CHECK(zd_param_view(model, ids[m], &w));
      CHECK(zd_grad_view(model, ids[m], &g));
      const float* wd = w.data;
      float* gd = g.data;
      for (int64_t j = 0; j < sizes[m]; ++j) {
        sum += (double)wd[j] * (double)(j + 1);
        gd[j] = wd[j] - cosf((float)(j + 3 * s + info.rank));
      }
      CHECK(zd_backward_end(model, m));
    }
    CHECK(zd_step(model, NULL));
    printf("step %d %a\n", s, sum);
    fflush(stdout);
    if (ms > 0) {
      struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
      nanosleep(&t, NULL);
    }
  }
  zd_model_destroy(model);
  zd_disconnect(client);
  return 0;
}
