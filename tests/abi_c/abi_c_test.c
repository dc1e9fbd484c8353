/*
 * The C ABI from C alone: this file includes zerod.h and nothing of zerod's
 * C++, is compiled as strict C11 with warnings as errors, and calls every
 * exported function. It exits non-zero on the first failed expectation.
 */
#include <zerod/zerod.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;

#define EXPECT(cond)                                                                 \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      fprintf(stderr, "%s:%d: expected %s (last error: %s)\n", __FILE__, __LINE__, #cond, \
              zd_last_error());                                                      \
      ++failures;                                                                    \
    }                                                                                \
  } while (0)

static const char* job =
    "local zerod = require('zerod')\n"
    "return {\n"
    "  optimizer = { type = 'adamw', lr = 0.05, weight_decay = 0 },\n"
    "  lr = zerod.warmup_linear{ warmup_steps = 2, max_lr = 0.05 },\n"
    "}\n";

int main(void) {
  EXPECT(zd_abi_version() == ZD_ABI_VERSION);
  EXPECT(strlen(zd_version()) > 0);
  EXPECT(strcmp(zd_status_str(ZD_ERR_TIMEOUT), "ZD_ERR_TIMEOUT") == 0);

  zd_connect_options co = ZD_CONNECT_OPTIONS_INIT;
  zd_client* client = NULL;
  EXPECT(zd_connect("embedded:", &co, &client) == ZD_OK);
  if (!client) return 1;
  zd_client_info info = ZD_CLIENT_INFO_INIT;
  EXPECT(zd_client_get_info(client, &info) == ZD_OK && info.world_size == 1);

  zd_model_options mo = ZD_MODEL_OPTIONS_INIT;
  mo.script_text = job;
  mo.script_name = "c_test.lua";
  zd_model* model = NULL;
  EXPECT(zd_model_create(client, &mo, &model) == ZD_OK);
  if (!model) return 1;

  /* Minimise sum((w - 3)^2) over 4 weights, starting from zero. */
  int64_t shape[1] = {4};
  zd_param_desc d = ZD_PARAM_DESC_INIT;
  d.name = "w";
  d.module = "m";
  d.ndim = 1;
  d.shape = shape;
  zd_param_id w = -1;
  EXPECT(zd_model_register_param(model, &d, &w) == ZD_OK && w == 0);
  EXPECT(zd_model_finalize(model) == ZD_OK);

  zd_module_id m = -1;
  zd_param_id found = -1;
  int32_t count = 0;
  EXPECT(zd_model_find_module(model, "m", &m) == ZD_OK && m == 0);
  EXPECT(zd_model_find_param(model, "w", &found) == ZD_OK && found == w);
  EXPECT(zd_model_param_count(model, &count) == ZD_OK && count == 1);
  EXPECT(zd_model_module_count(model, &count) == ZD_OK && count == 1);
  zd_param_info pi = ZD_PARAM_INFO_INIT;
  EXPECT(zd_model_param_info(model, w, &pi) == ZD_OK && pi.numel == 4 && strcmp(pi.name, "w") == 0);
  const char* mname = NULL;
  zd_param_id ids[1];
  count = 1;
  EXPECT(zd_model_module_info(model, m, &mname, ids, &count) == ZD_OK && count == 1 && ids[0] == w);

  double scale = 0;
  EXPECT(zd_model_loss_scale(model, &scale) == ZD_OK && scale == 1.0);
  EXPECT(zd_model_set_stream(model, NULL) == ZD_OK);
  EXPECT(zd_model_save(model, NULL) == ZD_ERR_INVALID_ARGUMENT && zd_model_load(model, "") == ZD_ERR_INVALID_ARGUMENT);
  zd_step_result r = ZD_STEP_RESULT_INIT;
  for (int step = 0; step < 200; ++step) {
    float wv[4];
    EXPECT(zd_forward_begin(model, m) == ZD_OK);
    zd_view v = ZD_VIEW_INIT;
    EXPECT(zd_param_view(model, w, &v) == ZD_OK && v.dtype == ZD_DTYPE_F32);
    memcpy(wv, v.data, sizeof wv);
    EXPECT(zd_forward_end(model, m) == ZD_OK);
    EXPECT(zd_backward_begin(model, m) == ZD_OK);
    zd_view g = ZD_VIEW_INIT;
    EXPECT(zd_grad_view(model, w, &g) == ZD_OK);
    for (int i = 0; i < 4; ++i) ((float*)g.data)[i] = 2.0f * (wv[i] - 3.0f);
    EXPECT(zd_backward_end(model, m) == ZD_OK);
    EXPECT(zd_step(model, &r) == ZD_OK);
  }
  EXPECT(r.step == 200 && (r.flags & ZD_STEP_APPLIED));
  float out[4];
  EXPECT(zd_param_read(model, w, ZD_DTYPE_F32, out, sizeof out) == ZD_OK);
  for (int i = 0; i < 4; ++i) EXPECT(fabsf(out[i] - 3.0f) < 0.05f);
  const float reset[4] = {0, 0, 0, 0};
  EXPECT(zd_param_write(model, w, ZD_DTYPE_F32, reset, sizeof reset) == ZD_OK);

  zd_memory_figures mem = ZD_MEMORY_FIGURES_INIT;
  EXPECT(zd_model_memory(model, -1, ZD_TIER_DEVICE, ZD_MEM_ALL, &mem) == ZD_OK && mem.current > 0);
  zd_comm_figures comm = ZD_COMM_FIGURES_INIT;
  EXPECT(zd_model_comm_figures(model, -1, &comm) == ZD_OK && comm.bytes_sent == 0);
  zd_progress progress = ZD_PROGRESS_INIT;
  progress.tokens = 64;
  progress.flags = ZD_PROGRESS_HAS_LOSS;
  progress.loss = 0.5;
  EXPECT(zd_model_report(model, &progress) == ZD_OK);
  EXPECT(zd_model_report(model, NULL) == ZD_ERR_INVALID_ARGUMENT);
  progress.flags = 2;
  EXPECT(zd_model_report(model, &progress) == ZD_ERR_INVALID_ARGUMENT);

  /* A checkpoint of the optimizer: its state slots and step, written back. */
  zd_optimizer_info oi = ZD_OPTIMIZER_INFO_INIT;
  EXPECT(zd_model_optimizer_info(model, &oi) == ZD_OK);
  EXPECT(oi.state_slots == 2 && oi.step == 200 && strcmp(oi.name, "adamw") == 0);
  EXPECT(oi.slot_names[0] && strcmp(oi.slot_names[0], "exp_avg") == 0 && oi.slot_names[2] == NULL);
  float m1[4], m2[4];
  EXPECT(zd_optimizer_state_read(model, w, 0, ZD_DTYPE_F32, m1, sizeof m1) == ZD_OK);
  EXPECT(zd_optimizer_state_write(model, w, 0, ZD_DTYPE_F32, reset, sizeof reset) == ZD_OK);
  EXPECT(zd_optimizer_state_read(model, w, 0, ZD_DTYPE_F32, m2, sizeof m2) == ZD_OK && m2[0] == 0.0f);
  EXPECT(zd_optimizer_state_write(model, w, 0, ZD_DTYPE_F32, m1, sizeof m1) == ZD_OK);
  EXPECT(zd_optimizer_state_read(model, w, 2, ZD_DTYPE_F32, m2, sizeof m2) == ZD_ERR_INVALID_ARGUMENT);
  EXPECT(zd_model_set_step(model, 7) == ZD_OK);
  EXPECT(zd_model_optimizer_info(model, &oi) == ZD_OK && oi.step == 7);
  /* The trainer's learning rate (ABI 1.7). */
  EXPECT(zd_model_set_lr(model, 0.001) == ZD_OK);
  EXPECT(zd_model_set_lr(model, -1.0) == ZD_ERR_INVALID_ARGUMENT);

  /* An error on this model is reported on it and on this thread. */
  EXPECT(zd_forward_end(model, m) == ZD_ERR_INVALID_STATE);
  EXPECT(strstr(zd_model_last_error(model), "not in forward") != NULL);
  EXPECT(strcmp(zd_last_error(), zd_model_last_error(model)) == 0);

  zd_model_destroy(model);
  zd_disconnect(client);
  if (failures) fprintf(stderr, "%d expectation(s) failed\n", failures);
  else printf("abi_c_test: every zd_* function called from C, all as expected\n");
  return failures ? 1 : 0;
}
