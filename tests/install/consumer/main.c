/* Trains one step against an installed zerod: headers, library and plugins
 * must all be where the install put them. */
#include <zerod/zerod.h>

#include <stdio.h>

int main(void) {
  zd_client* c = NULL;
  zd_model* m = NULL;
  zd_model_options o = ZD_MODEL_OPTIONS_INIT;
  o.script_text = "return { optimizer = { type = 'adamw', lr = 0.1 } }";
  int64_t shape[1] = {8};
  zd_param_desc d = ZD_PARAM_DESC_INIT;
  d.name = "w";
  d.module = "m";
  d.ndim = 1;
  d.shape = shape;
  zd_step_result r = ZD_STEP_RESULT_INIT;
  if (zd_connect(NULL, NULL, &c) || zd_model_create(c, &o, &m) ||
      zd_model_register_param(m, &d, NULL) || zd_model_finalize(m) || zd_backward_begin(m, 0) ||
      zd_backward_end(m, 0) || zd_step(m, &r)) {
    fprintf(stderr, "consumer: %s\n", zd_last_error());
    return 1;
  }
  printf("consumer: zerod %s, step %lld applied\n", zd_version(), (long long)r.step);
  zd_disconnect(c);
  return r.step == 1 ? 0 : 1;
}
