// Optimizer ABI version 1 lifted to version 3: a plain optimizer. Every step
// averages the gradients in full precision and runs one pass with them;
// nothing is exchanged, no tensor has scalars or statistics.
#include "optimizer_adapters.h"

namespace zerod {
namespace {

const AdaptedOptimizer& self(const void* a) { return *static_cast<const AdaptedOptimizer*>(a); }
const zd_optimizer_v1& desc(const void* a) { return *static_cast<const zd_optimizer_v1*>(self(a).descriptor); }

uint32_t state_slots(const void* a) { return desc(a).state_slots(self(a).instance); }
const char* state_name(const void* a, uint32_t slot) { return desc(a).state_name(self(a).instance, slot); }
zd_status update(const void* a, zd_isa isa, const zd_optimizer_update* u) {
  return desc(a).update(self(a).instance, isa, u);
}
zd_status update_cuda(const void* a, const zd_optimizer_update* u, void* stream) {
  return desc(a).update_cuda(self(a).instance, u, stream);
}

zd_status plan(const void*, int64_t step, int32_t, int32_t, zd_optimizer_plan* out) {
  if (step < 1 || out == nullptr) return ZD_ERR_INVALID_ARGUMENT;
  *out = zd_optimizer_plan{};
  out->struct_size = sizeof *out;
  out->grads = ZD_GRADS_AVERAGED;
  out->ops[0] = ZD_OP_PASS_GRAD;
  return ZD_OK;
}

uint32_t zero(const void*) { return 0; }
zd_stat_op sum(const void*, uint32_t) { return ZD_STAT_SUM; }
zd_status any_partitions(const void*, uint32_t, char*, size_t) { return ZD_OK; }
int32_t never(const void*) { return 0; }

}  // namespace

zd_optimizer_v3 lift_optimizer_v1(const zd_optimizer_v1& d) {
  zd_optimizer_v3 t{};
  t.header = d.header;
  t.hparams = d.hparams;
  t.hparam_count = d.hparam_count;
  t.create = d.create;  // the host creates and destroys through the plugin's own table
  t.destroy = d.destroy;
  t.supports_isa = d.supports_isa;
  t.state_slots = state_slots;
  t.state_name = state_name;
  t.update = update;
  t.update_cuda = d.update_cuda ? update_cuda : nullptr;
  t.plan = plan;
  t.prepare = nullptr;
  t.average_slot = zero;
  t.tensor_scalars = zero;
  t.tensor_stats = zero;
  t.stat_op = sum;
  t.tensor_step = nullptr;
  t.check_partitions = any_partitions;
  t.compresses = never;
  return t;
}

}  // namespace zerod
