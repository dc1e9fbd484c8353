// zd_optimizer_zero_one_adam.so: 0/1 Adam (Lu et al. 2022; DeepSpeed's
// ZeroOneAdam) on the plugin ABI v3 (zerod_plugin.h, zd_optimizer_v3). With
// update number t (1-based), V = var_freeze_step:
//
//   t <= V, a variance step (DeepSpeed's exponential policy, or the job's
//     compression.warmup): gradients averaged in full precision,
//       m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  p -= lr (m/d + wd p)
//   t <= V, any other step: the local gradients' 1-bit compressed average g~
//     (error feedback kept by the host), v unchanged,
//       m = b1 m + (1 - b1) g~;  p -= lr (m/d + wd p)
//   t > V, v frozen, local steps (when local_steps is true): each rank
//     moves its own copy with its own gradient and accumulates the move,
//       m = b1 m + (1 - b1) g;  upd = m/d + wd p;  p -= lr upd;  u -= lr upd
//     and at a sync step (DeepSpeed's interval policy, or compression.sync)
//     the moves are undone, u d is averaged 1-bit compressed, and
//       m = -avg / lrs;  p += avg / d;  u = 0
//     where lrs sums the learning rates since the last sync (a per-tensor
//     scalar the host keeps, and checkpoints hold, beside the accumulator
//     slot u: a run resumed between two syncs needs both).
//     lrs = 0 (every lr since the last sync 0: a schedule's tail at min_lr
//     = 0, or warmup_linear's lr(0) = 0 with var_freeze_step = 0): every
//     move and every u was 0, so there is nothing to sync, and m = -avg /
//     lrs has no limit (avg still carries the error feedback's remainder of
//     earlier syncs, so avg / lrs grows without bound as lrs -> 0). The
//     sync is then a local step at lr 0:
//       p and m as the first pass left them;  u = 0
//     p does not move (an lr of 0 moves nothing, as with every other
//     optimizer; the remainder that avg carried is dropped, and what these
//     syncs drop telescopes to at most the error feedback's own size), and
//     m stays each rank's own, as between two syncs, until the next sync
//     with lrs > 0 sets it from the moves again. No division by lrs, so
//     nothing non-finite.
//   t > V without local steps (local_steps = false, every ZeRO stage): the
//     sync interval is 1, and what is synced is the momentum: each rank's
//     m_r = b1 m + (1 - b1) g_r is averaged 1-bit compressed (error feedback
//     kept by the host), and
//       m = avg;  p -= lr (m/d + wd p)
//     which is 1-bit Adam's compressed step. It is the local steps' sync at
//     interval 1 but for the weight decay term (wd p d, the same on every
//     rank): there it is compressed with m and stays in the next step's m;
//     here it is applied outside m, so no rank needs another's v or master.
//     With weight_decay = 0 the two take the same path.
//
// d = sqrt(v) + eps; no bias correction (DeepSpeed's has none). Local steps
// move each rank's own whole copy of the parameters, momentum and
// accumulator, so they run where each rank holds all of them: ZeRO stage 0
// (check_partitions refuses them at stages 1-3, where local_steps = false
// runs). The error feedback restarts when the variance freezes (it held
// gradient errors, now it holds accumulator or momentum errors), as DeepSpeed
// restarts it when its local steps begin.
//
// Why momentum and not 1-bit gradients after V without local steps: on the
// main job's GPT (800 steps, lr 2e-3 and 4e-3) 1-bit gradient steps ended
// 6.7-10.9% above Adam's loss, the momentum syncs within 2% (docs/onebit.md).
#include <array>
#include <atomic>
#include <cstdint>
#include <new>

#include "glue.h"
#include "kernels.h"
#include "schedule.h"

