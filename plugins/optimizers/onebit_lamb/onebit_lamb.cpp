// zd_optimizer_onebit_lamb.so: 1-bit LAMB (Li et al. 2021; DeepSpeed's
// OnebitLamb) on the plugin ABI v3 (zerod_plugin.h, zd_optimizer_v3). With
// update number t (1-based), d = sqrt(v) + eps, per tensor:
//
//   warm-up (t <= freeze_step, or the job's compression.warmup): LAMB on
//   gradients averaged in full precision,
//     m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  v_fresh = v
//     upd = m/d + wd p;  c = clip(||p|| / ||upd||, min_coeff, max_coeff)
//     (1 where either norm is 0);  p -= lr c upd
//     and the frozen ratio follows c: cf = coeff_beta cf + (1 - coeff_beta) c
//     (when c != 1). The momentum's scale per tensor for the compression,
//     s = mean over tensors of rms(m) / rms(m), is taken from the last one.
//   compressed: each rank's local momentum, scaled, all tensors of a
//   parameter group 1-bit compressed as one buffer (one worker scale),
//     x = (b1 m + (1 - b1) g) s;  m = avg(x) / s   (v frozen)
//     g^ = (m - b1 m_last) / (1 - b1);  v_fresh = b2 v_fresh + (1 - b2) g^^2
//     upd = m/d + wd p;  f = max(d / (sqrt(v_fresh) + eps)), moved toward 1
//     by ||m/d|| / ||upd|| when wd > 0, clipped to [factor_min, factor_max]
//     and to within factor_threshold of the last f;  p -= lr cf f upd
//
// The norms and the largest ratio of a tensor are the host's per-tensor
// statistics (summed, or maxed, over the ranks that own its parts); the
// frozen ratio, the last factor, the scale and this step's coefficient are
// its per-tensor scalars, which checkpoints hold (as DeepSpeed's state
// holds lamb_coeff_freeze, last_factor and scaling_coeff): a run resumed
// past freeze_step needs its frozen ratio. No bias correction, as in
// DeepSpeed.
//
// A compressed step can be replayed (zd_optimizer_plan.replay_slots, from
// zerod 1.5): given the exchanged average, the first pass makes an
// element's m from it alone, and the second applies the coefficient (a
// per-tensor scalar every rank holds) with that m, v and the parameter. So
// another rank replays both passes from whole copies of m (written by the
// first, read by the second) and of the frozen v; v_fresh, m's old value
// and the statistics feed only the owners' figures.
#include <array>
#include <cmath>
#include <cstdint>
#include <new>
#include <vector>

#include "glue.h"
#include "kernels.h"

