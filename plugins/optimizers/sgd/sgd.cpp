// zd_optimizer_sgd.so: torch.optim.SGD (momentum, dampening, Nesterov, L2
// weight decay). One state slot, the momentum buffer, only when momentum > 0.
#include <array>
#include <new>

#include "glue.h"

#if defined(ZEROD_HAVE_CUDA)
#include <zerod/optim/kernels_cuda.h>
#endif

namespace {

namespace optim = zerod::optim;
namespace glue = zerod::optim::glue;

// Spec order = value order: lr, momentum, dampening, weight_decay, nesterov.
constexpr std::array<zd_hparam_spec, 5> kSpecs = {{
    glue::number_spec("lr", 1e-2, 0.0, glue::kUnbounded, ZD_HPARAM_MIN_EXCLUSIVE,
                      "learning rate; the job script's schedule may override it per step"),
    glue::number_spec("momentum", 0.0, 0.0, 1.0, ZD_HPARAM_MAX_EXCLUSIVE,
                      "momentum factor; 0 keeps no state"),
    glue::number_spec("dampening", 0.0, 0.0, 1.0, 0, "dampening of the gradient's share of the momentum"),
    glue::number_spec("weight_decay", 0.0, 0.0, glue::kUnbounded, 0,
                      "L2 penalty: wd*p is added to the gradient (torch.optim.SGD)"),
    glue::bool_spec("nesterov", false, "Nesterov momentum; needs momentum > 0 and dampening = 0"),
}};

struct Instance {
  optim::SgdParams hp;  // lr, step and grad_scale come with each update
  glue::Host host;
};

uint32_t slots_of(const Instance* inst) { return inst->hp.momentum > 0.0 ? 1u : 0u; }

zd_status create(const zd_host_services* host, const double* values, size_t value_count, void** out_instance,
                 char* err, size_t err_size) noexcept {
  const auto check = [&](const double* v) {
    const double momentum = v[1], dampening = v[2];
    if (v[4] != 0.0 && (momentum <= 0.0 || dampening != 0.0)) {
      glue::set_error(err, err_size,
                      "nesterov = true requires momentum > 0 and dampening = 0 "
                      "(got momentum = %g, dampening = %g)",
                      momentum, dampening);
      return ZD_ERR_CONFIG;
    }
    return ZD_OK;
  };
  return glue::create_instance<Instance>(kSpecs.data(), kSpecs.size(), values, value_count, out_instance, err,
                                         err_size, check, [host](Instance& inst, const double* v) {
                                           inst.hp.lr = v[0];
                                           inst.hp.momentum = v[1];
                                           inst.hp.dampening = v[2];
                                           inst.hp.weight_decay = v[3];
                                           inst.hp.nesterov = v[4] != 0.0;
                                           inst.host = glue::copy_host(host);
                                         });
}

void destroy(void* instance) noexcept { delete static_cast<Instance*>(instance); }

uint32_t state_slots(const void* instance) noexcept {
  return instance != nullptr ? slots_of(static_cast<const Instance*>(instance)) : 0u;
}

const char* state_name(const void* instance, uint32_t slot) noexcept {
  return slot < state_slots(instance) ? "momentum_buffer" : nullptr;
}

// Reads the update and the per-step values into a range and parameters.
zd_status prepare(const void* instance, const zd_optimizer_update* u, optim::Range* r, optim::SgdParams* hp,
                  float** buf) {
  if (instance == nullptr) return ZD_ERR_INVALID_ARGUMENT;
  const auto* inst = static_cast<const Instance*>(instance);
  const uint32_t slots = slots_of(inst);
  const zd_status st = glue::read_update(u, slots, r);
  if (st != ZD_OK) return st;
  *hp = inst->hp;
  hp->lr = u->lr;
  hp->step = u->step;
  hp->grad_scale = u->grad_scale;
  *buf = slots > 0 ? u->state[0] : nullptr;
  return ZD_OK;
}

zd_status update(const void* instance, zd_isa isa, const zd_optimizer_update* u) noexcept {
  return glue::guarded([&]() -> zd_status {
    optim::Range r;
    optim::SgdParams hp;
    float* buf = nullptr;
    zd_status st = prepare(instance, u, &r, &hp, &buf);
    if (st != ZD_OK) return st;
    optim::Isa k;
    st = glue::resolve_isa(isa, &k);
    if (st != ZD_OK) return st;
    return optim::sgd_update(k, hp, r, buf) ? ZD_OK : ZD_ERR_INTERNAL;
  });
}

#if defined(ZEROD_HAVE_CUDA)
zd_status update_cuda(const void* instance, const zd_optimizer_update* u, void* stream) noexcept {
  return glue::guarded([&]() -> zd_status {
    optim::Range r;
    optim::SgdParams hp;
    float* buf = nullptr;
    const zd_status st = prepare(instance, u, &r, &hp, &buf);
    if (st != ZD_OK) return st;
    const int rc = optim::cuda::sgd_update(hp, r, buf, stream);
    if (rc == 0) return ZD_OK;
    glue::log(static_cast<const Instance*>(instance)->host, ZD_LOG_ERROR, "sgd",
              "CUDA update of %llu elements failed: %s", static_cast<unsigned long long>(r.count),
              optim::cuda::error_string(rc));
    return rc == optim::cuda::kBadDtype ? ZD_ERR_INVALID_ARGUMENT : ZD_ERR_INTERNAL;
  });
}
#endif

const zd_optimizer_v1 kDescriptor = {
    ZD_DESCRIPTOR_HEAD(ZD_PLUGIN_OPTIMIZER, zd_optimizer_v1, 1, 0, 1, "sgd",
                       "SGD with momentum, dampening, Nesterov and L2 weight decay (torch.optim.SGD)",
                       kSpecs.data(), kSpecs.size()),
    .create = create,
    .destroy = destroy,
    .state_slots = state_slots,
    .state_name = state_name,
    .supports_isa = glue::supports_isa,
    .update = update,
#if defined(ZEROD_HAVE_CUDA)
    .update_cuda = update_cuda,
#else
    .update_cuda = nullptr,
#endif
};

}  // namespace

ZD_PLUGIN_DESCRIPTORS(&kDescriptor.header)
