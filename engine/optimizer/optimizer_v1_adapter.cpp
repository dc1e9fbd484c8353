// Optimizer ABI version 1 lifted to version 4: a plain optimizer. Every step
// averages the gradients in full precision and runs one pass with them;
// nothing is exchanged, no tensor has scalars or statistics.
#include "optimizer/optimizer_adapters.h"

namespace zerod {
namespace {

zd_status update(const void* a, zd_isa isa, const zd_optimizer_update* u) {
  return adapted::desc<zd_optimizer_v1>(a).update(adapted::instance(a), isa, u);
}

zd_status plan(const void*, int64_t step, int32_t, int32_t, zd_optimizer_plan* out) {
  if (step < 1 || out == nullptr) return ZD_ERR_INVALID_ARGUMENT;
  *out = zd_optimizer_plan{};
  out->struct_size = sizeof *out;
  out->grads = ZD_GRADS_AVERAGED;
  out->ops[0] = ZD_OP_PASS_GRAD;
  return ZD_OK;
}

}  // namespace

zd_optimizer_v4 lift_optimizer_v1(const zd_optimizer_v1& d) {
  zd_optimizer_v4 t = adapted::lift_common(d);
  t.update = update;
  t.plan = plan;
  return t;
}

}  // namespace zerod
