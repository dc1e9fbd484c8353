// Optimizer ABI version 2 lifted to version 4: 1-bit Adam's fixed protocol.
// Before compression_start() a step is plain (averaged gradients, one pass).
// From it on: momentum() folds the rank's local gradient into the kept
// average of the momentum (the exchange buffer), the host averages that
// compressed and keeps it, and update() runs with grad NULL on the momentum
// slot, which first receives the average. The plugin's schedule is its own:
// a v2 plugin takes no compression schedules from the job.
#include "optimizer/optimizer_adapters.h"

#include <cstring>

namespace zerod {
namespace {

const AdaptedOptimizer& self(const void* a) { return *static_cast<const AdaptedOptimizer*>(a); }
const zd_optimizer_v2& desc(const void* a) { return *static_cast<const zd_optimizer_v2*>(self(a).descriptor); }

int64_t start(const void* a) {
  const int64_t s = desc(a).compression_start(self(a).instance);
  return s > 0 ? s : 0;
}


zd_status update(const void* a, zd_isa isa, const zd_optimizer_update* u) {
  if (u != nullptr && u->exchange != nullptr) {
    // A compressed step: the momentum slot takes the average first, as the
    // v2 host wrote it there before calling update().
    const uint32_t slot = desc(a).momentum_slot(self(a).instance);
    if (slot >= ZD_OPTIMIZER_MAX_STATE || u->state[slot] == nullptr) return ZD_ERR_INVALID_ARGUMENT;
    std::memcpy(u->state[slot], u->exchange, u->count * sizeof(float));
  }
  return desc(a).update(self(a).instance, isa, u);
}

zd_status plan(const void* a, int64_t step, int32_t, int32_t, zd_optimizer_plan* out) {
  if (step < 1 || out == nullptr) return ZD_ERR_INVALID_ARGUMENT;
  *out = zd_optimizer_plan{};
  out->struct_size = sizeof *out;
  const int64_t s = start(a);
  if (s == 0 || step < s) {
    out->grads = ZD_GRADS_AVERAGED;
    out->ops[0] = ZD_OP_PASS_GRAD;
    return ZD_OK;
  }
  out->kind = 1;
  out->grads = ZD_GRADS_LOCAL;
  out->keep_average = 1;
  out->ops[0] = ZD_OP_PREPARE;
  out->ops[1] = ZD_OP_EXCHANGE;
  out->ops[2] = ZD_OP_PASS;
  return ZD_OK;
}

// The local momentum, written into the exchange buffer (which holds the
// last average, or the gathered momentum slot, on entry).
zd_status prepare(const void* a, zd_isa isa, const zd_optimizer_update* u) {
  if (u == nullptr || desc(a).momentum == nullptr) return ZD_ERR_INVALID_ARGUMENT;
  const uint32_t slot = desc(a).momentum_slot(self(a).instance);
  if (slot >= ZD_OPTIMIZER_MAX_STATE) return ZD_ERR_INVALID_ARGUMENT;
  zd_optimizer_update m = *u;
  m.state[slot] = u->exchange;
  return desc(a).momentum(self(a).instance, isa, &m);
}

uint32_t average_slot(const void* a) { return desc(a).momentum_slot ? desc(a).momentum_slot(self(a).instance) : 0; }
int32_t compresses(const void* a) { return start(a) > 0 ? 1 : 0; }

}  // namespace

zd_optimizer_v4 lift_optimizer_v2(const zd_optimizer_v2& d) {
  zd_optimizer_v4 t = adapted::lift_common(d);
  t.update = update;
  t.plan = plan;
  t.prepare = prepare;
  t.average_slot = average_slot;
  t.compresses = compresses;
  return t;
}

}  // namespace zerod
