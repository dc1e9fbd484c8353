// zd_optimizer_onebit_adam.so: 1-bit Adam as DeepSpeed's OnebitAdam does it,
// on the plugin ABI v2 (zerod_plugin.h, zd_optimizer_v2). docs/onebit.md has
// the whole story; in short, with update number t (1-based):
//
//   t <= freeze_step (warm-up), update() with the gradient averaged across
//   ranks:
//     m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//     p -= lr (m / (sqrt(v) + eps) + wd p)
//   t > freeze_step (compression; compression_start() = freeze_step + 1):
//     momentum() with the rank's local gradient: m = b1 m + (1 - b1) g
//     the host replaces m by its 1-bit compressed average across ranks
//     update() with grad NULL: p -= lr (m / (sqrt(v) + eps) + wd p), v frozen
//
// There is no bias correction, in either phase: DeepSpeed's OnebitAdam has
// none (its bias_correction argument is unused), and a job moved from it
// should train the same. g is the gradient times grad_scale. The working copy
// is written in the same pass as the master, as adamw does.
#include <array>
#include <atomic>
#include <new>

#include "glue.h"

namespace {

namespace glue = zerod::optim::glue;
namespace optim = zerod::optim;

constexpr const char* kName = "onebit_adam";

// DeepSpeed's default. Most jobs should set it (DeepSpeed recommends 15-25%
// of the total steps), but a default that compresses early would degrade
// convergence silently, while one this large only costs bandwidth: until
// freeze_step the optimizer is plain Adam (without bias correction).
constexpr double kDefaultFreezeStep = 100000;
// Any step count a run can reach, and exact as a double.
constexpr double kMaxFreezeStep = 1e15;

// Spec order, which is also the order of the values create() receives:
// lr, betas[0], betas[1], eps, weight_decay, freeze_step.
constexpr std::array<zd_hparam_spec, 5> kSpecs = {{
    glue::number_spec("lr", 1e-3, 0.0, glue::kUnbounded, ZD_HPARAM_MIN_EXCLUSIVE,
                      "learning rate; the job script's schedule may override it per step"),
    glue::pair_spec("betas", 0.9, 0.999, 0.0, 1.0, ZD_HPARAM_MAX_EXCLUSIVE,
                    "decay rates of the momentum (compressed after freeze_step) and of the variance (frozen "
                    "after freeze_step)"),
    glue::number_spec("eps", 1e-8, 0.0, glue::kUnbounded, ZD_HPARAM_MIN_EXCLUSIVE,
                      "added to sqrt(v), which is not bias-corrected (as in DeepSpeed's OnebitAdam)"),
    glue::number_spec("weight_decay", 0.0, 0.0, glue::kUnbounded, 0,
                      "added to the update: p -= lr * (m / (sqrt(v) + eps) + wd * p)"),
    glue::integer_spec("freeze_step", kDefaultFreezeStep, 0.0, kMaxFreezeStep,
                       "warm-up updates of plain Adam before the momentum is 1-bit compressed and v frozen; "
                       "DeepSpeed suggests 15-25% of the total steps; 0 compresses from the first update, with "
                       "v = 0 forever"),
}};

struct Instance {
  optim::OnebitAdamParams hp;  // lr and grad_scale come with each update
  int64_t freeze_step = 0;
  glue::Host host;
  // The host is told once about a call that breaks the v2 protocol, not once
  // per range.
  mutable std::atomic<bool> protocol_logged{false};
};

zd_status create(const zd_host_services* host, const double* values, size_t value_count, void** out_instance, char* err,
                 size_t err_size) noexcept {
  return glue::guarded([&]() -> zd_status {
    if (out_instance == nullptr) {
      glue::set_error(err, err_size, "out_instance is NULL");
      return ZD_ERR_INVALID_ARGUMENT;
    }
    *out_instance = nullptr;
    const zd_status st = glue::check_values(kSpecs.data(), kSpecs.size(), values, value_count, err, err_size);
    if (st != ZD_OK) return st;
    auto* inst = new (std::nothrow) Instance{};
    if (inst == nullptr) {
      glue::set_error(err, err_size, "out of memory");
      return ZD_ERR_OUT_OF_MEMORY;
    }
    inst->hp.lr = values[0];
    inst->hp.beta1 = values[1];
    inst->hp.beta2 = values[2];
    inst->hp.eps = values[3];
    inst->hp.weight_decay = values[4];
    inst->freeze_step = static_cast<int64_t>(values[5]);
    inst->host = glue::copy_host(host);
    if (inst->freeze_step == 0) {
      glue::log(inst->host, ZD_LOG_WARN, kName,
                "freeze_step = 0: v is never estimated (it stays 0), so every update is lr * m / eps; "
                "set freeze_step to 15-25%% of the steps unless that is what you want");
    }
    *out_instance = inst;
    return ZD_OK;
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

int64_t compression_start(const void* instance) noexcept {
  return instance == nullptr ? 0 : static_cast<const Instance*>(instance)->freeze_step + 1;
}

uint32_t momentum_slot(const void*) noexcept { return 0; }

// Reports, once, a call that breaks the v2 protocol (the status alone would
// not say why).
zd_status refuse(const Instance& inst, const zd_optimizer_update& u, const char* why) {
  if (!inst.protocol_logged.exchange(true)) {
    glue::log(inst.host, ZD_LOG_ERROR, kName, "update %lld (compression from update %lld): %s",
              static_cast<long long>(u.step), static_cast<long long>(inst.freeze_step + 1), why);
  }
  return ZD_ERR_INVALID_ARGUMENT;
}

zd_status run(const Instance& inst, zd_isa isa, const zd_optimizer_update& u, optim::OnebitPhase phase,
              const optim::Range& r) {
  optim::Isa k;
  const zd_status st = glue::resolve_isa(isa, &k);
  if (st != ZD_OK) return st;
  optim::OnebitAdamParams hp = inst.hp;
  hp.lr = u.lr;
  hp.grad_scale = u.grad_scale;
  const optim::AdamState s{u.state[0], phase == optim::OnebitPhase::momentum ? nullptr : u.state[1]};
  return optim::onebit_adam_update(k, hp, phase, r, s) ? ZD_OK : ZD_ERR_INTERNAL;
}

// Warm-up (grad: the average across ranks) or, from compression_start(),
// the step from the averaged momentum and frozen v (grad must be NULL: the
// gradient went into momentum() already).
zd_status update(const void* instance, zd_isa isa, const zd_optimizer_update* u) noexcept {
  return glue::guarded([&]() -> zd_status {
    if (instance == nullptr || u == nullptr) return ZD_ERR_INVALID_ARGUMENT;
    const auto& inst = *static_cast<const Instance*>(instance);
    const bool compressing = u->struct_size >= sizeof(zd_optimizer_update) && u->step > inst.freeze_step;
    if (compressing && u->grad != nullptr) {
      return refuse(inst, *u,
                    "update() got a gradient in the compression phase; the host must pass it to momentum(), "
                    "average the momentum with compressed_all_reduce, then call update() with grad NULL");
    }
    optim::Range r;
    const zd_status st = glue::read_update(u, 2, &r, {.master = true, .grad = !compressing});
    if (st != ZD_OK) return st;
    return run(inst, isa, *u, compressing ? optim::OnebitPhase::frozen : optim::OnebitPhase::warmup, r);
  });
}

// The compression phase's first step: m from the rank's local gradient.
// Reads only grad and state slot 0; master and work are not touched. It does
// not look at the step: the host decides when it is called.
zd_status momentum(const void* instance, zd_isa isa, const zd_optimizer_update* u) noexcept {
  return glue::guarded([&]() -> zd_status {
    if (instance == nullptr) return ZD_ERR_INVALID_ARGUMENT;
    optim::Range r;
    const zd_status st = glue::read_update(u, 1, &r, {.master = false, .grad = true});
    if (st != ZD_OK) return st;
    r.master = nullptr;
    r.work = nullptr;
    return run(*static_cast<const Instance*>(instance), isa, *u, optim::OnebitPhase::momentum, r);
  });
}

const zd_optimizer_v2 kDescriptor = {
    .header = {.kind = ZD_PLUGIN_OPTIMIZER,
               .struct_size = sizeof(zd_optimizer_v2),
               .abi_version = 2,
               .plugin_version = (0u << 16) | 1u,
               .name = kName,
               .description = "1-bit Adam (DeepSpeed's OnebitAdam): Adam warm-up, then 1-bit compressed momentum "
                              "with error feedback and frozen variance"},
    .hparams = kSpecs.data(),
    .hparam_count = kSpecs.size(),
    .reserved = 0,
    .create = create,
    .destroy = destroy,
    .state_slots = state_slots,
    .state_name = state_name,
    .supports_isa = glue::supports_isa,
    .update = update,
    // No CUDA kernels yet, and v2 has no momentum_cuda for the compression
    // phase: a rank on a GPU runs this optimizer's updates on the CPU.
    .update_cuda = nullptr,
    .compression_start = compression_start,
    .momentum_slot = momentum_slot,
    .momentum = momentum,
};

// Only v2: a v1 host could not compress, and would run this as Adam without
// bias correction under a name that promises less communication.
const zd_plugin_header* const kDescriptors[] = {&kDescriptor.header, nullptr};

}  // namespace

extern "C" ZD_PLUGIN_EXPORT const zd_plugin_header* const* zd_plugin_descriptors(void) { return kDescriptors; }
