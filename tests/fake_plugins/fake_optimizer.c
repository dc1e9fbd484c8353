/*
 * One source, several fake optimizer plugins (selected with -D), to test how
 * the host loads plugins: a good one, one from the future (ABI 99), one that
 * offers v1 and v3, one without the entry point, one whose descriptor has
 * another name, one whose create() refuses, one with a required function
 * missing, one whose create() is slow (FAKE_CREATE_SLEEP_MS: a plugin that
 * takes its time, for the daemon's tests of what waits for a model's build).
 * The update rule is plain SGD: p -= lr * scale * g.
 */
#include <zerod/zerod_plugin.h>

#include <stdio.h>
#include <string.h>
#ifdef FAKE_CREATE_SLEEP_MS
#include <time.h>
#endif

#ifndef FAKE_NAME
#define FAKE_NAME "fake"
#endif
#ifndef FAKE_ABI_VERSION
#define FAKE_ABI_VERSION 1
#endif

static const zd_hparam_spec hparams[] = {
    {"lr", ZD_HPARAM_NUMBER, 1, {0.1}, 0.0, 1e9, ZD_HPARAM_MIN_EXCLUSIVE, "learning rate"},
};

static int instance_token __attribute__((unused));

static zd_status create(const zd_host_services* host, const double* values, size_t count,
                        void** out, char* err, size_t err_size) {
  (void)values;
  (void)count;
  if (host && host->log) host->log(host->host, ZD_LOG_DEBUG, FAKE_NAME, "created");
#ifdef FAKE_CREATE_SLEEP_MS
  {
    struct timespec left = {FAKE_CREATE_SLEEP_MS / 1000, (FAKE_CREATE_SLEEP_MS % 1000) * 1000000L};
    while (nanosleep(&left, &left) != 0) {
    }
  }
#endif
#ifdef FAKE_CREATE_FAILS
  (void)out;
  snprintf(err, err_size, "fake refuses: lr must be exactly 42");
  return ZD_ERR_INVALID_ARGUMENT;
#else
  (void)err;
  (void)err_size;
  *out = &instance_token;
  return ZD_OK;
#endif
}

static void destroy(void* instance) { (void)instance; }
static uint32_t state_slots(const void* instance) { (void)instance; return 0; }
static const char* state_name(const void* instance, uint32_t slot) {
  (void)instance;
  (void)slot;
  return NULL;
}
static int32_t supports_isa(zd_isa isa) { return isa == ZD_ISA_AUTO || isa == ZD_ISA_SCALAR; }

__attribute__((unused)) static zd_status update(const void* instance, zd_isa isa, const zd_optimizer_update* u) {
  (void)instance;
  if (!supports_isa(isa)) return ZD_ERR_NOT_IMPLEMENTED;
  if (u->grad_dtype != ZD_DTYPE_F32) return ZD_ERR_INVALID_ARGUMENT;
  const float* g = (const float*)u->grad;
  for (uint64_t i = 0; i < u->count; ++i) {
    u->master[i] -= (float)(u->lr * u->grad_scale * g[i]);
    if (u->work && u->work_dtype == ZD_DTYPE_F32) ((float*)u->work)[i] = u->master[i];
  }
  return ZD_OK;
}

static const zd_optimizer_v1 descriptor = {
    {ZD_PLUGIN_OPTIMIZER, sizeof(zd_optimizer_v1), FAKE_ABI_VERSION, 1,
#ifdef FAKE_DESCRIPTOR_NAME
     FAKE_DESCRIPTOR_NAME,
#else
     FAKE_NAME,
#endif
     "a fake optimizer for loader tests"},
    hparams,
    1,
    0,
    create,
    destroy,
    state_slots,
    state_name,
    supports_isa,
#ifdef FAKE_NULL_UPDATE
    NULL,
#else
    update,
#endif
    NULL};

#ifdef FAKE_TWO_VERSIONS
/* A made-up version, one past the host's newest, that only a newer host would read. */
typedef struct {
  zd_optimizer_v1 v1;
  double extra[8];
} fake_v2;
static const fake_v2 descriptor_v2 = {{{ZD_PLUGIN_OPTIMIZER, sizeof(fake_v2), ZD_OPTIMIZER_ABI_VERSION + 1, 1, FAKE_NAME,
                                        "a version from the future"},
                                       NULL, 0, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL},
                                      {0}};
#endif

static const zd_plugin_header* const descriptors[] = {
#ifdef FAKE_TWO_VERSIONS
    &descriptor_v2.v1.header,
#endif
    &descriptor.header, NULL};

#ifndef FAKE_NO_ENTRY
ZD_PLUGIN_EXPORT const zd_plugin_header* const* zd_plugin_descriptors(void) { return descriptors; }
#else
ZD_PLUGIN_EXPORT const zd_plugin_header* const* not_the_entry_point(void) { return descriptors; }
#endif