namespace {

namespace glue = zerod::optim::glue;
namespace optim = zerod::optim;
namespace zo = zerod::optim::zero_one;

constexpr const char* kName = "zero_one_adam";
constexpr double kMaxStep = 1e15;  // any step count a run can reach, exact as a double

// Spec order, which is also the order of the values create() receives.
constexpr std::array<zd_hparam_spec, 9> kSpecs = {{
    glue::number_spec("lr", 1e-3, 0.0, glue::kUnbounded, ZD_HPARAM_MIN_EXCLUSIVE,
                      "learning rate; the job script's schedule may override it per step"),
    glue::pair_spec("betas", 0.9, 0.999, 0.0, 1.0, ZD_HPARAM_MAX_EXCLUSIVE,
                    "decay rates of the momentum and of the variance"),
    glue::number_spec("eps", 1e-8, 0.0, glue::kUnbounded, ZD_HPARAM_MIN_EXCLUSIVE,
                      "added to sqrt(v), which is not bias-corrected (as in DeepSpeed's ZeroOneAdam)"),
    glue::number_spec("weight_decay", 0.0, 0.0, glue::kUnbounded, 0,
                      "added to the update: p -= lr * (m / (sqrt(v) + eps) + wd * p)"),
    glue::integer_spec("var_freeze_step", 100000, 0.0, kMaxStep,
                       "the last update that may update the variance; local steps follow it (DeepSpeed's default; "
                       "usually the end of the learning-rate warm-up)"),
    glue::integer_spec("var_update_scaler", 16, 1.0, kMaxStep,
                       "kappa: the variance interval (1 at first) doubles after this many variance updates"),
    glue::integer_spec("local_step_scaler", 32678, 1.0, kMaxStep,
                       "after var_freeze_step the sync interval (1 at first) doubles every this many updates"),
    glue::integer_spec("local_step_clipper", 16, 1.0, kMaxStep, "H: the largest sync interval"),
    glue::bool_spec("local_steps", true,
                    "local steps after var_freeze_step (ZeRO stage 0 only); false syncs the momentum every step, "
                    "1-bit compressed (1-bit Adam's compressed step), with the variance frozen"),
}};

enum Kind : uint32_t { kVariance = 0, kGradient = 1, kLocal = 2, kSync = 3, kMomentum = 4 };

struct Instance {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  int64_t var_freeze_step = 0, kappa = 16, local_scaler = 32678, local_clipper = 16;
  bool local_steps = true;
  glue::Host host;
};

const Instance& self(const void* p) { return *static_cast<const Instance*>(p); }

zd_status create(const zd_host_services* host, const double* values, size_t value_count, void** out_instance, char* err,
                 size_t err_size) noexcept {
  return glue::create_instance<Instance>(
      kSpecs.data(), kSpecs.size(), values, value_count, out_instance, err, err_size, glue::no_more_checks,
      [host](Instance& inst, const double* v) {
        inst.beta1 = v[1];
        inst.beta2 = v[2];
        inst.eps = v[3];
        inst.weight_decay = v[4];
        inst.var_freeze_step = static_cast<int64_t>(v[5]);
        inst.kappa = static_cast<int64_t>(v[6]);
        inst.local_scaler = static_cast<int64_t>(v[7]);
        inst.local_clipper = static_cast<int64_t>(v[8]);
        inst.local_steps = v[9] != 0.0;
        inst.host = glue::copy_host(host);
        if (inst.var_freeze_step == 0) {
          glue::log(inst.host, ZD_LOG_WARN, kName,
                    "var_freeze_step = 0: v is never estimated (it stays 0), so every update is lr * m / eps; set it "
                    "to the end of the learning-rate warm-up unless that is what you want");
        }
      });
}

void destroy(void* instance) noexcept { delete static_cast<Instance*>(instance); }

uint32_t state_slots(const void* instance) noexcept { return instance != nullptr && self(instance).local_steps ? 3 : 2; }

const char* state_name(const void*, uint32_t slot) noexcept {
  switch (slot) {
    case 0: return "exp_avg";
    case 1: return "exp_avg_sq";
    case 2: return "momentum_accumulator";
    default: return nullptr;
  }
}

zd_status plan(const void* instance, int64_t step, int32_t warmup, int32_t sync, zd_optimizer_plan* out) noexcept {
  if (instance == nullptr || out == nullptr || step < 1) return ZD_ERR_INVALID_ARGUMENT;
  const Instance& inst = self(instance);
  *out = zd_optimizer_plan{};
  out->struct_size = sizeof *out;
  const bool frozen = step > inst.var_freeze_step;
  if (frozen) {
    // Every rank keeps its local gradient, and the error feedback restarts
    // at the first step after the freeze.
    out->grads = ZD_GRADS_LOCAL;
    out->reset_errors = step == inst.var_freeze_step + 1 ? 1 : 0;
    if (!inst.local_steps) {
      out->kind = kMomentum;
      out->keep_average = 1;
      out->ops[0] = ZD_OP_PREPARE;
      out->ops[1] = ZD_OP_EXCHANGE;
      out->ops[2] = ZD_OP_PASS;
      // The pass reads the exchanged momentum, the master and the frozen v:
      // a rank holding a whole copy of v can replay it for any element.
      out->replay_slots = 1u << 1;
      return ZD_OK;
    }
    const bool syncs = sync >= 0 ? sync != 0
                                 : zo::sync_step(step, inst.var_freeze_step, inst.local_scaler, inst.local_clipper);
    // lrs sums the learning rates of the local steps before this one since
    // the last sync (none before the first local step); zero again right
    // after a sync on the schedule (a step resumed there needs none: a new
    // model set to it is not refused). One the engine forced is not seen
    // here, and may be 1 where the sums are zero.
    out->kept_scalars = step > inst.var_freeze_step + 1 &&
                                !zo::sync_step(step - 1, inst.var_freeze_step, inst.local_scaler, inst.local_clipper)
                            ? 1
                            : 0;
    out->ops[0] = ZD_OP_PASS_GRAD;
    if (syncs) {
      out->kind = kSync;
      out->ops[1] = ZD_OP_EXCHANGE;
      out->ops[2] = ZD_OP_PASS;
    } else {
      out->kind = kLocal;
    }
    return ZD_OK;
  }
  const bool variance = warmup >= 0 ? warmup != 0 : zo::variance_step(step, inst.kappa);
  if (variance) {
    out->kind = kVariance;
    out->grads = ZD_GRADS_AVERAGED;
    out->ops[0] = ZD_OP_PASS_GRAD;
    return ZD_OK;
  }
  out->kind = kGradient;
  out->grads = ZD_GRADS_LOCAL;
  out->ops[0] = ZD_OP_PREPARE;
  out->ops[1] = ZD_OP_EXCHANGE;
  out->ops[2] = ZD_OP_PASS;
  // The pass reads the exchanged gradient, m and v and nothing else, element
  // by element, and writes m: a rank holding whole copies of m and v can
  // replay it for any element (compression.replay, stages 1-2).
  out->replay_slots = (1u << 0) | (1u << 1);
  return ZD_OK;
}

zo::Consts consts(const Instance& inst, const zd_optimizer_update& u) {
  return zo::make_consts(inst.beta1, inst.beta2, inst.eps, inst.weight_decay, u.lr, u.grad_scale);
}

zd_status prepare(const void* instance, zd_isa isa, const zd_optimizer_update* u) noexcept {
  return glue::guarded([&]() -> zd_status {
    if (instance == nullptr || u == nullptr || u->struct_size < sizeof(zd_optimizer_update) ||
        u->exchange == nullptr || (u->kind != kGradient && u->kind != kMomentum))
      return ZD_ERR_INVALID_ARGUMENT;
    optim::Isa k;
    if (const zd_status st = glue::resolve_isa_up_to_avx2(isa, &k); st != ZD_OK) return st;
    optim::Range r;
    if (const zd_status st = glue::read_update(u, 0, &r, {.master = false, .grad = true}); st != ZD_OK) return st;
    zo::Arrays a;
    a.count = r.count;
    a.grad = r.grad;
    a.grad_dtype = r.grad_dtype;
    a.exchange = u->exchange;
    if (u->kind == kMomentum)
      zo::prepare_momentum(k, consts(self(instance), *u), a);
    else
      zo::prepare_gradient(k, consts(self(instance), *u), a);
    return ZD_OK;
  });
}

zd_status update(const void* instance, zd_isa isa, const zd_optimizer_update* u) noexcept {
  return glue::guarded([&]() -> zd_status {
    if (instance == nullptr || u == nullptr || u->struct_size < sizeof(zd_optimizer_update))
      return ZD_ERR_INVALID_ARGUMENT;
    const Instance& inst = self(instance);
    optim::Isa k;
    if (const zd_status st = glue::resolve_isa_up_to_avx2(isa, &k); st != ZD_OK) return st;
    const uint32_t kind = u->kind;
    const bool with_grad = kind == kVariance || kind == kLocal || (kind == kSync && u->pass == 1);
    const bool needs_u = kind == kLocal || kind == kSync;
    const bool needs_exchange = kind == kGradient || kind == kSync || kind == kMomentum;
    if (kind > kMomentum || (with_grad != (u->grad != nullptr)) || (needs_exchange && u->exchange == nullptr) ||
        (needs_u && !inst.local_steps) || (kind == kSync && u->pass != 1 && u->pass != 2))
      return ZD_ERR_INVALID_ARGUMENT;
    optim::Range r;
    const zd_status st = glue::read_update(u, needs_u ? 3 : 2, &r, {.master = true, .grad = with_grad});
    if (st != ZD_OK) return st;
    zo::Arrays a;
    a.count = r.count;
    a.master = r.master;
    a.grad = r.grad;
    a.grad_dtype = r.grad_dtype;
    a.work = r.work;
    a.work_dtype = r.work_dtype;
    a.m = u->state[0];
    a.v = u->state[1];
    a.u = needs_u ? u->state[2] : nullptr;
    a.exchange = u->exchange;
    const zo::Consts c = consts(inst, *u);
    switch (kind) {
      case kVariance: zo::variance(k, c, a); break;
      case kGradient: zo::compressed_gradient(k, c, a); break;
      case kMomentum: zo::compressed_momentum(k, c, a); break;
      case kLocal: zo::local_step(k, c, a); break;
      default:
        if (u->pass == 1) {
          zo::sync_local(k, c, a);
        } else {
          // lrs sums learning rates, which the host takes >= 0; lrs = 0 is
          // a sync with nothing to sync (the header's "lrs = 0").
          if (u->tensor == nullptr || !(u->tensor[0] >= 0.0f)) return ZD_ERR_INVALID_ARGUMENT;
          if (u->tensor[0] == 0.0f)
            zo::sync_without_moves(k, c, a);
          else
            zo::sync_apply(k, c, a, u->tensor[0]);
        }
    }
    return ZD_OK;
  });
}

uint32_t average_slot(const void*) noexcept { return 0; }
// One scalar per tensor: lrs, the learning rates summed since the last sync.
uint32_t tensor_scalars(const void*) noexcept { return 1; }
uint32_t tensor_stats(const void*) noexcept { return 0; }
zd_stat_op stat_op(const void*, uint32_t) noexcept { return ZD_STAT_SUM; }

zd_status tensor_step(const void* instance, const zd_tensor_step* s) noexcept {
  if (instance == nullptr || s == nullptr || s->struct_size < sizeof(zd_tensor_step)) return ZD_ERR_INVALID_ARGUMENT;
  if (s->kind != kLocal && s->kind != kSync) return ZD_OK;
  if (s->scalars == nullptr) return ZD_ERR_INVALID_ARGUMENT;
  const bool first_pass = (s->op == ZD_OP_PASS_GRAD) && s->pass == 1;
  for (uint64_t i = 0; i < s->tensors; ++i) {
    if (first_pass) s->scalars[i] += static_cast<float>(s->lr);
    if (s->kind == kSync && s->op == ZD_OP_END) s->scalars[i] = 0.0f;
  }
  return ZD_OK;
}

zd_status check_partitions(const void* instance, uint32_t partitions, char* err, size_t err_size) noexcept {
  if (instance == nullptr) return ZD_ERR_INVALID_ARGUMENT;
  const Instance& inst = self(instance);
  if (!inst.local_steps || (partitions & ZD_PARTITION_OPTIMIZER) == 0) return ZD_OK;
  const int stage = (partitions & ZD_PARTITION_PARAMS) ? 3 : (partitions & ZD_PARTITION_GRADS) ? 2 : 1;
  glue::set_error(err, err_size,
                  "local steps (after var_freeze_step = %lld) move each rank's own whole copy of the parameters, "
                  "momentum and accumulator, which ZeRO stage %d partitions; set local_steps = false (1-bit momentum "
                  "syncs every step with the variance frozen after var_freeze_step) or use zero = { stage = 0 }",
                  static_cast<long long>(inst.var_freeze_step), stage);
  return ZD_ERR_CONFIG;
}

int32_t compresses(const void*) noexcept { return 1; }

const zd_optimizer_v3 kDescriptor = {
    ZD_DESCRIPTOR_HEAD(ZD_PLUGIN_OPTIMIZER, zd_optimizer_v3, 3, 0, 2, kName,
                       "0/1 Adam (DeepSpeed's ZeroOneAdam): 1-bit gradients between variance updates at "
                       "growing intervals, then local steps with 1-bit syncs (or, without local steps, a "
                       "1-bit momentum sync every step)",
                       kSpecs.data(), kSpecs.size()),
    .create = create,
    .destroy = destroy,
    .state_slots = state_slots,
    .state_name = state_name,
    .supports_isa = glue::supports_isa_up_to_avx2,
    .update = update,
    .update_cuda = nullptr,
    .plan = plan,
    .prepare = prepare,
    .average_slot = average_slot,
    .tensor_scalars = tensor_scalars,
    .tensor_stats = tensor_stats,
    .stat_op = stat_op,
    .tensor_step = tensor_step,
    .check_partitions = check_partitions,
    .compresses = compresses,
};

// v3 only: the host needs plans to run it.
}  // namespace

ZD_PLUGIN_DESCRIPTORS(&kDescriptor.header)
