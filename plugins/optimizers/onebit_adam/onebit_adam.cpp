// zd_optimizer_onebit_adam.so: 1-bit Adam as DeepSpeed's OnebitAdam does it,
// on the plugin ABI v3 (zerod_plugin.h, zd_optimizer_v3), and v2 for hosts
// that know no newer. docs/onebit.md has the whole story; in short, with
// update number t (1-based):
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
//
// On v3 the warm-up is the job's compression.warmup(step) where it has one
// (true: a warm-up step), else t <= freeze_step; the v3 plan of a compressed
// step is PREPARE (the local momentum, from the kept average), EXCHANGE,
// PASS (the momentum slot takes the average, then the frozen-v step).
#include <array>
#include <atomic>
#include <cstring>
#include <new>

#include "glue.h"

namespace {

namespace glue = zerod::optim::glue;
namespace optim = zerod::optim;

#ifdef ZEROD_ONEBIT_V2_ONLY
constexpr const char* kName = "onebit_adam_v2";
#else
constexpr const char* kName = "onebit_adam";
#endif

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
  return glue::create_instance<Instance>(
      kSpecs.data(), kSpecs.size(), values, value_count, out_instance, err, err_size, glue::no_more_checks,
      [host](Instance& inst, const double* v) {
        inst.hp.lr = v[0];
        inst.hp.beta1 = v[1];
        inst.hp.beta2 = v[2];
        inst.hp.eps = v[3];
        inst.hp.weight_decay = v[4];
        inst.freeze_step = static_cast<int64_t>(v[5]);
        inst.host = glue::copy_host(host);
        if (inst.freeze_step == 0) {
          glue::log(inst.host, ZD_LOG_WARN, kName,
                    "freeze_step = 0: v is never estimated (it stays 0), so every update is lr * m / eps; "
                    "set freeze_step to 15-25%% of the steps unless that is what you want");
        }
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

// --- plugin ABI v3 ----------------------------------------------------------

enum Kind : uint32_t { kWarmup = 0, kCompressed = 1 };

zd_status plan(const void* instance, int64_t step, int32_t warmup, int32_t, zd_optimizer_plan* out) noexcept {
  if (instance == nullptr || out == nullptr || step < 1) return ZD_ERR_INVALID_ARGUMENT;
  const auto& inst = *static_cast<const Instance*>(instance);
  *out = zd_optimizer_plan{};
  out->struct_size = sizeof *out;
  const bool warm = warmup >= 0 ? warmup != 0 : step <= inst.freeze_step;
  if (warm) {
    out->kind = kWarmup;
    out->grads = ZD_GRADS_AVERAGED;
    out->ops[0] = ZD_OP_PASS_GRAD;
    return ZD_OK;
  }
  out->kind = kCompressed;
  out->grads = ZD_GRADS_LOCAL;
  out->keep_average = 1;
  // The pass reads the exchanged momentum, the master and the variance,
  // which no compressed step changes: a rank holding a whole copy of v can
  // replay the update of any element (compression.replay).
  out->replay_slots = 1u << 1;
  out->ops[0] = ZD_OP_PREPARE;
  out->ops[1] = ZD_OP_EXCHANGE;
  out->ops[2] = ZD_OP_PASS;
  return ZD_OK;
}

// A warm-up step (grad: the average across ranks), or a compressed step's
// pass: m takes the average, then the step with the frozen v.
zd_status update_v3(const void* instance, zd_isa isa, const zd_optimizer_update* u) noexcept {
  return glue::guarded([&]() -> zd_status {
    if (instance == nullptr || u == nullptr || u->struct_size < sizeof(zd_optimizer_update)) {
      return ZD_ERR_INVALID_ARGUMENT;
    }
    const auto& inst = *static_cast<const Instance*>(instance);
    const bool compressed = u->kind == kCompressed;
    if (compressed && (u->grad != nullptr || u->exchange == nullptr)) {
      return refuse(inst, *u, "a compressed step's pass needs the exchanged momentum and no gradient");
    }
    optim::Range r;
    const zd_status st = glue::read_update(u, 2, &r, {.master = true, .grad = !compressed});
    if (st != ZD_OK) return st;
    if (compressed && u->count > 0) std::memcpy(u->state[0], u->exchange, u->count * sizeof(float));
    return run(inst, isa, *u, compressed ? optim::OnebitPhase::frozen : optim::OnebitPhase::warmup, r);
  });
}

// The local momentum from the rank's gradient and the last average (in the
// exchange buffer), written there for the exchange.
zd_status prepare(const void* instance, zd_isa isa, const zd_optimizer_update* u) noexcept {
  return glue::guarded([&]() -> zd_status {
    if (instance == nullptr || u == nullptr || u->struct_size < sizeof(zd_optimizer_update) ||
        u->exchange == nullptr) {
      return ZD_ERR_INVALID_ARGUMENT;
    }
    zd_optimizer_update m = *u;
    m.state[0] = u->exchange;
    optim::Range r;
    const zd_status st = glue::read_update(&m, 1, &r, {.master = false, .grad = true});
    if (st != ZD_OK) return st;
    r.master = nullptr;
    r.work = nullptr;
    return run(*static_cast<const Instance*>(instance), isa, m, optim::OnebitPhase::momentum, r);
  });
}

uint32_t no_values(const void*) noexcept { return 0; }
zd_stat_op sum_op(const void*, uint32_t) noexcept { return ZD_STAT_SUM; }
// Every stage: the host exchanges whole tensors and keeps the average as bits.
zd_status any_partitions(const void*, uint32_t, char*, size_t) noexcept { return ZD_OK; }
int32_t compresses(const void*) noexcept { return 1; }

constexpr const char* kDescription =
    "1-bit Adam (DeepSpeed's OnebitAdam): Adam warm-up, then 1-bit compressed momentum with error feedback and "
    "frozen variance";

[[maybe_unused]] const zd_optimizer_v3 kDescriptorV3 = {
    ZD_DESCRIPTOR_HEAD(ZD_PLUGIN_OPTIMIZER, zd_optimizer_v3, 3, 0, 2, kName,
                       kDescription,
                       kSpecs.data(), kSpecs.size()),
    .create = create,
    .destroy = destroy,
    .state_slots = state_slots,
    .state_name = state_name,
    .supports_isa = glue::supports_isa,
    .update = update_v3,
    .update_cuda = nullptr,
    .plan = plan,
    .prepare = prepare,
    .average_slot = momentum_slot,
    .tensor_scalars = no_values,
    .tensor_stats = no_values,
    .stat_op = sum_op,
    .tensor_step = nullptr,
    .check_partitions = any_partitions,
    .compresses = compresses,
};

// --- plugin ABI v2 ----------------------------------------------------------

const zd_optimizer_v2 kDescriptor = {
    ZD_DESCRIPTOR_HEAD(ZD_PLUGIN_OPTIMIZER, zd_optimizer_v2, 2, 0, 2, kName,
                       kDescription,
                       kSpecs.data(), kSpecs.size()),
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

// v3, then v2 for older hosts (a test build, ZEROD_ONEBIT_V2_ONLY, offers v2
// alone to exercise the host's v2 adapter). Never v1: a v1 host could not
// compress, and would run this as Adam without bias correction under a name
// that promises less communication.
}  // namespace

#ifdef ZEROD_ONEBIT_V2_ONLY
ZD_PLUGIN_DESCRIPTORS(&kDescriptor.header)
#else
ZD_PLUGIN_DESCRIPTORS(&kDescriptorV3.header, &kDescriptor.header)
#endif
