#include "adam_family.h"

#include <new>

#if defined(ZEROD_HAVE_CUDA)
#include <zerod/optim/kernels_cuda.h>
#endif

namespace zerod::optim::adam_family {
namespace {

struct Instance {
  AdamParams hp;  // lr, step and grad_scale come with each update
  glue::Host host;
  const char* plugin;
};

// Reads the update and the per-step values into a range and parameters;
// with_state_dtype: the v4 field saying what m and v hold (else fp32).
zd_status prepare(const void* instance, const zd_optimizer_update* u, bool with_state_dtype, Range* r,
                  AdamParams* hp, AdamState* s) {
  if (instance == nullptr) return ZD_ERR_INVALID_ARGUMENT;
  zd_status st = glue::read_update(u, 2, r);
  if (st != ZD_OK) return st;
  s->dtype = Dtype::f32;
  if (with_state_dtype) {
    st = glue::read_state_dtype(u, &s->dtype);
    if (st != ZD_OK) return st;
  }
  *hp = static_cast<const Instance*>(instance)->hp;
  hp->lr = u->lr;
  hp->step = u->step;
  hp->grad_scale = u->grad_scale;
  s->exp_avg = u->state[0];
  s->exp_avg_sq = u->state[1];
  return ZD_OK;
}

zd_status update_on_cpu(const void* instance, zd_isa isa, const zd_optimizer_update* u, bool with_state_dtype) {
  return glue::guarded([&]() -> zd_status {
    Range r;
    AdamParams hp;
    AdamState s;
    zd_status st = prepare(instance, u, with_state_dtype, &r, &hp, &s);
    if (st != ZD_OK) return st;
    Isa k;
    st = glue::resolve_isa(isa, &k);
    if (st != ZD_OK) return st;
    return adam_update(k, hp, r, s) ? ZD_OK : ZD_ERR_INTERNAL;
  });
}

#if defined(ZEROD_HAVE_CUDA)
zd_status update_on_cuda(const void* instance, const zd_optimizer_update* u, void* stream, bool with_state_dtype) {
  return glue::guarded([&]() -> zd_status {
    Range r;
    AdamParams hp;
    AdamState s;
    const zd_status st = prepare(instance, u, with_state_dtype, &r, &hp, &s);
    if (st != ZD_OK) return st;
    const int rc = cuda::adam_update(hp, r, s, stream);
    if (rc == 0) return ZD_OK;
    const auto* inst = static_cast<const Instance*>(instance);
    glue::log(inst->host, ZD_LOG_ERROR, inst->plugin, "CUDA update of %llu elements failed: %s",
              static_cast<unsigned long long>(r.count), cuda::error_string(rc));
    return rc == cuda::kBadDtype ? ZD_ERR_INVALID_ARGUMENT : ZD_ERR_INTERNAL;
  });
}
#endif

}  // namespace

zd_status create(bool decoupled, const char* plugin, const zd_hparam_spec* specs, uint32_t spec_count,
                 const zd_host_services* host, const double* values, size_t value_count, void** out_instance,
                 char* err, size_t err_size) noexcept {
  return glue::create_instance<Instance>(
      specs, spec_count, values, value_count, out_instance, err, err_size, glue::no_more_checks,
      [&](Instance& inst, const double* v) {
        inst.hp.lr = v[0];
        inst.hp.beta1 = v[1];
        inst.hp.beta2 = v[2];
        inst.hp.eps = v[3];
        inst.hp.weight_decay = v[4];
        inst.hp.bias_correction = v[5] != 0.0;
        inst.hp.decoupled = decoupled;
        inst.host = glue::copy_host(host);
        inst.plugin = plugin;
      });
}

void destroy(void* instance) noexcept { delete static_cast<Instance*>(instance); }

uint32_t state_slots(const void*) noexcept { return 2; }

const char* state_name(const void*, uint32_t slot) noexcept {
  switch (slot) {
    case 0: return "exp_avg";
    case 1: return "exp_avg_sq";
    default: return nullptr;
  }
}

zd_status update(const void* instance, zd_isa isa, const zd_optimizer_update* u) noexcept {
  return update_on_cpu(instance, isa, u, true);
}

zd_status update_v1(const void* instance, zd_isa isa, const zd_optimizer_update* u) noexcept {
  return update_on_cpu(instance, isa, u, false);
}

// Every ISA and the CUDA kernels keep m and v in either.
int32_t supports_state_dtype(const void*, zd_dtype dtype) noexcept {
  return dtype == ZD_DTYPE_F32 || dtype == ZD_DTYPE_BF16 ? 1 : 0;
}

#if defined(ZEROD_HAVE_CUDA)
zd_status update_cuda(const void* instance, const zd_optimizer_update* u, void* stream) noexcept {
  return update_on_cuda(instance, u, stream, true);
}

zd_status update_cuda_v1(const void* instance, const zd_optimizer_update* u, void* stream) noexcept {
  return update_on_cuda(instance, u, stream, false);
}
#endif

}  // namespace zerod::optim::adam_family