namespace {

namespace glue = zerod::optim::glue;
namespace optim = zerod::optim;
namespace lamb = zerod::optim::onebit_lamb;

constexpr const char* kName = "onebit_lamb";
constexpr double kMaxStep = 1e15;
// The first host (zerod 1.5) that replays a plan with more than one pass;
// an older one refuses replay_slots in such a plan.
constexpr uint32_t kHostReplaysPasses = (1u << 16) | 5u;

constexpr std::array<zd_hparam_spec, 11> kSpecs = {{
    glue::number_spec("lr", 1e-3, 0.0, glue::kUnbounded, ZD_HPARAM_MIN_EXCLUSIVE,
                      "learning rate; the job script's schedule may override it per step"),
    glue::pair_spec("betas", 0.9, 0.999, 0.0, 1.0, ZD_HPARAM_MAX_EXCLUSIVE,
                    "decay rates of the momentum (compressed after freeze_step) and of the variance (frozen "
                    "after freeze_step)"),
    glue::number_spec("eps", 1e-8, 0.0, glue::kUnbounded, ZD_HPARAM_MIN_EXCLUSIVE,
                      "added to sqrt(v), which is not bias-corrected (as in DeepSpeed's OnebitLamb)"),
    glue::number_spec("weight_decay", 0.0, 0.0, glue::kUnbounded, 0, "added to the update: m/d + wd p"),
    glue::integer_spec("freeze_step", 100000, 0.0, kMaxStep,
                       "warm-up updates of LAMB before the momentum is 1-bit compressed and v frozen (DeepSpeed's "
                       "default)"),
    glue::number_spec("max_coeff", 10.0, 0.0, glue::kUnbounded, ZD_HPARAM_MIN_EXCLUSIVE,
                      "the largest trust ratio ||p|| / ||update|| in the warm-up"),
    glue::number_spec("min_coeff", 0.01, 0.0, glue::kUnbounded, ZD_HPARAM_MIN_EXCLUSIVE,
                      "the smallest trust ratio in the warm-up"),
    glue::number_spec("coeff_beta", 0.9, 0.0, 1.0, ZD_HPARAM_MAX_EXCLUSIVE,
                      "decay of the running average of the warm-up's trust ratios (the frozen ratio)"),
    glue::number_spec("factor_max", 4.0, 0.0, glue::kUnbounded, ZD_HPARAM_MIN_EXCLUSIVE,
                      "the largest factor on the frozen ratio in the compression stage"),
    glue::number_spec("factor_min", 0.5, 0.0, glue::kUnbounded, ZD_HPARAM_MIN_EXCLUSIVE,
                      "the smallest factor on the frozen ratio in the compression stage"),
    glue::number_spec("factor_threshold", 0.1, 0.0, 1.0, ZD_HPARAM_MAX_EXCLUSIVE,
                      "how far the factor may move from the last step's, relative"),
}};

enum Kind : uint32_t { kWarmup = 0, kCompressed = 1 };

// Per-tensor scalars the host keeps (zero at first).
enum Scalar : uint32_t { kFrozen = 0, kLastFactor = 1, kScale = 2, kCoeff = 3, kScalars = 4 };

struct Instance {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  int64_t freeze_step = 0;
  double max_coeff = 10, min_coeff = 0.01, coeff_beta = 0.9, factor_min = 0.5, factor_max = 4, threshold = 0.1;
  bool host_replays_passes = false;  // the host replays a plan's later passes (zerod 1.5 and newer)
};

const Instance& self(const void* p) { return *static_cast<const Instance*>(p); }

zd_status create(const zd_host_services* host, const double* values, size_t value_count, void** out_instance,
                 char* err, size_t err_size) noexcept {
  const auto check = [&](const double* v) {
    if (v[7] > v[6]) {
      glue::set_error(err, err_size, "min_coeff = %g is above max_coeff = %g", v[7], v[6]);
      return ZD_ERR_CONFIG;
    }
    if (v[10] > v[9]) {
      glue::set_error(err, err_size, "factor_min = %g is above factor_max = %g", v[10], v[9]);
      return ZD_ERR_CONFIG;
    }
    return ZD_OK;
  };
  const zd_status st = glue::create_instance<Instance>(
      kSpecs.data(), kSpecs.size(), values, value_count, out_instance, err, err_size, check,
      [](Instance& inst, const double* v) {
        inst.beta1 = v[1];
        inst.beta2 = v[2];
        inst.eps = v[3];
        inst.weight_decay = v[4];
        inst.freeze_step = static_cast<int64_t>(v[5]);
        inst.max_coeff = v[6];
        inst.min_coeff = v[7];
        inst.coeff_beta = v[8];
        inst.factor_max = v[9];
        inst.factor_min = v[10];
        inst.threshold = v[11];
      });
  if (st != ZD_OK) return st;
  Instance& inst = *static_cast<Instance*>(*out_instance);
  if (host != nullptr && host->abi_version >= kHostReplaysPasses) inst.host_replays_passes = true;
  // The frozen ratio is the running average of the warm-up's trust ratios:
  // without a warm-up it stays 0, and every compressed update is lr * 0.
  // (A job's compression.warmup schedule, which the plugin cannot see here,
  // may still give it warm-up steps.)
  if (inst.freeze_step == 0)
    glue::log(glue::copy_host(host), ZD_LOG_WARN, kName,
              "freeze_step = 0: no warm-up sets the frozen trust ratio (unless the job's compression.warmup "
              "schedules one), which stays 0, so every update is lr * 0 and the parameters never move; set "
              "freeze_step to the number of LAMB warm-up updates");
  return st;
}

void destroy(void* instance) noexcept { delete static_cast<Instance*>(instance); }

uint32_t state_slots(const void*) noexcept { return 3; }

const char* state_name(const void*, uint32_t slot) noexcept {
  switch (slot) {
    case 0: return "exp_avg";
    case 1: return "exp_avg_sq";
    case 2: return "exp_avg_sq_fresh";
    default: return nullptr;
  }
}

zd_status plan(const void* instance, int64_t step, int32_t warmup, int32_t, zd_optimizer_plan* out) noexcept {
  if (instance == nullptr || out == nullptr || step < 1) return ZD_ERR_INVALID_ARGUMENT;
  *out = zd_optimizer_plan{};
  out->struct_size = sizeof *out;
  // Every step after the first reads what the ones before left per tensor:
  // the warm-up the running average of its trust ratios, a compressed step
  // the frozen ratio, the last factor and the momentum's scale.
  out->kept_scalars = step > 1 ? 1 : 0;
  const bool warm = warmup >= 0 ? warmup != 0 : step <= self(instance).freeze_step;
  if (warm) {
    out->kind = kWarmup;
    out->grads = ZD_GRADS_AVERAGED;
    out->ops[0] = ZD_OP_PASS_GRAD;
    out->ops[1] = ZD_OP_PASS;
    return ZD_OK;
  }
  out->kind = kCompressed;
  out->grads = ZD_GRADS_LOCAL;
  out->fused = 1;
  out->keep_average = 1;
  out->ops[0] = ZD_OP_PREPARE;
  out->ops[1] = ZD_OP_EXCHANGE;
  out->ops[2] = ZD_OP_PASS;
  out->ops[3] = ZD_OP_PASS;
  // m (slot 0) carries the first pass's result to the second; v is frozen.
  if (self(instance).host_replays_passes) out->replay_slots = (1u << 0) | (1u << 1);
  return ZD_OK;
}

lamb::Consts consts(const Instance& inst, const zd_optimizer_update& u) {
  return lamb::make_consts(inst.beta1, inst.beta2, inst.eps, inst.weight_decay, u.grad_scale);
}

// The momentum's scale for the fused exchange (1 until the warm-up set it).
float scale_of(const float* tensor) { return tensor != nullptr && tensor[kScale] > 0.0f ? tensor[kScale] : 1.0f; }

zd_status prepare(const void* instance, zd_isa isa, const zd_optimizer_update* u) noexcept {
  return glue::guarded([&]() -> zd_status {
    if (instance == nullptr || u == nullptr || u->struct_size < sizeof(zd_optimizer_update) ||
        u->exchange == nullptr || u->kind != kCompressed || u->tensor == nullptr)
      return ZD_ERR_INVALID_ARGUMENT;
    optim::Isa k;
    if (const zd_status st = glue::resolve_isa_up_to_avx2(isa, &k); st != ZD_OK) return st;
    optim::Range r;
    if (const zd_status st = glue::read_update(u, 0, &r, {.master = false, .grad = true}); st != ZD_OK) return st;
    lamb::Arrays a;
    a.count = r.count;
    a.grad = r.grad;
    a.grad_dtype = r.grad_dtype;
    a.exchange = u->exchange;
    lamb::prepare(k, consts(self(instance), *u), a, scale_of(u->tensor), u->exchange_in == ZD_EXCHANGE_IN_AVERAGE);
    return ZD_OK;
  });
}

zd_status update(const void* instance, zd_isa isa, const zd_optimizer_update* u) noexcept {
  return glue::guarded([&]() -> zd_status {
    if (instance == nullptr || u == nullptr || u->struct_size < sizeof(zd_optimizer_update) || u->tensor == nullptr ||
        (u->pass != 1 && u->pass != 2) || u->kind > kCompressed)
      return ZD_ERR_INVALID_ARGUMENT;
    optim::Isa k;
    if (const zd_status st = glue::resolve_isa_up_to_avx2(isa, &k); st != ZD_OK) return st;
    const bool with_grad = u->kind == kWarmup && u->pass == 1;
    const bool moments = u->pass == 1;
    if (with_grad != (u->grad != nullptr) || (moments && u->stats == nullptr) ||
        (u->kind == kCompressed && moments && u->exchange == nullptr))
      return ZD_ERR_INVALID_ARGUMENT;
    optim::Range r;
    if (const zd_status st = glue::read_update(u, 3, &r, {.master = true, .grad = with_grad}); st != ZD_OK) return st;
    lamb::Arrays a;
    a.count = r.count;
    a.master = r.master;
    a.grad = r.grad;
    a.grad_dtype = r.grad_dtype;
    a.work = r.work;
    a.work_dtype = r.work_dtype;
    a.m = u->state[0];
    a.v = u->state[1];
    a.v_fresh = u->state[2];
    a.exchange = u->exchange;
    const lamb::Consts c = consts(self(instance), *u);
    if (!moments)
      lamb::apply(k, c, a, static_cast<float>(-u->lr * static_cast<double>(u->tensor[kCoeff])));
    else if (u->kind == kWarmup)
      lamb::warmup_moments(k, c, a, u->stats);
    else
      lamb::compressed_moments(k, c, a, scale_of(u->tensor), u->stats);
    return ZD_OK;
  });
}

uint32_t average_slot(const void*) noexcept { return 0; }
uint32_t tensor_scalars(const void*) noexcept { return kScalars; }
uint32_t tensor_stats(const void*) noexcept { return lamb::kStats; }
zd_stat_op stat_op(const void*, uint32_t stat) noexcept {
  return stat == lamb::kMaxRatio ? ZD_STAT_MAX : ZD_STAT_SUM;
}

// Before a warm-up step's second pass: this step's trust ratio, the frozen
// ratio's running average, and the compression's momentum scales.
void warmup_coefficients(const Instance& inst, const zd_tensor_step& s) {
  constexpr uint32_t K = kScalars, N = lamb::kStats;
  double rms_sum = 0.0;
  std::vector<double> rms(s.tensors);
  for (uint64_t i = 0; i < s.tensors; ++i) {
    const double* st = s.stats + i * N;
    float* sc = s.scalars + i * K;
    const double wn = std::sqrt(st[lamb::kSumA]), un = std::sqrt(st[lamb::kSumB]);
    double coeff = 1.0;
    if (wn != 0.0 && un != 0.0) coeff = std::min(inst.max_coeff, std::max(inst.min_coeff, wn / un));
    if (coeff != 1.0)
      sc[kFrozen] = static_cast<float>(inst.coeff_beta * sc[kFrozen] + (1.0 - inst.coeff_beta) * coeff);
    sc[kCoeff] = static_cast<float>(coeff);
    rms[i] = s.numel[i] ? std::sqrt(st[lamb::kSumM] / static_cast<double>(s.numel[i])) : 0.0;
    rms_sum += rms[i];
  }
  const double united = s.tensors ? rms_sum / static_cast<double>(s.tensors) : 0.0;
  for (uint64_t i = 0; i < s.tensors; ++i)
    s.scalars[i * K + kScale] = rms[i] > 0.0 ? static_cast<float>(united / rms[i]) : 1.0f;
}

// Before a compressed step's second pass: the factor on the frozen ratio.
void compressed_coefficients(const Instance& inst, const zd_tensor_step& s) {
  constexpr uint32_t K = kScalars, N = lamb::kStats;
  for (uint64_t i = 0; i < s.tensors; ++i) {
    const double* st = s.stats + i * N;
    float* sc = s.scalars + i * K;
    double factor = st[lamb::kMaxRatio];
    if (inst.weight_decay > 0.0 && st[lamb::kSumA] > 0.0) {
      const double ratio = std::min(1.0, std::sqrt(st[lamb::kSumB]) / std::sqrt(st[lamb::kSumA]));
      factor = factor * ratio + (1.0 - ratio);
    }
    factor = std::min(inst.factor_max, std::max(inst.factor_min, factor));
    const double last = sc[kLastFactor] > 0.0f ? sc[kLastFactor] : 1.0;
    factor = std::min(last * (1.0 + inst.threshold), std::max(last * (1.0 - inst.threshold), factor));
    sc[kLastFactor] = static_cast<float>(factor);
    sc[kCoeff] = static_cast<float>(sc[kFrozen] * factor);
  }
}

zd_status tensor_step(const void* instance, const zd_tensor_step* s) noexcept {
  return glue::guarded([&]() -> zd_status {
    if (instance == nullptr || s == nullptr || s->struct_size < sizeof(zd_tensor_step) || s->scalars == nullptr)
      return ZD_ERR_INVALID_ARGUMENT;
    if (s->op != ZD_OP_PASS || s->pass != 2) return ZD_OK;
    if (s->stats == nullptr || s->numel == nullptr) return ZD_ERR_INVALID_ARGUMENT;
    if (s->kind == kWarmup)
      warmup_coefficients(self(instance), *s);
    else
      compressed_coefficients(self(instance), *s);
    return ZD_OK;
  });
}

zd_status any_partitions(const void*, uint32_t, char*, size_t) noexcept { return ZD_OK; }
int32_t compresses(const void*) noexcept { return 1; }

const zd_optimizer_v3 kDescriptor = {
    ZD_DESCRIPTOR_HEAD(ZD_PLUGIN_OPTIMIZER, zd_optimizer_v3, 3, 0, 2, kName,
                       "1-bit LAMB (DeepSpeed's OnebitLamb): LAMB warm-up, then 1-bit compressed scaled "
                       "momentum with frozen variance and trust ratios",
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
    .check_partitions = any_partitions,
    .compresses = compresses,
};

}  // namespace

ZD_PLUGIN_DESCRIPTORS(&kDescriptor.header)
